"""Rank-side functions and cluster probes of the launch defect and chaos tests.

Importable by the rank processes (functions pickled by reference).
"""

from __future__ import annotations

import glob
import os
import tempfile
import threading
import time
from typing import Any

from waits import wait_until  # noqa: F401 - re-exported for the launch tests

ACTIVE = ("processing", "waiting", "no-worker", "queued")


def store_timeout() -> Any:
    """A real ``DistStoreError``: a store's wait for a key no peer ever set, run out."""
    from datetime import timedelta

    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, 1, True, timedelta(seconds=5))
    try:
        store.wait(["never"], timedelta(milliseconds=50))
    except dist.DistStoreError as exc:
        return exc
    raise AssertionError("the store's wait did not time out")


def fill_results_then_raise(handler: Any, size: int, message: str) -> None:
    """Send two results no reader takes (the second stays stuck), then fail."""
    handler.submit_result("a.bin", b"x" * size)
    handler.submit_result("b.bin", b"y" * size)
    time.sleep(0.5)
    raise ValueError(message)


class LoopProbe(dict):  # type: ignore[type-arg]
    """A worker's task table that notes reads from threads other than the event loop."""

    def __init__(self, data: dict[Any, Any], loop_thread: int) -> None:
        super().__init__(data)
        self.loop_thread = loop_thread
        self.off_loop: list[str] = []

    def get(self, key: Any, default: Any = None) -> Any:
        if threading.get_ident() != self.loop_thread:
            self.off_loop.append(threading.current_thread().name)
        return super().get(key, default)


def install_loop_probe(dask_worker: Any) -> None:
    """Run on the worker's event loop (``client.run``)."""
    dask_worker.state.tasks = LoopProbe(dask_worker.state.tasks, threading.get_ident())


def off_loop_reads(dask_worker: Any) -> list[str]:
    tasks = dask_worker.state.tasks
    return list(tasks.off_loop) if isinstance(tasks, LoopProbe) else ["no probe"]


def active_tasks(job_id: str, dask_scheduler: Any = None) -> list[tuple[str, str]]:
    """The job's tasks still active on the scheduler (``client.run_on_scheduler``)."""
    return [(str(k), ts.state) for k, ts in dask_scheduler.tasks.items()
            if job_id in str(k) and ts.state in ACTIVE]


def worker_tasks(name: str, dask_worker: Any = None) -> list[tuple[str, str]]:
    """The tasks named ``name`` a worker still holds (``client.run``): a cancelled task
    stays there, as ``cancelled``, until its thread returns (a supervisor: once its rank
    is reaped)."""
    return [(str(k), ts.state) for k, ts in dask_worker.state.tasks.items() if name in str(k)]


def results_topics(dask_scheduler: Any) -> list[str]:
    ext = dask_scheduler.extensions.get("dask_ddp_results")
    return sorted(ext.info()) if ext is not None else []


def work_dirs(job_id: str) -> list[str]:
    return glob.glob(os.path.join(tempfile.gettempdir(), f"dask-ddp-{job_id[:8]}-*"))


def chaos_train(steps: int, raise_rank: int, raise_at: int) -> dict[str, Any]:
    """``steps`` all-reduces; on the first attempt rank ``raise_rank`` raises at step
    ``raise_at`` (-1: never)."""
    import torch
    import torch.distributed as dist

    import dask_ddp

    info = dask_ddp.rank_info()
    total = 0.0
    for step in range(steps):
        if info.restart == 0 and info.rank == raise_rank and step == raise_at:
            raise RuntimeError(f"chaos boom on rank {info.rank}")
        x = torch.ones(1)
        dist.all_reduce(x)
        total += x.item()
        time.sleep(0.05)
    return {"rank": info.rank, "total": total, "restart": info.restart}


def uneven_collectives(pause: float) -> int:
    """Rank r all-reduces 3 + r times: rank 0 returns, rank 1 waits in its 4th for good
    (the most common real hang: uneven data, an early break)."""
    import torch
    import torch.distributed as dist

    time.sleep(pause)
    t = torch.ones(1)
    for _ in range(3 + dist.get_rank()):
        dist.all_reduce(t)
    return dist.get_rank()


