"""Helpers shared by the launch tests: clusters, rank-side functions, process checks.

The rank-side functions live here (an importable module) so the rank processes can
unpickle them by reference.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import psutil
import pytest
from distributed import Client

from cluster_lease import LEASE_SHAPES, local_cluster, restart_after
from waits import wait_until

__all__ = ["client_fixture", "cluster_client", "local_cluster", "restart_after"]


@contextlib.contextmanager
def cluster_client(n_workers: int, threads_per_worker: int = 1) -> Iterator[Client]:
    """A client of a fresh local cluster, for a test of the cluster itself (the others
    lease the session's: :func:`client_fixture`); on exit, no rank process or warm
    template of it may be left."""
    with local_cluster(n_workers, threads_per_worker) as cluster, Client(cluster) as c:
        yield c
        addr = c.scheduler.address
    wait_no_rank_processes(addr, 10)
    wait_no_template_processes(addr, 10)


def client_fixture(n_workers: int, threads_per_worker: int = 1) -> Any:
    """A module's ``client`` fixture: each test leases this process's cluster at
    ``n_workers`` workers (:mod:`cluster_lease`).

    Use as ``client = client_fixture(2)`` at module level; the ``dask`` marker follows
    from the fixture's name (tests/conftest.py), and the module's tests are scheduled
    beside others of the same size (fewer rescales).
    """
    module = sys._getframe(1).f_globals.get("__name__", "")
    LEASE_SHAPES[module] = (threads_per_worker, n_workers)

    @pytest.fixture
    def client(lease: Any) -> Iterator[Client]:
        with lease(n_workers, threads_per_worker) as c:
            yield c

    return client


def worker_fates(client: Client, limit: int = 40) -> str:
    """What the cluster recorded of its workers leaving, for a failing test's message: the
    scheduler's remove-worker events (the stimulus says why: a closed comm, a worker's own
    close, a missed heartbeat), the workers' fail-hard events, and the nannies' log lines
    on their worker processes' deaths (the exit code or signal)."""
    lines: list[str] = []
    with contextlib.suppress(Exception):
        for t, msg in client.get_events("all"):
            if isinstance(msg, dict) and msg.get("action") == "remove-worker":
                lines.append(f"{time.strftime('%H:%M:%S', time.localtime(t))} remove-worker "
                             f"{msg.get('worker')} stimulus={msg.get('stimulus_id')} "
                             f"expected={msg.get('expected')}")
    with contextlib.suppress(Exception):
        for t, msg in client.get_events("worker-fail-hard"):
            lines.append(f"{time.strftime('%H:%M:%S', time.localtime(t))} fail-hard {msg}")
    with contextlib.suppress(Exception):
        # A LocalCluster's nannies share one process and so one log: each line once.
        seen: set[str] = set()
        for logs in client.get_worker_logs(nanny=True).values():
            for _, text in logs:
                if text not in seen and any(k in text for k in (
                        "Worker process", "Restarting", "fail", "Closing")):
                    seen.add(text)
                    lines.append(f"nanny: {text[:300]}")
    return "\n".join(lines[-limit:]) or "(nothing recorded)"


#: A rank forked by a warm template is named so (``prctl(PR_SET_NAME)``) and its command line
#: reads as a cold rank's; the template's own command line names its module.
WARM_RANK_NAME = "ddp-rank-"
TEMPLATE_MARKER = "dask_ddp._launch.rank.warm_template"


