"""Sharded checkpoints: ``torch.distributed.checkpoint`` (DCP) over our object stores.

:class:`StorageWriter` and :class:`StorageReader` implement DCP's storage interfaces over
:mod:`dask_ddp.storage` (``file://`` and ``s3://``; ``http(s)://`` read-only), so
``dcp.save``, ``dcp.load`` and ``dcp.async_save`` write and read checkpoints straight from
every rank to storage::

    import torch.distributed.checkpoint as dcp
    from dask_ddp.checkpoint import StorageReader, StorageWriter

    dcp.save(state, storage_writer=StorageWriter("s3://bucket/run/ckpt-100"))
    dcp.load(state, storage_reader=StorageReader("s3://bucket/run/ckpt-100"))

A checkpoint is a folder of objects in DCP's file format (the same as
``FileSystemWriter``'s, so a ``file://`` checkpoint also loads with ``FileSystemReader``)::

    __0_0.distcp  __0_1.distcp  __1_0.distcp ...   every rank's shards, several objects each
    .metadata                                      written last, by the coordinator

Each rank uploads its objects in parallel (``thread_count`` at a time; S3 objects above the
store's ``multipart_threshold`` go up in multipart). Each object appears whole or not at
all (the store's ``put`` is atomic), and ``.metadata`` is written only after every rank's
objects are complete (DCP gathers every rank's results before ``finish``), so a crash at any
point mid-save leaves no ``.metadata``: the checkpoint never looks complete. Saving again
into a folder that holds a checkpoint first deletes its ``.metadata``, then its
``__R_N.distcp`` objects (nothing else there). A transient storage error is retried (the
store's ``max_attempts``, then ``put_attempts`` whole uploads); past that the save fails on
every rank, naming the URL, key and rank.

Reading fetches only what the rank needs: ranged GETs of the byte ranges of the items in the
rank's load plan (neighbouring ranges of one object merged), in parallel.

:mod:`dask_ddp.checkpoint.sharded` adds the step layout of :mod:`dask_ddp.checkpoint`
(``checkpoints/step-000000000100/``), the newest-complete-step lookup and retention, and
:class:`dask_ddp.Checkpointer`'s ``sharded=True`` mode.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import io
import logging
import os
import pickle
import re
import time
import warnings
from collections.abc import Iterator, Sequence
from typing import IO, TYPE_CHECKING, Any, cast

import torch
from torch.distributed import checkpoint as dcp
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    ReadItem,
    SavePlan,
    SavePlanner,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from dask_ddp._identity import process_group
from dask_ddp.checkpoint.layout import open_store, redacted, retry
from dask_ddp.checkpoint.metadata import load_metadata

if TYPE_CHECKING:
    from dask_ddp.storage import Store

logger = logging.getLogger(__name__)

__all__ = ["StorageWriter", "StorageReader"]

METADATA = ".metadata"
SUFFIX = ".distcp"
#: Schemes each side accepts (``validate_checkpoint_id``).
_WRITE_SCHEMES = ("file://", "s3://", "memory://")
_READ_SCHEMES = (*_WRITE_SCHEMES, "http://", "https://")
#: The name of a data object of a checkpoint (rank, number), as DCP's own writers name them.
_OBJECT = re.compile(r"^__\d+_\d+\.distcp$")
#: Ranged reads of one object closer than this are merged into one request.
_MERGE_GAP = 1 << 20



def _rank_of(rank: int | None) -> int:
    if rank is not None:
        return rank
    group = process_group()
    return group[0] if group is not None else int(os.environ.get("RANK", "0"))


@contextlib.contextmanager
def _quiet_single_process() -> Iterator[None]:
    # DCP warns on every save/load without a process group; one process is intended here.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _check_url(url: str | os.PathLike[str], schemes: Sequence[str], who: str) -> str:
    url = os.fspath(url)
    if "://" not in url:  # a plain path is a folder
        url = "file://" + os.path.abspath(url)
    if not url.startswith(tuple(schemes)):
        raise ValueError(
            f"{who}: unsupported URL {redacted(url)!r}; use one of {', '.join(schemes)}")
    return url.rstrip("/")


class _Errors:
    """Adds the URL, key and rank to storage errors (same exception type)."""

    def __init__(self, who: str, url: str, rank: int) -> None:
        self.who, self.url, self.rank = who, redacted(url), rank

    def wrap(self, what: str, key: str, exc: BaseException) -> BaseException:
        msg = f"{self.who}: {what} {self.url}/{key} failed on rank {self.rank}: {exc}"
        try:
            new = type(exc)(msg)
        except Exception:  # noqa: BLE001 - an exception type with another signature
            new = RuntimeError(msg)
        new.__cause__ = exc
        return new


class StorageWriter(dcp.StorageWriter):
    """DCP storage writer to a ``file://`` or ``s3://`` folder (see the module docs).

    Parameters
    ----------
    url
        The checkpoint's folder: ``s3://bucket/prefix/ckpt``, ``file:///path`` or a plain
        path. ``dcp.save(checkpoint_id=...)`` replaces it.
    thread_count
        Objects each rank serialises and uploads at once.
    object_size
        Each rank's shards are split into objects of about this many bytes (a tensor
        larger than that is one object), so uploads overlap serialisation.
    put_attempts
        Whole-object upload attempts on a transient error (``ConnectionError``,
        ``TimeoutError``) after the store's own retries (``max_attempts``).
    **store_options
        Passed to :func:`dask_ddp.storage.open` (``endpoint_url``, ``max_attempts``,
        ``multipart_threshold``, ...).
    """

    def __init__(
        self,
        url: str | os.PathLike[str],
        *,
        thread_count: int = 4,
        object_size: int = 64 << 20,
        put_attempts: int = 3,
        **store_options: Any,
    ) -> None:
        super().__init__()
        if thread_count < 1 or object_size < 1 or put_attempts < 1:
            raise ValueError(
                "StorageWriter: thread_count, object_size and put_attempts must be >= 1, "
                f"got {thread_count}, {object_size}, {put_attempts}"
            )
        self.url = _check_url(url, _WRITE_SCHEMES, "StorageWriter")
        self.thread_count = thread_count
        self.object_size = object_size
        self.put_attempts = put_attempts
        self.store_options = dict(store_options)
        self.is_coordinator = False
        self.rank: int | None = None
        self._store: Store | None = None

    # -- DCP interface -------------------------------------------------------------------

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        if checkpoint_id:
            self.url = _check_url(checkpoint_id, _WRITE_SCHEMES, "StorageWriter")
            self._store = None

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("use_collectives", True) is False:
            raise ValueError(
                f"StorageWriter({redacted(self.url)!r}): use_collectives=False is not "
                "supported: the "
                "metadata is written once every rank's shards are complete"
            )
        self.is_coordinator = is_coordinator
        self.rank = kwargs.get("rank")

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        # Runs on the coordinator before any rank writes: clear an older checkpoint in the
        # folder, .metadata first, so it never describes a mix of old and new objects. Only
        # it matters (objects it does not name are never read): its deletion must succeed.
        retry(
            lambda: self.store.delete(METADATA),
            attempts=self.put_attempts,
            on_error=lambda e: self._errors().wrap("deleting the old", METADATA, e),
        )
        try:
            for info in self.store.list("__"):
                if _OBJECT.match(info.key):  # only DCP's objects, whatever else is there
                    self.store.delete(info.key)
        except Exception as e:  # noqa: BLE001 - stale objects are harmless, just space
            logger.warning("StorageWriter: could not clear %s: %s", redacted(self.url), e)
        return [dataclasses.replace(p, storage_data=f"__{i}_") for i, p in enumerate(plans)]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        prefix = plan.storage_data if isinstance(plan.storage_data, str) else "__0_"
        groups = _split(plan.items, self.object_size)
        names = [f"{prefix}{i}{SUFFIX}" for i in range(len(groups))]
        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(
            self.thread_count, thread_name_prefix="dask-ddp-dcp-write"
        ) as pool:
            futures = [
                pool.submit(self._write_object, name, items, planner)
                for name, items in zip(names, groups, strict=True)
            ]
            results: list[WriteResult] = []
            for f in futures:
                results.extend(f.result())
        logger.debug(
            "rank %s: %d objects, %d bytes to %s in %.2fs",
            self.rank,
            len(names),
            sum(r.size_in_bytes for r in results),
            redacted(self.url),
            time.perf_counter() - t0,
        )
        fut: Future[list[WriteResult]] = Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        metadata.version = "1.0.0"
        metadata.storage_data = {r.index: r.storage_data for rs in results for r in rs}
        metadata.storage_meta = self.storage_meta()
        # Last: the checkpoint exists from here on.
        self._put(METADATA, pickle.dumps(metadata))

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return isinstance(checkpoint_id, str) and checkpoint_id.startswith(_WRITE_SCHEMES)

    def storage_meta(self) -> StorageMeta | None:
        return StorageMeta(checkpoint_id=redacted(self.url))

    # -- mechanics -----------------------------------------------------------------------

    @property
    def store(self) -> Store:
        if self._store is None:
            self._store = open_store(self.url, **self.store_options)
        return self._store

    def _errors(self) -> _Errors:
        return _Errors("StorageWriter", self.url, _rank_of(self.rank))

    def _write_object(
        self, name: str, items: list[WriteItem], planner: SavePlanner
    ) -> list[WriteResult]:
        buf = io.BytesIO()
        results = []
        for item in items:
            offset = buf.tell()
            data = planner.resolve_data(item)
            if item.type == WriteItemType.BYTE_IO:
                assert isinstance(data, io.BytesIO)
                buf.write(data.getbuffer())
            else:
                assert isinstance(data, torch.Tensor)
                tensor = data.detach().cpu()
                if tensor.untyped_storage().nbytes() != tensor.nbytes:
                    tensor = tensor.clone()  # save only the view, not its whole storage
                torch.save(tensor, buf)
            length = buf.tell() - offset
            results.append(WriteResult(item.index, length, _StorageInfo(name, offset, length)))
        self._put(name, buf.getbuffer())
        return results

    def _put(self, key: str, data: bytes | memoryview) -> None:
        retry(
            lambda: self.store.put(key, data),
            attempts=self.put_attempts,
            on_error=lambda e: self._errors().wrap("writing", key, e),
        )


def _item_size(item: WriteItem) -> int:
    if item.tensor_data is None:
        return 0
    n = 1
    for s in item.tensor_data.size:
        n *= s
    return n * torch._utils._element_size(item.tensor_data.properties.dtype)  # noqa: SLF001 (torch's DCP metadata gives a dtype, and only this sizes it)


def _split(items: list[WriteItem], object_size: int) -> list[list[WriteItem]]:
    """Items in groups of about ``object_size`` bytes, in order; at least one group."""
    groups: list[list[WriteItem]] = [[]]
    size = 0
    for item in items:
        n = _item_size(item)
        if groups[-1] and size + n > object_size:
            groups.append([])
            size = 0
        groups[-1].append(item)
        size += n
    return groups


class StorageReader(dcp.StorageReader):
    """DCP storage reader from a ``file://``, ``s3://`` or ``http(s)://`` folder.

    Parameters
    ----------
    url
        The checkpoint's folder (as given to :class:`StorageWriter`); an ``http(s)://``
        base URL serving the same objects works read-only.
    thread_count
        Ranged reads in flight per rank.
    **store_options
        Passed to :func:`dask_ddp.storage.open`.
    """

    def __init__(
        self, url: str | os.PathLike[str], *, thread_count: int = 8, **store_options: Any
    ) -> None:
        super().__init__()
        if thread_count < 1:
            raise ValueError(f"StorageReader: thread_count must be >= 1, got {thread_count}")
        self.url = _check_url(url, _READ_SCHEMES, "StorageReader")
        self.thread_count = thread_count
        self.store_options = dict(store_options)
        self.storage_data: dict[Any, _StorageInfo] = {}
        self.rank: int | None = None
        self._store: Store | None = None

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        self.storage_data = {}
        if checkpoint_id:
            self.url = _check_url(checkpoint_id, _READ_SCHEMES, "StorageReader")
            self._store = None

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        data = self._get(METADATA, 0, None)
        metadata = load_metadata(data, f"StorageReader: {redacted(self.url)}/{METADATA}")
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        return metadata

    def set_up_storage_reader(
        self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any
    ) -> None:
        if metadata.storage_data is None:
            raise ValueError(f"StorageReader: {redacted(self.url)}/{METADATA} has no storage data")
        self.storage_data = metadata.storage_data
        self.rank = kwargs.get("rank")

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        with concurrent.futures.ThreadPoolExecutor(
            self.thread_count, thread_name_prefix="dask-ddp-dcp-read"
        ) as pool:
            futures = {
                pool.submit(self._get, key, start, end - start): reqs
                for key, start, end, reqs in _ranges(plan.items, self.storage_data)
            }
            # Tensors are copied into place on this thread, as each range arrives.
            for f in concurrent.futures.as_completed(futures):
                data = memoryview(f.result())
                start = self.storage_data[futures[f][0].storage_index].offset
                for req in futures[f]:
                    info = self.storage_data[req.storage_index]
                    piece = data[info.offset - start : info.offset - start + info.length]
                    self._apply(req, piece, planner)
        fut: Future[None] = Future()
        fut.set_result(None)
        return fut

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return isinstance(checkpoint_id, str) and checkpoint_id.startswith(_READ_SCHEMES)

    # -- mechanics -----------------------------------------------------------------------

    @property
    def store(self) -> Store:
        if self._store is None:
            self._store = open_store(self.url, **self.store_options)
        return self._store

    def _get(self, key: str, offset: int, length: int | None) -> bytes:
        errors = _Errors("StorageReader", self.url, _rank_of(self.rank))
        data = retry(
            lambda: self.store.get_range(key, offset, length),
            attempts=1,
            on_error=lambda e: errors.wrap("reading", key, e),
        )
        if length is not None and len(data) != length:
            raise OSError(
                f"StorageReader: {redacted(self.url)}/{key} is short on rank "
                f"{_rank_of(self.rank)}: "
                f"wanted bytes {offset}..{offset + length}, got {len(data)}"
            )
        return data

    def _apply(self, req: ReadItem, piece: memoryview, planner: LoadPlanner) -> None:
        if req.type == LoadItemType.BYTE_IO:
            planner.load_bytes(req, io.BytesIO(piece))
            return
        from torch.distributed._shard._utils import narrow_tensor_by_index

        stream = cast(IO[bytes], _ViewReader(piece))
        tensor = torch.load(stream, map_location="cpu", weights_only=True)
        tensor = narrow_tensor_by_index(tensor, req.storage_offsets, req.lengths)
        target = planner.resolve_tensor(req).detach()
        if target.size() != tensor.size():
            raise ValueError(
                f"StorageReader: {redacted(self.url)}: {req.storage_index.fqn} has shape "
                f"{tuple(tensor.size())} in the checkpoint, {tuple(target.size())} here"
            )
        target.copy_(tensor)
        planner.commit_tensor(req, target)


class _ViewReader(io.RawIOBase):
    """A seekable file over a memoryview, without copying it (``io.BytesIO`` would)."""

    def __init__(self, view: memoryview) -> None:
        super().__init__()
        self._view = view
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        n = max(0, min(len(buffer), len(self._view) - self._pos))
        memoryview(buffer).cast("B")[:n] = self._view[self._pos : self._pos + n]
        self._pos += n
        return n


def _ranges(
    items: list[ReadItem], storage_data: dict[Any, _StorageInfo]
) -> list[tuple[str, int, int, list[ReadItem]]]:
    """(key, start, end, items) byte ranges covering the items, neighbours merged."""
    per_key: dict[str, list[ReadItem]] = {}
    for item in items:
        per_key.setdefault(storage_data[item.storage_index].relative_path, []).append(item)
    out: list[tuple[str, int, int, list[ReadItem]]] = []
    for key, reqs in per_key.items():
        reqs.sort(key=lambda r: storage_data[r.storage_index].offset)
        for req in reqs:
            info = storage_data[req.storage_index]
            end = info.offset + info.length
            if out and out[-1][0] == key and info.offset - out[-1][2] <= _MERGE_GAP:
                k, s, e, rs = out[-1]
                out[-1] = (k, s, max(e, end), [*rs, req])
            else:
                out.append((key, info.offset, end, [req]))
    return out
