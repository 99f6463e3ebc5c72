"""The model on a worker: shipped once as one graph key, built once per process, cached.

:func:`dask_ddp.predict` puts a :class:`ModelSpec` in the graph as a single key that
every partition's task depends on, so Dask sends it to each worker once (as it sends any
shared dependency), never inside every task. The spec carries the model pickled once on
the client (an ``nn.Module`` or a zero-argument function building one) and where its
weights are; :func:`model_for` unpickles, builds and loads it the first time a process
needs it and then hands the same module to every partition and every later call with the
same token. The cache keeps the few most recent models (:data:`CACHE_SIZE`).
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

__all__ = ["ModelSpec", "cache_info", "model_for", "thread_share", "torch_threads"]

logger = logging.getLogger(__name__)

#: Models kept per worker process (least recently used dropped first).
CACHE_SIZE = 4

_lock = threading.Lock()
_models: collections.OrderedDict[str, tuple[nn.Module, torch.device]] = (
    collections.OrderedDict())
_building: dict[str, threading.Lock] = {}
_builds: collections.Counter[str] = collections.Counter()
_loads: collections.Counter[str] = collections.Counter()


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """What a worker needs to build the model: one small record per ``predict`` call.

    Attributes
    ----------
    token
        Names the model and its weights: equal tokens share a cached module.
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
    """

    token: str
    payload: bytes
    checkpoint: str | None = None
    step: int | None = None
    device: str | None = None
    threads: int | None = None
    host_threads: Mapping[str, int] = dataclasses.field(default_factory=dict)

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
        _loads[spec.token] += 1
    _builds[spec.token] += 1
    return model.eval()


def _device(spec: ModelSpec) -> torch.device:
    if spec.device is not None:
        return torch.device(spec.device)
    # A worker started with CUDA_VISIBLE_DEVICES=<its GPU> sees that GPU as cuda:0.
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def model_for(spec: ModelSpec) -> tuple[nn.Module, torch.device]:
    """The cached module of ``spec`` on its device, built on the first call in this process.

    Concurrent tasks of one worker wait for a single build.
    """
    with _lock:
        hit = _models.get(spec.token)
        if hit is not None:
            _models.move_to_end(spec.token)
            return hit
        gate = _building.setdefault(spec.token, threading.Lock())
    with gate:
        with _lock:
            hit = _models.get(spec.token)
        if hit is not None:
            return hit
        device = _device(spec)
        model = build(spec).to(device)
        logger.info("predict: built %s on %s", spec, device)
        with _lock:
            _models[spec.token] = (model, device)
            while len(_models) > CACHE_SIZE:
                _models.popitem(last=False)
            _building.pop(spec.token, None)
        return model, device


def cache_info() -> dict[str, dict[str, int]]:
    """Per token: how often this process built the model and loaded its weights, and
    whether it is cached now (``cached`` 1 or 0)."""
    with _lock:
        return {t: {"builds": _builds[t], "loads": _loads[t], "cached": int(t in _models)}
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
