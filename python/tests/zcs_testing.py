"""Shared by the tests and the peer processes they start: Zenoh configurations on
loopback TCP, the GPU gate, and starting a peer process."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
IO_TIMEOUT = 30.0
REQUIRE_GPU_ENV = "ZCS_REQUIRE_GPU"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def zenoh_config(listen: Optional[int] = None, connect: Optional[int] = None,
                 block_prefix: Optional[str] = None) -> Dict[str, Any]:
    """Peer mode, no multicast scouting, TCP on 127.0.0.1 only (the Rust tests' loopback
    configuration); puts under `block_prefix` block instead of dropping when a queue is
    full, so that tests counting every message measure the library."""
    c: Dict[str, Any] = {
        "mode": "peer",
        "scouting": {"multicast": {"enabled": False}},
        "listen": {"endpoints": [f"tcp/127.0.0.1:{listen or 0}"]},
    }
    if connect is not None:
        c["connect"] = {"endpoints": [f"tcp/127.0.0.1:{connect}"]}
    if block_prefix is not None:
        c["qos"] = {"publication": [{
            "key_exprs": [f"{block_prefix}/**", f"{block_prefix}/**/@zcs/**"],
            "config": {"congestion_control": "block"},
        }]}
    return c


def gpu_required() -> bool:
    v = os.environ.get(REQUIRE_GPU_ENV, "")
    return v not in ("", "0")


class Peer:
    """A peer Python process running `peer.py <role> <args…>` (or another script of this
    folder). It exits when its stdin gets a line; `expect` reads what it prints."""

    def __init__(self, role: str, *args: Any, script: str = "peer.py", env: Optional[Dict[str, str]] = None,
                 cwd: Optional[str] = None) -> None:
        e = dict(os.environ)
        e["PYTHONPATH"] = HERE + os.pathsep + e.get("PYTHONPATH", "")
        e.update(env or {})
        # Started outside the source tree, so `import zenoh_cuda_shm` finds the installed
        # package, not the sources (which lack the native module).
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, script), role, *[str(a) for a in args]],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            cwd=cwd or tempfile.gettempdir(), env=e,
        )
        self.lines: List[str] = []

    def expect(self, word: str, timeout: float = IO_TIMEOUT) -> str:
        """Waits for a stdout line starting with `word` and returns it."""
        import select
        import time
        end = time.monotonic() + timeout
        assert self.proc.stdout is not None
        while time.monotonic() < end:
            r, _, _ = select.select([self.proc.stdout], [], [], max(0.0, end - time.monotonic()))
            if not r:
                break
            line = self.proc.stdout.readline()
            if not line:
                break
            self.lines.append(line.rstrip("\n"))
            if line.startswith(word):
                return line.rstrip("\n")
        raise AssertionError(f"peer never printed {word!r}; said {self.lines!r}; {self._fail_text()}")

    def _fail_text(self) -> str:
        if self.proc.poll() is None:
            return "still running"
        err = self.proc.stderr.read() if self.proc.stderr else ""
        return f"exited with {self.proc.returncode}, stderr:\n{err}"

    def finish(self, timeout: float = IO_TIMEOUT) -> str:
        """Tells the peer to stop and checks that it exited successfully; returns its
        remaining output."""
        try:
            out, err = self.proc.communicate("done\n", timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
            raise AssertionError(f"peer did not exit within {timeout} s; stderr:\n{err}")
        assert self.proc.returncode == 0, f"peer exited with {self.proc.returncode}; stderr:\n{err}"
        return out

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


# ---------------------------------------------------------------------------------
# The GPU gate
# ---------------------------------------------------------------------------------

#: `SKIPPED <name>: <reason>` lines, printed at the end of the pytest run (conftest.py).
SKIPPED_LINES: List[str] = []


def gpu_or_skip(name: str) -> Optional[Any]:
    """`torch` if it imports and sees a CUDA device, else `None` after recording
    `SKIPPED <name>: <reason>` (the test then returns early, as the Rust GPU tests do);
    with ZCS_REQUIRE_GPU=1 a missing GPU fails the test instead."""
    try:
        import torch
        reason = None if torch.cuda.is_available() else "torch.cuda.is_available() is False"
    except Exception as e:  # ImportError, or a broken install
        torch, reason = None, f"torch not importable ({type(e).__name__}: {e})"
    if reason is None:
        return torch
    if gpu_required():
        raise AssertionError(f"{name}: {REQUIRE_GPU_ENV} is set but there is no usable GPU: {reason}")
    SKIPPED_LINES.append(f"SKIPPED {name}: {reason}")
    return None


def module_or_skip(name: str, module: str) -> Optional[Any]:
    """An optional framework (CuPy, JAX): its module, or `None` after recording a SKIPPED
    line (a missing framework is not a missing GPU, so it never fails the run)."""
    import importlib
    try:
        return importlib.import_module(module)
    except Exception as e:
        SKIPPED_LINES.append(f"SKIPPED {name}: {module} not importable ({type(e).__name__}: {e})")
        return None
