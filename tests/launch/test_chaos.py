"""Random faults on one cluster: after each, nothing is left behind and the error is right.

Each run starts a 2-rank job (``submit``, the seed's ``dispatch.run`` + ``gather``, or a
job submitted by a client in a subprocess) and, at a random time, SIGKILLs a rank's worker
(its nanny brings it back), SIGKILLs a rank process, makes a rank raise, SIGSTOPs a rank
(a frozen rank: the job must end as a stall within ``stall_timeout``), or SIGKILLs the
client process; half the runs have ``max_restarts=1``. After each: no rank process, no
task of the job active on the scheduler, no results topic on the scheduler, no work dir of
the job; and the error names the root cause, or the restarted job returned the right
result. The seed is printed; ``DASK_DDP_CHAOS_SEED=N`` replays it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
from distributed import Client

import dask_ddp
from cluster_util import client_fixture, rank_processes, wait_rank_processes, worker_fates
from dask_ddp import dispatch
from launch_util import (
    active_tasks,
    chaos_train,
    results_topics,
    wait_until,
    work_dirs,
)
from waits import WORKER_CHECK

pytestmark = [pytest.mark.dask, pytest.mark.slow, pytest.mark.timeout(600)]

logger = logging.getLogger(__name__)

STEPS = 40          # ~2 s of collectives per attempt
FAULTS = ("worker", "rank", "raise", "stop", "client")
#: ``make test``'s smoke run, in random order: a killed rank process without a restart
#: (through ``submit`` or the seed's API at random) and a killed client. Each fault has its
#: deterministic test in the fault matrix (docs/testing.md): a killed rank and a frozen
#: one, restarted or not (test_fault_matrix.py, test_stall.py), a killed worker
#: (test_faults.py; restarted: test_elastic_job.py, test_restarts.py), a rank that raises
#: (test_dispatch.py; restarted: test_elastic_job.py).
SMOKE = (("rank", 0), ("client", 0))
#: ``DASK_DDP_CHAOS_RUNS=N`` (``make stress``): N runs, every fault without and with a
#: restart, the pairs repeated.
RUNS = int(os.environ.get("DASK_DDP_CHAOS_RUNS", "0")) or None
#: The jobs' stall_timeout: a frozen rank ends the job within it.
STALL_S = 16 * WORKER_CHECK
CLEAN_S = 20.0      # "within seconds": the budget for everything to be gone

CLIENT_SCRIPT = """
import sys, time
sys.path.insert(0, {tests!r})
from distributed import Client
import dask_ddp
from launch_util import chaos_train
client = Client({addr!r})
job = dask_ddp.submit(client, chaos_train, {steps}, -1, -1, n_workers=2, name={name!r},
                      max_restarts={restarts}, progress=False)
