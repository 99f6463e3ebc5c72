"""Sharded checkpoints by step: the layout of :mod:`dask_ddp.checkpoint` over DCP.

Under a job's storage URL, step ``N``'s checkpoint is the DCP folder
``checkpoints/step-<N, 12 digits>/`` written by :class:`dask_ddp.checkpoint.StorageWriter`
(see :mod:`dask_ddp.checkpoint.dcp`): complete once its ``.metadata`` exists. This module
finds the newest complete step (metadata readable, every object it names present and
long enough) and keeps the newest ``keep`` steps; :class:`dask_ddp.Checkpointer`'s
``sharded=True`` mode (:mod:`dask_ddp.checkpoint.resume`) saves through it.
"""

from __future__ import annotations

import concurrent.futures
import logging
from typing import Any

from torch.distributed import checkpoint as dcp

from dask_ddp import _identity, _pending
from dask_ddp.checkpoint.dcp import (
    METADATA,
    StorageReader,
    StorageWriter,
    _quiet_single_process,
    _rank_of,
)
from dask_ddp.checkpoint.layout import (
    PREFIX,
    SHARDED_KEY,
    SHARDED_METADATA,
    delete_steps,
    get_or_none,
    open_store,
    redacted,
    sharded_prefix,
    storage_url,
)
from dask_ddp.checkpoint.metadata import load_metadata

logger = logging.getLogger(__name__)

__all__ = ["save_sharded", "load_sharded", "list_sharded_checkpoints", "latest_sharded_step",
           "step_url"]

def step_url(storage: str, step: int) -> str:
    """The folder URL of ``step``'s sharded checkpoint under a job's storage URL."""
    return f"{storage.rstrip('/')}/{sharded_prefix(step).rstrip('/')}"


def list_sharded_checkpoints(storage: str | None = None, **store_options: Any) -> list[int]:
    """Steps whose sharded checkpoint is complete (has ``.metadata``), oldest first."""
    store = open_store(storage_url(storage), **store_options)
    return sorted(
        int(m.group(1)) for o in store.list(PREFIX) if (m := SHARDED_METADATA.match(o.key))
    )


def latest_sharded_step(storage: str | None = None, **store_options: Any) -> int | None:
    """The newest step whose metadata reads and whose objects are all present and long
    enough; ``None`` if there is none."""
    url = storage_url(storage)
    store = open_store(url, **store_options)
    listing = store.list(PREFIX)
    sizes = {o.key: o.size for o in listing}
    steps = sorted(
        (int(m.group(1)) for k in sizes if (m := SHARDED_METADATA.match(k))), reverse=True
    )
    for step in steps:
        base = sharded_prefix(step)
        # Missing (pruned meanwhile) or not a DCP metadata object: try an older step. A
        # storage error (after retries) raises: never resume from an older step by mistake.
        raw = get_or_none(store, url, base + METADATA, f"sharded checkpoint step {step}")
        if raw is None:
            continue
        try:
            metadata = load_metadata(raw, f"{redacted(url)}/{base}{METADATA}")
            needed: dict[str, int] = {}
            for info in (metadata.storage_data or {}).values():
                key = base + info.relative_path
                needed[key] = max(needed.get(key, 0), info.offset + info.length)
        except Exception as e:  # noqa: BLE001 - not metadata, or refused: skip it
            logger.warning("sharded checkpoint step %d in %s unreadable (%s)", step,
                           redacted(url), e)
            continue
        missing = [k for k, n in needed.items() if sizes.get(k, -1) < n]
        if missing:
            logger.warning(
                "sharded checkpoint step %d in %s lacks %d objects (e.g. %s)",
                step, redacted(url), len(missing), missing[0],
            )
            continue
        return step
    return None


def prune_sharded(storage: str, keep: int, **store_options: Any) -> None:
    """Keep the newest ``keep`` complete checkpoints; delete older ones and partial ones
    older than the newest complete one (``.metadata`` first). Best effort."""
    if keep <= 0:
        return
    store = open_store(storage, **store_options)
    listing = [o.key for o in store.list(PREFIX)]
    complete = sorted(int(m.group(1)) for k in listing if (m := SHARDED_METADATA.match(k)))
    if not complete:
        return
    kept = set(complete[-keep:])
    doomed = {
        int(m.group(1))
        for k in listing
        if (m := SHARDED_KEY.match(k)) and int(m.group(1)) not in kept
        and int(m.group(1)) < complete[-1]
    }

    def keys_of(step: int) -> list[str]:
        base = sharded_prefix(step)
        return sorted((k for k in listing if k.startswith(base)),
                      key=lambda k: not k.endswith(METADATA))

    delete_steps(store, doomed, keys_of)


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
    if not isinstance(step, int) or step < 0:
        raise ValueError(f"save_sharded(): step must be a non-negative int, got {step!r}")
    _pending.flush_pending()  # a flush point of the metrics, as save_checkpoint's
    url = storage_url(storage)
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
                     planner=planner, no_dist=_identity.process_group() is None)
        return done()
    upload = dcp.async_save(
        state_dict, storage_writer=writer, process_group=process_group, planner=planner,
        no_dist=_identity.process_group() is None,
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
    url = storage_url(storage)
    if step is None:
        step = latest_sharded_step(url, **reader_options)
        if step is None:
            return None
    reader = StorageReader(step_url(url, step), **reader_options)
    logger.info("loading sharded checkpoint step %d from %s", step, redacted(url))
    with _quiet_single_process():
        dcp.load(state_dict, storage_reader=reader, process_group=process_group,
                 no_dist=_identity.process_group() is None)
    return step
