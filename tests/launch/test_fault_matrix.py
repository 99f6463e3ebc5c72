"""The fault matrix's cells that no other test of ``make test`` runs, once each.

``make test`` keeps one deterministic matrix: fault (a rank's process SIGKILLed, a frozen
rank, a rank that raises, its worker SIGKILLed, its worker retired) x recovery (restart,
live) x API (``submit``, the seed's ``dispatch.run``, a script through ``run_command``).
docs/testing.md maps every cell to its test; the cells here are the ones missing there.
Each is a 2-rank job of :func:`live_util.live_train`, whose rank 1 holds before a step
until it is struck (or raises there): so a strike always lands mid-run, on any machine.

What a user expects of each cell:

- ``restart`` with ``submit`` (``max_restarts=1``): the job completes after one restart,
  with every rank's result;
- ``restart`` with ``dispatch.run`` or a script, which take no ``max_restarts`` (0): the
  job ends at once with the named :class:`~dask_ddp.JobError` subclass, naming rank 1;
- ``live``: the survivor finishes in a group of one (generation 1); a rank that raised
  ends the job (``RankFailedError``), as the fault-tolerance page says.

Repetition is ``make stress``'s: it runs this module 20 times (STRESS_TESTS).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
from distributed import Client, wait

import dask_ddp
import live_util
from cluster_util import client_fixture
from dask_ddp import dispatch
from dask_ddp._launch.worker.workdir import clean_orphans
from launch_util import work_dirs
from waits import STALL_TIMEOUT, WORKER_CHECK, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

client = client_fixture(2)

STEPS = 40          # a run's steps: the survivor's rest takes about a second
HOLD_AT = 5         # the step rank 1 holds before
PAUSE = 0.01        # seconds between steps
#: A frozen rank's jobs: a stall within a few of the watcher's checks.
STALL_S = 8 * WORKER_CHECK
RESULT_S = 120.0    # bound on a job's end after the strike
VICTIM = live_util.VICTIM

#: A script run by ``run_command``: :func:`live_util.live_train` as its body, its result
#: in ``done<rank>``.
SCRIPT = """
import json, sys
from pathlib import Path
sys.path.insert(0, {tests!r})
import torch.distributed as dist
from live_util import live_train
out, steps, hold_at, fault = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
dist.init_process_group("gloo")
result = live_train(out, steps, {pause!r}, hold_at, fault)
Path(out, "done%d" % result["first_rank"]).write_text(json.dumps(result))
dist.destroy_process_group()
"""


@dataclass(frozen=True)
class Cell:
    fault: str     # "sigkill", "frozen", "raises", "lost-worker", "retired"
    recovery: str  # "restart", "live"
    api: str       # "submit", "seed", "script"

    @property
    def id(self) -> str:
        return f"{self.fault}-{self.recovery}-{self.api}"


#: The cells no other test of ``make test`` runs, by (recovery, API) (docs/testing.md has
#: the whole matrix).
MISSING = {
    ("restart", "submit"): ("sigkill", "frozen"),
    ("restart", "seed"): ("sigkill", "frozen", "retired"),
    ("restart", "script"): ("sigkill", "frozen", "retired"),
    ("live", "submit"): ("raises",),
    ("live", "script"): ("frozen", "raises", "lost-worker", "retired"),
}
CELLS = [Cell(fault, recovery, api) for (recovery, api), faults in MISSING.items()
         for fault in faults]

#: The error a job without a restart ends with, by fault, and what its message says.
ERRORS: dict[str, tuple[type[dask_ddp.JobError], str]] = {
    "sigkill": (dask_ddp.RankFailedError, "killed by signal SIGKILL"),
    "frozen": (dask_ddp.StallError, f"rank {VICTIM} frozen"),
    "raises": (dask_ddp.RankFailedError, f"rank {VICTIM} raises at step {HOLD_AT}"),
    "lost-worker": (dask_ddp.WorkerLostError, "left the cluster"),
    "retired": (dask_ddp.WorkerLostError, "left the cluster"),
}


@dataclass
class Started:
    """A job under way: how to wait for its outcome, and its ``Job`` (``submit``)."""

    outcome: Callable[[], Any]
    job: Any = None
    seed_job: Any = None


def start(client: Client, cell: Cell, out: Path) -> Started:
    """Start the cell's job through its API; rank 1 holds before step :data:`HOLD_AT`."""
    fault = "raise" if cell.fault == "raises" else ""
    stall = STALL_S if cell.fault == "frozen" else STALL_TIMEOUT
    if cell.api == "submit":
        job = dask_ddp.submit(client, live_util.live_train, str(out), STEPS, PAUSE, HOLD_AT,
                              fault, n_workers=2, recovery=cell.recovery, progress=False,
                              max_restarts=int(cell.recovery == "restart"),
                              stall_timeout=stall)
        return Started(lambda: job.result(timeout=RESULT_S), job=job)
    if cell.api == "seed":
        futures = dispatch.run(client, live_util.live_train, str(out), STEPS, PAUSE, HOLD_AT,
                               fault, stall_timeout=stall)

        def gathered() -> Any:
            try:
                wait(futures, timeout=RESULT_S)
                return client.gather(futures)
            except Exception as exc:
                # The seed's wait or gather raises the first failed future's error: the
                # struck rank's own future may be cancelled, its reason naming the rank;
                # the job's error is every other rank's.
                assert f"rank {VICTIM}" in str(exc), str(exc)
                raise futures[1 - VICTIM].exception() from exc

        return Started(gathered, seed_job=dispatch.job_of(futures))
    script = out.parent / "train.py"
    tests = str(Path(live_util.__file__).resolve().parent)
    script.write_text(SCRIPT.format(tests=tests, pause=PAUSE))
    pool = ThreadPoolExecutor(1)
    run = pool.submit(dask_ddp.run_command, client,
                      ["python", str(script), str(out), str(STEPS), str(HOLD_AT), fault],
                      n_workers=2, recovery=cell.recovery, stream_output=False,
                      timeout=RESULT_S, stall_timeout=stall)
    pool.shutdown(wait=False)
    return Started(lambda: run.result(timeout=RESULT_S + 30))


