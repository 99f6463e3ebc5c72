"""Stall detection and live stacks: a job whose ranks can no longer make progress ends
with an error naming the stuck ranks, the collective and every rank's stack; a healthy job
where rank 0 alone computes for long is never taken for one."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import dask
import pytest
from distributed import Client

import dask_ddp
from cluster_util import client_fixture, rank_processes, sleep_only, wait_rank_processes
from dask_ddp import dispatch
from dask_ddp._launch.client.stall import find_stall
from dask_ddp._launch.wire.names import progress_topic
from launch_util import (
    collectives_forever,
    long_eval_on_rank0,
    uneven_collectives,
    wait_until,
)
from waits import WORKER_CHECK

pytestmark = [pytest.mark.timeout(180)]

client = client_fixture(2)

#: The jobs' stall_timeout: a few of the watcher's checks (the fast profile's).
STALL_S = 8 * WORKER_CHECK


def page_stall(job_id: str, dask_scheduler: Any = None) -> Any:
    """The stall on the job page's JSON (``client.run_on_scheduler``)."""
    body = dask_scheduler.extensions["dask_ddp_dashboard"].board.job_json(job_id, None)
    return None if body is None else body["job"].get("stall")


def test_ranks_disagreeing_on_collective_count_end_as_a_stall(client: Client) -> None:
    job = dask_ddp.submit(client, uneven_collectives, 0.0, n_workers=2, progress=False,
                          stall_timeout=STALL_S)
    t0 = time.monotonic()
    with pytest.raises(dask_ddp.StallError) as info:
        job.result(timeout=90)
    took = time.monotonic() - t0
    err = info.value
    text = str(err)
    assert err.ranks == [1] and err.rank == 1 and err.collective == "all_reduce", text
    assert "rank 1 blocked in all_reduce" in text and "rank 0 returned" in text, text
    # Each rank's stack: rank 1 inside all_reduce, rank 0 in the launcher's finish barrier.
    assert set(err.stacks) == {0, 1}, err.stacks
    assert "all_reduce" in err.stacks[1] and "uneven_collectives" in err.stacks[1]
    assert "_finish_barrier" in err.stacks[0]
    assert "Python stacks of the ranks" in text
    assert job.stalled is err
    # The seed's gather names the stall too, from every rank's future.
    with pytest.raises(dask_ddp.StallError):
        client.gather(job.futures)
    # The scheduler holds the stall for the job page (from the job's failure topic, which
    # is dropped a few seconds after the job's end): rank, collective, stacks.
    stall = client.run_on_scheduler(page_stall, job.id)
    assert stall and list(stall["ranks"]) == [1] and stall["collective"] == "all_reduce", stall
    assert "all_reduce" in stall["stacks"]["1"]
    logging.getLogger(__name__).warning("stall error after %.1f s (stall_timeout %g s):\n%s",
                                        took, STALL_S, text)


def test_a_collective_that_breaks_after_the_stall_still_names_the_stall(
        client: Client) -> None:
    # The supervisors look in every 3 stall timeouts only (from their rank's start), and
    # rank 1's collective times out 4 stall timeouts after it entered it (a few seconds
    # after the start): it breaks by itself after the stall was recorded (at the first
    # look) and before any supervisor stops a rank for it (at the second). Its own error
    # (a collective that timed out, the same as a peer stopped by the stall's end) gives
    # way to the stall: under load a peer stopped for the stall broke the collective
    # before the rank's supervisor stopped it, and the seed-style gather named that
    # broken collective.
    look, breaks = 3 * STALL_S, 4 * STALL_S
    with dask.config.set({"dask-ddp.launch.abort-poll": look}):
        job = dask_ddp.submit(client, uneven_collectives, 0.0, n_workers=2, progress=False,
                              stall_timeout=STALL_S,
                              init_kwargs={"timeout": timedelta(seconds=breaks)})
    with pytest.raises(dask_ddp.StallError):
        job.result(timeout=150)
    errors = [f.exception(timeout=30) for f in job.futures]
    assert all(isinstance(e, dask_ddp.StallError) for e in errors), errors
    # Rank 1's own error: its collective timed out (not a stop by its supervisor).
    own = errors[1].__cause__
    assert isinstance(own, dask_ddp.RankFailedError), repr(own)
    assert "timed out" in str(own).lower() and "all_reduce" in (own.remote_traceback or ""), own
    with pytest.raises(dask_ddp.StallError):
        client.gather(job.futures)


