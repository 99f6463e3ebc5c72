"""Which device a ``predict`` task runs on: the CPU, or one of the worker's visible GPUs.

A worker may see one GPU (dask-cuda's convention: one worker per GPU, each started with
``CUDA_VISIBLE_DEVICES=<its GPU>``, so it sees that GPU as ``cuda:0``) or several (one
worker for a machine's GPUs, ideally with as many threads as GPUs). A task takes the GPU of
its thread: the worker's threads are numbered in the order they first run a ``predict``
task, and thread ``k`` uses visible GPU ``k % count``. So a worker with as many threads as
GPUs keeps each GPU busy with one thread, a thread always finds its model on the same GPU
(the model cache is keyed by model and device), and a one-thread worker uses ``cuda:0``.

:func:`device_for` is the choice as a pure function of the request, the visible GPU count
and the thread's slot; :func:`task_device` applies it in the running thread.
"""

from __future__ import annotations

import itertools
import threading

import torch

__all__ = ["device_for", "task_device", "thread_slot"]

_slots_lock = threading.Lock()
_slots = threading.local()
_next_slot = itertools.count()


def thread_slot() -> int:
    """This thread's number among the process's threads that asked, in order of first ask
    (a Dask worker's threads live as long as the worker: a thread keeps its number)."""
    slot: int | None = getattr(_slots, "slot", None)
    if slot is None:
        with _slots_lock:
            slot = _slots.slot = next(_next_slot)
    return slot


def device_for(requested: str | None, cuda_count: int, slot: int) -> torch.device:
    """The device a task in thread ``slot`` uses.

    Parameters
    ----------
    requested
        ``predict``'s ``device=``: None (a GPU when the worker sees one, else the CPU),
        ``"cuda"`` (a visible GPU, chosen here), or a device with its index
        (``"cuda:1"``, ``"cpu"``), used as given.
    cuda_count
        The GPUs this process sees (``torch.cuda.device_count()``).
    slot
        The task's thread number (:func:`thread_slot`).

    Examples
    --------
    >>> [str(device_for(None, 2, s)) for s in range(3)]
    ['cuda:0', 'cuda:1', 'cuda:0']
    >>> str(device_for(None, 0, 5)), str(device_for("cuda:1", 4, 0))
    ('cpu', 'cuda:1')
    """
    if slot < 0:
        raise ValueError(f"predict: a thread slot is >= 0, got {slot}")
    if requested is None:
        return torch.device("cuda", slot % cuda_count) if cuda_count > 0 else torch.device("cpu")
    device = torch.device(requested)
    if device.type == "cuda" and device.index is None and cuda_count > 0:
        return torch.device("cuda", slot % cuda_count)
    return device


def task_device(requested: str | None) -> torch.device:
    """The device for a task running in this thread (:func:`device_for`)."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return device_for(requested, count, thread_slot())
