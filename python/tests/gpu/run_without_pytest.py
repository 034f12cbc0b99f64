#!/usr/bin/env python3
"""Runs the GPU tests of test_gpu.py and test_gpu_ros2.py where pytest is not installed (the GPU machine has
no network): each test gets a free port and a fresh key, as the pytest fixtures give.
Prints `PASSED <test>` / `FAILED <test>`, the SKIPPED lines, then `N passed, N failed`."""

import os
import sys
import traceback
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]

import test_gpu  # noqa: E402
import test_gpu_ros2  # noqa: E402
import zcs_testing  # noqa: E402


def main() -> int:
    passed = failed = 0
    tests = [(m, n) for m in (test_gpu, test_gpu_ros2) for n in sorted(dir(m)) if n.startswith("test_")]
    for module, name in tests:
        try:
            getattr(module, name)(zcs_testing.free_port(), f"zcspy{uuid.uuid4().hex[:12]}/t")
        except Exception:
            traceback.print_exc()
            print(f"FAILED {name}", flush=True)
            failed += 1
        else:
            print(f"PASSED {name}", flush=True)
            passed += 1
    for line in zcs_testing.SKIPPED_LINES:
        print(line)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
