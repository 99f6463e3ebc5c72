#!/usr/bin/env bash
# The GPU check rehearsed on this CPU machine (make gpu-check-sim), as close to the bare GPU
# machine as a CPU allows:
#   - a bundle for this machine's Python (tools/gpu/bundle.sh --python-version of .venv's);
#   - a copy of what the device tool ships (tracked and untracked-not-ignored files) in a
#     scratch folder outside the checkout, the bundle in its build/gpu-bundle;
#   - the "machine's Python": a virtual environment holding only torch, torchvision and what
#     they need (linked from the project environment), as the GPU machine's holds torch and
#     no Dask, pytest or nanobind of ours;
#   - in a mount namespace (unshare -m, as root), the system's libcurl, libturbojpeg, libjpeg,
#     libspng and pugixml libraries, all the engine's dependency headers and Python's own
#     headers hidden (bind mounts of /dev/null and an empty folder), so the build and the
#     module can only use the bundle's; without root or unshare this is skipped with the
#     reason;
#   - there, tools/gpu/check.sh --cpu (the gpu tests skip, the benchmark runs --quick on the
#     CPU), results in build/gpu-sim/out.
#   tools/gpu/simulate.sh [--keep-work]   (--keep-work: reuse the compiled objects of a last run)
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
PY=$ROOT/.venv/bin/python
sim=${GPU_SIM_DIR:-${TMPDIR:-/tmp}/dask-ddp-gpu-sim}
results=$ROOT/build/gpu-sim/out
say() { echo "simulate: $*"; }
keep=0
[ "${1:-}" = --keep-work ] && keep=1

pyver=$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
say "bundle for CPython $pyver"
bash tools/gpu/bundle.sh --python-version "$pyver" --out build/gpu-sim/bundle --no-tar

# The shipped copy, fresh each time (objects of a last build kept with --keep-work).
[ "$keep" = 1 ] || rm -rf "$sim/work"
rm -rf "$sim/repo" "$sim/machine"
mkdir -p "$sim/repo/build"
git ls-files -z --cached --others --exclude-standard \
  | xargs -0 -I{} sh -c '[ -e "{}" ] && printf "%s\0" "{}"' \
  | tar -c --null -T - | tar -x -C "$sim/repo"
cp -r build/gpu-sim/bundle "$sim/repo/build/gpu-bundle"

# The machine's Python: torch and its needs only, in a venv as the GPU machine's python3 is.
base=$("$PY" -c 'import sys; print(sys._base_executable)')
"$base" -m venv --without-pip "$sim/machine"
"$PY" - "$sim/machine" <<'PY'
import os
import sys
import sysconfig
from importlib.metadata import PackageNotFoundError, distribution

dest = os.path.join(sys.argv[1], "lib", f"python{sys.version_info[0]}.{sys.version_info[1]}",
                    "site-packages")
src = sysconfig.get_paths()["purelib"]
# torch and what it needs; pandas and pyarrow too, which the GPU machine's image holds
# (tests of tables import dask.dataframe). Not scikit-image, which it also holds: here the
# stand-in for its photos (tools/gpu/shim) is tried.
wanted = ["torch", "torchvision", "numpy", "pillow", "sympy", "mpmath", "networkx", "jinja2",
          "markupsafe", "fsspec", "filelock", "typing_extensions", "pandas", "pyarrow",
          "python-dateutil", "six", "pytz", "tzdata"]
linked = set()
for name in wanted:
    try:
        files = distribution(name).files or ()
    except PackageNotFoundError:
        continue
    for f in files:
        top = f.parts[0]
        if top not in linked and top != ".." and os.path.exists(os.path.join(src, top)):
            os.symlink(os.path.join(src, top), os.path.join(dest, top))
            linked.add(top)
print(f"simulate: the machine's Python holds {len(linked)} entries of {', '.join(wanted)}")
PY

# What to hide: the engine's dependency headers and the libraries the bundle carries that
# the machine's Python does not load by itself (libssl/libcrypto stay: its ssl module uses
# them, as on the GPU machine).
hide_files=()
for h in /usr/include/pugixml.hpp /usr/include/pugiconfig.hpp /usr/include/turbojpeg.h \
  /usr/include/jpeglib.h /usr/include/jerror.h /usr/include/jmorecfg.h /usr/include/jpegint.h \
  /usr/include/x86_64-linux-gnu/jconfig.h /usr/include/spng.h; do
  [ -e "$h" ] && hide_files+=("$h")
done
for l in libcurl libturbojpeg libjpeg libspng libpugixml; do
  for f in /usr/lib/x86_64-linux-gnu/"$l".so*; do [ -e "$f" ] && hide_files+=("$(readlink -f "$f")"); done
done
mapfile -t hide_files < <(printf '%s\n' "${hide_files[@]}" | sort -u)
# Python's own headers too, as on a machine whose Python came without its -dev package: the
# build then takes the bundle's copy.
py_include=$("$base" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
hide_dirs=()
for d in /usr/include/x86_64-linux-gnu/curl /usr/include/openssl /usr/include/x86_64-linux-gnu/openssl \
  "$py_include"; do
  [ -d "$d" ] && hide_dirs+=("$d")
done

rm -rf "$results" && mkdir -p "$results"
check=(env -u PYTHONPATH -u LD_LIBRARY_PATH GPU_CHECK_WORK="$sim/work" JOBS=2
  PYTHON="$sim/machine/bin/python" bash "$sim/repo/tools/gpu/check.sh" --cpu "$results")
rc=0
if [ "$(id -u)" -ne 0 ] || ! unshare -m true 2>/dev/null; then
  say "SKIP hiding the system libraries and headers: needs root and unshare -m"
  "${check[@]}" || rc=$?
else
  say "hiding ${#hide_files[@]} files and ${#hide_dirs[@]} folders: ${hide_files[*]} ${hide_dirs[*]}"
  empty=$(mktemp -d)
  unshare -m --propagation private bash -c '
    set -e
    empty=$1; nf=$2; shift 2
    for ((i = 0; i < nf; i++)); do mount --bind /dev/null "$1"; shift; done
    nd=$1; shift
    for ((i = 0; i < nd; i++)); do mount --bind "$empty" "$1"; shift; done
    if echo "#include <curl/curl.h>" | g++ -x c++ -fsyntax-only - 2>/dev/null; then
      echo "simulate: curl/curl.h still compiles: hiding did not work" >&2; exit 1
    fi
    if python3 -c "import ctypes; ctypes.CDLL(\"libturbojpeg.so.0\")" 2>/dev/null; then
      echo "simulate: libturbojpeg.so.0 still loads: hiding did not work" >&2; exit 1
    fi
    echo "simulate: hidden (curl/curl.h does not compile, libturbojpeg.so.0 does not load)"
    "$@"
  ' _ "$empty" "${#hide_files[@]}" "${hide_files[@]}" "${#hide_dirs[@]}" "${hide_dirs[@]}" \
    "${check[@]}" || rc=$?
  rmdir "$empty"
fi
say "check.sh exited $rc; results in $results:"
ls -la "$results"
exit $rc