def _cluster_processes(scheduler: str, match: Any) -> list[psutil.Process]:
    """Live processes of the cluster at ``scheduler`` that ``match(name, cmdline)``: by
    the ``DASK_DDP_SCHEDULER`` the launcher sets, so other clusters' processes on the same
    machine do not count (orphans included)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "name", "pid"]):
        try:
            cmd = " ".join(proc.info["cmdline"] or [])
            if proc.pid == os.getpid() or not match(proc.info["name"] or "", cmd):
                continue
            if proc.environ().get("DASK_DDP_SCHEDULER") != scheduler:
                continue
            if proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def rank_processes(scheduler: str,
                   marker: str = "dask_ddp._launch.rank.main") -> list[psutil.Process]:
    """Live rank processes of jobs on the cluster at ``scheduler``.

    Matched by ``marker`` in the command line, or (the rank module's marker) by a warm
    rank's name; a warm template is not a rank.
    """
    def is_rank(name: str, cmd: str) -> bool:
        if marker in cmd:
            return True
        return marker == "dask_ddp._launch.rank.main" and name.startswith(WARM_RANK_NAME)

    return _cluster_processes(scheduler, is_rank)


def template_processes(scheduler: str) -> list[psutil.Process]:
    """Live warm templates of the cluster at ``scheduler`` (not the ranks they forked)."""
    return _cluster_processes(scheduler, lambda name, cmd: TEMPLATE_MARKER in cmd
                              and not name.startswith(WARM_RANK_NAME))


def _described(procs: list[psutil.Process]) -> list[tuple[int, list[str]]]:
    found = []
    for p in procs:
        try:  # one may end (or be a zombie being reaped) while it is looked at
            found.append((p.pid, p.cmdline()))
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def wait_no_rank_processes(scheduler: str, timeout: float = 30.0,
                           marker: str = "dask_ddp._launch.rank.main") -> None:
    """Fail unless every rank process of the cluster is gone within ``timeout`` seconds."""
    wait_until(lambda: _described(rank_processes(scheduler, marker)), timeout,
               "rank processes still running")


def wait_no_template_processes(scheduler: str, timeout: float = 30.0) -> None:
    """Fail unless every warm template of the cluster is gone within ``timeout`` seconds
    (a template must not outlive its worker)."""
    wait_until(lambda: _described(template_processes(scheduler)), timeout,
               "warm templates still running")


def wait_rank_processes(scheduler: str, n: int, timeout: float = 60.0,
                        marker: str = "dask_ddp._launch.rank.main") -> None:
    """Wait until at least ``n`` rank processes of the cluster run."""
    def fewer() -> str | None:
        running = len(rank_processes(scheduler, marker))
        return f"{running} running" if running < n else None

    wait_until(fewer, timeout, f"fewer than {n} rank processes")


# -- functions run inside rank processes ----------------------------------------------------

def all_reduce_rank(offset: float) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    import dask_ddp

    info = dask_ddp.rank_info()
    t = torch.tensor([float(dist.get_rank()) + offset])
    dist.all_reduce(t)
    return {"sum": t.item(), "rank": info.rank, "local_rank": info.local_rank,
            "world": info.world_size, "local_world": info.local_world_size,
            "backend": dist.get_backend(), "pid": os.getpid(), "env": {
                k: os.environ.get(k) for k in (
                    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                    "MASTER_PORT", "CUDA_VISIBLE_DEVICES", "DASK_DDP_JOB_NAME",
                    "GLOO_SOCKET_IFNAME", "DASK_DDP_WORKER")}}


def raise_on_rank(bad_rank: int, message: str) -> int:
    import torch
    import torch.distributed as dist

    if dist.get_rank() == bad_rank:
        raise ValueError(message)
    t = torch.zeros(1)
    while True:  # the healthy ranks sit in a collective the bad rank never joins
        dist.all_reduce(t)


def exit_on_rank(bad_rank: int, code: int) -> int:
    import torch.distributed as dist

    if dist.get_rank() == bad_rank:
        time.sleep(0.5)
        os._exit(code)
    time.sleep(600)  # not in a collective: only the launcher can stop this rank
    return 0


def sleep_in_collectives(seconds: float) -> int:
    """All-reduce until ``seconds`` passed; the ranks decide to stop together (each step
    all-reduces "my time is up" with MAX), so no rank leaves a peer in a collective."""
    import torch
    import torch.distributed as dist

    deadline = time.monotonic() + seconds
    while True:
        done = torch.tensor([1.0 if time.monotonic() >= deadline else 0.0])
        dist.all_reduce(done, op=dist.ReduceOp.MAX)
        if done.item() > 0:
            return dist.get_rank()
        time.sleep(0.05)


def print_rank() -> None:
    import dask_ddp

    info = dask_ddp.rank_info()
    print(f"hello from {info.rank} of {info.world_size}")  # noqa: T201 - the output under test


def sleep_only(seconds: float) -> int:
    """Sleep outside any collective: gloo cannot notice a dead peer, only the launcher can."""
    time.sleep(seconds)
    return 0


def with_local_rank(local_rank: int) -> int:
    return local_rank


def ddp_train(steps: int, batch: int, seed: int) -> dict[str, Any]:
    """Train a small model with DDP on rank-sharded slices of fixed global batches."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, world = dist.get_rank(), dist.get_world_size()
    model = make_model(seed)
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(steps):
        x, y = global_batch(step, batch * world, seed)
        xs, ys = x[rank * batch:(rank + 1) * batch], y[rank * batch:(rank + 1) * batch]
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(xs), ys)
        loss.backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def make_model(seed: int) -> Any:
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def global_batch(step: int, size: int, seed: int) -> tuple[Any, Any]:
    import torch

    g = torch.Generator().manual_seed(seed * 1000 + step)
    x = torch.randn(size, 8, generator=g)
    return x, x.sum(dim=1, keepdim=True).sin()


