#!/usr/bin/env bash
# The GPU check (make gpu-check): on a bare CUDA machine with Python, torch, torchvision, g++
# and nothing else of ours, from this checkout and the bundle made by tools/gpu/bundle.sh:
#   env      the machine: GPU, Python, torch, glibc against what the bundle needs
#   install  a virtual environment over the machine's own packages (a .pth adds its site
#            folders, so torch is the machine's) and the bundle's wheels it lacks, by the
#            bundle's pip, offline
#   libs     the bundle's libraries that the machine lacks, linked into one folder
#   build    dask_ddp._core for this Python with g++ (tools/gpu/build_core.py)
#   import   the module loads, every library it needs resolves, a Loader reads a folder
#   photos   the benchmark's JPEGs (8,192 of ~500x375, quality 90, 16 class folders)
#   tests    pytest -m gpu over the test files that mark tests gpu
#   bench    benchmarks/bench_gpu.py (its table goes into the summary)
#   predict  benchmarks/bench_predict.py --gpu, where that script has the flag
#   examples every examples/*.py with its defaults, 4 at a time
#   goals    tools/gpu/verdicts.py: one verdict per goal (thresholds on the benchmarks'
#            figures, the tests, the examples, the check's time) at the top of summary.md
# Each step is timed, its output kept; a failing step does not stop the later ones. On a GPU
# the whole check ends within CHECK_DEADLINE seconds (470): each step's time limit is cut to
# what is left, and the benchmark gets what the others leave. Results go to OUT (at most 8
# files: what the device tool brings back): summary.md, steps.log, env.txt, bench_gpu.json,
# bench_predict.json. Exit status 1 when any step failed or any goal was missed.
#   tools/gpu/check.sh [--cpu] [--bundle DIR] [--python PY] [OUT]   (OUT: $OUT, else build/gpu-check)
# --cpu: a machine without CUDA (the simulation, tools/gpu/simulate.sh): the gpu tests skip,
# the benchmark runs its --quick --device cpu mode, only CPU_EXAMPLES run (train_script.py
# quickstart.py), the thresholds print "not measured (cpu)", and there is no deadline.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
mode=gpu
bundle=${GPU_BUNDLE:-$ROOT/build/gpu-bundle}
python=${PYTHON:-python3}
out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu) mode=cpu; shift ;;
    --bundle) bundle=$2; shift 2 ;;
    --python) python=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 0 ;;
    -*) echo "check: unknown option $1" >&2; exit 2 ;;
    *) out=$1; shift ;;
  esac
done
out=${out:-${OUT:-$ROOT/build/gpu-check}}
mkdir -p "$out" && out=$(cd "$out" && pwd)
bundle=$(cd "$bundle" 2>/dev/null && pwd) || { echo "check: no bundle at $bundle (make gpu-bundle)" >&2; exit 2; }
work=${GPU_CHECK_WORK:-${TMPDIR:-/tmp}/dask-ddp-gpu-check}
mkdir -p "$work/logs"
jobs=${JOBS:-$(nproc)}
venv=$work/venv
vpy=$venv/bin/python
photos=$work/photos
# What the step functions read (each runs in a bash of its own).
export ROOT mode bundle python out work venv vpy
t_start=$(date +%s)
# On a GPU the whole check ends within CHECK_DEADLINE seconds (under the 8 minutes it
# promises, the device tool's machine start not counted); the benchmark gets what the steps
# before it left, less what the steps after it are given (its rounds stop when the next
# would not fit). With --cpu (the rehearsal on 2 cores) there is no deadline.
if [ "$mode" = gpu ]; then deadline=$(( t_start + ${CHECK_DEADLINE:-470} )); else deadline=0; fi
BENCH_BUDGET=${BENCH_BUDGET:-150}
PREDICT_LIMIT=${PREDICT_LIMIT:-80}
EXAMPLES_LIMIT=${EXAMPLES_LIMIT:-150}
export PREDICT_LIMIT EXAMPLES_LIMIT
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
rm -f "$out"/{summary.md,steps.log,env.txt,bench_gpu.json,bench_predict.json}

