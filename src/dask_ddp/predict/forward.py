"""The batched forward of one task: inputs to the device, the model, outputs back to the host.

On the CPU an output batch is written into the partition's array as it comes. On a GPU
the thread does not wait for each batch: an output is copied into a pinned host buffer with
a non-blocking copy and an event recorded after it, and the previous batch's output is
collected (its event waited for, the buffer read into the partition's array) only after
this batch's forward is queued, so the GPU runs batch ``k`` while the host collects batch
``k - 1``. Two pinned buffers take turns: a buffer is reused two batches later, after the
batch that used it was collected. The wait is a blocking one (the thread sleeps until the
event): CUDA's default is to spin on a core, which an image task's decode threads need.

Host batches reach the GPU through the device stage, on its own stream, which also puts a
4-d batch in ``channels_last`` when asked: the model's stream gets it ready, not one more
pass over it. The image paths hand over batches already there, in that format.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch
from torch import nn

from dask_ddp.data.device import DeviceStage
from dask_ddp.predict.model import ModelSpec
from dask_ddp.predict.outputs import Layout
from dask_ddp.predict.precision import as_output, compute_mode

__all__ = ["HostCopies", "forward"]


class HostCopies:
    """Output batches of a GPU copied into ``out`` without a sync per batch.

    :meth:`put` queues a batch's copy into a pinned buffer and collects the batch before;
    :meth:`finish` collects the last one.
    """

    def __init__(self, out: np.ndarray) -> None:
        self.out = out
        self._buffers: list[torch.Tensor | None] = [None, None]
        self._turn = 0
        self._pending: tuple[int, torch.Tensor, torch.cuda.Event] | None = None

    def _buffer(self, like: torch.Tensor) -> torch.Tensor:
        buf = self._buffers[self._turn]
        if buf is None or buf.dtype != like.dtype or len(buf) < len(like) or \
                buf.shape[1:] != like.shape[1:]:
            buf = torch.empty(like.shape, dtype=like.dtype, pin_memory=True)
            self._buffers[self._turn] = buf
        self._turn ^= 1
        return buf[:len(like)]

    def put(self, start: int, y: torch.Tensor) -> None:
        """Queue ``y`` (on the GPU, rows ``start:start + len(y)`` of ``out``) for the host;
        collect the batch queued before."""
        view = self._buffer(y)
        view.copy_(y, non_blocking=True)
        done = torch.cuda.Event(blocking=True)
        done.record(torch.cuda.current_stream(y.device))  # y's GPU, not the current one
        previous, self._pending = self._pending, (start, view, done)
        if previous is not None:
            self._collect(*previous)

    def finish(self) -> None:
        """Collect the last batch queued."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            self._collect(*pending)

    def _collect(self, start: int, view: torch.Tensor, done: torch.cuda.Event) -> None:
        done.synchronize()
        self.out[start:start + len(view)] = view.numpy()


def forward(model: nn.Module, device: torch.device, batches: Iterable[tuple[int, torch.Tensor]],
            n: int, layout: Layout, where: Callable[[int], str], spec: ModelSpec) -> np.ndarray:
    """Run ``model`` over ``batches`` (``(start, input tensor)`` pairs covering ``n``
    samples) in inference mode, at ``spec``'s precision, TF32 and memory format; the
    outputs as one ``[n, *shape]`` array.

    ``where(start)`` names a batch for errors (its partition and first key).
    """
    out = layout.empty(n)
    copies = HostCopies(out) if device.type == "cuda" else None
    # Host batches cross on the stage's stream (released on a raise too); batches on the
    # device already (the image paths') pass as they are.
    stage = DeviceStage(device, channels_last=spec.channels_last)
    with compute_mode(device, spec.precision, spec.tf32), \
            stage.over(batches, image_at=1) as inputs:
        for start, x in inputs:
            y = model(x)
            _check(y, len(x), layout, where, start)
            y = as_output(y)
            if copies is not None:
                copies.put(start, y)
            else:
                out[start:start + len(x)] = y.detach().cpu().numpy()
        if copies is not None:
            copies.finish()
    return out


def _check(y: Any, rows: int, layout: Layout, where: Callable[[int], str], start: int) -> None:
    """``ValueError`` naming the batch when ``y`` is not ``[rows, *layout.shape]``."""
    if not isinstance(y, torch.Tensor) or tuple(y.shape) != (rows, *layout.shape):
        shown = tuple(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__
        raise ValueError(
            f"predict: the model returned {shown} for {where(start)} (a batch of "
            f"{rows}); every batch must give [batch, {', '.join(map(str, layout.shape))}]"
            " as the first one did")
