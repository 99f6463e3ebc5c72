"""Rank work directories (``$TMPDIR/dask-ddp-*``): made by the supervisor, never left behind.

The supervisor removes its rank's directory when the rank ends. A worker killed outright
cannot, so each directory names its owner (the worker process's pid and start time) and
any dask-ddp worker on the host removes directories whose owner is gone: when its
supervisor starts a rank, and when the worker (re)joins the cluster (a worker plugin the
launcher installs, so a nanny's restart of a killed worker cleans up after it).
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import logging
import os
import shutil
import tempfile
import time
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

from dask_ddp.data.table import host_cache

logger = logging.getLogger(__name__)

PREFIX = "dask-ddp-"
_OWNER = ".owner"
#: Start times of one process differ by less than this between reads.
_SAME_START_S = 0.05
#: How long a closing worker lets its supervisors remove their own directories (its
#: nanny kills it a few seconds into its close).
TEARDOWN_WAIT_S = 2.5


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


def _owner(path: str) -> tuple[int, float] | None:
    try:
        with open(os.path.join(path, _OWNER)) as f:
            pid_text, start_text = f.read().split()
        return int(pid_text), float(start_text)
    except (OSError, ValueError):
        return None  # not ours, or being created


def _orphaned(path: str) -> bool:
    owner = _owner(path)
    if owner is None:
        return False  # leave it
    pid, recorded = owner
    start = _start_time(pid)
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


def own_workdirs(root: str | None = None) -> list[str]:
    """The work directories under ``root`` (default the temp dir) this process made."""
    me = os.getpid()
    return [path for path in glob.glob(os.path.join(root or tempfile.gettempdir(), PREFIX + "*"))
            if (owner := _owner(path)) is not None and owner[0] == me]


class WorkdirCleaner(WorkerPlugin):
    """Removes the work dirs of dead workers when a worker joins, and its own when it
    closes (see the module)."""

    name = "dask-ddp-workdir-cleaner"
    idempotent = True

    def setup(self, worker: Any) -> None:
        clean_orphans()

    async def teardown(self, worker: Any) -> None:
        """A closing worker (retired, scaled down) exits before the task threads of its
        supervisors end: their rank's directories would stay until another worker of the
        host starts. Each supervisor removes its own as its rank ends; what is left after
        :data:`TEARDOWN_WAIT_S` is removed here."""
        deadline = time.monotonic() + TEARDOWN_WAIT_S
        while own_workdirs() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for path in own_workdirs():
            remove_workdir(path)
            logger.info("removed the work dir %s of a rank of this closing worker", path)


def install_cleaner(client: Any) -> None:
    """Have every worker, present and future, clean up after dead ones (idempotent)."""
    client.register_plugin(WorkdirCleaner())