def long_eval_on_rank0(seconds: float, others: str) -> int:
    """Rank 0 alone computes for ``seconds`` while the others wait (``others``: "barrier":
    in ``dist.barrier()``; "return": returned from the function): a healthy job."""
    import torch.distributed as dist

    rank = dist.get_rank()
    if rank == 0:
        deadline = time.monotonic() + seconds
        x = 0
        while time.monotonic() < deadline:  # busy, as an evaluation is
            x += 1
    if others == "barrier":
        dist.barrier()
    return rank


def collectives_forever() -> int:
    """All-reduce until stopped (a frozen peer leaves the others blocked in one)."""
    import torch
    import torch.distributed as dist

    t = torch.ones(1)
    while True:
        dist.all_reduce(t)
        time.sleep(0.02)


def ddp_uneven_steps(pause: float) -> int:
    """Rank r trains 3 + r DDP steps (uneven data): rank 0 returns and waits at the end,
    rank 1 blocks for good in its 4th ``backward()``, in DDP's gradient all-reduce."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    time.sleep(pause)
    model = DistributedDataParallel(torch.nn.Linear(8, 2))
    for _ in range(3 + dist.get_rank()):
        model(torch.randn(4, 8)).sum().backward()
    return dist.get_rank()


def ddp_frozen_inside_allreduce(hold: float) -> int:
    """Two DDP steps; in the third, rank 1 stops itself (SIGSTOP) inside DDP's gradient
    all-reduce once its probe could read that collective (``hold`` seconds after issuing
    it, from its comm hook), and rank 0 issues the same all-reduce only after that: both
    count the same collective, and rank 0 waits in it for good."""
    import signal

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    model = DistributedDataParallel(torch.nn.Linear(8, 2))
    calls = []

    def freeze_in_third(state, bucket):  # type: ignore[no-untyped-def]  # torch reads
        # the annotations: a string one is refused
        work = dist.all_reduce(bucket.buffer(), async_op=True)
        calls.append(work)
        if len(calls) == 3:
            time.sleep(hold)  # the probe reads the flight recorder twice a second
            os.kill(os.getpid(), signal.SIGSTOP)
        return work.get_future().then(lambda f: f.value()[0])

    if dist.get_rank() == 1:
        model.register_comm_hook(None, freeze_in_third)
    for step in range(3):
        if step == 2 and dist.get_rank() == 0:
            time.sleep(hold + 3)  # rank 1 is stopped by now
        model(torch.ones(4, 8)).sum().backward()
    return dist.get_rank()


def ddp_compute_after_backward(seconds: float) -> int:
    """Both ranks train 3 DDP steps; then rank 1 computes for ``seconds`` (busy, no
    collective) while rank 0 returns and waits at the end: a healthy job."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    model = DistributedDataParallel(torch.nn.Linear(8, 2))
    for _ in range(3):
        model(torch.randn(4, 8)).sum().backward()
    if dist.get_rank() == 1:
        deadline = time.monotonic() + seconds
        x = 0
        while time.monotonic() < deadline:  # busy, as an evaluation is
            x += 1
    return dist.get_rank()


def ddp_uneven_steps_with_buffers(pause: float) -> int:
    """As :func:`ddp_uneven_steps` with a BatchNorm: DDP broadcasts its buffers from rank 0
    in each forward, so rank 1's extra step blocks in ``forward()``, in that broadcast."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    time.sleep(pause)
    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.BatchNorm1d(4)))
    for _ in range(3 + dist.get_rank()):
        model(torch.randn(4, 8)).sum().backward()
    return dist.get_rank()


def spin_with_pid(folder: str) -> int:
    """A rank that writes its pid to ``folder/rank-N.pid``, then reports until stopped."""
    import torch.distributed as dist

    import dask_ddp

    rank = dist.get_rank()
    with open(os.path.join(folder, f"rank-{rank}.pid"), "w") as f:
        f.write(str(os.getpid()))
    while True:
        dask_ddp.report({"loss": 1.0})
        time.sleep(0.05)
