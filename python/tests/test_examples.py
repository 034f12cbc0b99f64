"""The plain Python examples (examples/python/pub.py, sub.py) as a user runs them: the
Rust examples' Zenoh flags, a word while waiting, a summary on SIGINT and SIGTERM whose
counts add up, and flags refused in plain words. Host memory, loopback TCP."""

import pathlib
import signal
import subprocess
import sys
import time

import pytest

from zcs_testing import IO_TIMEOUT, free_port

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples" / "python"


def example(script, *args, ignore_sigint=False):
    def start():
        if ignore_sigint:  # as a background job of a non-interactive shell starts
            signal.signal(signal.SIGINT, signal.SIG_IGN)

    return subprocess.Popen([sys.executable, str(EXAMPLES / script), "--device", "host", *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=EXAMPLES,
                            preexec_fn=start)


def read_until(proc, prefix):
    """Lines up to and including the first that starts with `prefix`."""
    seen = []
    while True:
        line = proc.stdout.readline()
        assert line, "".join(seen)
        seen.append(line)
        if line.startswith(prefix):
            return "".join(seen)


def finish(proc):
    try:
        out, _ = proc.communicate(timeout=IO_TIMEOUT * 2)
    finally:
        proc.kill()
    return proc.returncode, out


def test_a_subscriber_and_a_publisher_count_what_they_did():
    port, key = free_port(), f"test/examples/{free_port()}"
    sub = example("sub.py", "-k", key, "-n", 5, "-l", f"tcp/127.0.0.1:{port}", "--no-multicast-scouting")
    read_until(sub, "[sub] subscribed to")
    pub = example("pub.py", "-k", key, "-n", 8, "--shape", "4,4", "-r", 20, "-e", f"tcp/127.0.0.1:{port}",
                  "--no-multicast-scouting")
    code, out = finish(sub)
    assert code == 0 and "MISMATCH" not in out, out
    summary = [line for line in out.splitlines() if line.startswith("[sub] done: ")]
    assert summary and summary[0].startswith("[sub] done: 5 messages checked of "), out
    code, out = finish(pub)
    assert code == 0 and "[pub] done: 8 messages" in out, out


@pytest.mark.parametrize("script,extra,ready,end", [
    ("sub.py", [], "[sub] subscribed to", "[sub] interrupted: 0 messages checked of 0 received"),
    ("pub.py", ["--shape", 4], "put #1 ", "[pub] interrupted: "),
], ids=["sub", "pub"])
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_examples_stop_on_signals_with_a_summary(script, extra, ready, end, sig):
    """Started with SIGINT ignored (a script's background job), they still stop on
    SIGINT and SIGTERM, and say how far they got."""
    proc = example(script, "-n", 0, *extra, "-l", f"tcp/127.0.0.1:{free_port()}", "--no-multicast-scouting",
                   ignore_sigint=True)
    read_until(proc, ready)
    time.sleep(0.3)
    proc.send_signal(sig)
    code, out = finish(proc)
    assert code == 0 and end in out, out


def test_a_subscriber_without_a_publisher_says_that_it_waits_and_gives_up_when_told():
    proc = example("sub.py", "-k", "test/examples/nobody", "-l", f"tcp/127.0.0.1:{free_port()}",
                   "--no-multicast-scouting", "--idle-timeout", 3)
    code, out = finish(proc)
    assert "[sub] waiting for a publisher on 'test/examples/nobody'…" in out, out
    assert "no message for 3 s" in out and "[sub] stopped: 0 messages checked of 0 received" in out, out
    assert code == 1, out


@pytest.mark.parametrize("args,words", [
    (["-c", "/nonexistent/zenoh.json5"], "-c/--config /nonexistent/zenoh.json5: no such file"),
    (["-c", __file__, "-e", "tcp/127.0.0.1:7447"], "-c/--config is read whole: put -e in"),
    (["-m", "clinet"], "argument -m/--mode: invalid choice: 'clinet'"),
], ids=["missing-file", "mixed", "bad-mode"])
@pytest.mark.parametrize("script", ["sub.py", "pub.py"])
def test_bad_flags_are_named(script, args, words):
    code, out = finish(example(script, *args))
    assert code == 2 and words in out, out


def test_a_bad_shape_is_named():
    code, out = finish(example("pub.py", "--shape", "4,x"))
    assert code == 2 and "--shape takes comma-separated whole numbers, not '4,x'" in out, out


def test_a_waiting_subscriber_names_publishers_on_other_keys():
    """A subscriber whose key matches no publisher names ours on other keys (a mistyped
    key), after its waiting line."""
    port, root = free_port(), f"test/examples/{free_port()}"
    sub = example("sub.py", "-k", f"{root}/camera", "-l", f"tcp/127.0.0.1:{port}", "--no-multicast-scouting",
                  "--idle-timeout", 4)
    read_until(sub, "[sub] subscribed to")
    pub = example("pub.py", "-k", f"{root}/camra", "-n", 0, "--shape", 4, "-r", 5, "-e", f"tcp/127.0.0.1:{port}",
                  "--no-multicast-scouting")
    try:
        code, out = finish(sub)
    finally:
        pub.kill()
        pub.wait()
    lines = out.splitlines()
    waiting = lines.index(f"[sub] waiting for a publisher on '{root}/camera'…")
    assert lines[waiting + 1] == (f"[sub] publishers seen on other keys: '{root}/camra' "
                                  "(plain Zenoh publishers are not listed)"), out
    assert code == 1, out
