"""Recovery policies (``dask_ddp.recovery``): the built-ins' pure decisions for every kind
of event, and a policy of this module's own ("regroup on a lost worker, restart on
anything else") run through real faults on the session cluster, nothing in ``src/``
written for it: a worker SIGKILLed (the others go on smaller), a rank that raises and a
rank process SIGKILLed (the job restarts whole and completes). Then a policy that answers
``CONTINUE`` to a lost worker, and one defined in a user's script (``__main__``, pickled
by value)."""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from distributed import Client

import dask_ddp
import live_util
from cluster_util import client_fixture
from dask_ddp.errors import FailureKind
from dask_ddp.recovery import LIVE, RESTART, Action, Policy, RecoveryStatus
from elastic_util import return_when_told
from examples_util import run as run_script
from waits import FAST_LAUNCH_WAITS, WORKER_CHECK, wait_until

# -- the built-ins, pure ---------------------------------------------------------------
LEFT = (FailureKind.LOST, FailureKind.DIED)
NOT_LEFT = [k for k in FailureKind if k not in LEFT]


def status(kind: FailureKind, **fields: Any) -> RecoveryStatus:
    return RecoveryStatus(kind, **{"rank": 1, **fields})


@pytest.mark.parametrize("kind", list(FailureKind), ids=str)
def test_restart_restarts_any_kind_while_restarts_are_left(kind: FailureKind) -> None:
    for live in (None, 0, 2):
        assert RESTART.decide(status(kind, max_restarts=1, live_workers=live)) \
            is Action.RESTART
        assert RESTART.decide(status(kind, restarts=2, max_restarts=3, frozen=True)) \
            is Action.RESTART
        assert RESTART.decide(status(kind, max_restarts=0, live_workers=live)) is Action.RAISE
        assert RESTART.decide(status(kind, restarts=1, max_restarts=1)) is Action.RAISE
        assert RESTART.decide(status(kind, restarts=5, max_restarts=3)) is Action.RAISE


@pytest.mark.parametrize("kind", LEFT, ids=str)
def test_live_regroups_a_rank_that_left_while_enough_run(kind: FailureKind) -> None:
    # The rank's supervisor cannot count the group (None): the group checks as it re-forms.
    assert LIVE.decide(status(kind)) is Action.REGROUP
    assert LIVE.decide(status(kind, live_workers=2, min_workers=2)) is Action.REGROUP
    assert LIVE.decide(status(kind, live_workers=1, min_workers=2, max_restarts=1)) \
        is Action.RESTART
    assert LIVE.decide(status(kind, live_workers=1, min_workers=2)) is Action.RAISE
    # The attempt ended (the elastic driver asks): a whole restart, or the error.
    assert LIVE.decide(status(kind, live_workers=0, max_restarts=1)) is Action.RESTART
    assert LIVE.decide(status(kind, live_workers=0)) is Action.RAISE


def test_live_regroups_a_frozen_rank_only() -> None:
    frozen = status(FailureKind.STALLED, frozen=True, live_workers=2, max_restarts=1)
    assert LIVE.decide(frozen) is Action.REGROUP
    blocked = status(FailureKind.STALLED, live_workers=2, max_restarts=1)
    assert LIVE.decide(blocked) is Action.RESTART
    assert RESTART.decide(frozen) is Action.RESTART


@pytest.mark.parametrize("kind", NOT_LEFT, ids=str)
def test_live_restarts_a_rank_that_raised_stalled_or_was_aborted(kind: FailureKind) -> None:
    for live in (None, 0, 2):
        assert LIVE.decide(status(kind, live_workers=live, max_restarts=1)) is Action.RESTART
        assert LIVE.decide(status(kind, live_workers=live, restarts=1, max_restarts=1)) \
            is Action.RAISE


def test_neither_built_in_continues_and_only_live_regroups() -> None:
    answers = {p.name: {p.decide(status(k, live_workers=w, frozen=f, restarts=r,
                                        max_restarts=1))
                        for k in FailureKind for w in (None, 0, 1, 3) for f in (False, True)
                        for r in (0, 1)}
               for p in (RESTART, LIVE)}
    assert answers == {"restart": {Action.RESTART, Action.RAISE},
                       "live": {Action.REGROUP, Action.RESTART, Action.RAISE}}


