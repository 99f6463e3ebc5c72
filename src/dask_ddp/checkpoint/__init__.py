"""Checkpoints from the ranks straight to storage (``file://``, ``s3://``), never through Dask.

- Full checkpoints (:mod:`~dask_ddp.checkpoint.full`): rank 0's ``torch.save`` of any
  object, uploaded off the training thread, atomic, verified on load:
  :func:`save_checkpoint`, :func:`load_checkpoint`, :func:`wait_checkpoints`,
  :func:`list_checkpoints`.
- Sharded checkpoints through ``torch.distributed.checkpoint`` (:mod:`~dask_ddp.checkpoint.dcp`,
  :mod:`~dask_ddp.checkpoint.sharded`): every rank writes its own shards and a load
  reshards to any world size: :class:`StorageWriter`, :class:`StorageReader`,
  :func:`save_sharded`, :func:`load_sharded`, :func:`list_sharded_checkpoints`,
  :func:`latest_sharded_step`, :func:`step_url`.
- Exact resume (:mod:`~dask_ddp.checkpoint.resume`): the whole training state
  (optimizer, scheduler, RNGs, loader positions): :class:`Checkpointer`,
  :func:`training_state`, :func:`restore_training_state`.

Where they live under the storage URL: :mod:`~dask_ddp.checkpoint.layout`. Names are
imported on first use: the sharded modules import torch's DCP at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dask_ddp._lazy import attribute_loader, public_dir

if TYPE_CHECKING:
    from dask_ddp.checkpoint.dcp import StorageReader, StorageWriter
    from dask_ddp.checkpoint.full import (
        list_checkpoints,
        load_checkpoint,
        save_checkpoint,
        wait_checkpoints,
    )
    from dask_ddp.checkpoint.layout import READ_ATTEMPTS as READ_ATTEMPTS
    from dask_ddp.checkpoint.resume import (
        Checkpointer,
        restore_training_state,
        training_state,
    )
    from dask_ddp.checkpoint.sharded import (
        latest_sharded_step,
        list_sharded_checkpoints,
        load_sharded,
        save_sharded,
        step_url,
    )

_WHERE = {
    **{n: f"dask_ddp.checkpoint.full:{n}"
       for n in ("save_checkpoint", "load_checkpoint", "wait_checkpoints", "list_checkpoints")},
    **{n: f"dask_ddp.checkpoint.dcp:{n}" for n in ("StorageWriter", "StorageReader")},
    **{n: f"dask_ddp.checkpoint.sharded:{n}"
       for n in ("save_sharded", "load_sharded", "list_sharded_checkpoints",
                 "latest_sharded_step", "step_url")},
    **{n: f"dask_ddp.checkpoint.resume:{n}"
       for n in ("Checkpointer", "training_state", "restore_training_state")},
    "READ_ATTEMPTS": "dask_ddp.checkpoint.layout:READ_ATTEMPTS",
}

__all__ = [
    "Checkpointer", "StorageReader", "StorageWriter", "latest_sharded_step", "list_checkpoints",
    "list_sharded_checkpoints", "load_checkpoint", "load_sharded", "restore_training_state",
    "save_checkpoint", "save_sharded", "step_url", "training_state", "wait_checkpoints",
]
__getattr__ = attribute_loader(__name__, _WHERE)
__dir__ = public_dir(__name__)
