"""A rank's reads of a Dask table's partitions (internal).

The rank asks for the rows it needs of one partition; a small task on the worker holding
the partition (or computing it, when the collection is not persisted) writes those rows
as records (a row's columns side by side) into a memory file the rank created
(``memfd``, reached by the worker as ``/proc/<rank pid>/fd/<fd>`` on the same host), or
straight into the host cache's file of the partition (a temporary file of ``/dev/shm``
the rank links into place once written: no copy in the rank). The rank maps the file:
no pickle of the data, no pandas in the rank. A worker on another host (the file is not
reachable there, which a token written in the file tells) sends the records back through
Dask instead.

The memory file disappears with the rank process, whatever way it ends; a temporary
cache file goes when its read finishes or is dropped, or with the job's cache directory.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import mmap
import os
import secrets
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from dask_ddp.data.table.columns import (
    Column,
    TableColumnError,
    fill_records,
    record_layout,
    unsupported,
)

__all__ = ["DaskReader", "export_rows"]

logger = logging.getLogger(__name__)

_TOKEN_BYTES = 16
_HEADER = 64  # the token, padded: the records start aligned
#: Seconds to wait for one partition's rows (a partition computed as read can be slow).
FETCH_TIMEOUT_S = 600.0

_clients: dict[str, Any] = {}
_clients_lock = threading.Lock()
#: The clients a fork()ed child inherited: kept, never used nor closed there.
_inherited: list[Any] = []


def _forget_clients() -> None:
    """In a fork()ed child: no client of the parent's (its connections and event loop
    thread are the parent's; closing one here would close the parent's connection), and a
    lock no parent's thread can hold."""
    global _clients_lock
    _inherited.extend(_clients.values())
    _clients.clear()
    _clients_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_clients)


def _client(address: str) -> Any:
    """This process's client of the scheduler (one per address, closed at exit)."""
    with _clients_lock:
        client = _clients.get(address)
        if client is None:
            from distributed import Client

            client = Client(address, set_as_default=False, timeout=60)
            _clients[address] = client
            atexit.register(_close_clients)
        return client


def _close_clients() -> None:
    with _clients_lock:
        for client in _clients.values():
            with contextlib.suppress(Exception):
                client.close(timeout=5)
        _clients.clear()


def _file_size(columns: Sequence[Column], n: int) -> int:
    """Bytes of a memory file of ``n`` records: the token's header, then the records."""
    return _HEADER + n * record_layout(columns)[1]


def _rows_arg(rows: np.ndarray) -> Any:
    """Rows as a (start, stop) range when contiguous (a few bytes in the task)."""
    if len(rows) and rows[-1] - rows[0] + 1 == len(rows):
        return (int(rows[0]), int(rows[-1]) + 1)
    return rows


def _column_values(part: Any, c: Column, rows: Any, partition: int) -> np.ndarray:
    """Column ``c``'s rows ``rows`` of a partition (pandas DataFrame or numpy block)."""
    where = f" in partition {partition}"
    idx = slice(*rows) if isinstance(rows, tuple) else rows
    if isinstance(part, np.ndarray):
        if part.shape[1:] != c.shape:
            raise ValueError(f"block {partition} has rows of shape {part.shape[1:]}, "
                             f"not {c.shape}")
        return part[idx]
    try:
        s = part[c.name]
    except KeyError:
        raise KeyError(f"column {c.name!r} is missing{where}") from None
    s = s.iloc[idx]
    if c.kind == "numpy":
        a = s.to_numpy()
        if a.dtype != np.dtype(c.dtype):
            if a.dtype.kind not in "biuf":
                raise unsupported(c.name, a.dtype, where)
            a = a.astype(c.dtype)
        return a
    if c.kind == "ext":
        try:
            return s.to_numpy(dtype=np.dtype(c.dtype))
        except (ValueError, TypeError) as exc:
            raise TableColumnError(f"column {c.name!r}{where} has dtype {s.dtype} with "
                                   f"values that are not {np.dtype(c.dtype)}: {exc}") from exc
    if c.kind == "arrow_list":
        import pyarrow as pa

        arr = pa.array(s.array) if not hasattr(s.array, "_pa_array") else \
            s.array._pa_array.combine_chunks()  # noqa: SLF001 (pandas' ArrowExtensionArray hands its pyarrow array no other way)
        values = arr.flatten().to_numpy(zero_copy_only=False)
        if arr.null_count or len(values) != len(arr) * int(np.prod(c.shape)):
            raise TableColumnError(f"column {c.name!r}{where} has lists that are null or "
                                   f"not all of length {c.shape[0]}")
        return values.reshape(len(arr), *c.shape).astype(c.dtype, copy=False)
    # object column of lists or arrays
    values = s.to_numpy()
    try:
        out = np.stack([np.asarray(v, dtype=c.dtype) for v in values]) if len(values) \
            else np.zeros((0, *c.shape), c.dtype)
    except (ValueError, TypeError) as exc:
        raise TableColumnError(f"column {c.name!r}{where} (dtype object) does not hold lists "
                               f"of numbers of one length: {exc}") from exc
    if out.shape[1:] != c.shape:
        raise TableColumnError(f"column {c.name!r}{where} holds lists of shape "
                               f"{out.shape[1:]}, not {c.shape}")
    return out


