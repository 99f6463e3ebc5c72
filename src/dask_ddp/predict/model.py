"""The model on a worker: shipped once as one graph key, built once per process, cached.

:func:`dask_ddp.predict` puts a :class:`ModelSpec` in the graph as a single key that
every partition's task depends on, so Dask sends it to each worker once (as it sends any
shared dependency), never inside every task. The spec carries the model pickled once on
the client (an ``nn.Module`` or a zero-argument function building one) and where its
weights are; :func:`model_for` unpickles, builds and loads it the first time a process
needs it on a device and then hands the same module to every partition and every later
call with the same model (payload and weights), device and memory format. The cache keeps
the few most recent models (:data:`CACHE_SIZE`); a worker using several GPUs
(:mod:`dask_ddp.predict.devices`) holds one copy per GPU.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import threading
from collections.abc import Iterator, Mapping

import torch
from torch import nn

from dask_ddp._identity import usable_cores
from dask_ddp.predict.devices import task_device

__all__ = ["ModelSpec", "cache_info", "model_for", "thread_share", "torch_threads"]

logger = logging.getLogger(__name__)

#: Models kept per worker process (least recently used dropped first).
CACHE_SIZE = 4

_lock = threading.Lock()
#: A cached module's key: the model (:attr:`ModelSpec.model_key`), its device, channels_last.
CacheKey = tuple[str, str, bool]

_models: collections.OrderedDict[CacheKey, tuple[nn.Module, torch.device]] = (
    collections.OrderedDict())
_building: dict[CacheKey, threading.Lock] = {}
_builds: collections.Counter[str] = collections.Counter()
_loads: collections.Counter[str] = collections.Counter()


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """What a worker needs to build the model: one small record per ``predict`` call.

    Attributes
    ----------
    token
        Names the whole record (the graph key holding it).
    payload
        The ``nn.Module`` or zero-argument builder, cloudpickled once on the client.
    checkpoint
        Where the weights are (see :func:`dask_ddp.predict.weights.load_weights`), or None.
    step
        The checkpoint step (None: the newest).
    device
        ``"cpu"``, ``"cuda"``, ``"cuda:1"``...; None: the worker's GPU when it has one.
    threads
        torch's intra-op threads per task; None: the worker's share of the cores.
    host_threads
        Each host's total Dask worker threads when the graph was made (for the share).
    model_key
        Names the model and its weights (payload, checkpoint, step): equal keys share a
        cached module on a device. Empty: the token.
    precision
        ``"fp32"``, ``"bf16"`` or ``"fp16"`` (:mod:`dask_ddp.predict.precision`).
    tf32
        TF32 for the task's matmuls and convolutions; None: the process's setting.
    channels_last
        The model and its 4-d inputs in ``torch.channels_last`` memory format.
    """

    token: str
    payload: bytes
    checkpoint: str | None = None
    step: int | None = None
    device: str | None = None
    threads: int | None = None
    host_threads: Mapping[str, int] = dataclasses.field(default_factory=dict)
    model_key: str = ""
    precision: str = "fp32"
    tf32: bool | None = None
    channels_last: bool = False

    @property
    def model_id(self) -> str:
        """The model's name in the cache and in :func:`cache_info`."""
        return self.model_key or self.token

    def __repr__(self) -> str:  # the dashboard and errors show it: no payload bytes
        return f"ModelSpec({self.token!r}, checkpoint={self.checkpoint is not None})"


def build(spec: ModelSpec) -> nn.Module:
    """The module of ``spec``, freshly unpickled (and built), weights loaded, in eval mode."""
    import cloudpickle

    obj = cloudpickle.loads(spec.payload)
    model = obj if isinstance(obj, nn.Module) else obj()
    if not isinstance(model, nn.Module):
        raise TypeError(
            f"predict: the model builder returned {type(model).__name__}, not a torch.nn.Module")
    if spec.checkpoint is not None:
        from dask_ddp.predict.weights import load_weights

        load_weights(model, spec.checkpoint, spec.step)
        _loads[spec.model_id] += 1
    _builds[spec.model_id] += 1
    return model.eval()


def model_for(spec: ModelSpec,
              device: torch.device | None = None) -> tuple[nn.Module, torch.device]:
    """The cached module of ``spec`` on ``device`` (default: this thread's,
    :func:`~dask_ddp.predict.devices.task_device`), built on the first call in this
    process for that model and device.

    Concurrent tasks of one worker wait for a single build.
    """
    if device is None:
        device = task_device(spec.device)
    key: CacheKey = (spec.model_id, str(device), spec.channels_last)
    with _lock:
        hit = _models.get(key)
        if hit is not None:
            _models.move_to_end(key)
            return hit
        gate = _building.setdefault(key, threading.Lock())
    with gate:
        with _lock:
            hit = _models.get(key)
        if hit is not None:
            return hit
        model = build(spec).to(device)
        if spec.channels_last:
            model = model.to(memory_format=torch.channels_last)
        logger.info("predict: built %s on %s", spec, device)
        with _lock:
            _models[key] = (model, device)
            while len(_models) > CACHE_SIZE:
                _models.popitem(last=False)
            _building.pop(key, None)
        return model, device


def cache_info() -> dict[str, dict[str, int]]:
    """Per model (its weights included): how often this process built it and loaded its
    weights, and how many copies are cached now (``cached``: one per device)."""
    with _lock:
        return {t: {"builds": _builds[t], "loads": _loads[t],
                    "cached": sum(k[0] == t for k in _models)}
                for t in _builds}


def thread_share(spec: ModelSpec) -> int:
    """torch threads for one task: the cores over the Dask threads of this host's workers.

    Each worker thread may run a task at once, so ``cores // threads`` per task keeps the
    host from being oversubscribed. Outside a worker: every core.
    """
    if spec.threads is not None:
        return spec.threads
    try:
        from distributed import get_worker

        worker = get_worker()
    except (ImportError, ValueError):
        return usable_cores()
    from distributed.comm.addressing import get_address_host

    total = spec.host_threads.get(get_address_host(worker.address)) or worker.state.nthreads
    return max(1, usable_cores() // max(1, total))


_threads_lock = threading.Lock()
_threads_users = 0
_threads_saved = 0


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """torch's intra-op threads set to ``n`` while inside, the process's value restored when
    the last concurrent task leaves (the setting is per process, tasks share it)."""
    global _threads_users, _threads_saved
    with _threads_lock:
        if _threads_users == 0:
            _threads_saved = torch.get_num_threads()
        _threads_users += 1
        if torch.get_num_threads() != n:
            torch.set_num_threads(n)
    try:
        yield
    finally:
        with _threads_lock:
            _threads_users -= 1
            if _threads_users == 0 and torch.get_num_threads() != _threads_saved:
                torch.set_num_threads(_threads_saved)
