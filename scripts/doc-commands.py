#!/usr/bin/env python3
"""Runs every documented command block on a fresh clone, so that the docs cannot rot.

    scripts/doc-commands.py [--keep] [--only FILE[:LINE]]

It clones the repository's HEAD (committed files only, as a new user gets them) into a
temporary folder and runs there, in document order, every ```sh block of the pages
listed in PAGES. Each such block must carry a directive on the line just above its
opening fence, an HTML comment that Markdown viewers do not show:

    <!-- doc-test: serve="z_cuda_" ready="path zero-copy" -->

Directives (values in double quotes where they contain spaces; regexes are Python's):

    skip="why"          not run; printed as SKIPPED with the reason
    serve=REGEX         lines matching it are long-running commands a user starts in a
                        terminal of their own: each is started in the background, in its
                        own process group, `gap` seconds after the previous one
    before="COMMAND"    (repeatable) a terminal the prose asks for before the block
                        (a router, a publisher), started first
    await=REGEX         (repeatable) a line typed after a terminal was started runs
                        once every await pattern has appeared in the terminals' output
    one-at-a-time       the serve lines are alternatives: each is run on its own
    ready=REGEX         (repeatable) once every ready pattern has appeared in the
                        terminals' output, Ctrl-C (SIGINT) is sent to those still running;
                        without one, the terminals must end by themselves
    expect=REGEX        (repeatable) must appear in the block's output at the end
    gap=SECONDS         between terminal starts (default 2)
    timeout=SECONDS     for the whole block, builds included (default 1200)

Lines that are not served run one after the other in one bash, so `cd`, `export` and
`. venv/bin/activate` carry to the later lines and terminals. A block fails if a line
fails, a terminal exits with a status other than 0, a terminal does not
stop within 20 s of Ctrl-C, an expected pattern is missing, or the output shows a panic
or a content mismatch. The Rust snippet of README.md is a doc test of the library
(`cargo test`), not run here.

Every command line in the examples' own doc comments (examples/examples/*.rs and
examples/python/*.py) must also appear, verbatim, in a block that runs.

The clone's `target` is a link to this checkout's `target`, a build cache only: what is
tested is the clone's files, and nothing else of this checkout is used. The last line
printed is the summary: `doc commands: N ran, M skipped, F failed`.
"""

import argparse
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

# The pages whose command blocks a new user pastes, in the order they are run.
PAGES = ["README.md", "docs/quickstart.md", "python/README.md", "docs/plugin.md", "docs/ros2.md", "docs/c.md"]
EXAMPLE_DOCS = ["examples/examples/*.rs", "examples/python/*.py"]
# Output that fails a block whatever its directive says.
ALWAYS_FAILS = re.compile(r"panicked at|CONTENT MISMATCH|MISMATCH|Traceback \(most recent call last\)")
STOP_GRACE = 20.0

DIRECTIVE = re.compile(r"^<!--\s*doc-test:(.*?)-->\s*$")
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")


@dataclass
class Block:
    page: str
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    opts: dict = field(default_factory=dict)

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def parse_directive(text: str, where: str) -> dict:
    opts = {"before": [], "await": [], "ready": [], "expect": []}
    for tok in shlex.split(text):
        key, eq, value = tok.partition("=")
        if key == "one-at-a-time" and not eq:
            opts[key] = True
        elif key in ("before", "await", "ready", "expect") and eq:
            opts[key].append(value)
        elif key in ("skip", "serve") and eq:
            opts[key] = value
        elif key in ("gap", "timeout") and eq:
            opts[key] = float(value)
        else:
            raise SystemExit(f"{where}: unknown doc-test directive {tok!r}")
    return opts


def blocks_of(root: Path, page: str) -> list:
    out, lines = [], (root / page).read_text().splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m or not m.group(2):
            i += 1
            continue
        indent, lang, start = m.group(1), m.group(2), i
        body = []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i][len(indent):])
            i += 1
        i += 1
        d = DIRECTIVE.match(lines[start - 1].strip()) if start > 0 else None
        b = Block(page, start + 1, lang, "\n".join(body) + "\n")
        if d:
            b.opts = parse_directive(d.group(1), b.where)
        out.append(b)
    return out


def command_lines(text: str) -> list:
    """The block's commands: one per line, continuation lines joined, comment lines dropped."""
    out, cur = [], ""
    for raw in text.splitlines():
        cur += raw.rstrip()
        if cur.endswith("\\"):
            cur = cur[:-1] + " "
            continue
        if cur.strip() and not cur.strip().startswith("#"):
            out.append(cur.strip())
        cur = ""
    return out


def example_commands(root: Path) -> list:
    """Command lines of the examples' doc comments: (file, command)."""
    out = []
    for pattern in EXAMPLE_DOCS:
        for f in sorted(root.glob(pattern)):
            for raw in f.read_text().splitlines():
                line = raw.strip().removeprefix("//!").strip()
                if line.startswith(("cargo run", "python3 examples/")):
                    out.append((str(f.relative_to(root)), line))
    return out


