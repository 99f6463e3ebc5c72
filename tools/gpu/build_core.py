"""Build the extension ``dask_ddp._core`` for the running Python with g++ alone, in parallel.

For a machine without the project's build environment (the GPU check, tools/gpu/check.sh):
no CMake configure and no pkg-config, the dependencies' headers and libraries from the
bundle's sysroot (tools/gpu/bundle.sh). It compiles what CMakeLists.txt builds into
``_core`` with the same flags: the engine (``cpp/src``, tests and fuzz targets left out) as
a static library, the bindings (``bindings/``) and nanobind's library sources (the list in
nanobind's CMake file), then links the module beside the package's sources.

Objects are kept in the build folder with their header dependencies (``-MMD``); a later run
compiles only what changed.

Usage::

    python tools/gpu/build_core.py --sysroot build/gpu-bundle/sysroot --build /tmp/b \
        [--rpath DIR] [--jobs N]
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import shlex
import subprocess
import sys
import sysconfig
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger("build_core")

ROOT = Path(__file__).resolve().parents[2]
#: The libraries ``ddp_core`` links (CMakeLists.txt), by their link names.
LINK_LIBS = ("curl", "crypto", "pugixml", "turbojpeg", "jpeg", "spng")
#: The nanobind release the bindings are written for (pyproject's build requirements).
NANOBIND_VERSION = "3.1.0"
BASE_FLAGS = ["-std=c++20", "-fPIC", "-O2", "-DNDEBUG"]


@dataclass(frozen=True)
class Unit:
    """One translation unit: its source, its object and the flags it compiles with."""

    source: Path
    obj: Path
    flags: tuple[str, ...]

    def stale(self) -> bool:
        """Whether the object is missing or older than its source or a header it read."""
        dep = self.obj.with_suffix(".d")
        if not self.obj.exists() or not dep.exists():
            return True
        built = self.obj.stat().st_mtime
        text = dep.read_text().replace("\\\n", " ")
        deps = text.split(":", 1)[1].split() if ":" in text else [str(self.source)]
        return any(not os.path.exists(d) or os.path.getmtime(d) > built for d in deps)

    def command(self, cxx: str) -> list[str]:
        return [cxx, *self.flags, "-MMD", "-c", str(self.source), "-o", str(self.obj)]


def nanobind_sources(nb_dir: Path) -> list[Path]:
    """The library sources nanobind's CMake file compiles (free-threading's left out)."""
    text = (nb_dir / "cmake" / "nanobind-config.cmake").read_text()
    body = text[text.index("function (nanobind_build_library"):]
    body = body[: body.index("endfunction")]
    names = re.findall(r"\$\{NB_DIR\}/src/(\w+)\.cpp", body)
    return [nb_dir / "src" / f"{n}.cpp" for n in dict.fromkeys(names) if n != "nb_ft"]


def engine_sources(root: Path) -> list[Path]:
    """``cpp/src``'s library sources, as CMakeLists.txt's glob and filter select them."""
    return sorted(p for p in (root / "cpp" / "src").rglob("*.cc")
                  if not re.search(r"(_test|_fuzz|_testutil)\.cc$", p.name))


def python_include(sysroot: Path) -> str:
    """This Python's header folder, or the bundle's copy of the same version's where this
    Python has none (installed without its development package)."""
    own = Path(sysconfig.get_paths()["include"])
    if (own / "Python.h").exists():
        return str(own)
    carried = sysroot / "python-include"
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    patchlevel = carried / "patchlevel.h"
    if patchlevel.exists() and re.search(rf'PY_VERSION\s+"{re.escape(version)}\.',
                                         patchlevel.read_text()):
        logger.warning("%s has no Python.h: using the bundle's CPython %s headers", own, version)
        return str(carried)
    raise SystemExit(f"build_core: {own}/Python.h is missing (this Python has no development "
                     f"headers) and the bundle holds none of CPython {version}")


def plan(root: Path, sysroot: Path, nb_dir: Path, build: Path) -> dict[str, list[Unit]]:
    """The translation units of the engine, the bindings and nanobind, by group."""
    py_inc = python_include(sysroot)
    deps_inc = ["-I", str(sysroot / "include"), "-I", str(sysroot / "include" / "x86_64-linux-gnu")]
    engine_inc = ["-I", str(root / "cpp" / "include"), "-I", str(root / "cpp" / "src")]
    # nanobind_add_module: hidden visibility and the size-optimised build of the module.
    binding_flags = [*BASE_FLAGS, "-fvisibility=hidden", "-Os", "-ffunction-sections",
                     "-fdata-sections", "-I", py_inc, "-I", str(nb_dir / "include"),
                     *engine_inc, *deps_inc]
    nb_flags = [*BASE_FLAGS, "-DNB_BUILD", "-DNB_COMPACT_ASSERTIONS", "-fvisibility=hidden",
                "-ffunction-sections", "-fdata-sections", "-fno-strict-aliasing",
                "-mtls-dialect=gnu2", "-I", py_inc, "-I", str(nb_dir / "include"),
                "-isystem", str(nb_dir / "ext" / "robin_map" / "include")]

    def units(group: str, sources: list[Path], flags: list[str], base: Path) -> list[Unit]:
        out = []
        for s in sources:
            rel = s.relative_to(base)
            out.append(Unit(s, build / group / rel.with_suffix(".o"), tuple(flags)))
        return out

    return {
        "engine": units("engine", engine_sources(root), [*BASE_FLAGS, *engine_inc, *deps_inc],
                        root / "cpp" / "src"),
        "bindings": units("bindings", sorted((root / "bindings").glob("*.cc")), binding_flags,
                          root / "bindings"),
        "nanobind": units("nanobind", nanobind_sources(nb_dir), nb_flags, nb_dir / "src"),
    }


def compile_all(units: list[Unit], cxx: str, jobs: int) -> None:
    """Compile the stale units, ``jobs`` at a time, largest first (they bound the wall time)."""
    todo = sorted((u for u in units if u.stale()), key=lambda u: -u.source.stat().st_size)
    logger.info("compiling %d of %d units with %d jobs", len(todo), len(units), jobs)

    def run(u: Unit) -> tuple[Unit, subprocess.CompletedProcess[str]]:
        u.obj.parent.mkdir(parents=True, exist_ok=True)
        return u, subprocess.run(u.command(cxx), capture_output=True, text=True)

    failed = []
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for u, proc in pool.map(run, todo):
            if proc.returncode != 0:
                failed.append(u)
                logger.error("%s failed:\n%s\n%s", u.source, shlex.join(u.command(cxx)),
                             proc.stderr[-6000:])
    if failed:
        raise SystemExit(f"build_core: {len(failed)} units failed: "
                         + ", ".join(u.source.name for u in failed))


def link(groups: dict[str, list[Unit]], sysroot: Path, build: Path, out: Path, cxx: str,
         rpath: str | None) -> None:
    """Archive the engine (as CMake's static ddp_core) and link the module."""
    archive = build / "libddp_core.a"
    archive.unlink(missing_ok=True)
    subprocess.run(["ar", "rcs", str(archive), *(str(u.obj) for u in groups["engine"])],
                   check=True)
    lib = sysroot / "lib"
    cmd = [cxx, "-shared", "-Wl,--gc-sections", "-Wl,-s", "-o", str(out),
           *(str(u.obj) for u in groups["bindings"] + groups["nanobind"]), str(archive),
           "-L", str(lib), f"-Wl,-rpath-link,{lib}", *(f"-l{n}" for n in LINK_LIBS), "-pthread"]
    if rpath:
        # DT_RPATH (not RUNPATH) also serves the libraries' own dependencies.
        cmd += ["-Wl,--disable-new-dtags", f"-Wl,-rpath,{rpath}"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"build_core: link failed:\n{shlex.join(cmd)}\n{proc.stderr[-6000:]}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sysroot", type=Path, required=True,
                   help="include/ and lib/ of the dependencies (the bundle's sysroot)")
    p.add_argument("--build", type=Path, required=True, help="folder for objects")
    p.add_argument("--out", type=Path, default=ROOT / "src" / "dask_ddp",
                   help="folder the module is written to (default: the package's sources)")
    p.add_argument("--rpath", help="library folder the module looks in first at run time")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--cxx", default=os.environ.get("CXX", "g++"))
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")

    import nanobind

    if nanobind.__version__ != NANOBIND_VERSION:
        logger.warning("nanobind %s, not the %s the bindings are written for",
                       nanobind.__version__, NANOBIND_VERSION)
    nb_dir = Path(nanobind.__file__).parent
    t0 = time.perf_counter()
    groups = plan(ROOT, args.sysroot.resolve(), nb_dir, args.build.resolve())
    compile_all([u for g in groups.values() for u in g], args.cxx, max(1, args.jobs))
    t1 = time.perf_counter()
    out = args.out / f"_core{sysconfig.get_config_var('EXT_SUFFIX')}"
    link(groups, args.sysroot.resolve(), args.build.resolve(), out, args.cxx, args.rpath)
    logger.info("%s: compiled in %.1f s, linked in %.1f s (%s, nanobind %s, %s)", out,
                t1 - t0, time.perf_counter() - t1, args.cxx, nanobind.__version__,
                sys.version.split()[0])


if __name__ == "__main__":
    main()