def test_a_rank_state_is_recorded_as_its_process_ends(client: Client) -> None:
    # Supervisors that look every 60 s only still record each rank's last state (it
    # returned) as its process ends: under load a rank whose collective completed as its
    # peer ended was seen blocked in it for seconds after, and the stall rule ended a
    # healthy job (rank 0's long evaluation, rank 1 in a barrier).
    seen: list[Any] = []
    with dask.config.set({"dask-ddp.launch.abort-poll": "60s"}):
        job = dask_ddp.submit(client, long_eval_on_rank0, 2.0, "barrier", n_workers=2,
                              progress=False, stall_timeout=STALL_S)
    client.subscribe_topic(progress_topic(job.id), seen.append)
    try:
        assert job.result(timeout=120) == [0, 1]

        def both_recorded() -> Any:
            ranks = {m["rank"] for _, m in seen}
            return None if ranks == {0, 1} else seen

        wait_until(both_recorded, 10, "a state recorded for each rank")
    finally:
        client.unsubscribe_topic(progress_topic(job.id))
    assert {m["rank"]: m["state"] for _, m in seen} == {0: "returned", 1: "returned"}, seen


@pytest.mark.parametrize("others", ["barrier", "return"])
def test_rank0_long_evaluation_is_not_a_stall(client: Client, others: str) -> None:
    # Rank 0 computes for 3x the stall timeout while rank 1 waits (in a barrier, or at the
    # end): rank 0 works, so the job is healthy however long it takes.
    job = dask_ddp.submit(client, long_eval_on_rank0, 3 * STALL_S, others, n_workers=2,
                          progress=False, stall_timeout=STALL_S)
    if others == "barrier":
        # The watcher sees rank 1 blocked in the barrier while rank 0 works: stall
        # detection is looking, and holds still.
        def rank1_not_blocked() -> Any:
            states = job.rank_states()
            return None if states[1]["state"] == "blocked" else states

        wait_until(rank1_not_blocked, 3 * STALL_S, "rank 1 seen blocked in the barrier")
    assert job.result(timeout=120) == [0, 1]
    assert job.stalled is None


def inside(job: Any, fn: str) -> Any:
    """What is missing for every rank of ``job`` to be inside ``fn`` (its live stacks)."""
    stacks = job.stacks()
    if len(stacks) == job.world_size and all(fn in t for t in stacks.values()):
        return None
    return stacks or "no rank answered yet"


def test_frozen_rank_ends_as_a_stall(client: Client) -> None:
    job = dask_ddp.submit(client, collectives_forever, n_workers=2, progress=False,
                          stall_timeout=STALL_S)
    victim = None
    try:
        wait_until(lambda: inside(job, "collectives_forever"), 60,
                   "ranks not inside collectives_forever")
        victim = next(p for p in rank_processes(client.scheduler.address)
                      if p.environ().get("DASK_DDP_JOB_ID") == job.id
                      and p.environ().get("RANK") == "1")
        os.kill(victim.pid, signal.SIGSTOP)
        with pytest.raises(dask_ddp.StallError) as info:
            job.result(timeout=90)
    finally:
        if victim is not None and victim.is_running():
            os.kill(victim.pid, signal.SIGCONT)
        job.cancel()
    err = info.value
    assert 1 in err.ranks and "rank 1 frozen" in str(err), str(err)
    assert "stopped" in err.stacks[1]
    assert "all_reduce" in err.stacks[0]


