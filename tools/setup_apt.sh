#!/usr/bin/env bash
# Installs the Debian packages dask-ddp builds and tests with, only those missing.
# Idempotent: a machine that has them all runs no apt command at all. Building the package
# from its sdist needs only the first three lines (README "Install").
set -euo pipefail

packages=(
  build-essential pkg-config
  libcurl4-openssl-dev libpugixml-dev            # object stores: HTTP(S)/S3, S3 XML listings
  libturbojpeg0-dev libjpeg62-turbo-dev libspng-dev  # image decode
  libopencv-imgproc-dev libopencv-core-dev      # tests only: our resize vs OpenCV's pixels
  libgtest-dev libgmock-dev libbenchmark-dev    # C++ tests and micro-benchmarks
  clang libclang-rt-14-dev                      # libFuzzer targets
  nginx-light wrk                               # HTTP throughput benchmark
  iproute2 procps
  ccache                                        # compiler cache outside the clone (Makefile)
  chromium                                      # tests only: the job page in a real browser
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "setup_apt: installing ${missing[*]}" >&2
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "setup_apt: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  sudo_cmd=(sudo)
fi
"${sudo_cmd[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
