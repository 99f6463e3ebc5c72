#!/usr/bin/env bash
# Runs the Python fuzz targets (atheris, libFuzzer's engine) of what crosses the network
# into dask-ddp's Python: the results channel's entries and records (tools/fuzz/channel_fuzz.py)
# and the job pages' intake (tools/fuzz/page_intake_fuzz.py), RUNS executions each (default
# 20000, the CI smoke; BENCHMARKS.md "Fuzzing" records the long campaigns). Exit status is
# non-zero on any crash (an exception the contract does not allow).
#
#   tools/fuzz_python.sh [runs]
set -euo pipefail
runs="${1:-20000}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="$root/.venv/bin/python"
out="$root/build/fuzz-python"
mkdir -p "$out"
for target in channel_fuzz page_intake_fuzz; do
  mkdir -p "$out/corpus-$target"
  echo "fuzz_python: $target, $runs runs" >&2
  (cd "$out" && PYTHONPATH="$root/src" "$py" "$root/tools/fuzz/$target.py" \
      -atheris_runs="$runs" -print_final_stats=1 "$out/corpus-$target" 2>&1 \
      | grep -v "^INFO: Instrumenting" | tail -n 12)
done
