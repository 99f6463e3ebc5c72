"""Exact resume after a restart: checkpoints of the whole training state.

A job started with ``dask_ddp.submit(..., max_restarts=N)`` calls its function again after
a failure; the function picks up where the last checkpoint left off. For the resumed job
to end with the same weights (bitwise, on CPU) as one never interrupted, a checkpoint must
hold more than the model: the optimizer, the LR scheduler, every rank's random number
generators (torch, numpy, Python's ``random``) and every rank's position in its data
(:meth:`dask_ddp.data.Loader.state_dict`). :func:`training_state` collects all that (a
collective call: every rank's RNG and loader state is gathered to each rank), and
:func:`restore_training_state` puts it back; :class:`Checkpointer` pairs them with
:func:`dask_ddp.save_checkpoint` / :func:`dask_ddp.load_checkpoint`, and makes every
rank load the same step.
"""

from __future__ import annotations

import concurrent.futures
import io
import logging
import random
from collections.abc import Callable
from typing import Any

from dask_ddp._identity import process_group
from dask_ddp.checkpoint.full import (
    list_checkpoints,
    load_checkpoint,
    read_verified,
    save_checkpoint,
    wait_checkpoints,
)
from dask_ddp.checkpoint.layout import open_store, redacted, storage_url

logger = logging.getLogger(__name__)

__all__ = ["Checkpointer", "restore_training_state", "training_state"]

_FORMAT = 1

#: Called with ``(model, optimizer, scheduler, loader)`` by every new Checkpointer: a
#: launcher's live recovery hooks the model and optimizer there (see ``on_checkpointer``).
_ON_NEW: list[Callable[[Any, Any, Any, Any], Any]] = []


def on_checkpointer(fn: Callable[[Any, Any, Any, Any], Any]) -> None:
    """Call ``fn(model, optimizer, scheduler, loader)`` for every Checkpointer made in this
    process from now on (the launcher's live recovery: the one place a training function
    names its model, optimizer and loader together)."""
    if fn not in _ON_NEW:
        _ON_NEW.append(fn)


def _unwrap(model: Any) -> Any:
    # DistributedDataParallel (and DataParallel) keep the real model in .module.
    from torch import nn

    if isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
        return model.module
    return model


def _rng_state() -> dict[str, Any]:
    import numpy as np
    import torch

    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)  # type: ignore[misc]
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        # Plain tensors and numbers: loadable with torch.load(weights_only=True).
        "numpy": {"kind": str(kind), "keys": torch.from_numpy(np.asarray(keys, np.int64)),
                  "pos": int(pos), "has_gauss": int(has_gauss), "cached": float(cached)},
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    import numpy as np
    import torch

    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"],
                         n["has_gauss"], n["cached"]))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def training_state(model: Any, optimizer: Any = None, scheduler: Any = None,
                   loader: Any = None, **extra: Any) -> dict[str, Any]:
    """Everything needed to continue training exactly, as one ``torch.save``-able dict.

    In a job (an initialised process group) this is a collective call: every rank must
    call it, at the same step; each rank's RNG states and loader position are gathered
    into the result (on every rank), so rank 0 alone can save it.

    Parameters
    ----------
    model : torch.nn.Module or None
        The model (a ``DistributedDataParallel`` wrapper is unwrapped); ``None`` leaves it
        out (sharded checkpoints save model and optimizer through DCP instead).
    optimizer, scheduler : optional
        Objects with ``state_dict()``/``load_state_dict()``.
    loader : dask_ddp.data.Loader, optional
        Its position in the epoch (``state_dict()``); any object with ``state_dict``.
    **extra
        More values to keep (step, epoch, best metric...): tensors, numbers, strings,
        lists and dicts of them.

    Returns
    -------
    dict
        Give it to :func:`dask_ddp.save_checkpoint`; restore with
        :func:`restore_training_state`.

    Examples
    --------
    >>> state = dask_ddp.training_state(model, opt, loader=loader, step=step)  # doctest: +SKIP
    >>> dask_ddp.save_checkpoint(state, step)  # doctest: +SKIP
    """
    mine = {"rng": _rng_state(),
            "loader": loader.state_dict() if loader is not None else None}
    group = process_group()
    if group is None:
        ranks = [mine]
    else:
        import torch.distributed as dist

        gathered: list[Any] = [None] * group[1]
        dist.all_gather_object(gathered, mine)
        ranks = gathered
    return {
        "format": _FORMAT,
        "world_size": len(ranks),
        "model": _unwrap(model).state_dict() if model is not None else None,
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "ranks": ranks,
        "extra": dict(extra),
    }


