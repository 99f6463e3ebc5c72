#!/usr/bin/env bash
# Makes the GPU check's bundle (make gpu-bundle): what a bare CUDA machine with Python,
# torch and torchvision lacks to build and test dask-ddp, made here, for its Python:
#   build/gpu-bundle/wheels/   the wheels of tools/gpu/requirements.txt and their
#                              dependencies (--only-binary, manylinux x86-64, the target's
#                              Python), versions pinned to the project environment's
#   build/gpu-bundle/sysroot/  include/ and lib/: the headers and shared libraries of
#                              libcurl, OpenSSL's libcrypto, pugixml, libjpeg-turbo
#                              (turbojpeg and libjpeg) and libspng from this machine's
#                              Debian packages, with every library they load but glibc's;
#                              python-include/: CPython's headers of that version, for a
#                              target whose Python has none
#   build/gpu-bundle/tools/    pip's wheel, which installs the others there
#   build/gpu-bundle/photos/   the seven scikit-image photos tests/images.py crops from
#                              (served by tools/gpu/shim/ where scikit-image is missing)
#   build/gpu-bundle/MANIFEST.txt
# and build/gpu-check.tar.gz: the checkout's tracked files plus the bundle, for a machine
# reached some other way (unpack, then `bash tools/gpu/check.sh OUT_DIR`). The device tool
# ships the checkout itself: carry build/gpu-bundle there (docs/gpu-check.md).
#   tools/gpu/bundle.sh [--python-version 3.12] [--out build/gpu-bundle] [--no-tar]
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
PY=${PY:-$ROOT/.venv/bin/python}
pyver=3.12
out=build/gpu-bundle
tar=1
# What travels to the device machine at most (the checkout and the carried paths together).
LIMIT_MB=64
while [ $# -gt 0 ]; do
  case "$1" in
    --python-version) pyver=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --no-tar) tar=0; shift ;;
    *) echo "bundle: unknown argument $1" >&2; exit 2 ;;
  esac
done
say() { echo "bundle: $*"; }
[ -x "$PY" ] || { echo "bundle: no $PY (run make setup)" >&2; exit 1; }
rm -rf "$out"
mkdir -p "$out"/{wheels,tools,sysroot/include,sysroot/lib,photos}
out=$(cd "$out" && pwd)
t0=$(date +%s)

# ---- wheels ----------------------------------------------------------------------------
# The project environment's versions as constraints, so the GPU machine runs what the tests
# here ran; torch and its CUDA parts are the machine's own and never travel.
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
"$PY" -m pip freeze --exclude-editable 2>/dev/null \
  | grep -E '^[A-Za-z0-9_.-]+==' \
  | grep -viE '^(torch|torchvision|torchaudio|triton|nvidia-|dask-ddp)' >"$constraints" || true
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
  manylinux2014_x86_64 manylinux1_x86_64; do platforms+=(--platform "$p"); done
say "downloading wheels for CPython $pyver (x86-64)"
"$PY" -m pip download -q --disable-pip-version-check --only-binary=:all: \
  --python-version "$pyver" --implementation cp "${platforms[@]}" \
  -c "$constraints" -r tools/gpu/requirements.txt -d "$out/wheels"
# pip itself, run from its wheel on the target (python pip.whl/pip install ...), so the check
# needs neither the machine's pip nor ensurepip.
"$PY" -m pip download -q --disable-pip-version-check --only-binary=:all: --no-deps pip -d "$out/tools"
if ls "$out"/wheels | grep -qiE '^(torch|nvidia_|triton)'; then
  echo "bundle: a torch or CUDA wheel was pulled in; it must not travel" >&2; exit 1
fi

# ---- headers and shared libraries ------------------------------------------------------
# The -dev packages whose headers the engine includes (CMakeLists.txt: CURL, OpenSSL Crypto,
# pugixml, libturbojpeg, libjpeg, spng). Debian keeps some headers under the multiarch
# folder (curl/, jconfig.h, openssl/configuration.h): the tree is kept as it is and both
# folders go on the include path.
dev_packages=(libcurl4-openssl-dev libssl-dev libpugixml-dev libturbojpeg0-dev
  libjpeg62-turbo-dev libspng-dev)