names=() statuses=() seconds=()
# step NAME TIMEOUT_S COMMAND...: run it with its output in the log, time it, record it.
step() {
  local name=$1 limit=$2; shift 2
  local log=$work/logs/$name.log t0 rc
  t0=$(date +%s.%N)
  echo "check: $name ..."
  if [ "$deadline" -gt 0 ] && [ $(( deadline - $(date +%s) )) -lt "$limit" ]; then
    limit=$(( deadline - $(date +%s) ))
    [ "$limit" -ge 1 ] || limit=1  # past the deadline: the step is stopped at once
  fi
  if declare -F "$1" >/dev/null; then
    # A step written as a function runs in a bash of its own, so that timeout can end it.
    timeout --kill-after=10 "$limit" bash -o pipefail -c "$(declare -f skip_because "$1"); $1" \
      >"$log" 2>&1
  else
    timeout --kill-after=10 "$limit" "$@" >"$log" 2>&1
  fi
  rc=$?
  local dt
  dt=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')
  local status=ok
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then status="TIMEOUT (${limit} s)"
  elif [ $rc -eq 75 ]; then status=skipped
  elif [ $rc -ne 0 ]; then status="FAILED (exit $rc)"; fi
  names+=("$name") statuses+=("$status") seconds+=("$dt")
  { echo "===== $name: $status in $dt s ====="; cat "$log"; echo; } >>"$out/steps.log"
  echo "check: $name: $status in $dt s"
  [ "$status" = ok ] || [ "$status" = skipped ]
}
# skip REASON: a step's way of saying it did not apply (exit 75), the reason in its log.
skip_because() { echo "skipped: $*"; exit 75; }

# ---- env --------------------------------------------------------------------------------
env_step() {
  echo "mode: $mode"
  echo "host: $(cat /proc/sys/kernel/hostname), $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)"
  echo "os: $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME"), kernel $(uname -r)"
  local have need
  have=$(ldd --version 2>/dev/null | head -1 | awk '{print $NF}')
  need=$(awk '/^glibc_needed:/ {print $2}' "$bundle/MANIFEST.txt")
  echo "glibc: $have (the bundle's libraries need $need)"
  echo "compiler: $(g++ --version | head -1)"
  echo "bundle: $(head -1 "$bundle/MANIFEST.txt")"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  "$python" - "$mode" <<'PY'
import sys
import sysconfig
print("python:", sys.executable, sys.version.split()[0], "headers:", sysconfig.get_paths()["include"])
import torch, torchvision
print("torch:", torch.__version__, "cuda", torch.version.cuda, "torchvision", torchvision.__version__)
ok = torch.cuda.is_available()
if ok:
    p = torch.cuda.get_device_properties(0)
    print(f"gpu: {p.name}, {p.total_memory / 2**30:.0f} GiB, {p.multi_processor_count} SMs,"
          f" nccl {'.'.join(map(str, torch.cuda.nccl.version()))}")
if sys.argv[1] == "gpu" and not ok:
    sys.exit("torch.cuda.is_available() is False on a check run without --cpu")
PY
  local rc=$?
  if [ -n "$need" ] && [ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | head -1)" != "$need" ]; then
    echo "glibc $have is older than the $need the bundle's libraries need"; return 1
  fi
  return $rc
}
step env 60 env_step
cp "$work/logs/env.log" "$out/env.txt"

