#!/usr/bin/env bash
# CI check of the self-contained wheel (make wheel), installed as a user would:
# 1. a fresh virtual environment with the wheel installed --no-deps; its dependencies
#    (torch, dask, numpy, pillow) come from the project environment through a .pth file
#    naming that environment's site-packages (torch is large and pinned: not reinstalled;
#    a .pth adds the directory without running the .pth files in it, so the project's
#    development link to src/ is not followed and dask_ddp can only come from the wheel);
# 2. a mount namespace (unshare -m, as root) in which every system copy of a library the
#    wheel bundles is /dev/null (bind mounts), except those the Python environment loads
#    without dask_ddp (e.g. libssl for the ssl module): those are listed and kept;
# 3. there, a check that a hidden library really fails to load, then tools/check_wheel.py:
#    import, a file store and a memory store, a Loader over a small folder, and every
#    library _core needs resolving into the wheel or to the manylinux baseline.
# Without root or unshare, step 2 is skipped with the reason and step 3 still runs.
#   tools/check_wheel.sh [WHEEL]     (default: the wheel in dist/)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PY:-$ROOT/.venv/bin/python}
wheel=${1:-$(ls -t dist/dask_ddp-*manylinux*.whl 2>/dev/null | head -1)}
[ -n "$wheel" ] && [ -f "$wheel" ] || { echo "check_wheel: no wheel in dist/ (run make wheel)" >&2; exit 1; }
wheel=$(readlink -f "$wheel")
say() { echo "check_wheel: $*"; }

venv=$ROOT/build/wheel/venv
rm -rf "$venv"
"$PY" -m venv --without-pip "$venv"
"$PY" -m pip --python "$venv/bin/python" install -q --no-deps --no-cache-dir "$wheel"
env_site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
venv_site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$env_site" > "$venv_site/project_env.pth"
say "installed $(basename "$wheel") into $venv (dependencies from $env_site)"

libs_dir=$venv_site/dask_ddp.libs
[ -d "$libs_dir" ] || { say "no dask_ddp.libs in the wheel: not repaired?" >&2; exit 1; }

# System libraries the Python environment itself loads (the ssl and ctypes modules, torch,
# numpy, pillow, distributed), without dask_ddp: hiding those would break Python, not test us.
env_loads=$("$venv/bin/python" -c '
import ctypes, hashlib, ssl, numpy, torch, PIL.Image, dask, distributed
print("\n".join(sorted({l.split()[-1] for l in open("/proc/self/maps") if ".so" in l.split()[-1]})))
' | grep -v site-packages | xargs -r -n1 basename)

hide=()
kept=()
for f in "$libs_dir"/*; do
  name=$(basename "$f")
  # libcurl-1a2b3c4d.so.4.8.0 -> libcurl, libldap-2-1a2b3c4d.5.so.0 -> libldap-2.5
  plain=$(sed -E 's/-[0-9a-f]{8}\././' <<<"$name")
  stem=${plain%%.so*}
  if grep -qx "$stem\.so.*" <<<"$env_loads"; then
    kept+=("$stem")
    continue
  fi
  for d in /usr/lib/x86_64-linux-gnu /lib/x86_64-linux-gnu /usr/lib /usr/local/lib; do
    for sys_lib in "$d/$stem".so*; do
      [ -e "$sys_lib" ] && hide+=("$(readlink -f "$sys_lib")")
    done
  done
done
mapfile -t hide < <(printf '%s\n' "${hide[@]}" | sort -u)
say "bundled: $(ls "$libs_dir" | tr '\n' ' ')"
say "kept visible (the Python environment loads them itself): ${kept[*]:-none}"

check=("$venv/bin/python" "$ROOT/tools/check_wheel.py" --expect-under "$venv" --bundled-only)
run_dir=$(mktemp -d)
trap 'rm -rf "$run_dir"' EXIT
if [ "$(id -u)" -ne 0 ]; then
  say "SKIP hiding the system libraries: needs root for unshare -m and bind mounts (uid $(id -u))"
  (cd "$run_dir" && "${check[@]}")
elif [ ${#hide[@]} -eq 0 ]; then
  say "no system copy of a bundled library to hide"
  (cd "$run_dir" && "${check[@]}")
elif ! unshare -m true 2>/dev/null; then
  say "SKIP hiding the system libraries: unshare -m is not permitted here (container without CAP_SYS_ADMIN?)"
  (cd "$run_dir" && "${check[@]}")
else
  say "hiding ${#hide[@]} system files: ${hide[*]}"
  probe=${hide[0]}
  # The namespace's mounts are private: nothing is hidden outside it.
  RUN_DIR=$run_dir unshare -m --propagation private bash -euo pipefail -c '
    probe=$1; shift; n=$1; shift
    for ((i = 0; i < n; i++)); do mount --bind /dev/null "$1"; shift; done
    if "$1" -c "import ctypes, sys; ctypes.CDLL(sys.argv[1])" "$probe" 2>/dev/null; then
      echo "check_wheel: $probe still loads: hiding did not work" >&2; exit 1
    fi
    echo "check_wheel: hidden ($probe no longer loads)"
    cd "$RUN_DIR" && "$@"
  ' _ "$probe" "${#hide[@]}" "${hide[@]}" "${check[@]}"
fi
say "ok: $(basename "$wheel") ($(du -k "$wheel" | cut -f1) kB)"