# -- a policy of this module's own, through real faults --------------------------------
def regroup_lost_workers(s: RecoveryStatus) -> Action:
    """Regroup on a lost worker while the attempt runs; restart on anything else."""
    if s.kind is FailureKind.LOST and s.live_workers != 0:
        return Action.REGROUP
    return Action.RESTART if s.restarts_left else Action.RAISE


MINE = Policy("regroup-lost-workers", regroup_lost_workers, regroups=True)

client = client_fixture(3)


@pytest.fixture(autouse=True)
def _all_workers_back(client: Client) -> None:
    """A worker the test before killed is back (its nanny restarts it)."""
    client.wait_for_workers(3, timeout=120)


def _step(folder: Path, rank: int) -> int:
    try:
        return int((folder / f"step{rank}").read_text() or -1)
    except (FileNotFoundError, ValueError):
        return -1


def _at_step(folder: Path, rank: int, step: int, job: Any) -> None:
    def missing() -> str | None:
        if job.done():
            job.result()  # raises the job's error: it ended before the rank got there
        return None if _step(folder, rank) >= step else f"rank {rank} at {_step(folder, rank)}"

    wait_until(missing, 120, f"rank {rank} to reach step {step}")


def _submit(client: Client, folder: Path, steps: int, **kwargs: Any) -> Any:
    job = dask_ddp.submit(client, live_util.live_train, str(folder), steps, 0.01,
                          recovery=MINE, max_restarts=1, progress=False, **kwargs)
    assert isinstance(job, dask_ddp.ElasticJob)
    return job


def _finished_whole(job: Any, restart_kinds: set[str]) -> None:
    values = job.result(timeout=180)
    assert len(values) == 3 and len({v["hash"] for v in values}) == 1, values
    assert {(v["world"], v["generation"]) for v in values} == {(3, 0)}, values
    (restart,) = job.restarts
    assert restart.kind in restart_kinds, restart


@pytest.mark.timeout(300)
def test_a_lost_worker_is_regrouped_without(client: Client, tmp_path: Path) -> None:
    job = _submit(client, tmp_path, 150)
    pids = client.run(os.getpid)
    _at_step(tmp_path, 1, 20, job)
    os.kill(pids[job.workers[1]], signal.SIGKILL)
    values = job.result(timeout=120)
    assert sorted(v["rank"] for v in values) == [0, 1], values
    assert {(v["world"], v["generation"]) for v in values} == {(2, 1)}, values
    assert len({v["hash"] for v in values}) == 1, values
    assert job.restarts == []
    (gen,) = job.generations
    assert gen.lost == (1,) and gen.world_size == 2, gen


@pytest.mark.timeout(300)
def test_a_rank_that_raised_restarts_the_job(client: Client, tmp_path: Path) -> None:
    job = _submit(client, tmp_path, 40, raise_at=(1, 5))
    _finished_whole(job, {"raised", "raised-first"})
    assert "rank 1 raises at step 5" in str(job.restarts[0])


@pytest.mark.timeout(300)
def test_a_rank_process_that_died_restarts_the_job(client: Client, tmp_path: Path) -> None:
    """Where ``recovery="live"`` regroups (test_live_job.test_rank_process_killed), this
    policy restarts: the policy decides, not the machinery."""
    job = _submit(client, tmp_path, 60)
    _at_step(tmp_path, 1, 10, job)
    os.kill(int((tmp_path / "pid1").read_text()), signal.SIGKILL)
    _finished_whole(job, {"died"})


# -- CONTINUE: the peers of a lost worker go on ----------------------------------------
def continue_always(s: RecoveryStatus) -> Action:
    """Never stop anything: a lost worker's peers go on; an ended attempt's error stands."""
    return Action.CONTINUE


GO_ON = Policy("go-on", continue_always)


