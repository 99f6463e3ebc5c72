"""``python -m dask_ddp``: the ``dask-ddp`` command."""

from __future__ import annotations

import sys

from dask_ddp.cli import main

if __name__ == "__main__":
    sys.exit(main())
