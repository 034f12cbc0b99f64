"""Fixtures for the tests against real rclpy on rmw_zenoh_cpp (see docs/ros2-real.md).

The environment comes from scripts/ros2-real.sh (its env.sh, sourced by
scripts/ros2-real-test.sh): RMW_IMPLEMENTATION, the library path that makes rcl load
rmw_zenoh_cpp, ROS2_REAL_RMW_ZENOHD. Our example binaries are taken from
ZCS_EXAMPLES_DIR (default: target/release/examples of this checkout).

Every test gets its own router (rmw_zenohd on a free 127.0.0.1 port, multicast
scouting off) and its own ROS_DOMAIN_ID; every process a test starts is in a process
group of its own and is killed when the test ends, whatever the outcome.
"""

import atexit
import itertools
import json
import os
import pathlib
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
HERE = pathlib.Path(__file__).resolve().parent
EXAMPLES = pathlib.Path(os.environ.get("ZCS_EXAMPLES_DIR", ROOT / "target" / "release" / "examples"))
DISTRO = os.environ.get("ROS_DISTRO", "?")
RMW_VERSION = os.environ.get("ROS2_REAL_RMW_ZENOH_VERSION", "?")

# Domain ids: a random base per pytest run, one more per test (0..232 are valid).
_domains = itertools.count(random.randrange(1, 150))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Every process started, so that none outlives pytest even if a teardown did not run.
_all_procs = []


@atexit.register
def _kill_leftovers():
    for p in _all_procs:
        if p.p.poll() is None:
            try:
                os.killpg(p.p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


class Proc:
    """A child process whose stdout+stderr lines are collected by a thread."""

    def __init__(self, name, argv, env, log_dir):
        self.name = name
        self.argv = [str(a) for a in argv]
        self.lines = []
        self.cond = threading.Condition()
        self.log = open(log_dir / f"{name}.log", "w", buffering=1)
        self.log.write("$ " + " ".join(self.argv) + "\n")
        self.p = subprocess.Popen(self.argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, start_new_session=True, text=True, bufsize=1)
        _all_procs.append(self)
        self.t = threading.Thread(target=self._read, daemon=True)
        self.t.start()

    def _read(self):
        for line in self.p.stdout:
            self.log.write(line)
            with self.cond:
                self.lines.append(line.rstrip("\n"))
                self.cond.notify_all()
        with self.cond:
            self.cond.notify_all()

    def wait_line(self, pattern, timeout):
        """The first line matching `pattern` (a regex), waiting up to `timeout` s."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        seen = 0
        with self.cond:
            while True:
                for line in self.lines[seen:]:
                    if rx.search(line):
                        return line
                seen = len(self.lines)
                left = deadline - time.monotonic()
                if left <= 0 or (self.p.poll() is not None and not self.t.is_alive()):
                    raise AssertionError(f"{self.name}: no line matching {pattern!r} within {timeout} s "
                                         f"(exit {self.p.poll()}); output:\n" + self.tail())
                self.cond.wait(min(left, 0.2))

    def events(self):
        out = []
        with self.cond:
            lines = list(self.lines)
        for line in lines:
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
        return out

    def summary(self, timeout):
        """The `{"summary": ...}` line of an rclpy peer."""
        return json.loads(self.wait_line(r'^\{"summary"', timeout))["summary"]

    def json_line(self, role, timeout):
        """Our examples' closing JSON line (`{"role":"ros2_sub",...}`)."""
        return json.loads(self.wait_line(r'^\{"role":"%s"' % role, timeout))

    def wait(self, timeout):
        try:
            return self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.name} still running after {timeout} s; output:\n" + self.tail())

    def signal(self, sig):
        if self.p.poll() is None:
            try:
                os.killpg(self.p.pid, sig)
            except ProcessLookupError:
                pass

    def stop(self, grace=5.0):
        """SIGINT (our examples and rclpy end their loops on it), then SIGKILL."""
        self.signal(signal.SIGINT)
        try:
            self.p.wait(grace)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.p.wait(5)
        self.t.join(5)

    def kill(self):
        self.signal(signal.SIGKILL)
        try:
            self.p.wait(5)
        except subprocess.TimeoutExpired:
            pass
        self.t.join(5)
        self.log.close()

    def tail(self, n=40):
        with self.cond:
            return "\n".join(self.lines[-n:])