@pytest.mark.timeout(300)
def test_continue_lets_a_lost_workers_peers_run_to_their_end(client: Client,
                                                             tmp_path: Path) -> None:
    """Rank 1's worker is SIGKILLed; the policy answers CONTINUE: rank 0 is not aborted and
    returns from its function after the loss was seen. The attempt then ends with the
    lost rank's error (rank 0 cannot wait for a peer that will never finish), and
    CONTINUE to the ended attempt restarts nothing: the job raises it."""
    job = dask_ddp.submit(client, return_when_told, str(tmp_path), 120.0, n_workers=2,
                          recovery=GO_ON, max_restarts=1, progress=False)
    assert isinstance(job, dask_ddp.ElasticJob)

    def not_running() -> list[int] | None:
        if job.done():
            job.result()  # raises the job's error: it ended before its ranks ran
        return [r for r in (0, 1) if not (tmp_path / f"running{r}").exists()]

    wait_until(not_running, 120, "both ranks running")
    os.kill(client.run(os.getpid)[job.workers[1]], signal.SIGKILL)
    wait_until(lambda: None if job.futures[1].status == "cancelled" else
               f"rank 1's future {job.futures[1].status}", 60,
               "the watcher to find rank 1's worker gone")
    # Several checks of the watcher: any other answer would have aborted rank 0 by now.
    time.sleep(4 * WORKER_CHECK)
    assert not job.done() and job.futures[0].status == "pending", job
    (tmp_path / "go").touch()
    with pytest.raises(dask_ddp.WorkerLostError) as info:
        job.result(timeout=120)
    assert (tmp_path / "returned0").exists(), "rank 0 was stopped before its end"
    assert info.value.rank == 1 and info.value.kind == "lost", info.value
    assert job.restarts == [] and len(info.value.attempts) == 1, info.value.attempts
    assert str(job.state) == "failed"


# -- a policy of a user's script: defined in __main__, pickled by value ----------------
SCRIPT = textwrap.dedent("""\
    import json
    import sys

    import dask
    from distributed import Client

    import dask_ddp
    from dask_ddp.errors import FailureKind
    from dask_ddp.recovery import Action, Policy


    def restart_once(status):
        # A rank that raised restarts the job once; anything else raises.
        raised = status.kind in (FailureKind.RAISED, FailureKind.RAISED_FIRST)
        return Action.RESTART if raised and status.restarts == 0 else Action.RAISE


    def train():
        import torch.distributed as dist

        info = dask_ddp.rank_info()
        dist.barrier()
        if info.rank == 1 and info.restart < 2:
            raise ValueError(f"rank 1 fails attempt {info.restart}")
        return info.restart


    if __name__ == "__main__":
        dask.config.set(json.loads(sys.argv[2]))
        with Client(sys.argv[1]) as client:
            job = dask_ddp.submit(client, train, n_workers=2, max_restarts=3,
                                  recovery=Policy("restart-once", restart_once),
                                  progress=False)
            try:
                job.result(timeout=150)
                error = None
            except dask_ddp.JobError as err:
                error = {"type": type(err).__name__, "rank": err.rank,
                         "attempts": [a.reason for a in err.attempts]}
            print(json.dumps({"module": restart_once.__module__, "job": type(job).__name__,
                              "restarts": len(job.restarts), "error": error}))
""")


@pytest.mark.timeout(300)
def test_a_policy_of_a_users_script_is_obeyed(client: Client, tmp_path: Path) -> None:
    """A script defines its policy at its top level (``__main__``: cloudpickle sends it to
    the workers by value, in the job's options) and runs a job whose rank 1 raises in
    its first two attempts. The policy restarts once, then raises, where the built-in
    ``"restart"`` would have used ``max_restarts=3`` and succeeded in the third."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    done = run_script([sys.executable, str(script), client.scheduler.address,
                       json.dumps(FAST_LAUNCH_WAITS)], tmp_path, timeout=240)
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["module"] == "__main__" and out["job"] == "ElasticJob", out
    assert out["restarts"] == 1, out
    error = out["error"]
    assert error is not None and error["type"] == "RankFailedError" and error["rank"] == 1, out
    assert len(error["attempts"]) == 2 and "fails attempt 1" in error["attempts"][1], out
