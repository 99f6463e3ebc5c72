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
``__R_N.distcp`` objects (nothing else there).
A transient storage error is retried (the store's ``max_attempts``, then ``put_attempts``
whole uploads); past that the save fails on every rank, naming the URL, key and rank.

Reading fetches only what the rank needs: ranged GETs of the byte ranges of the items in
the rank's load plan (neighbouring ranges of one object merged), in parallel.

:func:`save_sharded` / :func:`load_sharded` add the step layout of
:mod:`dask_ddp.checkpoint` (``checkpoints/step-000000000100/``), the newest-complete-step
lookup and retention; :class:`dask_ddp.Checkpointer` uses them with ``sharded=True``.
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
from collections.abc import Callable, Iterator, Sequence
from typing import IO, TYPE_CHECKING, Any, TypeVar, cast

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

if TYPE_CHECKING:
    from dask_ddp.storage import Store

logger = logging.getLogger(__name__)

__all__ = [
    "StorageWriter",
    "StorageReader",
    "save_sharded",
    "load_sharded",
    "list_sharded_checkpoints",
    "latest_sharded_step",
]

METADATA = ".metadata"
SUFFIX = ".distcp"
#: Schemes each side accepts (``validate_checkpoint_id``).
_WRITE_SCHEMES = ("file://", "s3://", "memory://")
_READ_SCHEMES = (*_WRITE_SCHEMES, "http://", "https://")
#: Retryable errors of a whole upload, after the store's own retries.
_TRANSIENT = (ConnectionError, TimeoutError)
#: The name of a data object of a checkpoint (rank, number), as DCP's own writers name them.
_OBJECT = re.compile(r"^__\d+_\d+\.distcp$")
#: Ranged reads of one object closer than this are merged into one request.
_MERGE_GAP = 1 << 20

T = TypeVar("T")


def _rank_of(rank: int | None) -> int:
    if rank is not None:
        return rank
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


def _no_dist() -> bool:
    import torch.distributed as dist

    return not (dist.is_available() and dist.is_initialized())


@contextlib.contextmanager
def _quiet_single_process() -> Iterator[None]:
    # DCP warns on every save/load without a process group; one process is intended here.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _open_store(url: str, options: dict[str, Any]) -> Store:
    from dask_ddp import storage

    return storage.open(url, **options)


def _check_url(url: str | os.PathLike[str], schemes: Sequence[str], who: str) -> str:
    url = os.fspath(url)
    if "://" not in url:  # a plain path is a folder
        url = "file://" + os.path.abspath(url)
    if not url.startswith(tuple(schemes)):
        raise ValueError(f"{who}: unsupported URL {url!r}; use one of {', '.join(schemes)}")
    return url.rstrip("/")


class _Errors:
    """Adds the URL, key and rank to storage errors (same exception type)."""

    def __init__(self, who: str, url: str, rank: int) -> None:
        self.who, self.url, self.rank = who, url, rank

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
                f"StorageWriter({self.url!r}): use_collectives=False is not supported: the "
                "metadata is written once every rank's shards are complete"
            )
        self.is_coordinator = is_coordinator
        self.rank = kwargs.get("rank")

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        # Runs on the coordinator before any rank writes: clear an older checkpoint in the
        # folder, .metadata first, so it can never describe a mix of old and new objects.
        # Only the .metadata matters for correctness (objects it does not name are never
        # read): its deletion must succeed, the rest is tidying.
        _retry(
            lambda: self.store.delete(METADATA),
            attempts=self.put_attempts,
            on_error=lambda e: self._errors().wrap("deleting the old", METADATA, e),
        )
        try:
            for info in self.store.list("__"):
                if _OBJECT.match(info.key):  # only DCP's objects, whatever else is there
                    self.store.delete(info.key)
        except Exception as e:  # noqa: BLE001 - stale objects are harmless, just space
            logger.warning("StorageWriter: could not clear %s: %s", self.url, e)
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
            self.url,
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
        return StorageMeta(checkpoint_id=self.url)

    # -- mechanics -----------------------------------------------------------------------

    @property
    def store(self) -> Store:
        if self._store is None:
            self._store = _open_store(self.url, self.store_options)
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
        _retry(
            lambda: self.store.put(key, data),
            attempts=self.put_attempts,
            on_error=lambda e: self._errors().wrap("writing", key, e),
        )