print(job.id, flush=True)
time.sleep(600)
"""


@dataclass
class Run:
    index: int
    fault: str
    restarts: int
    victim: int
    delay: float
    seed_api: bool

    @property
    def name(self) -> str:
        return f"chaos{self.index}"


def plan(seed: int) -> list[Run]:
    rng = random.Random(seed)
    # Every kind of fault without and with a restart (from 2 * len(FAULTS) runs on), or
    # the smoke run's, in random order.
    pairs = (list(SMOKE) if RUNS is None else
             [(FAULTS[i // 2 % len(FAULTS)], i % 2) for i in range(RUNS)])
    rng.shuffle(pairs)
    runs = []
    for i, (fault, restarts) in enumerate(pairs):
        runs.append(Run(i, fault, restarts, rng.randrange(2), rng.uniform(0.2, 1.5),
                        seed_api=not restarts and rng.random() < 0.5))
    return runs


client = client_fixture(2)


def test_random_faults_leave_nothing_behind(client: Client, tmp_path: Path) -> None:
    seed = int(os.environ.get("DASK_DDP_CHAOS_SEED", random.randrange(1 << 30)))
    print(f"\nchaos seed {seed} (replay: DASK_DDP_CHAOS_SEED={seed})",  # noqa: T201
          file=sys.stderr)
    t0 = time.monotonic()
    for run in plan(seed):
        t = time.monotonic()
        try:
            job_ids = one_run(client, run, tmp_path)
            check_nothing_left(client, run, job_ids)
        except BaseException as exc:
            raise AssertionError(f"chaos seed {seed}, {run}: {exc}\nthe cluster's record "
                                 f"of workers leaving:\n{worker_fates(client)}") from exc
        print(f"  {run}: ok in {time.monotonic() - t:.1f} s",  # noqa: T201
              file=sys.stderr)
    print(f"chaos: {len(plan(seed))} runs in {time.monotonic() - t0:.0f} s",  # noqa: T201
          file=sys.stderr)


def one_run(client: Client, run: Run, tmp_path: Path) -> list[str]:
    """Start the job, strike, check the outcome; the ids of the job's attempts."""
    client.wait_for_workers(2, timeout=60)
    addr = client.scheduler.address
    if run.fault == "client":
        return client_run(client, run, tmp_path)
    raise_at = int(run.delay / 0.05) if run.fault == "raise" else -1
    args = (chaos_train, STEPS, run.victim if run.fault == "raise" else -1, raise_at)
    if run.seed_api:
        futures = dispatch.run(client, *args, stall_timeout=STALL_S)
        job: Any = dispatch.job_of(futures)
    else:
        job = dask_ddp.submit(client, *args, n_workers=2, name=run.name,
                              max_restarts=run.restarts, progress=False,
                              stall_timeout=STALL_S)
    workers = list(job.workers)
    wait_rank_processes(addr, 2)
    time.sleep(run.delay)
    if run.fault == "worker":
        pid = client.run(os.getpid, workers=[workers[run.victim]])[workers[run.victim]]
        os.kill(pid, signal.SIGKILL)
    elif run.fault in ("rank", "stop"):
        procs = [p for p in rank_processes(addr) if p.environ().get("RANK") == str(run.victim)]
        assert procs, "the victim's rank process is gone before the fault"
        procs[0].send_signal(signal.SIGKILL if run.fault == "rank" else signal.SIGSTOP)
    t_fault = time.monotonic()
    try:
        if run.seed_api:
            value = client.gather(futures)
        else:
            value = job.result(timeout=120)
    except BaseException as exc:  # noqa: BLE001 - checked against the fault
        assert not run.restarts, f"the restarted job failed: {exc!r}"
        check_root_cause(run, workers, exc)
        if run.fault == "stop":  # stall_timeout, plus the ranks' polls and the stacks
            assert time.monotonic() - t_fault < STALL_S + 30, "the stall came late"
    else:
        assert run.restarts, f"the job survived a {run.fault} fault: {value}"
        assert [v["rank"] for v in value] == [0, 1]
        assert all(v["total"] == 2.0 * STEPS and v["restart"] == 1 for v in value), value
        assert len(job.restarts) == 1, job.restarts
        if run.fault == "stop":
            assert job.restarts[0].kind == "stalled", job.restarts
        else:
            assert job.restarts[0].rank == run.victim, job.restarts
    attempts = getattr(job, "attempts", [job])
    return [a.id for a in attempts]


def check_root_cause(run: Run, workers: list[str], exc: BaseException) -> None:
    text = str(exc)
    assert f"rank {run.victim}" in text, text
    if run.fault == "worker":
        assert workers[run.victim] in text and "left the cluster" in text, text
    elif run.fault == "rank":
        assert "killed by signal SIGKILL" in text, text
    elif run.fault == "stop":
        assert isinstance(exc, dask_ddp.StallError), repr(exc)
        assert run.victim in exc.ranks and f"rank {run.victim} frozen" in text, text
    else:
        assert f"chaos boom on rank {run.victim}" in text, text


def client_run(client: Client, run: Run, tmp_path: Path) -> list[str]:
    addr = client.scheduler.address
    script = tmp_path / f"{run.name}.py"
    tests = str(Path(__file__).resolve().parents[1])  # tests/: the shared helpers
    script.write_text(CLIENT_SCRIPT.format(tests=tests, addr=addr, steps=STEPS * 100,
                                           name=run.name, restarts=run.restarts))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(Path(dask_ddp.__file__).parents[1]), tests, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, env=env)
    try:
        assert proc.stdout is not None
        job_id = proc.stdout.readline().decode().strip()
        assert job_id, "the client process printed no job id"
        wait_rank_processes(addr, 2)
        time.sleep(run.delay)
    finally:
        proc.kill()
        proc.wait()
    return [job_id]


def live_ranks(addr: str) -> list[tuple[int, str]]:
    """(pid, command line) of the cluster's rank processes still alive."""
    found = []
    for p in rank_processes(addr):
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            found.append((p.pid, " ".join(p.cmdline())))
    return found


def check_nothing_left(client: Client, run: Run, job_ids: list[str]) -> None:
    addr = client.scheduler.address
    wait_until(lambda: live_ranks(addr), CLEAN_S, "rank processes alive")
    wait_until(lambda: client.run_on_scheduler(active_tasks, f"{run.name}-")
               + sum((client.run_on_scheduler(active_tasks, j) for j in job_ids), []),
               CLEAN_S, "tasks of the job active on the scheduler")
    wait_until(lambda: [t for t in client.run_on_scheduler(results_topics)
                        if any(j in t for j in job_ids)], CLEAN_S, "results topics left")
    wait_until(lambda: sum((work_dirs(j) for j in job_ids), []), CLEAN_S, "work dirs left")
