"""Weights for a predicting model: a dask-ddp checkpoint (full or sharded) or a state dict.

Everything read from storage goes through ``torch.load(weights_only=True)`` (tensors and
plain containers only) or DCP's own reader; nothing is unpickled freely.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from dask_ddp import storage

__all__ = ["load_weights"]

logger = logging.getLogger(__name__)

#: A URL ending so names one state-dict object rather than a checkpoint storage.
STATE_DICT_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")


def _state_dict_file(url: str) -> dict[str, Any]:
    folder, _, name = url.rstrip("/").rpartition("/")
    data = storage.open(folder or ".").get(name)
    obj = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    if not isinstance(obj, Mapping):
        raise TypeError(
            f"{storage.redact_url(url)} holds a {type(obj).__name__}, not a state dict")
    return dict(obj)


def _stripped(state: Mapping[str, Any], model: nn.Module) -> dict[str, Any]:
    """``state`` without DDP's ``module.`` prefix when the model's keys have none."""
    mine = model.state_dict().keys()
    if state and all(k.startswith("module.") for k in state) and not any(
            k.startswith("module.") for k in mine):
        return {k[len("module."):]: v for k, v in state.items()}
    return dict(state)


def _full(url: str, step: int) -> dict[str, Any]:
    from dask_ddp.checkpoint.full import load_checkpoint

    obj = load_checkpoint(url, step=step, weights_only=True, map_location="cpu")
    if obj is None:
        raise FileNotFoundError(f"checkpoint step {step} vanished from {storage.redact_url(url)}")
    # A Checkpointer's training state keeps the model under "model"; else a state dict.
    if isinstance(obj, Mapping) and isinstance(obj.get("model"), Mapping):
        return dict(obj["model"])
    if isinstance(obj, Mapping):
        return dict(obj)
    raise TypeError(f"checkpoint step {step} in {storage.redact_url(url)} holds a "
                    f"{type(obj).__name__}, not a state dict or a training state")


def _sharded(model: nn.Module, url: str, step: int) -> None:
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        set_model_state_dict,
    )

    from dask_ddp.checkpoint.sharded import load_sharded

    state = {"model": get_model_state_dict(model)}
    load_sharded(state, storage=url, step=step)
    set_model_state_dict(model, state["model"])


def load_weights(model: nn.Module, url: str, step: int | None = None) -> int | None:
    """Load ``url``'s weights into ``model``; returns the checkpoint step (None: a file).

    Parameters
    ----------
    url
        A state-dict object (``.pt``, ``.pth``, ``.bin``, ``.ckpt``: ``torch.save`` of a
        state dict), or a job's checkpoint storage (the ``storage=`` of ``submit``), whose
        newest complete checkpoint (or ``step``'s), full or sharded, is read; a full one
        saved by :class:`~dask_ddp.Checkpointer` contributes its ``"model"``.
    step
        The checkpoint step (storage only).

    Raises
    ------
    FileNotFoundError
        No checkpoint (of ``step``) under ``url``, or no object there.
    RuntimeError
        The weights do not fit the model (missing or unexpected keys, shapes).
    """
    shown = storage.redact_url(url)
    if url.lower().endswith(STATE_DICT_SUFFIXES):
        if step is not None:
            raise ValueError(f"checkpoint_step={step} given with a state-dict file {shown}")
        state = _state_dict_file(url)
        found = None
    else:
        from dask_ddp.checkpoint.full import list_checkpoints
        from dask_ddp.checkpoint.sharded import list_sharded_checkpoints

        full, sharded = list_checkpoints(url), list_sharded_checkpoints(url)
        if step is not None:
            full, sharded = [s for s in full if s == step], [s for s in sharded if s == step]
        if not full and not sharded:
            what = "no checkpoint" if step is None else f"no checkpoint of step {step}"
            raise FileNotFoundError(f"{what} under {shown} (full or sharded)")
        if sharded and (not full or sharded[-1] >= full[-1]):
            _sharded(model, url, sharded[-1])
            logger.info("predict: weights of sharded step %d from %s", sharded[-1], shown)
            return sharded[-1]
        found = full[-1]
        state = _full(url, found)
    try:
        model.load_state_dict(_stripped(state, model))
    except RuntimeError as e:
        raise RuntimeError(f"the weights in {shown} do not fit the model: {e}") from None
    logger.info("predict: weights from %s%s", shown, "" if found is None else f" step {found}")
    return found
