"""One cache of a table's partitions per host (internal).

The ranks of a job on one host share a directory of a memory file system
(``/dev/shm/dask-ddp-tables-<job id>``; ``DASK_DDP_TABLE_CACHE_ROOT`` names another
root): a partition's records are one file there (the engine's ``table/host_cache``: a
header then the records, written under a temporary name then linked, mode 0600), which
every local rank maps read-only. The first local rank to need a partition takes its lock
(``flock``, released by the kernel if that rank dies), reads it from its source and
writes the file; the others wait for the lock, then map the file (or, the holder having
died without writing it, read it themselves). So a host reads each partition once per
run, and holds it once whatever the number of local ranks.

The directory goes with the job: each rank registers itself in it (``users/``, its pid
and start time); a rank's loader leaving removes its entry and the directory when no
registered rank lives; the supervisor of a rank that ended (killed, say) and the work-dir
cleaner of a dask-ddp worker remove every such directory whose ranks are all gone
(:func:`clean_orphans`).
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import logging
import os
import secrets
import shutil
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from dask_ddp.data.table.columns import Column
    from dask_ddp.data.table.table import Table

__all__ = ["HostCache", "clean_orphans", "host_root"]

#: Partition lock files held by a HostCache of this process: another Loader of the same
#: process never waits on one (the holder's iteration may be abandoned, never to finish).
_HELD_HERE: set[str] = set()

logger = logging.getLogger(__name__)

PREFIX = "dask-ddp-tables-"
ROOT_ENV = "DASK_DDP_TABLE_CACHE_ROOT"
_DEFAULT_ROOT = "/dev/shm"  # Linux's memory file system, present on every distribution
_USERS = "users"
_LOCK = ".lock"
#: Bytes of a file's header (the engine's kHostCacheHeaderBytes).
HEADER = 64
#: The room /dev/shm must have beyond the table's files (other users of it).
_MARGIN = 1.05
#: Start times of one process differ by less than this between reads.
_SAME_START_S = 0.05
_warned: set[str] = set()


def _warn_once(key: str, msg: str, *args: Any) -> None:
    if key not in _warned:
        _warned.add(key)
        logger.warning(msg, *args)


def host_root() -> str | None:
    """The memory file system the host caches live in, None when missing."""
    root = os.environ.get(ROOT_ENV) or _DEFAULT_ROOT
    return root if os.path.isdir(root) and os.access(root, os.W_OK | os.X_OK) else None


def _me() -> str:
    """This process as a user entry: pid, start time, and a token (several loaders)."""
    import psutil

    pid = os.getpid()
    return f"{pid}-{psutil.Process(pid).create_time():.3f}-{secrets.token_hex(4)}"


def _alive(entry: str) -> bool:
    """Whether the process a user entry names still runs (a zombie does not)."""
    import psutil

    try:
        pid_text, start_text, _ = entry.split("-")
        proc = psutil.Process(int(pid_text))
        return abs(proc.create_time() - float(start_text)) <= _SAME_START_S \
            and proc.status() != psutil.STATUS_ZOMBIE
    except (ValueError, psutil.Error):
        return False


def _remove_if_unused(directory: str) -> bool:
    """Remove a job's directory when none of its registered ranks lives (its lock held,
    so no rank registers meanwhile)."""
    from dask_ddp import _core

    lock = _core.HostLock(os.path.join(directory, _LOCK))
    try:
        if not lock.acquire(5.0):
            return False
    except OSError:
        return False  # removed meanwhile, or not ours
    try:
        users = os.listdir(os.path.join(directory, _USERS)) \
            if os.path.isdir(os.path.join(directory, _USERS)) else []
        if any(_alive(u) for u in users):
            return False
        shutil.rmtree(directory, ignore_errors=True)
        return True
    finally:
        lock.release()


def clean_orphans(root: str | None = None) -> list[str]:
    """Remove the host cache directories under ``root`` whose ranks are all gone."""
    root = root or host_root()
    if root is None:
        return []
    removed = [d for d in glob.glob(os.path.join(root, PREFIX + "*"))
               if os.path.isdir(d) and _remove_if_unused(d)]
    if removed:
        logger.info("removed %d table caches of ended dask-ddp ranks: %s", len(removed),
                    ", ".join(removed))
    return removed


def table_name(table: Table, columns: Sequence[Column]) -> str:
    """A name for the table's records in these columns: the same in every rank."""
    src = table.__dict__
    what = (src.get("source"), src.get("keys"), src.get("files"), src.get("row_groups"),
            list(table.partition_rows),
            [(c.name, str(c.dtype), tuple(c.shape)) for c in columns])
    h = hashlib.sha256(repr(what).encode())
    graph = src.get("graph")
    if graph is not None and not src.get("keys"):
        h.update(graph)
    return "t" + h.hexdigest()[:20]