for p in "${dev_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" \
    || { echo "bundle: Debian package $p is missing (make setup installs it)" >&2; exit 1; }
  dpkg -L "$p" | grep -E '^/usr/include/.+\.(h|hpp)$' | while read -r h; do
    dest=$out/sysroot/include/${h#/usr/include/}
    mkdir -p "$(dirname "$dest")" && cp "$h" "$dest"
  done
done
# The libraries linked by name, and everything they load except glibc, the C++ runtime
# and the dynamic loader (every Linux has those; a newer glibc runs these older builds).
link_libs=(libcurl.so libcrypto.so libpugixml.so libturbojpeg.so libjpeg.so libspng.so)
glibc='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libresolv|libutil|libanl|libnsl|libstdc\+\+|libgcc_s)\.so'
declare -A wanted=()
for l in "${link_libs[@]}"; do
  real=$(readlink -f "/usr/lib/x86_64-linux-gnu/$l")
  soname=$(objdump -p "$real" | awk '/SONAME/ {print $2}')
  wanted[$soname]=$real
  ln -sf "$soname" "$out/sysroot/lib/$l"  # what -lNAME finds at link time
  while read -r name path; do
    [[ "$name" =~ $glibc ]] && continue
    wanted[$name]=$(readlink -f "$path")
  done < <(ldd "$real" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}')
done
for soname in "${!wanted[@]}"; do
  cp "${wanted[$soname]}" "$out/sysroot/lib/$soname"
done
strip --strip-unneeded "$out"/sysroot/lib/*.so.* 2>/dev/null || true
# The newest glibc symbol version the carried libraries need: the target's glibc must be
# at least that (check.sh compares).
glibc_need=$(objdump -T "$out"/sysroot/lib/*.so.* 2>/dev/null | grep -oE 'GLIBC_[0-9]+\.[0-9]+' \
  | sort -t. -k2,2n -u | tail -1)

# Python's own headers, for a target whose Python has none (a Python without its -dev
# package): those of a CPython of the same minor version here (pyenv's), used by the build
# only where the target's are missing (a release's patch versions share one ABI).
py_inc=""
for d in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$pyver".*/include/python"$pyver" \
  /usr/include/python"$pyver"; do
  [ -f "$d/Python.h" ] && { py_inc=$d; break; }
done
if [ -n "$py_inc" ]; then
  cp -r "$py_inc" "$out/sysroot/python-include"
else
  say "no CPython $pyver headers here: a target without its own cannot build"
fi

# ---- photos ----------------------------------------------------------------------------
skdata=$("$PY" -c 'import os, skimage; print(os.path.join(os.path.dirname(skimage.__file__), "data"))')
for f in astronaut.png coffee.png chelsea.png rocket.jpg ihc.png hubble_deep_field.jpg retina.jpg; do
  cp "$skdata/$f" "$out/photos/"
done

# ---- manifest and size -----------------------------------------------------------------
{
  echo "dask-ddp GPU check bundle, made $(date -u +%Y-%m-%dT%H:%MZ) from $(git rev-parse --short HEAD)"
  echo "python: cp${pyver/./}"
  echo "glibc_needed: ${glibc_need#GLIBC_}"
  echo "python_headers: ${py_inc:-none}"
  echo "made_on: $(. /etc/os-release && echo "$PRETTY_NAME"), glibc $(ldd --version | head -1 | awk '{print $NF}')"
  echo "wheels:"; ls "$out/wheels" | sed 's/^/  /'
  echo "libraries:"; ls "$out/sysroot/lib" | sed 's/^/  /'
  echo "photos:"; ls "$out/photos" | sed 's/^/  /'
} >"$out/MANIFEST.txt"
bundle_kb=$(du -sk "$out" | cut -f1)
tree_kb=$(git ls-files -z | xargs -0 du -ck 2>/dev/null | tail -1 | cut -f1)
say "$(ls "$out/wheels" | wc -l) wheels ($(du -sh "$out/wheels" | cut -f1)), $(ls "$out/sysroot/lib" | wc -l) libraries ($(du -sh "$out/sysroot/lib" | cut -f1)), headers $(du -sh "$out/sysroot/include" | cut -f1), photos $(du -sh "$out/photos" | cut -f1)"
say "bundle $((bundle_kb / 1024)) MiB + tracked files $((tree_kb / 1024)) MiB = $(((bundle_kb + tree_kb) / 1024)) MiB of the ${LIMIT_MB} MiB that travel"
if [ $((bundle_kb + tree_kb)) -gt $((LIMIT_MB * 1024)) ]; then
  echo "bundle: over the ${LIMIT_MB} MiB the device tool carries" >&2; exit 1
fi

# ---- tarball ---------------------------------------------------------------------------
if [ "$tar" = 1 ]; then
  tarball=$ROOT/build/gpu-check.tar.gz
  rel=$(realpath --relative-to="$ROOT" "$out")
  { git ls-files --cached --others --exclude-standard | while read -r f; do [ -e "$f" ] && echo "$f"; done
    echo "$rel"; } | tar -czf "$tarball" --transform 's,^,dask-ddp/,' -T -
  say "$tarball: $(du -h "$tarball" | cut -f1) (unpack, then: bash dask-ddp/tools/gpu/check.sh OUT_DIR)"
fi
say "done in $(( $(date +%s) - t0 )) s: $out"