class Net:
    """One test's network: a router (or none, for peer-to-peer), a domain, its processes."""

    def __init__(self, log_dir):
        self.log_dir = log_dir
        self.domain = next(_domains) % 230 + 1
        self.procs = []
        self.port = None

    def env(self, extra=None):
        e = dict(os.environ)
        e["ROS_DOMAIN_ID"] = str(self.domain)
        e["RUST_LOG"] = e.get("RUST_LOG", "warn")
        e["PYTHONUNBUFFERED"] = "1"
        e.update(extra or {})
        return e

    def start(self, name, argv, env=None):
        p = Proc(name, argv, env or self.env(), self.log_dir)
        self.procs.append(p)
        return p

    # --- the router -------------------------------------------------------------
    def start_router(self, deadline_s=20.0):
        zenohd = os.environ.get("ROS2_REAL_RMW_ZENOHD")
        assert zenohd, "ROS2_REAL_RMW_ZENOHD is not set: source the env.sh of scripts/ros2-real.sh"
        for attempt in range(3):
            port = free_port()
            override = f'listen/endpoints=["tcp/127.0.0.1:{port}"];scouting/multicast/enabled=false'
            r = self.start(f"rmw_zenohd-{attempt}", [zenohd], self.env({"ZENOH_CONFIG_OVERRIDE": override}))
            deadline = time.monotonic() + deadline_s
            while time.monotonic() < deadline and r.p.poll() is None:
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                        self.port = port
                        return r
                except OSError:
                    time.sleep(0.1)
            r.kill()  # the port was taken meanwhile, or the router failed: try another
        raise AssertionError("rmw_zenohd did not listen; output:\n" + r.tail())

    # --- peers --------------------------------------------------------------------
    def rclpy_env(self, connect=None, listen="tcp/127.0.0.1:0"):
        """rmw_zenoh session settings: connect to the router (or `connect`; False: to
        nothing), listen on `listen`, multicast off."""
        if connect is None:
            connect = f"tcp/127.0.0.1:{self.port}"
        targets = f'["{connect}"]' if connect else "[]"
        override = (f'connect/endpoints={targets};listen/endpoints=["{listen}"];'
                    "scouting/multicast/enabled=false")
        extra = {"ZENOH_CONFIG_OVERRIDE": override}
        if self.port is None:
            extra["ZENOH_ROUTER_CHECK_ATTEMPTS"] = "-1"  # peer to peer: no router to wait for
        return self.env(extra)

    def rclpy(self, name, role, *args, connect=None, listen="tcp/127.0.0.1:0"):
        argv = [sys.executable, HERE / "rclpy_peer.py", role, *args]
        return self.start(name, argv, self.rclpy_env(connect, listen))

    def ours(self, name, example, *args, connect=None, listen="tcp/127.0.0.1:0"):
        binary = EXAMPLES / example
        assert binary.exists(), f"{binary} is missing: build it (scripts/ros2-real-test.sh does)"
        argv = [binary, "--no-multicast-scouting", "-l", listen, "--domain", str(self.domain), *args]
        connect = connect or (f"tcp/127.0.0.1:{self.port}" if self.port else None)
        if connect:
            argv += ["-e", connect]
        return self.start(name, argv)

    def ours_py(self, name, script, *args, connect=None, listen="tcp/127.0.0.1:0"):
        """One of our Python examples (examples/python/<script>) on our package, in the
        interpreter ZCS_PYTHON names (scripts/ros2-real-test.sh sets it), without the ROS
        stack's library and module paths."""
        python = os.environ.get("ZCS_PYTHON", str(ROOT / "target" / "py-venv" / "bin" / "python"))
        assert pathlib.Path(python).exists(), f"{python} is missing: scripts/python-build.sh makes it"
        argv = [python, ROOT / "examples" / "python" / script, "--no-multicast-scouting", "-l", listen,
                "--domain", str(self.domain), "--device", "host", *args]
        connect = connect or (f"tcp/127.0.0.1:{self.port}" if self.port else None)
        if connect:
            argv += ["-e", connect]
        env = {k: v for k, v in self.env().items() if k not in ("LD_LIBRARY_PATH", "PYTHONPATH")}
        return self.start(name, argv, env)

    def close(self):
        for p in reversed(self.procs):
            p.kill()


@pytest.fixture
def net(tmp_path, request):
    n = Net(tmp_path)
    yield n
    n.close()
    if getattr(request.node, "rep_call", None) is not None and request.node.rep_call.failed:
        print(f"\nlogs of {request.node.name} in {tmp_path}")


@pytest.fixture
def routed(net):
    net.start_router()
    return net


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)


def pytest_report_header(config):
    return [f"ros2-real: {DISTRO}, rmw_zenoh {RMW_VERSION}, RMW_IMPLEMENTATION={os.environ.get('RMW_IMPLEMENTATION')}",
            f"examples: {EXAMPLES}"]