class Terminal:
    """A long-running command in a terminal of its own: started with the shell's
    environment and folder, in a new session (so Ctrl-C reaches its whole process group
    and nothing else), its output in a log."""

    def __init__(self, index: int, command: str, logdir: Path):
        self.command = command
        self.log = logdir / f"term{index}.log"
        self.proc = None
        self.interrupted = False

    def start(self, env: dict, cwd: str) -> None:
        # Popen, not `cmd &` in the shell: a non-interactive bash starts background jobs
        # with SIGINT ignored, and a process that finds it ignored keeps ignoring it.
        self.proc = subprocess.Popen(["bash", "-c", self.command], env=env, cwd=cwd, start_new_session=True,
                                     stdin=subprocess.DEVNULL, stdout=self.log.open("w"), stderr=subprocess.STDOUT)

    def output(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def alive(self) -> bool:
        if self.proc is None:
            return False
        if self.proc.poll() is None:
            return True
        try:  # its leader is gone; anything left in its group?
            os.killpg(self.proc.pid, 0)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:
            return True

    def signal(self, sig) -> None:
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass


class Shell:
    """One bash that runs a block's lines in order, as a user's terminal would: `cd`,
    `export` and `. venv/bin/activate` carry to the later lines and terminals."""

    def __init__(self, clone: Path, logdir: Path):
        self.log = logdir / "shell.log"
        self.proc = subprocess.Popen(["bash"], stdin=subprocess.PIPE, stdout=self.log.open("w"),
                                     stderr=subprocess.STDOUT, text=True, cwd=clone)
        self.runs = 0

    def run(self, line: str, deadline: float):
        """Runs `line` (its stdin empty); its exit status, or None past the deadline."""
        self.runs += 1
        marker = f"__doc_test_status_{self.runs}__"
        # The marker on a line of its own, whether or not the output ended with one.
        self.proc.stdin.write(f"{{ {line}\n}} < /dev/null\nprintf '\\n%s %d\\n' {marker} $?\n")
        self.proc.stdin.flush()
        while time.monotonic() < deadline:
            if m := re.search(rf"^{marker} (\d+)$", self.output(), re.M):
                return int(m.group(1))
            if self.proc.poll() is not None:
                return self.proc.returncode or 1
            time.sleep(0.2)
        return None

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def state(self, deadline: float) -> tuple:
        """The shell's environment and folder, for a terminal started from it."""
        dump = self.log.parent / f"state{self.runs}"
        self.run(f"env -0 > {shlex.quote(str(dump))}.env; pwd > {shlex.quote(str(dump))}.cwd", deadline)
        env = dict(kv.split("=", 1) for kv in Path(f"{dump}.env").read_text().split("\0") if "=" in kv)
        return env, Path(f"{dump}.cwd").read_text().strip()

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def run_variant(b: Block, clone: Path, lines: list, serve: set, logdir: Path) -> tuple:
    """Runs one variant of a block; returns (ok, why, output)."""
    opts = b.opts
    gap = opts.get("gap", 2.0)
    deadline = time.monotonic() + opts.get("timeout", 1200.0)
    awaited = [re.compile(r, re.M) for r in opts["await"]]
    ready = [re.compile(r, re.M) for r in opts["ready"]]
    shell = Shell(clone, logdir)
    terms = []
    why = None

    def start(command: str):
        t = Terminal(len(terms), command, logdir)
        terms.append(t)
        t.start(*shell.state(deadline))

    def terminal_output() -> str:
        return "".join(t.output() for t in terms)

    for command in opts["before"]:
        start(command)
        time.sleep(gap)
    for i, line in enumerate(lines):
        if i in serve:
            start(line)
            # The next terminal after a pause; a command typed next waits for `await`.
            if i + 1 in serve or not awaited:
                time.sleep(gap)
            continue
        # A command typed once the terminals are up: wait until they say so.
        while terms and awaited and not all(r.search(terminal_output()) for r in awaited):
            if time.monotonic() > deadline or not any(t.alive() for t in terms):
                missing = [r.pattern for r in awaited if not r.search(terminal_output())]
                why = f"the terminals never printed {missing}"
                break
            time.sleep(0.2)
        if why:
            break
        status = shell.run(line, deadline)
        if status != 0:
            why = f"`{line}` " + ("did not finish within the timeout" if status is None else f"failed (status {status})")
            break
    while why is None:
        text = terminal_output()
        if ready and all(r.search(text) for r in ready):
            break
        if not any(t.alive() for t in terms):
            if ready:
                why = f"the terminals ended before printing {[r.pattern for r in ready if not r.search(text)]}"
            break
        if time.monotonic() > deadline:
            why = f"not ready within the timeout (waiting for {[r.pattern for r in ready if not r.search(text)]})"
            break
        time.sleep(0.2)
    # Ctrl-C on whatever still runs, as a user would; then make sure nothing is left.
    for t in terms:
        if t.alive():
            t.interrupted = True
            t.signal(signal.SIGINT)
    stop_by = time.monotonic() + STOP_GRACE
    while any(t.alive() for t in terms) and time.monotonic() < stop_by:
        time.sleep(0.2)
    for t in terms:
        if t.alive():
            t.signal(signal.SIGKILL)
            why = why or f"`{t.command}` did not stop within {STOP_GRACE:.0f} s of Ctrl-C"
    shell.close()
    out = re.sub(r"\n__doc_test_status_\d+__ \d+\n", "", shell.output())
    for t in terms:
        rc = t.proc.wait()
        # Ended by our Ctrl-C is fine (zenohd's way); any other end but 0 is not.
        if rc != 0 and not (t.interrupted and rc == -signal.SIGINT):
            why = why or f"`{t.command}` ended with status {rc}"
        out += f"\n--- terminal: {t.command} (status {rc})\n{trim(t.output())}"
    if why is None:
        for r in opts["expect"]:
            if not re.search(r, out, re.M):
                why = f"expected output missing: {r!r}"
                break
    if why is None and (m := ALWAYS_FAILS.search(out)):
        why = f"the output shows {m.group(0)!r}"
    return why is None, why, out


def trim(text: str, keep: int = 25) -> str:
    """The first and last `keep` lines of a long output."""
    lines = text.splitlines()
    if len(lines) <= 2 * keep:
        return text
    return "\n".join(lines[:keep] + [f"[... {len(lines) - 2 * keep} lines ...]"] + lines[-keep:]) + "\n"


def run_block(b: Block, clone: Path) -> tuple:
    opts = b.opts
    lines = command_lines(b.text)
    serve = set()
    if "serve" in opts:
        pat = re.compile(opts["serve"])
        serve = {i for i, line in enumerate(lines) if pat.search(line)}
    if opts.get("one-at-a-time"):
        variants = []
        for a in sorted(serve):
            keep = [i for i in range(len(lines)) if i not in serve or i == a]
            variants.append(([lines[i] for i in keep], {k for k, i in enumerate(keep) if i in serve}))
    else:
        variants = [(lines, serve)]
    out_all = ""
    for v, s in variants:
        with tempfile.TemporaryDirectory(prefix="zcs-doc-") as logdir:
            ok, why, out = run_variant(b, clone, v, s, Path(logdir))
        out_all += out
        if not ok:
            return False, why, out_all
    return True, None, out_all


def fresh_clone(repo: Path, into: Path) -> Path:
    clone = into / "clone"
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(repo), str(clone)], check=True)
    target = repo / "target"
    target.mkdir(exist_ok=True)
    (clone / "target").symlink_to(target.resolve())
    return clone


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--keep", action="store_true", help="keep the clone (its path is printed)")
    ap.add_argument("--only", help="run only the blocks of FILE (or the one at FILE:LINE)")
    args = ap.parse_args()
    # Started as a background job of a non-interactive shell (`.ci/run &`), this process
    # inherits SIGINT ignored, and so would every command it starts: zenohd keeps an
    # ignored SIGINT ignored, and Ctrl-C would never stop it. A handler of ours is not
    # inherited across exec, so the commands start with the default action again.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    repo = Path(__file__).resolve().parent.parent
    tmp = Path(tempfile.mkdtemp(prefix="zcs-doc-clone-"))
    clone = fresh_clone(repo, tmp)
    print(f"== documented commands, on a fresh clone of {repo} at {clone}", flush=True)

    blocks = [b for page in PAGES for b in blocks_of(clone, page)]
    errors = [f"{b.where}: a ```{b.lang} block without a doc-test directive" for b in blocks
              if b.lang in ("sh", "bash", "console") and not b.opts]
    ran_lines = {re.sub(r"\s+#.*$", "", ln) for b in blocks if b.opts and "skip" not in b.opts
                 for ln in command_lines(b.text)}
    errors += [f"{f}: `{cmd}` is run by no documented block (paste it into one, verbatim)"
               for f, cmd in example_commands(clone) if cmd not in ran_lines]
    for e in errors:
        print(f"FAILED {e}")

    ran = skipped = failed = 0
    for b in blocks:
        if not b.opts:
            continue
        if args.only and not (b.where == args.only or b.page == args.only):
            continue
        if "skip" in b.opts:
            skipped += 1
            print(f"SKIPPED {b.where}: {b.opts['skip']}", flush=True)
            continue
        t = time.monotonic()
        print(f"-- {b.where}: {' ; '.join(command_lines(b.text))}", flush=True)
        ok, why, out = run_block(b, clone)
        ran += 1
        if ok:
            print(f"ok {b.where} ({time.monotonic() - t:.0f} s)", flush=True)
        else:
            failed += 1
            print(f"FAILED {b.where}: {why}\n{trim(out.strip(), 60)}\n", flush=True)
    if args.keep:
        print(f"clone kept at {clone}")
    else:
        subprocess.run(["rm", "-rf", str(tmp)], check=False)
    failed += len(errors)
    print(f"doc commands: {ran} ran, {skipped} skipped, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
