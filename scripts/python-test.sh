#!/usr/bin/env bash
# Builds and installs the Python package (scripts/python-build.sh) and runs its pytest
# suites; arguments go to pytest. `--installed` first skips the build (scripts/test.sh
# built it before the Rust tests). Runs alone too.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --installed ]; then
  shift
else
  ./scripts/python-build.sh
fi
# GPU tests that find no GPU (or no torch) pass after recording "SKIPPED <name>: <reason>",
# printed at the end of pytest's output, as the Rust GPU tests do: scripts/test.sh's
# summary takes them out of the passed count. ZCS_REQUIRE_GPU=1 makes them fail.
# From the repository root with the pytest script (not `python -m pytest`), so that
# `import zenoh_cuda_shm` finds the installed package, not python/zenoh_cuda_shm.
target/py-venv/bin/pytest -q python/tests "$@"