def _fill(records: np.ndarray, part: Any, rows: Any, columns: Sequence[Column],
          partition: int) -> None:
    """Write rows ``rows`` of a partition into ``records`` (a block of rows at a time)."""
    sources: list[tuple[np.ndarray, Any]] = []
    for c in columns:
        if c.kind == "numpy" and not isinstance(part, np.ndarray) and c.name in part:
            a = part[c.name].to_numpy()
            if a.dtype == np.dtype(c.dtype):
                # Straight from the column into the records: one copy.
                sources.append((a, rows))
                continue
        sources.append((_column_values(part, c, rows, partition), None))
    fill_records(records, columns, sources, f"partition {partition}")


def export_rows(part: Any, rows: Any, columns: Sequence[Column], target: dict[str, Any],
                partition: int) -> dict[str, Any]:
    """Runs on a worker: write rows ``rows`` of partition ``part`` as records into the
    rank's memory file, or return the records when that file is not reachable from here."""
    n = rows[1] - rows[0] if isinstance(rows, tuple) else len(rows)
    size = record_layout(columns)[1]
    fd = -1
    with contextlib.suppress(OSError):
        fd = os.open(target["path"], os.O_RDWR)
    try:
        if fd >= 0 and os.fstat(fd).st_size == target["size"] \
                and os.pread(fd, _TOKEN_BYTES, 0) == target["token"]:
            mm = mmap.mmap(fd, target["size"], mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            try:
                records = np.frombuffer(mm, np.uint8, n * size, _HEADER).reshape(n, size)
                _fill(records, part, rows, columns, partition)
                del records
            finally:
                # A view may outlive this frame for a moment (the worker's profiler holds
                # sampled frames): the mapping then closes when the last view goes.
                with contextlib.suppress(BufferError):
                    mm.close()
            return {"shm": True}
    finally:
        if fd >= 0:
            os.close(fd)
    records = np.empty((n, size), np.uint8)
    _fill(records, part, rows, columns, partition)
    return {"shm": False, "records": records}


def export_many(parts: Sequence[Any], rows: Sequence[Any], columns: Sequence[Column],
                targets: Sequence[dict[str, Any]], partitions: Sequence[int]
                ) -> list[dict[str, Any]]:
    """Runs on a worker: :func:`export_rows` for several partitions it holds (one task,
    one round trip)."""
    return [export_rows(part, r, columns, target, p)
            for part, r, target, p in zip(parts, rows, targets, partitions, strict=True)]


class _Pending:
    """A started read of one partition; ``group`` counts the reads sharing its task;
    ``into`` is the (temporary, final) host cache file it writes, or None (a memfd)."""

    def __init__(self, partition: int, future: Any, index: int, fd: int, size: int, n: int,
                 source: Any, group: list[int], into: tuple[str, str] | None) -> None:
        self.partition, self.future, self.index = partition, future, index
        self.fd, self.size, self.n, self.source, self.group = fd, size, n, source, group
        self.into = into
        self.open = True  # not finished nor cancelled

    def close_files(self) -> None:
        """Close the memfd, or remove the temporary cache file (linked into place or not)."""
        self.open = False
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1
        if self.into is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.into[0])

    def done_with_task(self) -> None:
        self.group[0] -= 1
        if self.group[0] == 0:
            with contextlib.suppress(Exception):
                self.future.release()