# ---- install ----------------------------------------------------------------------------
install_step() {
  rm -rf "$venv"
  "$python" -m venv --without-pip "$venv" || return 1
  # The machine's site folders, with their own .pth files run (addsitedir), after ours.
  local site
  site=$("$vpy" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  "$python" -c '
import site, sys
dirs = [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
print("\n".join(f"import site; site.addsitedir({d!r})" for d in dirs))
' >"$site/machine_site.pth" || return 1
  echo "machine site folders: $(grep -o "'.*'" "$site/machine_site.pth" | tr '\n' ' ')"
  local pip_whl
  pip_whl=$(ls "$bundle"/tools/pip-*.whl | head -1)
  "$vpy" "$pip_whl/pip" install --no-index --find-links "$bundle/wheels" --no-cache-dir \
    --disable-pip-version-check --no-warn-script-location -r tools/gpu/requirements.txt || return 1
  # scikit-image's photos (tests/images.py crops them): a stand-in reads the bundle's copies
  # where the package is missing.
  if ! "$vpy" -c 'import skimage.data' 2>/dev/null; then
    echo "$ROOT/tools/gpu/shim" >>"$site/machine_site.pth"
    echo "scikit-image is missing: its photos come from $bundle/photos (tools/gpu/shim)"
  fi
  "$vpy" -c 'import torch, dask, distributed, pytest, nanobind
print("in the environment: torch", torch.__version__, "dask", dask.__version__,
      "distributed", distributed.__version__, "pytest", pytest.__version__,
      "nanobind", nanobind.__version__)'
}
step install 120 install_step
export DASK_DDP_GPU_PHOTOS=$bundle/photos
export PATH=$venv/bin:$PATH
export PYTHONPATH=$ROOT/src

# ---- libs, build, import ----------------------------------------------------------------
step libs 30 env -u LD_LIBRARY_PATH "$vpy" tools/gpu/libs.py "$bundle/sysroot/lib" "$work/lib"
export LD_LIBRARY_PATH=$work/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# 15-25 s on the GPU machine's 16 cores; about 4 minutes on the rehearsal's 2, more when
# they are shared.
if [ "$mode" = gpu ]; then build_limit=300; else build_limit=900; fi
step build "$build_limit" "$vpy" tools/gpu/build_core.py --sysroot "$bundle/sysroot" --build "$work/obj" \
  --rpath "$work/lib" --jobs "$jobs"
import_step() {
  local so
  so=$(ls src/dask_ddp/_core*.so 2>/dev/null | head -1)
  [ -n "$so" ] || { echo "no src/dask_ddp/_core*.so"; return 1; }
  echo "ldd $so:"; ldd "$so" | sed 's/^/  /'
  if ldd "$so" | grep -q "not found"; then echo "a library _core needs is not found"; return 1; fi
  "$vpy" - <<'PY'
import tempfile
from pathlib import Path

from PIL import Image

from dask_ddp import _core
from dask_ddp.data import ImageFolder, Loader
from dask_ddp.data import transforms as T

print("imported", _core.__file__)
with tempfile.TemporaryDirectory() as d:
    for c in "ab":
        (Path(d) / c).mkdir()
        for i in range(4):
            Image.new("RGB", (40, 30), (60 * i, 100, 20)).save(Path(d) / c / f"{i}.jpg", quality=90)
    loader = Loader(ImageFolder(d), 4, transform=T.Compose([T.Resize((16, 16)), T.PILToTensor()]),
                    num_threads=2, pin_memory=False)
    shapes = [tuple(x.shape) for x, _ in loader]
    loader.close()
print("a Loader read", shapes)
assert shapes == [(4, 3, 16, 16), (4, 3, 16, 16)], shapes
PY
}
step import 60 import_step

# ---- photos, tests, benchmarks ----------------------------------------------------------
if [ "$mode" = gpu ]; then n_photos=8192; bench_mode=(); else n_photos=256; bench_mode=(--quick --device cpu); fi
step photos 120 "$vpy" benchmarks/bench_gpu.py --make-photos --data "$photos" --images "$n_photos"

tests_step() {
  # Only the files that mark tests gpu: collecting the whole suite would import what the
  # other tests need (moto, boto3, lightning, ...), which this machine need not have.
  local files
  mapfile -t files < <(grep -rlE --include='test_*.py' 'mark\.gpu\b' tests | sort)
  [ ${#files[@]} -gt 0 ] || skip_because "no test file marks tests gpu"
  echo "files: ${files[*]}"
  # Without --cpu this is a GPU machine; with it, CUDA is hidden, so what the run proves is
  # that the gpu tests collect and skip with their reason.
  [ "$mode" = gpu ] || export CUDA_VISIBLE_DEVICES=""
  # The 2-GPU tests (tests/gpu/test_live_nccl.py: a live group on NCCL, a rank a GPU) run
  # where the machine has 2 GPUs; with one they are reported skipped, with their reason.
  if [ "$mode" = gpu ]; then
    echo "GPUs: $("$vpy" -c 'import torch; print(torch.cuda.device_count())') (2 or more: the 2-GPU tests run)"
  fi
  # A file that fails to import (a module this machine lacks) is reported, and fails the
  # step, without keeping the other files' tests from running.
  # The machine's own pytest plugins (its image may hold benchmark, cov, mock, xdist, ...)
  # stay out, as they are not the project's: only pytest-timeout, which pyproject configures.
  PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 "$vpy" -m pytest -p pytest_timeout -m gpu -p no:cacheprovider \
    -q -rs --continue-on-collection-errors "${files[@]}"
}
step tests 240 tests_step

# The benchmark's share: what is left before the deadline, less the predict and examples
# steps' limits; of that, its rounds get all but 50 s (loaders, DataLoader workers and
# models made, its first round's warm-up), at most BENCH_BUDGET, at least 40 s.
if [ "$deadline" -gt 0 ]; then
  bench_limit=$(( deadline - $(date +%s) - PREDICT_LIMIT - EXAMPLES_LIMIT ))
  [ "$bench_limit" -ge 90 ] || bench_limit=90
else
  bench_limit=400
fi
bench_budget=$(( bench_limit - 50 ))
bench_budget=$(( bench_budget > BENCH_BUDGET ? BENCH_BUDGET : (bench_budget < 40 ? 40 : bench_budget) ))
step bench "$bench_limit" "$vpy" benchmarks/bench_gpu.py --data "$photos" --budget "$bench_budget" \
  --json "$out/bench_gpu.json" --markdown "$work/bench_gpu.md" "${bench_mode[@]}"

predict_step() {
  [ "$mode" = gpu ] || skip_because "bench_predict.py --gpu needs CUDA"
  grep -q -- '"--gpu"' benchmarks/bench_predict.py \
    || skip_because "benchmarks/bench_predict.py has no --gpu flag yet"
  # Fewer photos than its default, so that it fits the check's minutes; its own folder.
  local size=()
  grep -q -- '"--gpu-images"' benchmarks/bench_predict.py && size=(--gpu-images 8192)
  grep -q -- '"--photos"' benchmarks/bench_predict.py && size+=(--photos "$work/predict-photos")
  "$vpy" benchmarks/bench_predict.py --gpu "${size[@]}" --json "$out/bench_predict.json"
}
step predict "$PREDICT_LIMIT" predict_step

examples_step() {
  # Each example as a user runs it (python examples/NAME.py, its defaults), in a folder of
  # its own (their outputs are relative paths), EXAMPLE_LANES at a time: each makes its own
  # LocalCluster (the bundle's Dask) and ranks.
  local names=() dir=$work/examples lanes=${EXAMPLE_LANES:-4}
  local each=$(( EXAMPLES_LIMIT - 15 ))
  if [ "$mode" = gpu ]; then
    mapfile -t names < <(grep -l '^if __name__ == "__main__":' examples/*.py | xargs -n1 basename)
  else
    read -ra names <<<"${CPU_EXAMPLES:-train_script.py quickstart.py}"
  fi
  echo "examples: ${names[*]} ($lanes at a time, each stopped at $each s)"
  rm -rf "$dir" && mkdir -p "$dir"
  local name
  for name in "${names[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$lanes" ]; do wait -n; done
    mkdir -p "$dir/${name%.py}"
    (
      cd "$dir/${name%.py}" || exit 1
      t0=$(date +%s)
      timeout --kill-after=10 "$each" "$vpy" "$ROOT/examples/$name" >"$dir/$name.log" 2>&1
      echo "$? $(( $(date +%s) - t0 ))" >"$dir/$name.rc"
    ) &
  done
  wait
  local failed=0 rc secs
  for name in "${names[@]}"; do
    read -r rc secs <"$dir/$name.rc" || { rc=unknown; secs=?; }
    case "$rc" in
      0) echo "example $name: ok in $secs s" ;;
      124|137) echo "example $name: TIMEOUT ($each s)"; failed=1 ;;
      *) echo "example $name: FAILED (exit $rc) in $secs s"; failed=1 ;;
    esac
  done
  for name in "${names[@]}"; do
    read -r rc _ <"$dir/$name.rc" 2>/dev/null || rc=unknown
    [ "$rc" = 0 ] || { echo; echo "--- $name, the end of its output:"; tail -25 "$dir/$name.log"; }
  done
  return $failed
}
step examples "$EXAMPLES_LIMIT" examples_step

# ---- summary ----------------------------------------------------------------------------
total=$(( $(date +%s) - t_start ))
step_args=()
for i in "${!names[@]}"; do step_args+=(--step "${names[$i]}=${statuses[$i]}"); done
goals=$("$vpy" tools/gpu/verdicts.py --mode "$mode" --out "$out" --seconds "$total" \
  "${step_args[@]}" 2>&1)
goals_rc=$?
failed=0
{
  echo "# dask-ddp GPU check"
  echo
  echo "Mode **$mode**, $(date -u +%Y-%m-%dT%H:%MZ), $total s in all."
  echo
  echo "## Goals"
  echo
  echo "$goals"
  echo
  echo '```'
  cat "$out/env.txt"
  echo '```'
  echo
  echo "| step | status | seconds |"
  echo "| --- | --- | ---: |"
  for i in "${!names[@]}"; do
    echo "| ${names[$i]} | ${statuses[$i]} | ${seconds[$i]} |"
    case "${statuses[$i]}" in ok|skipped) ;; *) failed=$((failed + 1)) ;; esac
  done
  echo
  [ -f "$work/bench_gpu.md" ] && { cat "$work/bench_gpu.md"; echo; }
  for i in "${!names[@]}"; do
    case "${statuses[$i]}" in
      ok) ;;
      skipped) echo "- ${names[$i]}: $(grep -m1 '^skipped:' "$work/logs/${names[$i]}.log" || echo skipped)" ;;
      *) echo "## ${names[$i]}: ${statuses[$i]}"; echo; echo '```'
         tail -40 "$work/logs/${names[$i]}.log"; echo '```'; echo ;;
    esac
  done
  echo
  echo "Every step's whole output: steps.log."
} >"$out/summary.md"
echo "$goals"
echo "check: $failed of ${#names[@]} steps failed, goals $([ $goals_rc -eq 0 ] && echo met || echo MISSED), $total s; results in $out"
[ "$failed" -eq 0 ] && [ "$goals_rc" -eq 0 ]
