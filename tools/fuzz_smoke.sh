#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan+UBSan, coverage-instrumented engine) in their
# own build directory and runs each for a share of N seconds (default 60): the image
# decode+transform target (two thirds, from a seed corpus of real JPEG/PNG files plus
# the checked-in seeds of tools/fuzz_seeds/decode, e.g. a 694-scan progressive JPEG),
# then the store URL parser, the credential JSON parser, the tar shard parser (seeds in
# tools/fuzz_seeds/tar: ustar, GNU and pax shards), the .npy parser (seeds in
# tools/fuzz_seeds/npy: arrays numpy.save wrote) and the host cache's file header (seeds in
# tools/fuzz_seeds/host_cache). Exit status is libFuzzer's: non-zero on
# any crash, sanitizer report, leak or timeout.
#
#   tools/fuzz_smoke.sh [seconds] [build-dir]
#
# A long campaign of one target (FUZZ_RUNS executions, no time limit):
#   FUZZ_RUNS=10000000 FUZZ_TARGETS=decode_fuzz tools/fuzz_smoke.sh
set -euo pipefail

seconds="${1:-60}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${2:-$root/build/fuzz}"
cmake_bin="$root/.venv/bin/cmake"
[ -x "$cmake_bin" ] || cmake_bin="$(command -v cmake)"
py="$root/.venv/bin/python"
[ -x "$py" ] || py="$(command -v python3)"

CC=clang CXX=clang++ "$cmake_bin" -S "$root" -B "$build" -G Ninja \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDDP_FUZZ=ON -DDDP_BUILD_TESTS=OFF -DDDP_BUILD_PYTHON=OFF \
  -DCMAKE_CXX_FLAGS="-fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer" \
  -DCMAKE_C_FLAGS="-fsanitize=fuzzer-no-link,address,undefined" >/dev/null
targets="${FUZZ_TARGETS:-decode_fuzz url_fuzz flat_json_fuzz tar_fuzz npy_fuzz host_cache_fuzz}"
# shellcheck disable=SC2086
"$cmake_bin" --build "$build" -j "${JOBS:-2}" --target $targets

corpus="$build/corpus/decode"
mkdir -p "$corpus"
if [ -z "$(ls -A "$corpus")" ]; then
  # Seeds: small real images of every variant the loader reads (PIL writes them).
  "$py" - "$corpus" <<'PY' || echo "fuzz_smoke: no PIL, starting from an empty corpus" >&2
import io, sys
from PIL import Image
out = sys.argv[1]
img = Image.linear_gradient("L").resize((48, 40)).convert("RGB")
variants = {
    "rgb.jpg": lambda b: img.save(b, "JPEG", quality=80),
    "prog.jpg": lambda b: img.save(b, "JPEG", quality=80, progressive=True),
    "gray.jpg": lambda b: img.convert("L").save(b, "JPEG"),
    "cmyk.jpg": lambda b: img.convert("CMYK").save(b, "JPEG"),
    "444.jpg": lambda b: img.save(b, "JPEG", subsampling=0),
    "rgb.png": lambda b: img.save(b, "PNG"),
    "gray.png": lambda b: img.convert("L").save(b, "PNG"),
    "pal.png": lambda b: img.convert("P").save(b, "PNG"),
    "rgba.png": lambda b: img.convert("RGBA").save(b, "PNG"),
}
for name, save in variants.items():
    buf = io.BytesIO()
    save(buf)
    open(f"{out}/{name}", "wb").write(buf.getvalue())
PY
fi

# Checked-in seeds (crafted inputs PIL cannot write); cp -n keeps what is there.
for t in decode url flat_json tar npy host_cache; do
  mkdir -p "$build/corpus/$t"
  if [ -d "$root/tools/fuzz_seeds/$t" ]; then
    cp -n "$root/tools/fuzz_seeds/$t"/* "$build/corpus/$t"/ || true
  fi
done

# Crash, timeout and slow-unit inputs go to the build directory, not the working one.
mkdir -p "$build/artifacts"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
for t in $targets; do
  name="${t%_fuzz}"
  if [ -n "${FUZZ_RUNS:-}" ]; then
    limit=(-runs="$FUZZ_RUNS")
  elif [ "$t" = decode_fuzz ]; then
    limit=(-max_total_time=$(( seconds * 2 / 3 )))
  else
    limit=(-max_total_time=$(( (seconds + 5) / 6 )))
  fi
  echo "fuzz_smoke: $t ${limit[*]}" >&2
  "$build/$t" "${limit[@]}" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
    -artifact_prefix="$build/artifacts/" -print_final_stats=1 "$build/corpus/$name"
done
