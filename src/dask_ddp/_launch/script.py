"""``python -m dask_ddp._launch.script SCRIPT ARGS...``: a rank running a Python script
(``run_command``, ``dask-ddp run``), watched as a function's rank is (internal).

Installs the rank's probe (its collective state and live stacks, see
:mod:`dask_ddp._launch.probe`) in the work directory the supervisor passes in
``DASK_DDP_WORKDIR``, then runs the script as ``python SCRIPT ARGS...`` would: as
``__main__``, with its own folder first on ``sys.path`` and ``sys.argv`` its arguments.
"""

from __future__ import annotations

import logging
import os
import runpy
import sys

logger = logging.getLogger(__name__)


def main(argv: list[str]) -> None:
    if not argv:
        sys.stderr.write("usage: python -m dask_ddp._launch.script SCRIPT [ARGS...] "
                         "(started by dask-ddp)\n")
        sys.exit(2)
    workdir = os.environ.get("DASK_DDP_WORKDIR")
    if workdir:
        from dask_ddp._launch import probe

        try:
            probe.install(workdir)
        except Exception as exc:  # the script runs anyway, unwatched
            sys.stderr.write(f"dask-ddp: the rank's probe is not installed: {exc}\n")
    script = os.path.abspath(argv[0])
    sys.argv = list(argv)
    sys.path[0] = os.path.dirname(script)
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
