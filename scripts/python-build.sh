#!/usr/bin/env bash
# Builds the Python package (python/) with maturin into a wheel and installs it into a
# virtual environment under target/ (target/py-venv), with NumPy and pytest beside it.
# The wheel is built with the dev profile into the workspace's target dir, so after
# `cargo test --workspace --no-run` only the binding crate and PyO3 are compiled.
# PYTHON picks the interpreter that makes the venv (default python3).
# Called by scripts/python-test.sh, and by scripts/test.sh before the Rust tests (the
# C ABI's tests run the Python examples against this build, not an older one).
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
