#!/usr/bin/env bash
# Builds the report of one benchmark run (the folder `scripts/gpu-run.sh` wrote: one
# `<program>.jsonl` per benchmark, and machine.txt): report.md, latency.png,
# throughput.png and run.json, into <out-folder> (default: <run-folder>/report).
#   scripts/bench-report.sh gpu-out [report-dir] [--font file.ttf]
# Built with the release profile (ZCS_REPORT_PROFILE=dev for a quicker first build).
set -euo pipefail
if [ $# -lt 1 ]; then
  echo "usage: $0 <run-folder> [<out-folder>] [--font <file.ttf>]" >&2
  exit 2
fi
root=$(cd "$(dirname "$0")/.." && pwd)
cargo run -q --manifest-path "$root/Cargo.toml" --profile "${ZCS_REPORT_PROFILE:-release}" --locked \
  -p zcs-bench --bin zcs_report -- "$@"