def _resized_loader_state(saved: dict[str, Any], loader: Any) -> dict[str, Any]:
    """A loader position saved with another world size, mapped onto this loader: the same
    epoch, at the same fraction of it (an exact replay is impossible: shards differ)."""
    mine = loader.state_dict()
    total = max(int(saved.get("num_batches", 0)), 1)
    batch = int(saved["batch"]) * int(mine["num_batches"]) // total
    return {**saved, "world_size": mine["world_size"], "num_batches": mine["num_batches"],
            "batch": min(batch, int(mine["num_batches"]))}


def restore_training_state(state: dict[str, Any], model: Any, optimizer: Any = None,
                           scheduler: Any = None, loader: Any = None) -> dict[str, Any]:
    """Put back what :func:`training_state` saved; return its ``**extra`` values.

    With the world size the state was saved with, each rank gets its own RNG states and
    loader position back, so training continues exactly as if never interrupted. With
    another world size (an elastic restart), the model, optimizer and scheduler are
    restored exactly; each rank takes the RNG states of the rank with its number (or
    rank 0's) and the loader continues the same epoch at the same fraction of it.

    Parameters
    ----------
    state : dict
        From :func:`training_state` (e.g. via :func:`dask_ddp.load_checkpoint`).
    model, optimizer, scheduler, loader
        As given to :func:`training_state`.

    Returns
    -------
    dict
        The ``**extra`` values given to :func:`training_state`.

    Raises
    ------
    ValueError
        ``state`` is not a training state.
    """
    if not isinstance(state, dict) or state.get("format") != _FORMAT:
        raise ValueError("restore_training_state() needs a dict made by training_state(), "
                         f"got {type(state).__name__}")
    group = process_group()
    rank, world = group if group is not None else (0, 1)
    if model is not None and state["model"] is not None:
        _unwrap(model).load_state_dict(state["model"])
    if optimizer is not None and state["optimizer"] is not None:
        optimizer.load_state_dict(state["optimizer"])
    if scheduler is not None and state["scheduler"] is not None:
        scheduler.load_state_dict(state["scheduler"])
    ranks = state["ranks"]
    same = len(ranks) == world
    if not same:
        logger.warning("resuming a state saved with world size %d at world size %d: the "
                       "data order and random streams differ from an uninterrupted run",
                       len(ranks), world)
    own = ranks[rank] if rank < len(ranks) else ranks[0]
    _set_rng_state(own["rng"])
    if loader is not None and own["loader"] is not None:
        saved = own["loader"]
        unread = [r["loader"].get("unread") for r in ranks if isinstance(r.get("loader"), dict)]
        if any(u is not None for u in unread) and _is_loader(loader):
            # Saved after a membership change (live recovery): every rank's unread samples
            # of the epoch, together, dealt over this job's ranks; nothing read twice.
            samples = [i for u in unread if u is not None for i in u.tolist()]
            loader.resume_unread(int(saved["epoch"]), samples, rank, world)
        else:
            loader.load_state_dict(saved if same else _resized_loader_state(saved, loader))
    return dict(state["extra"])


def _is_loader(loader: object) -> bool:
    """Whether ``loader`` is a dask-ddp Loader (which resumes the unread samples of an
    epoch saved after a membership change), not a torch DataLoader, say."""
    from dask_ddp.data.loader import Loader

    return isinstance(loader, Loader)


def _chosen_by_rank0(choose: Any) -> Any:
    """``choose()`` on rank 0, broadcast to every rank (collective in a job)."""
    group = process_group()
    if group is None:
        return choose()
    import torch.distributed as dist

    error: BaseException | None = None
    box: list[Any] = [None]
    if group[0] == 0:
        try:
            box = [("ok", choose())]
        except Exception as e:  # every rank raises, not just rank 0 (the others would wait)
            error = e
            box = [("error", f"{type(e).__name__}: {e}")]
    dist.broadcast_object_list(box, src=0)
    kind, value = box[0]
    if error is not None:
        raise error
    if kind == "error":
        raise RuntimeError(f"rank 0 could not choose the checkpoint to restore: {value}")
    return value


