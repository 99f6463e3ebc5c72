"""Choose, per library, the machine's copy or the bundle's, and link the bundle's chosen ones.

The GPU check's bundle carries the engine's libraries and all they load (tools/gpu/bundle.sh).
A machine's own copy of a library is usually newer and already loaded by its Python (libssl
by the ssl module, libz by zlib), so it is kept wherever it loads; the bundle's copy serves
only where the machine's is missing or cannot load. The chosen ones are linked into one
folder that goes first on the module's run path and ``LD_LIBRARY_PATH``.

Usage (without the bundle's folder on ``LD_LIBRARY_PATH``, so that the test sees the machine)::

    python tools/gpu/libs.py BUNDLE_LIB_DIR DEST_DIR [--all]
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
from pathlib import Path

logger = logging.getLogger("libs")


def loads_here(soname: str) -> bool:
    """Whether the machine's own loader finds and loads ``soname``."""
    try:
        ctypes.CDLL(soname)
    except OSError:
        return False
    return True


def choose(bundle_lib: Path, dest: Path, take_all: bool) -> list[str]:
    """Link into ``dest`` the bundle's libraries the machine lacks (all with ``take_all``);
    returns their names."""
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.iterdir():
        old.unlink()
    taken, kept = [], []
    for lib in sorted(p for p in bundle_lib.iterdir() if ".so." in p.name and not p.is_symlink()):
        if not take_all and loads_here(lib.name):
            kept.append(lib.name)
            continue
        os.symlink(lib.resolve(), dest / lib.name)
        taken.append(lib.name)
    logger.info("from the bundle (%d): %s", len(taken), " ".join(taken) or "none")
    logger.info("the machine's own (%d): %s", len(kept), " ".join(kept) or "none")
    return taken


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("bundle_lib", type=Path)
    p.add_argument("dest", type=Path)
    p.add_argument("--all", action="store_true", help="take every library from the bundle")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    if os.environ.get("LD_LIBRARY_PATH"):
        logger.warning("LD_LIBRARY_PATH is set (%s): what loads here may not be the machine's",
                       os.environ["LD_LIBRARY_PATH"])
    choose(args.bundle_lib, args.dest, args.all)


if __name__ == "__main__":
    main()