class HostCache:
    """This rank's view of its host's cache of one table (see the module).

    Made by :meth:`open`; :meth:`get` maps a partition written by any local rank,
    :meth:`claim` / :meth:`put` / :meth:`release` write one, :meth:`close` leaves.
    """

    def __init__(self, directory: str, name: str, record_bytes: int, user: str) -> None:
        self.directory, self.name, self.record_bytes = directory, name, record_bytes
        self._user = user
        self._locks: dict[int, Any] = {}

    @classmethod
    def open(cls, table: Table, columns: Sequence[Column], record_bytes: int
             ) -> HostCache | None:
        """This rank's view of the host cache, None outside a job or (with one warning)
        when the memory file system is missing or has no room for the table."""
        from dask_ddp import _core

        job = os.environ.get("DASK_DDP_JOB_ID", "")
        if not job:
            return None
        root = host_root()
        need = int(len(table) * record_bytes + HEADER * table.npartitions)
        if root is None:
            _warn_once("root", "table cache: no writable %s: each rank keeps its own copy "
                       "of the partitions it reads", os.environ.get(ROOT_ENV) or _DEFAULT_ROOT)
            return None
        directory = os.path.join(root, PREFIX + job)
        name = table_name(table, columns)
        try:
            user = cls._register(directory)
        except OSError as exc:
            _warn_once("root", "table cache: cannot use %s (%s): each rank keeps its own "
                       "copy of the partitions it reads", directory, exc)
            return None
        have = sum(os.path.getsize(f) for f in glob.glob(os.path.join(directory,
                                                                      f"{name}-p*.rec")))
        free = _core.free_bytes(root)
        if free + have < need * _MARGIN:
            _warn_once("room", "table cache: %s has %d MB free, the table needs %d MB: each "
                       "rank keeps its own copy of the partitions it reads", root, free >> 20,
                       need >> 20)
            cls._unregister(directory, user)
            return None
        return cls(directory, name, record_bytes, user)

    @staticmethod
    def _register(directory: str) -> str:
        """Enter this process in the directory's users (made if missing), under its lock
        so that a rank leaving does not remove the directory meanwhile."""
        from dask_ddp import _core

        user = _me()
        for _ in range(10):  # the directory removed between making it and locking it
            os.makedirs(os.path.join(directory, _USERS), mode=0o700, exist_ok=True)
            lock = _core.HostLock(os.path.join(directory, _LOCK))
            try:
                if not lock.acquire(30.0):
                    raise OSError(f"{directory}: its lock was held for 30 s")
            except FileNotFoundError:
                continue
            try:
                if not os.path.isdir(os.path.join(directory, _USERS)):
                    continue
                fd = os.open(os.path.join(directory, _USERS, user),
                             os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o600)
                os.close(fd)
                return user
            finally:
                lock.release()
        raise OSError(f"{directory}: removed again and again while registering")

    @staticmethod
    def _unregister(directory: str, user: str) -> None:
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(directory, _USERS, user))
        _remove_if_unused(directory)

    def path(self, partition: int) -> str:
        return os.path.join(self.directory, f"{self.name}-p{partition}.rec")

    def temp_path(self, partition: int) -> str:
        """A name of this process for the partition's file while it is written."""
        return f"{self.path(partition)}.tmp.{os.getpid()}.{secrets.token_hex(4)}"

    def get(self, partition: int) -> np.ndarray | None:
        """The partition's records mapped read-only, None when no rank wrote them yet."""
        from dask_ddp import _core

        try:
            return _core.map_records(self.path(partition), self.record_bytes)
        except FileNotFoundError:
            return None

    def _lock_path(self, partition: int) -> str:
        return os.path.join(self.directory, f"{self.name}-p{partition}.lock")

    def held_here(self, partition: int) -> bool:
        """Whether another cache object of this process (another Loader) holds the
        partition's lock: waiting on it could wait for ever."""
        return partition not in self._locks and self._lock_path(partition) in _HELD_HERE

    def claim(self, partition: int, timeout_s: float) -> bool:
        """Take the partition's lock (the right to write it) within ``timeout_s``."""
        from dask_ddp import _core

        if self.held_here(partition):
            return False
        lock = self._locks.get(partition)
        if lock is None:
            lock = self._locks[partition] = _core.HostLock(self._lock_path(partition))
        taken = bool(lock.acquire(timeout_s))
        if taken:
            _HELD_HERE.add(self._lock_path(partition))
        return taken

    def release(self, partition: int) -> None:
        lock = self._locks.pop(partition, None)
        if lock is not None:
            _HELD_HERE.discard(self._lock_path(partition))
            lock.release()

    def put(self, partition: int, records: np.ndarray) -> np.ndarray:
        """Write the partition's records (kept if another rank wrote them first) and
        return them mapped from the file. OSError naming the file when there is no room."""
        from dask_ddp import _core

        _core.write_records(self.path(partition), np.ascontiguousarray(records))
        out = self.get(partition)
        if out is None:  # removed under us: the job's directory was cleaned
            raise FileNotFoundError(f"{self.path(partition)} vanished once written")
        return out

    def close(self) -> None:
        """Release the locks held and leave (the directory goes with its last rank)."""
        for p in list(self._locks):
            self.release(p)
        self._unregister(self.directory, self._user)
