#!/usr/bin/env bash
# Creates or reuses the project's Python environment and installs what it needs.
#
# The environment lives in a cache outside the clone (torch alone is ~5 GB), keyed by
# Python version and machine, and .venv at the repo root links to it. Each step is
# skipped when already done, so CI reuses an environment from an earlier run.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
py_base=${PYTHON:-python3}
arch=$(uname -m)
pyver=$("$py_base" -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')
cache=${DASK_DDP_VENV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dask-ddp}
venv=${DASK_DDP_VENV:-$cache/venv-cp$pyver-$arch}

mkdir -p "$cache"
if [ ! -x "$venv/bin/python" ]; then
  echo "setup_venv: creating $venv" >&2
  "$py_base" -m venv "$venv"
fi
ln -sfn "$venv" "$root/.venv"
py="$venv/bin/python"
pip=("$py" -m pip install --quiet --disable-pip-version-check)

# 1. The pinned torch first: anything that depends on torch installed before it would
#    pull a multi-GB CUDA build from the index. These pins lie on this kind of machine's disk.
if ! "$py" -c 'import torch, torchvision' >/dev/null 2>&1; then
  case "$arch" in
    x86_64) torch_pins=(torch==2.14.1 torchvision==0.29.1) ;;
    aarch64) torch_pins=(torch==2.9.1 torchvision==0.24.1) ;;
    *) torch_pins=(torch torchvision) ;;
  esac
  echo "setup_venv: installing ${torch_pins[*]}" >&2
  "${pip[@]}" "${torch_pins[@]}"
fi

# 2. The package's own dependencies (ranges from pyproject.toml) and the test/dev tools.
#    A stamp holding the hash of pyproject.toml skips this when nothing changed.
stamp="$venv/.dask-ddp-deps-$(sha256sum "$root/pyproject.toml" | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  reqs=$("$py" - "$root/pyproject.toml" <<'PY'
import sys, tomllib
with open(sys.argv[1], "rb") as f:
    p = tomllib.load(f)
deps = list(p["project"]["dependencies"])
for name, extra in p["project"].get("optional-dependencies", {}).items():
    if name != "bench":  # benchmark peers: `make bench-deps`
        deps += extra
deps += p["build-system"]["requires"] + ["cmake>=3.25", "ninja"]
print("\n".join(sorted(set(deps))))
PY
)
  echo "setup_venv: installing dependencies" >&2
  req_file=$(mktemp)
  trap 'rm -f "$req_file"' EXIT
  printf '%s\n' "$reqs" >"$req_file"
  "${pip[@]}" -r "$req_file"
  touch "$stamp"
fi
