#!/usr/bin/env bash
# Builds the Python package (python/) with maturin into a wheel, installs it into a
# virtual environment under target/ and runs its pytest suites. Called by
# scripts/test.sh; runs alone too. The wheel is built with the dev profile into the
# workspace's target dir, so after `cargo test --workspace` only the binding crate and
# PyO3 are compiled. PYTHON picks the interpreter that makes the venv (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/py-venv
if [ ! -x "$venv/bin/python" ]; then
  "${PYTHON:-python3}" -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check "maturin>=1.9.4,<2" "numpy>=1.25" "pytest>=7"
rm -rf target/wheels/py
"$venv/bin/maturin" build --profile dev --locked -m python/Cargo.toml -i "$venv/bin/python" -o target/wheels/py
"$venv/bin/python" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps target/wheels/py/*.whl
# GPU tests that find no GPU (or no torch) pass after recording "SKIPPED <name>: <reason>",
# printed at the end of pytest's output, as the Rust GPU tests do: scripts/test.sh's
# summary takes them out of the passed count. ZCS_REQUIRE_GPU=1 makes them fail.
# From the repository root with the pytest script (not `python -m pytest`), so that
# `import zenoh_cuda_shm` finds the installed package, not python/zenoh_cuda_shm.
"$venv/bin/pytest" -q python/tests "$@"