class Checkpointer:
    """Saves and restores the whole training state of a job, for exact resume.

    Every rank makes one, with its own objects, and calls :meth:`save` and
    :meth:`restore` at the same points (both are collective calls). Rank 0 writes the
    checkpoints (asynchronously, see :func:`dask_ddp.save_checkpoint`); :meth:`restore`
    makes every rank load the same, newest complete checkpoint.

    Parameters
    ----------
    model : torch.nn.Module
    optimizer, scheduler : optional
    loader : dask_ddp.data.Loader, optional
    storage : str, optional
        The checkpoints' store URL; default: the job's storage (``DASK_DDP_STORAGE``).
    keep : int
        How many checkpoints to keep (0: all).
    sharded : bool
        Save through ``torch.distributed.checkpoint`` (DCP): every rank writes its own
        shards of the model and optimizer (``get_state_dict``: FSDP2, DDP or a plain
        module), and a restore reshards to any world size. See
        :mod:`dask_ddp.checkpoint.sharded`.
    async_save : bool
        Sharded only: ``dcp.async_save``, so :meth:`save` returns once the state is copied
        to memory and the upload overlaps training. Call :meth:`wait` before the training
        function returns (the job's process group ends then).
    evaluate : dask_ddp.Evaluate, optional
        Score each checkpoint saved (every ``every``-th) on the cluster while training
        goes on; the scores arrive as the job's ``eval/...`` metrics at the checkpoint's
        step. :meth:`wait` also waits for them.

    Examples
    --------
    A training function resuming after a restart (``submit(..., max_restarts=2)``):

    >>> def train(steps):  # doctest: +SKIP
    ...     model = DDP(make_model())
    ...     opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ...     loader = Loader(ImageFolder(url), 32, transform=tf)
    ...     ckpt = dask_ddp.Checkpointer(model, opt, loader=loader)
    ...     step = ckpt.restore().get("step", 0)
    ...     while step < steps:
    ...         loader.set_epoch(loader.epoch)  # keeps a restored position
    ...         for x, y in loader:
    ...             ...  # one training step
    ...             step += 1
    ...             if step % 100 == 0:
    ...                 ckpt.save(step)
    ...             if step == steps:
    ...                 break
    ...         else:
    ...             loader.set_epoch(loader.epoch + 1)
    """

    def __init__(self, model: Any, optimizer: Any = None, scheduler: Any = None,
                 loader: Any = None, *, storage: str | None = None, keep: int = 3,
                 sharded: bool = False, async_save: bool = False,
                 evaluate: Any = None) -> None:
        if async_save and not sharded:
            raise ValueError("Checkpointer(async_save=True) needs sharded=True (full "
                             "checkpoints upload in the background already)")
        self.sharded = sharded
        self.async_save = async_save
        #: Sharded mode: the gloo group of async saves (their collectives must not
        #: interleave with training's), made at the first async save.
        self._save_group: Any = None
        #: Sharded mode: the async save in flight, if any (one at a time: bounded memory).
        self._pending: concurrent.futures.Future[str] | None = None
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.loader = loader
        self.storage = storage
        self.keep = keep
        #: The step restored by the last :meth:`restore` (None: nothing to restore).
        self.restored_step: int | None = None
        #: A live job's hold on the objects (its rank joined a running group: the state
        #: came from the group, and restore() reads nothing).
        self._live: Any = None
        for hook in _ON_NEW:
            self._live = hook(model, optimizer, scheduler, loader) or self._live
        self.evaluate = evaluate

    def save(self, step: int, /, **extra: Any) -> Any:
        """Checkpoint the training state as ``step`` (collective: call on every rank).

        ``step`` and the ``**extra`` values come back from :meth:`restore`. Returns rank
        0's upload future (see :func:`dask_ddp.save_checkpoint`), ``None`` on the other
        ranks.
        """
        if self.sharded:
            upload = self._save_sharded(step, extra)
        else:
            state = training_state(self.model, self.optimizer, self.scheduler, self.loader,
                                   **{"step": step, **extra})
            upload = save_checkpoint(state, step, storage=self.storage, rank=0, keep=self.keep)
        if self.evaluate is not None and (process_group() or (0, 1))[0] == 0:
            self.evaluate.checkpoint_saved(step, storage_url(self.storage), upload)
        return upload

    def restore(self) -> dict[str, Any]:
        """Load the newest complete checkpoint into the objects (collective).

        Rank 0 picks the step and tells the others, so every rank loads the same one.

        Returns
        -------
        dict
            ``step`` and the ``**extra`` values given to :meth:`save`; empty when there
            is no checkpoint yet (a fresh start).
        """
        joined = getattr(self._live, "joined_step", None)
        if joined is not None:  # this rank joined a live group: it took the group's state
            self._live.joined_step = None
            self.restored_step = joined
            return {"step": joined}
        if self.sharded:
            return self._restore_sharded()
        step = _chosen_by_rank0(self._newest)
        self.restored_step = step
        if self._live is not None:  # what a joining rank's restore() will count from
            self._live.base_step = step or 0
        if step is None:
            return {}
        state = load_checkpoint(self.storage, step=step)
        if state is None:
            raise RuntimeError(f"checkpoint step {step} in {self.storage or 'the job storage'} "
                               "vanished while restoring it")
        logger.info("restoring checkpoint step %d", step)
        return restore_training_state(state, self.model, self.optimizer, self.scheduler,
                                      self.loader)

    def wait(self, timeout: float | None = None) -> None:
        """Wait until this process's checkpoints are complete in storage (raises their
        error)."""
        if self.sharded:
            pending, self._pending = self._pending, None
            if pending is not None:
                pending.result(timeout)
        else:
            wait_checkpoints(timeout)
        if self.evaluate is not None:
            self.evaluate.wait(timeout)

    def _newest(self) -> int | None:
        # The newest step whose data matches its manifest (load_checkpoint's choice).
        url = storage_url(self.storage)
        store = open_store(url)
        for s in reversed(list_checkpoints(url)):
            if read_verified(store, url, s) is not None:
                return s
        return None

    # -- sharded=True: the model and optimizer through DCP -------------------------------

    def _model_and_optim(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

        if self.optimizer is None:
            return {"model": get_model_state_dict(self.model)}
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        return {"model": model_sd, "optim": optim_sd}

    def _save_sharded(self, step: int, extra: dict[str, Any]) -> Any:
        """The model and optimizer go through DCP, sharded as they are in memory; the rest
        of the training state (scheduler, every rank's RNG states and loader position,
        ``extra``) is :func:`training_state` without the model, one small object in the
        same checkpoint."""
        import torch

        from dask_ddp.checkpoint.sharded import save_sharded

        if self._pending is not None:  # one staged copy at a time: bounded memory
            self.wait()
        rest = training_state(None, None, self.scheduler, self.loader, **{"step": step, **extra})
        buf = io.BytesIO()
        torch.save(rest, buf)
        state = {**self._model_and_optim(), "train": buf.getvalue()}
        if not self.async_save:
            return save_sharded(state, step, storage=self.storage, keep=self.keep)
        if self._save_group is None and process_group() is not None:
            import torch.distributed as dist

            self._save_group = dist.new_group(backend="gloo")
        self._pending = save_sharded(
            state, step, storage=self.storage, keep=self.keep, async_save=True,
            process_group=self._save_group,
        )
        return self._pending

    def _restore_sharded(self) -> dict[str, Any]:
        """Rank 0 picks the newest complete step and tells the others; every rank then
        reads the shards it needs for its own part of the model and optimizer, whatever
        world size saved them."""
        import torch
        from torch.distributed.checkpoint.state_dict import set_state_dict

        from dask_ddp.checkpoint.sharded import latest_sharded_step, load_sharded

        url = storage_url(self.storage)
        step = _chosen_by_rank0(lambda: latest_sharded_step(url))
        self.restored_step = step
        if step is None:
            return {}
        state = {**self._model_and_optim(), "train": b""}
        load_sharded(state, storage=url, step=step)
        if self.optimizer is None:
            set_state_dict(self.model, [], model_state_dict=state["model"], optim_state_dict={})
        else:
            set_state_dict(
                self.model, self.optimizer, model_state_dict=state["model"],
                optim_state_dict=state["optim"],
            )
        rest = torch.load(io.BytesIO(state["train"]), weights_only=True)
        logger.info("restored sharded checkpoint step %d from %s", step, redacted(url))
        return restore_training_state(rest, None, None, self.scheduler, self.loader)