def _retry(
    fn: Callable[[], T], *, attempts: int, on_error: Callable[[Exception], BaseException]
) -> T:
    """``fn()``, tried ``attempts`` times on transient errors; other errors at once."""
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except _TRANSIENT as e:
            if attempt == attempts:
                raise on_error(e) from e
            logger.warning("transient storage error (attempt %d of %d): %s", attempt, attempts, e)
            time.sleep(min(0.5 * 2 ** (attempt - 1), 5.0))
        except Exception as e:
            raise on_error(e) from e
    raise AssertionError("unreachable")


def _item_size(item: WriteItem) -> int:
    if item.tensor_data is None:
        return 0
    n = 1
    for s in item.tensor_data.size:
        n *= s
    return n * torch._utils._element_size(item.tensor_data.properties.dtype)


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
        metadata = pickle.loads(data)
        if not isinstance(metadata, Metadata):
            raise ValueError(f"StorageReader: {self.url}/{METADATA} is not DCP metadata")
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        return metadata

    def set_up_storage_reader(
        self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any
    ) -> None:
        if metadata.storage_data is None:
            raise ValueError(f"StorageReader: {self.url}/{METADATA} has no storage data")
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
            self._store = _open_store(self.url, self.store_options)
        return self._store

    def _get(self, key: str, offset: int, length: int | None) -> bytes:
        errors = _Errors("StorageReader", self.url, _rank_of(self.rank))
        data = _retry(
            lambda: self.store.get_range(key, offset, length),
            attempts=1,
            on_error=lambda e: errors.wrap("reading", key, e),
        )
        if length is not None and len(data) != length:
            raise OSError(
                f"StorageReader: {self.url}/{key} is short on rank {_rank_of(self.rank)}: "
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
                f"StorageReader: {self.url}: {req.storage_index.fqn} has shape "
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


# -- the step layout of dask_ddp.checkpoint --------------------------------------------

PREFIX = "checkpoints/"
_STEP_METADATA = re.compile(r"^checkpoints/step-(\d{12})/\.metadata$")
_STEP_KEY = re.compile(r"^checkpoints/step-(\d{12})/")


def _step_prefix(step: int) -> str:
    return f"{PREFIX}step-{step:012d}/"


def step_url(storage: str, step: int) -> str:
    """The folder URL of ``step``'s sharded checkpoint under a job's storage URL."""
    return f"{storage.rstrip('/')}/{_step_prefix(step).rstrip('/')}"


def list_sharded_checkpoints(storage: str | None = None, **store_options: Any) -> list[int]:
    """Steps whose sharded checkpoint is complete (has ``.metadata``), oldest first."""
    from .checkpoint import _storage_url

    store = _open_store(_storage_url(storage), store_options)
    return sorted(
        int(m.group(1)) for o in store.list(PREFIX) if (m := _STEP_METADATA.match(o.key))
    )


def latest_sharded_step(storage: str | None = None, **store_options: Any) -> int | None:
    """The newest step whose metadata reads and whose objects are all present and long
    enough; ``None`` if there is none."""
    from .checkpoint import _storage_url

    url = _storage_url(storage)
    store = _open_store(url, store_options)
    listing = store.list(PREFIX)
    sizes = {o.key: o.size for o in listing}
    steps = sorted(
        (int(m.group(1)) for k in sizes if (m := _STEP_METADATA.match(k))), reverse=True
    )
    for step in steps:
        base = _step_prefix(step)
        try:
            metadata = pickle.loads(store.get(base + METADATA))
            needed: dict[str, int] = {}
            for info in (metadata.storage_data or {}).values():
                key = base + info.relative_path
                needed[key] = max(needed.get(key, 0), info.offset + info.length)
        except Exception as e:  # noqa: BLE001 - try an older one
            logger.warning("sharded checkpoint step %d in %s unreadable (%s)", step, url, e)
            continue
        missing = [k for k, n in needed.items() if sizes.get(k, -1) < n]
        if missing:
            logger.warning(
                "sharded checkpoint step %d in %s lacks %d objects (e.g. %s)",
                step, url, len(missing), missing[0],
            )
            continue
        return step
    return None


def prune_sharded(storage: str, keep: int, **store_options: Any) -> None:
    """Keep the newest ``keep`` complete checkpoints; delete older ones and partial ones
    older than the newest complete one (``.metadata`` first). Best effort."""
    if keep <= 0:
        return
    store = _open_store(storage, store_options)
    listing = [o.key for o in store.list(PREFIX)]
    complete = sorted(int(m.group(1)) for k in listing if (m := _STEP_METADATA.match(k)))
    if not complete:
        return
    kept = set(complete[-keep:])
    doomed = {
        int(m.group(1))
        for k in listing
        if (m := _STEP_KEY.match(k)) and int(m.group(1)) not in kept
        and int(m.group(1)) < complete[-1]
    }
    for step in sorted(doomed):
        base = _step_prefix(step)
        # .metadata first: the step stops counting before any of its objects go.
        keys = sorted((k for k in listing if k.startswith(base)),
                      key=lambda k: not k.endswith(METADATA))
        for key in keys:
            try:
                store.delete(key)
            except Exception:  # noqa: BLE001 - pruning is best effort
                logger.warning("could not delete old checkpoint object %s", key, exc_info=True)


def save_sharded(
    state_dict: dict[str, Any],
    step: int,
    *,
    storage: str | None = None,
    keep: int = 3,
    async_save: bool = False,
    process_group: Any = None,
    planner: Any = None,
    **writer_options: Any,
) -> Any:
    """Save a (sharded) state dict as ``step`` with DCP (collective: every rank calls it).

    Parameters
    ----------
    state_dict
        As for ``dcp.save`` (e.g. ``{"model": ..., "optim": ...}`` from
        ``torch.distributed.checkpoint.state_dict.get_state_dict``).
    step
        The step number; :func:`load_sharded` loads the newest complete one.
    storage
        The job's store URL (default ``DASK_DDP_STORAGE``); the checkpoint goes to
        ``<storage>/checkpoints/step-<step>/``.
    keep
        Complete checkpoints to keep (0: all); older ones are deleted after a save.
    async_save
        Use ``dcp.async_save``: return once the state is copied, upload in the background.
        Pass a ``process_group`` of its own (gloo) so its collectives never interleave
        with training's.
    process_group
        The group of the save's collectives (default: the default group).
    planner
        A DCP ``SavePlanner`` (default: DCP's).
    **writer_options
        Passed to :class:`StorageWriter` (``thread_count``, store options, ...).

    Returns
    -------
    str or concurrent.futures.Future
        The checkpoint's URL; with ``async_save``, a future resolving to it once complete
        (and pruned).
    """
    from .checkpoint import _storage_url

    if not isinstance(step, int) or step < 0:
        raise ValueError(f"save_sharded(): step must be a non-negative int, got {step!r}")
    url = _storage_url(storage)
    target = step_url(url, step)
    writer = StorageWriter(target, **writer_options)
    store_options = writer.store_options

    def done() -> str:
        if _rank_of(None) == 0:
            prune_sharded(url, keep, **store_options)
        return target

    if not async_save:
        with _quiet_single_process():
            dcp.save(state_dict, storage_writer=writer, process_group=process_group,
                     planner=planner, no_dist=_no_dist())
        return done()
    upload = dcp.async_save(
        state_dict, storage_writer=writer, process_group=process_group, planner=planner,
        no_dist=_no_dist(),
    )
    if not isinstance(upload, concurrent.futures.Future):  # AsyncSaveResponse
        upload = upload.upload_completion
    result: concurrent.futures.Future[str] = concurrent.futures.Future()

    def chain(f: Any) -> None:
        try:
            f.result()
            result.set_result(done())
        except BaseException as e:  # noqa: BLE001 - CheckpointException is a BaseException
            result.set_exception(e if isinstance(e, Exception) else RuntimeError(str(e)))

    upload.add_done_callback(chain)
    return result


def load_sharded(
    state_dict: dict[str, Any],
    *,
    storage: str | None = None,
    step: int | None = None,
    process_group: Any = None,
    **reader_options: Any,
) -> int | None:
    """Load the newest complete sharded checkpoint (or ``step``'s) into ``state_dict``.

    Collective; every rank must load the same step: pass ``step`` (e.g. chosen by rank 0
    with :func:`latest_sharded_step` and broadcast), as :class:`dask_ddp.Checkpointer`
    does. Returns the step loaded, ``None`` if there is none.
    """
    from .checkpoint import _storage_url

    url = _storage_url(storage)
    if step is None:
        step = latest_sharded_step(url, **reader_options)
        if step is None:
            return None
    reader = StorageReader(step_url(url, step), **reader_options)
    logger.info("loading sharded checkpoint step %d from %s", step, url)
    with _quiet_single_process():
        dcp.load(state_dict, storage_reader=reader, process_group=process_group,
                 no_dist=_no_dist())
    return step


# -- Checkpointer(sharded=True) ---------------------------------------------------------


@dataclasses.dataclass
class ShardedState:
    """What a sharded :class:`dask_ddp.Checkpointer` keeps between calls."""

    #: The gloo group of async saves (their collectives must not interleave with training's).
    group: Any = None
    #: The async save in flight, if any.
    pending: concurrent.futures.Future[str] | None = None


def _state(ckpt: Any) -> ShardedState:
    if ckpt._dcp is None:
        ckpt._dcp = ShardedState()
    return ckpt._dcp  # type: ignore[no-any-return]


def _model_and_optim(ckpt: Any) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    if ckpt.optimizer is None:
        return {"model": get_model_state_dict(ckpt.model)}
    model_sd, optim_sd = get_state_dict(ckpt.model, ckpt.optimizer)
    return {"model": model_sd, "optim": optim_sd}


def save_training(ckpt: Any, step: int, extra: dict[str, Any]) -> Any:
    """:meth:`dask_ddp.Checkpointer.save` with ``sharded=True`` (collective).

    The model and optimizer go through DCP, sharded as they are in memory; the rest of the
    training state (scheduler, every rank's RNG states and loader position, ``extra``) is
    :func:`dask_ddp.training_state` without the model, one small object in the same
    checkpoint.
    """
    from .elastic import _group, training_state

    st = _state(ckpt)
    if st.pending is not None:  # one staged copy at a time: bounded memory
        wait_training(ckpt)
    rest = training_state(None, None, ckpt.scheduler, ckpt.loader, **{"step": step, **extra})
    buf = io.BytesIO()
    torch.save(rest, buf)
    state = {**_model_and_optim(ckpt), "train": buf.getvalue()}
    if not ckpt.async_save:
        return save_sharded(state, step, storage=ckpt.storage, keep=ckpt.keep)
    if st.group is None and _group() is not None:
        import torch.distributed as dist

        st.group = dist.new_group(backend="gloo")
    st.pending = save_sharded(
        state, step, storage=ckpt.storage, keep=ckpt.keep, async_save=True,
        process_group=st.group,
    )
    return st.pending


def wait_training(ckpt: Any, timeout: float | None = None) -> None:
    """Wait for a sharded Checkpointer's async save in flight (raises its error)."""
    st = _state(ckpt)
    pending, st.pending = st.pending, None
    if pending is not None:
        pending.result(timeout)


def restore_training(ckpt: Any) -> dict[str, Any]:
    """:meth:`dask_ddp.Checkpointer.restore` with ``sharded=True`` (collective).

    Rank 0 picks the newest complete step and tells the others; every rank then reads the
    shards it needs for its own part of the model and optimizer, whatever world size saved
    them.
    """
    from torch.distributed.checkpoint.state_dict import set_state_dict

    from .checkpoint import _storage_url
    from .elastic import _chosen_by_rank0, restore_training_state

    url = _storage_url(ckpt.storage)
    step = _chosen_by_rank0(lambda: latest_sharded_step(url))
    ckpt.restored_step = step
    if step is None:
        return {}
    state = {**_model_and_optim(ckpt), "train": b""}
    load_sharded(state, storage=url, step=step)
    if ckpt.optimizer is None:
        set_state_dict(ckpt.model, [], model_state_dict=state["model"], optim_state_dict={})
    else:
        set_state_dict(
            ckpt.model, ckpt.optimizer, model_state_dict=state["model"],
            optim_state_dict=state["optim"],
        )
    rest = torch.load(io.BytesIO(state["train"]), weights_only=True)
    logger.info("restored sharded checkpoint step %d from %s", step, url)
    return restore_training_state(rest, None, None, ckpt.scheduler, ckpt.loader)