def test_stacks_of_a_running_job(client: Client) -> None:
    job = dask_ddp.submit(client, sleep_only, 120.0, n_workers=2, progress=False)
    try:
        wait_until(lambda: inside(job, "sleep_only"), 60, "ranks not inside sleep_only")
        # The command line prints them, found by the job's name.
        out = subprocess.run(
            [sys.executable, "-m", "dask_ddp", "stacks", "--scheduler",
             client.scheduler.address, "sleep_only"],
            capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert "rank 0 on worker" in out.stdout and "rank 1 on worker" in out.stdout
        assert out.stdout.count("sleep_only") >= 2, out.stdout
    finally:
        job.cancel()
    with pytest.raises(Exception):  # noqa: B017 - cancelled
        job.result(timeout=60)


def test_result_timeout_carries_the_stacks(client: Client) -> None:
    job = dask_ddp.submit(client, sleep_only, 120.0, n_workers=2, progress=False)
    try:
        wait_rank_processes(client.scheduler.address, 2)
        time.sleep(2.0)
        with pytest.raises(TimeoutError) as info:
            job.result(timeout=1)
        assert "sleep_only" in str(info.value), str(info.value)
    finally:
        job.cancel()


def test_dispatch_run_takes_stall_timeout(client: Client) -> None:
    futures = dispatch.run(client, uneven_collectives, 0.0, stall_timeout=STALL_S)
    with pytest.raises(dask_ddp.StallError):
        client.gather(futures, errors="raise")


def test_stall_rule() -> None:
    blocked = {"state": "blocked", "collective": "all_reduce", "since": 100.0}
    returned = {"state": "returned", "since": 99.0}
    working = {"state": "working", "since": 99.0}
    frozen = {"state": "frozen", "since": 101.0}
    # A peer returned: a stall once it lasted the timeout.
    assert find_stall({0: returned, 1: blocked}, {}, 2, 104.0, 5.0) is None
    found = find_stall({0: returned, 1: blocked}, {}, 2, 105.0, 5.0)
    assert found is not None and found.stuck == [1] and found.collective == "all_reduce"
    # A rank that works keeps the job alive; a rank with no state works.
    assert find_stall({0: working, 1: blocked}, {}, 2, 1000.0, 5.0) is None
    assert find_stall({1: blocked}, {}, 2, 1000.0, 5.0) is None
    # A finished task counts as returned, from when it was seen finished: until the
    # timeout has passed since, a peer that looks blocked may only not show yet that its
    # collective completed with it (a healthy job under load); a frozen rank is stuck.
    assert find_stall({1: blocked}, {0: 990.0}, 2, 1000.0, 5.0) is not None
    assert find_stall({1: blocked}, {0: 998.0}, 2, 1000.0, 5.0) is None
    found = find_stall({0: blocked, 1: frozen}, {}, 2, 106.0, 5.0)
    assert found is not None and found.stuck == [0, 1]
    # Everyone returned: not a stall (the finish barrier completes).
    assert find_stall({0: returned, 1: returned}, {}, 2, 1000.0, 5.0) is None


def test_launch_waits_come_from_the_config() -> None:
    import dask

    from dask_ddp._launch.wire.options import LaunchOptions

    with dask.config.set({"dask-ddp.launch.term-grace": "750 ms",
                          "dask-ddp.launch.stall-timeout": None}):
        opts = LaunchOptions.build(name="x", payload=b"p")
    assert opts.waits.term_grace == 0.75 and opts.stall_timeout is None
    assert LaunchOptions.build(name="x", payload=b"p", stall_timeout="2 minutes") \
        .stall_timeout == 120.0
    with pytest.raises(ValueError, match="stall_timeout"):
        LaunchOptions.build(name="x", payload=b"p", stall_timeout=-1)
    with dask.config.set({"dask-ddp.launch.root-wait": "soon"}), \
            pytest.raises(ValueError, match="dask-ddp.launch.root-wait"):
        LaunchOptions.build(name="x", payload=b"p")


def test_cli_stall_timeout_argument() -> None:
    from dask_ddp.cli import _run_parser

    parse = _run_parser().parse_args
    assert parse(["train.py"]).stall_timeout == "config"
    assert parse(["--stall-timeout", "none", "train.py"]).stall_timeout is None
    assert parse(["--stall-timeout", "12.5", "train.py"]).stall_timeout == 12.5
    with pytest.raises(SystemExit):
        parse(["--stall-timeout", "-3", "train.py"])


UNEVEN_SCRIPT = """
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(1)
for _ in range(3 + dist.get_rank()):
    dist.all_reduce(t)
if dist.get_rank() == 0:
    dist.recv(t, src=1)  # a message rank 1 never sends: both ranks wait for good
dist.destroy_process_group()
"""


def test_a_scripts_stall_is_found_too(client: Client, tmp_path: Any) -> None:
    # run_command / dask-ddp run: a Python script's ranks run behind the same probe.
    script = tmp_path / "uneven.py"
    script.write_text(UNEVEN_SCRIPT)
    with pytest.raises(dask_ddp.StallError) as info:
        dask_ddp.run_command(client, ["python", str(script)], n_workers=2,
                             stream_output=False, timeout=120, stall_timeout=STALL_S)
    err = info.value
    assert err.ranks == [0, 1] and err.collective == "recv", str(err)
    assert "rank 1 blocked in all_reduce" in str(err), str(err)
    assert "uneven.py" in err.stacks[0] and "uneven.py" in err.stacks[1], err.stacks


INSTALL_ORDER = """
import faulthandler, os, sys
from dask_ddp._launch.rank import probe
from dask_ddp._launch.wire.probe_file import STACKS_FILE
workdir = sys.argv[1]
register = faulthandler.register
def checked(*args, **kwargs):
    named = os.path.exists(os.path.join(workdir, STACKS_FILE))
    print("stacks file named before the handler" if named else "handler first", flush=True)
    return register(*args, **kwargs)
faulthandler.register = checked
probe.install(workdir)
print("named" if os.path.exists(os.path.join(workdir, STACKS_FILE)) else "unnamed")
"""


def test_the_stacks_file_appears_only_with_its_handler(tmp_path: Path) -> None:
    # The supervisor sends the stacks signal once the rank's stacks file exists; the
    # signal's default action kills the process. So the file must get its name only after
    # the handler is registered (make stress once caught a rank killed by SIGUSR2, asked
    # for its stacks between the two).
    out = subprocess.run([sys.executable, "-c", INSTALL_ORDER, str(tmp_path)],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["handler", "first", "named"], out.stdout


def test_a_rank_whose_work_dir_goes_while_its_stacks_are_read(tmp_path: Path) -> None:
    # A job that ends while its stacks are read (a result timeout, a cancel) removes its
    # ranks' work dirs: the read says so instead of failing with the missing file.
    from dask_ddp._launch.wire import probe_file
    from dask_ddp._launch.worker import probe

    (tmp_path / probe_file.STACKS_FILE).write_text("")
    ignores = subprocess.Popen(
        [sys.executable, "-c", "import signal, time\n"
         f"signal.signal({int(probe_file.STACKS_SIGNAL)}, signal.SIG_IGN)\nprint(flush=True)\n"
         "time.sleep(60)"], stdout=subprocess.PIPE)
    try:
        assert ignores.stdout is not None and ignores.stdout.readline()  # handler set
        remover = threading.Timer(0.3, (tmp_path / probe_file.STACKS_FILE).unlink)
        remover.start()
        text = probe.read_stacks(ignores.pid, str(tmp_path), 5.0)
        remover.join()
    finally:
        ignores.kill()
        ignores.wait(timeout=30)
    assert text == "(no stack: the rank's work dir is gone: its job ended)", text