def strike(client: Client, cell: Cell, out: Path, started: Started
           ) -> tuple[psutil.Process, dict[str, str]]:
    """Once rank 1 holds: the cell's fault on it (a rank that raises strikes itself);
    rank 1's process and its environment (its worker, its job)."""
    def holding() -> str | None:
        if (out / "holding").exists():
            return None
        if started.job is not None and started.job.done():
            started.job.result()  # its error: it ended before the strike
        return "rank 1 not holding yet"

    wait_until(holding, RESULT_S, "rank 1 to hold before its strike")
    victim = psutil.Process(int((out / f"pid{VICTIM}").read_text()))
    env = victim.environ()
    worker = env["DASK_DDP_WORKER"]
    try:
        if cell.fault in ("sigkill", "frozen"):
            victim.send_signal(signal.SIGKILL if cell.fault == "sigkill" else signal.SIGSTOP)
        elif cell.fault == "lost-worker":
            os.kill(client.run(os.getpid, workers=[worker])[worker], signal.SIGKILL)
        elif cell.fault == "retired":
            client.retire_workers([worker], close_workers=True)
    finally:
        (out / "struck").touch()
    return victim, env


def sweep(client: Client, job_id: str) -> None:
    """A retired worker's process ends before its supervisor removed its rank's work dir:
    the next worker started on the host removes it; here the workers left sweep."""
    def left() -> list[str]:
        client.run(clean_orphans)
        return work_dirs(job_id)

    wait_until(left, RESULT_S, "the retired rank's work dir left")


def check_recovered(cell: Cell, out: Path, started: Started, value: Any) -> None:
    """The job, or its survivor, finished as the cell promises."""
    if cell.recovery == "restart":  # submit with max_restarts=1
        assert [v["rank"] for v in value] == [0, 1], value
        assert {(v["world"], v["restart"]) for v in value} == {(2, 1)}, value
        (restart,) = started.job.restarts
        assert restart.attempt == 0, restart
        if cell.fault == "frozen":  # the stall is told from the rank blocked by it
            assert restart.kind == "stalled" and f"rank {VICTIM} frozen" in restart.reason, \
                restart
        else:
            assert restart.kind == "died" and restart.rank == VICTIM, restart
        return
    if cell.api == "script":
        assert value == [0], value  # the survivor's exit code
        value = [json.loads(p.read_text()) for p in sorted(out.glob("done*"))]
    (survivor,) = value
    assert survivor["first_rank"] == 0, value
    assert (survivor["rank"], survivor["world"], survivor["generation"]) == (0, 1, 1), value
    if started.job is not None:
        (gen,) = started.job.generations
        assert gen.lost == (VICTIM,) and gen.world_size == 1, gen
        if cell.fault == "retired":
            assert "left at a step boundary" in gen.cause, gen


def check_error(cell: Cell, err: BaseException, worker: str) -> None:
    """The named error of a job that cannot go on, naming rank 1 (and its worker)."""
    cls, says = ERRORS[cell.fault]
    assert isinstance(err, cls), repr(err)
    # A stall names the rank blocked by the frozen one first, and the frozen one as such.
    assert VICTIM in (err.ranks if isinstance(err, dask_ddp.StallError) else [err.rank])
    assert f"rank {VICTIM}" in str(err) and says in str(err), str(err)
    if cell.fault in ("lost-worker", "retired"):
        assert err.worker == worker and worker in str(err), (worker, str(err))


def recovers(cell: Cell) -> bool:
    """Whether the cell's job finishes: a restart is there to spend, or a live group
    loses a rank (a rank that raised ends a live job too)."""
    if cell.recovery == "restart":
        return cell.api == "submit"
    return cell.fault != "raises"


@pytest.mark.parametrize("cell", CELLS, ids=lambda c: c.id)
def test_cell(cell: Cell, client: Client, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    started = start(client, cell, out)
    victim, env = None, {}
    try:
        if cell.fault != "raises":
            victim, env = strike(client, cell, out, started)
        if recovers(cell):
            check_recovered(cell, out, started, started.outcome())
        else:
            with pytest.raises(dask_ddp.JobError) as info:
                started.outcome()
            check_error(cell, info.value, env.get("DASK_DDP_WORKER", ""))
        if cell.fault == "retired":
            sweep(client, env["DASK_DDP_JOB_ID"])
    finally:
        (out / "struck").touch()
        if victim is not None and cell.fault == "frozen":
            with contextlib.suppress(psutil.Error):
                victim.kill()  # the launcher's job, unless the test failed first