def train_single(steps: int, global_size: int, seed: int) -> dict[str, Any]:
    """The same training in one process, on the whole global batches."""
    import torch

    model = make_model(seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        x, y = global_batch(step, global_size, seed)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


class SquaresDataset:
    def __len__(self) -> int:
        return 32

    def __getitem__(self, i: int) -> Any:
        import torch

        return torch.tensor([float(i * i)]), os.getpid()


def dataloader_rank(num_workers: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    loader = torch.utils.data.DataLoader(SquaresDataset(), batch_size=4,
                                         num_workers=num_workers)
    total = 0.0
    pids: set[int] = set()
    for x, pid in loader:
        total += float(x.sum())
        pids.update(int(p) for p in pid)
    t = torch.tensor([total])
    dist.all_reduce(t)
    return {"total": t.item(), "loader_pids": sorted(pids), "pid": os.getpid()}


def rank_facts(note: str) -> dict[str, Any]:
    """What a rank process is, as its function sees it: environment, parentage, argv,
    working directory; ``note`` goes to its stdout and stderr, and its results channel."""
    import sys

    import torch

    os.write(int(os.environ["DASK_DDP_CHANNEL_FD"]), note.encode())
    print(f"out {note}", flush=True)  # noqa: T201 - the output under test
    print(f"err {note}", file=sys.stderr, flush=True)  # noqa: T201
    return {"env": dict(os.environ), "pid": os.getpid(), "ppid": os.getppid(),
            "pgid": os.getpgrp(), "sid": os.getsid(0), "cwd": os.getcwd(),
            "argv": list(sys.argv), "path0": sys.path[0], "threads": torch.get_num_threads(),
            "hashseed": sys.flags.hash_randomization, "fds": _open_fds()}


def _open_fds() -> list[str]:
    """What this process's open file descriptors are (their kinds, by number)."""
    kinds = []
    for fd in sorted(os.listdir("/proc/self/fd"), key=int):
        with contextlib.suppress(OSError):
            kinds.append(f"{fd}:{os.readlink(f'/proc/self/fd/{fd}').split(':')[0]}")
    return kinds


def exit_with(code: int) -> int:
    os._exit(code)


def child_then_sleep(pidfile: str) -> int:
    """Start a child in the rank's process group, name it in ``pidfile``, then sleep."""
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    with open(pidfile + ".tmp", "w") as f:
        f.write(str(child.pid))
    os.replace(pidfile + ".tmp", pidfile)
    time.sleep(600)
    return 0
