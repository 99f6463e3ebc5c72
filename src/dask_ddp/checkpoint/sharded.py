"""Sharded checkpoints by step: the layout of :mod:`dask_ddp.checkpoint` over DCP.

Under a job's storage URL, step ``N``'s checkpoint is the DCP folder
``checkpoints/step-<N, 12 digits>/`` written by :class:`dask_ddp.checkpoint.StorageWriter`
(see :mod:`dask_ddp.checkpoint_dcp`): complete once its ``.metadata`` exists. This module
finds the newest complete step (metadata readable, every object it names present and
long enough), keeps the newest ``keep`` steps, and implements
:class:`dask_ddp.Checkpointer`'s ``sharded=True`` mode.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import io
import logging
import pickle
import re
from typing import Any

import torch
from torch.distributed import checkpoint as dcp

from .checkpoint_dcp import (
    METADATA,
    StorageReader,
    StorageWriter,
    _no_dist,
    _open_store,
    _quiet_single_process,
    _rank_of,
)

logger = logging.getLogger(__name__)

__all__ = ["save_sharded", "load_sharded", "list_sharded_checkpoints", "latest_sharded_step",
           "step_url"]

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
    from .checkpoint import _storage_url, get_or_none

    url = _storage_url(storage)
    store = _open_store(url, store_options)
    listing = store.list(PREFIX)
    sizes = {o.key: o.size for o in listing}
    steps = sorted(
        (int(m.group(1)) for k in sizes if (m := _STEP_METADATA.match(k))), reverse=True
    )
    for step in steps:
        base = _step_prefix(step)
        # Missing (pruned meanwhile) or not a DCP metadata object: try an older step. A
        # storage error (after retries) raises: never resume from an older step by mistake.
        raw = get_or_none(store, url, base + METADATA, f"sharded checkpoint step {step}")
        if raw is None:
            continue
        try:
            metadata = pickle.loads(raw)
            needed: dict[str, int] = {}
            for info in (metadata.storage_data or {}).values():
                key = base + info.relative_path
                needed[key] = max(needed.get(key, 0), info.offset + info.length)
        except Exception as e:  # noqa: BLE001 - unpickling fails in many ways
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
