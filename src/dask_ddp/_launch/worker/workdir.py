"""Rank work directories (``$TMPDIR/dask-ddp-*``): made by the supervisor, never left behind.

The supervisor removes its rank's directory when the rank ends. A worker killed outright
cannot, so each directory names its owner (the worker process's pid and start time) and
any dask-ddp worker on the host removes directories whose owner is gone: when its
supervisor starts a rank, and when the worker (re)joins the cluster (a worker plugin the
launcher installs, so a nanny's restart of a killed worker cleans up after it).
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import shutil
import tempfile
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

from dask_ddp._launch.wire.entry_points import WORKDIR_CLEANER
from dask_ddp.data.table import host_cache

logger = logging.getLogger(__name__)

PREFIX = "dask-ddp-"
_OWNER = ".owner"
#: Start times of one process differ by less than this between reads.
_SAME_START_S = 0.05


def _start_time(pid: int) -> float | None:
    import psutil

    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError):
        return None


def create_workdir(job_id: str, rank: int) -> str:
    """A fresh work directory for rank ``rank`` of ``job_id``, owned by this process."""
    path = tempfile.mkdtemp(prefix=f"{PREFIX}{job_id[:8]}-r{rank}-")
    with open(os.path.join(path, _OWNER), "w") as f:
        f.write(f"{os.getpid()} {_start_time(os.getpid())}\n")
    return path


def remove_workdir(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)
    # A rank's end (killed, say) may leave its host's table cache with no live rank.
    host_cache.clean_orphans()


def _orphaned(path: str) -> bool:
    try:
        with open(os.path.join(path, _OWNER)) as f:
            pid_text, start_text = f.read().split()
    except (OSError, ValueError):
        return False  # not ours, or being created: leave it
    try:
        recorded = float(start_text)
    except ValueError:
        return False
    start = _start_time(int(pid_text))
    # The same process's start time reads differently in its last digits from one read to
    # the next (psutil derives it from the boot time and clock ticks); another process
    # with the same pid started at least a tick later.
    return start is None or abs(start - recorded) > _SAME_START_S


def clean_orphans(root: str | None = None) -> list[str]:
    """Remove the work directories under ``root`` (default the temp dir) whose owner died."""
    removed = []
    for path in glob.glob(os.path.join(root or tempfile.gettempdir(), PREFIX + "*")):
        with contextlib.suppress(OSError):
            if os.path.isdir(path) and _orphaned(path):
                remove_workdir(path)
                removed.append(path)
    if removed:
        logger.info("removed %d work dirs of dead dask-ddp workers: %s", len(removed),
                    ", ".join(removed))
    host_cache.clean_orphans()  # and the table caches of dead ranks
    return removed


class WorkdirCleaner(WorkerPlugin):
    """Removes the work dirs of dead workers when a worker joins (see the module)."""

    name = WORKDIR_CLEANER.name
    idempotent = True

    def setup(self, worker: Any) -> None:
        clean_orphans()