class DaskReader:
    """A rank's reader of a Dask table's partitions."""

    def __init__(self, table: Any, columns: Sequence[Column] | None = None) -> None:
        self.table = table
        self.columns = list(table.column_specs if columns is None else columns)
        self.client = _client(table.scheduler)
        self._collection: Any = None
        self._lock = threading.Lock()

    def _source(self, partition: int) -> Any:
        """A future of the partition: its persisted key, or its computation."""
        from distributed import Future

        if self.table.keys is not None:
            return Future(self.table.keys[partition], client=self.client)
        with self._lock:
            if self._collection is None:
                import cloudpickle

                with self.client.as_current():
                    self._collection = cloudpickle.loads(self.table.graph)
        coll = self._collection
        part = coll.blocks[partition] if self.table.kind == "array" else \
            coll.partitions[partition]
        return self.client.compute(part)

    def start(self, partitions: Sequence[int], rows: Sequence[np.ndarray],
              into: Sequence[tuple[str, str] | None] | None = None) -> list[_Pending]:
        """Start reading rows ``rows[i]`` (sorted) of each partition ``partitions[i]``: one
        task per worker holding some of them (one per partition computed as read);
        :meth:`finish` waits for each. ``into[i]``, when given, is a (temporary, final)
        pair of host cache file names: the records go there (:meth:`finish` links the
        temporary file to the final name and maps it)."""
        from dask_ddp import _core

        cols = self.columns
        record = record_layout(cols)[1]
        pending: list[_Pending] = []
        fds: list[int] = []
        temps: list[str] = []
        groups: dict[str, list[int]] = {}
        for i, p in enumerate(partitions):
            holder = self.table.workers[p]
            groups.setdefault(holder if holder else f"compute-{i}", []).append(i)
        try:
            for members in groups.values():
                holder = self.table.workers[partitions[members[0]]]
                first = len(fds)
                targets: list[dict[str, Any]] = []
                sources: list[Any] = []
                for i in members:
                    n = len(rows[i])
                    size = _file_size(cols, n)
                    token = secrets.token_bytes(_TOKEN_BYTES)
                    pair = into[i] if into is not None else None
                    if pair is not None:
                        # Space reserved, the token where the header goes (written when
                        # the file is linked into place).
                        _core.create_records_file(pair[0], n, record, token)
                        temps.append(pair[0])
                        fds.append(-1)
                        targets.append({"path": pair[0], "token": token, "size": size})
                        sources.append(self._source(partitions[i]))
                        continue
                    fd = os.memfd_create(f"dask-ddp-table-p{partitions[i]}", os.MFD_CLOEXEC)
                    fds.append(fd)
                    os.ftruncate(fd, size)
                    os.pwrite(fd, token, 0)
                    targets.append({"path": f"/proc/{os.getpid()}/fd/{fd}", "token": token,
                                    "size": size})
                    sources.append(self._source(partitions[i]))
                # On the worker holding the partitions (another one may serve them if that
                # one left: Dask moves the data); a partition computed as read is exported
                # where Dask computed it.
                where: dict[str, Any] = {"workers": [holder], "allow_other_workers": True} \
                    if holder else {}
                future = self.client.submit(
                    export_many, sources, [_rows_arg(rows[i]) for i in members], cols,
                    targets, [partitions[i] for i in members], pure=False,
                    key=f"dask-ddp-table-read-{secrets.token_hex(8)}", **where)
                group = [len(members)]
                for k, i in enumerate(members):
                    pending.append(_Pending(int(partitions[i]), future, k, fds[first + k],
                                            targets[k]["size"], len(rows[i]), sources[k], group,
                                            into[i] if into is not None else None))
        except BaseException:
            for pend in pending:
                self.cancel(pend)
            for fd in fds[len(pending):]:
                if fd >= 0:
                    with contextlib.suppress(OSError):
                        os.close(fd)
            for tmp in temps:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            raise
        order = {int(p): j for j, p in enumerate(partitions)}
        return sorted(pending, key=lambda x: order[x.partition])

    def finish(self, pending: _Pending) -> np.ndarray:
        """The records of a started read (uint8 [rows, record bytes], a view of the
        memory file, or of the host cache file it was written into, which stays mapped
        while the array lives)."""
        from dask_ddp import _core

        try:
            try:
                out = pending.future.result(timeout=FETCH_TIMEOUT_S)[pending.index]
            except (TableColumnError, KeyError, ValueError):
                raise  # already names the column and partition
            except Exception as exc:
                holder = self.table.workers[pending.partition]
                where = f" held by {holder}" if holder else " (computed as read)"
                raise RuntimeError(f"reading rows of partition {pending.partition}{where} "
                                   f"failed: {type(exc).__name__}: {exc}") from exc
            size = record_layout(self.columns)[1]
            if pending.into is not None:
                tmp, final = pending.into
                if out["shm"]:
                    _core.commit_records_file(tmp, final, pending.n, size)
                else:  # a worker of another host: the records came through Dask
                    records = np.ascontiguousarray(out["records"])
                    try:
                        _core.write_records(final, records)
                    except OSError as exc:
                        logger.warning("table cache: partition %d kept in this rank only: "
                                       "%s", pending.partition, exc)
                        return records
                return _core.map_records(final, size)
            if not out["shm"]:
                return np.ascontiguousarray(out["records"])
            mm = mmap.mmap(pending.fd, pending.size, mmap.MAP_SHARED, mmap.PROT_READ)
            return np.frombuffer(mm, np.uint8, pending.n * size, _HEADER).reshape(pending.n,
                                                                                  size)
        finally:
            pending.close_files()
            pending.done_with_task()
            with contextlib.suppress(Exception):
                pending.source.release()

    def cancel(self, pending: _Pending) -> None:
        """Drop a started read that will not be finished (no-op for a finished one)."""
        if not pending.open:
            return
        with contextlib.suppress(Exception):
            pending.future.cancel()
        with contextlib.suppress(Exception):
            pending.source.release()
        pending.close_files()
