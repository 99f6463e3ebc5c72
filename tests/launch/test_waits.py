"""Every wait of the launcher is bounded or tied to the job's end: each test here names a
wait that had no bound and proves it has one now (each failed, or hung past its bound,
before the fix)."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from distributed import Client, Event, get_worker

import dask_ddp
from cluster_util import (
    client_fixture,
    raise_on_rank,
    rank_processes,
    sleep_only,
    wait_no_rank_processes,
)
from dask_ddp._channel.rank_writer import Forwarder
from dask_ddp._cluster import cluster_info
from dask_ddp._launch.wire.names import master_variable_name
from dask_ddp._launch.wire.options import LaunchOptions
from dask_ddp._launch.wire.rank_spec import RankSpec
from dask_ddp._launch.worker import workdir
from launch_util import active_tasks, wait_until
from waits import ABORT_POLL

pytestmark = [pytest.mark.timeout(180)]

client = client_fixture(2)


def master_port_without_variable(job_id: str, rendezvous_timeout: float) -> str:
    """In a worker: rank 0's Event says the address is published, but the Variable is gone
    (the job ended between the two): a rank's supervisor must not wait forever."""
    from dask_ddp._launch.worker.supervisor import _Supervisor

    worker = get_worker()
    Event(master_variable_name(job_id)).set()
    options = LaunchOptions.build(name="orphan", payload=b"x",
                                  rendezvous_timeout=rendezvous_timeout)
    spec = RankSpec(options=options, job_id=job_id, run_id=job_id, restart=0, rank=1,
                    local_rank=0, local_world_size=1, group_rank=1, group_world_size=2,
                    proc_index=0, workers=(worker.address, worker.address),
                    master_addr="127.0.0.1", scheduler=worker.scheduler.address)
    sup = _Supervisor(spec, worker, worker.get_current_task())
    try:
        sup._await_master_port()
    except dask_ddp.JobError as exc:
        return str(exc)
    finally:
        Event(master_variable_name(job_id)).clear()
    return "returned a port"


def test_master_port_wait_ends_when_the_variable_is_gone(client: Client) -> None:
    fut = client.submit(master_port_without_variable, "f" * 32, 3.0, pure=False)
    message = fut.result(timeout=60)
    assert "rendezvous" in message and "3 s" in message, message


def block_event_loop(seconds: float) -> None:
    """Run on a worker's event loop (``client.run``): keep it busy for ``seconds``."""
    time.sleep(seconds)


def test_busy_worker_loop_does_not_kill_the_rank(client: Client) -> None:
    # A worker's event loop busy for longer than the supervisor's look at its task state
    # (one abort poll) made the supervisor believe its task was cancelled, and kill a
    # healthy rank. The loop is busy for many polls, while the ranks sleep.
    busy_s = 30 * ABORT_POLL
    job = dask_ddp.submit(client, sleep_only, 3 * busy_s, n_workers=2, progress=False)
    wait_until(lambda: len([p for p in rank_processes(client.scheduler.address)
                            if p.environ().get("DASK_DDP_JOB_ID") == job.id]) < 2,
               60, "ranks not started")
    busy = threading.Thread(target=client.run, args=(block_event_loop, busy_s),
                            kwargs={"workers": [job.workers[1]]}, daemon=True)
    busy.start()
    assert job.result(timeout=120) == [0, 0]
    busy.join(60)
    assert not busy.is_alive()


def test_forwarder_call_tells_a_put_timeout_from_its_poll() -> None:
    # On Python 3.11 concurrent.futures.TimeoutError is TimeoutError: a put that raised
    # TimeoutError looked like the forwarder's own poll timing out, and was waited on
    # until the whole deadline passed.
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        worker = type("W", (), {"loop": type("L", (), {"asyncio_loop": loop})()})()
        r, w = os.pipe()
        os.close(w)
        fwd = Forwarder.__new__(Forwarder)
        fwd._worker = worker
        fwd._stop = threading.Event()

        async def put_that_times_out() -> None:
            raise TimeoutError("the scheduler's own timeout")

        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match="the scheduler's own timeout"):
            fwd._call(put_that_times_out(), 20.0)
        assert time.monotonic() - t0 < 10.0
        os.close(r)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def test_workdir_of_a_live_owner_is_kept(tmp_path: Path) -> None:
    # The owner's start time was compared as a float string: psutil's create_time of the
    # same process can differ in its last digits between reads, and a live worker's
    # directory was then removed under its rank.
    path = tmp_path / f"{workdir.PREFIX}live-r0-x"
    path.mkdir()
    start = workdir._start_time(os.getpid())
    assert start is not None
    (path / ".owner").write_text(f"{os.getpid()} {start + 0.004}\n")
    assert workdir.clean_orphans(str(tmp_path)) == []
    assert path.exists()
    # A dead owner's directory still goes.
    (path / ".owner").write_text(f"{os.getpid()} {start - 100.0}\n")
    assert workdir.clean_orphans(str(tmp_path)) == [str(path)]


def coordination_objects(job_id: str, dask_scheduler: Any = None) -> list[str]:
    """The job's Variables and Events left on the scheduler."""
    left = []
    variables = dask_scheduler.extensions.get("variables")
    if variables is not None:
        left += [n for n in variables.variables if job_id in n]
    events = dask_scheduler.extensions.get("events")
    if events is not None:
        left += [n for n in events._events if job_id in n]
    return left


def test_launch_failing_part_way_leaves_no_coordination_objects(
        client: Client, tmp_path: Path) -> None:
    blocker = tmp_path / "out"
    blocker.write_text("not a folder")
    before = set(client.run_on_scheduler(coordination_objects, "dask-ddp-"))
    with pytest.raises(FileExistsError):
        dask_ddp.submit(client, sleep_only, 600.0, n_workers=2, output_dir=blocker,
                        progress=False)
    wait_until(lambda: client.run_on_scheduler(active_tasks, "sleep_only"), 30,
               "tasks of the failed launch still active")
    wait_no_rank_processes(client.scheduler.address, 20)

    def left() -> list[str]:
        return sorted(set(client.run_on_scheduler(coordination_objects, "dask-ddp-"))
                      - before)

    # The rank 0 supervisor may publish its address after the launch gave up: it must
    # take it back.
    wait_until(left, 30, "the failed launch's Variables/Events left on the scheduler")
    time.sleep(30 * ABORT_POLL)  # many of its polls: a late publish would show
    assert not left()


def _put(client: Client, topic: str, seq: int, writer: str, wait: float = 1.0) -> Any:
    """Put one well-formed record of 1000 bytes (one frame, as a rank writes it)."""
    from dask_ddp._channel.wire import Entry, FrameHeader

    frame = FrameHeader(1000, seq, 1, 0, 0, 1).pack() + b"x" * 1000
    return client.sync(client.scheduler.dask_ddp_results_put, topic=topic,
                       entries=[list(Entry.run("job/0/src.1", seq, 1, frame))], writer=writer,
                       wait=wait)


def _topics(client: Client) -> dict[str, Any]:
    return dict(client.sync(client.scheduler.dask_ddp_results_info))


def test_a_closed_topic_is_not_made_again_by_its_writers(client: Client) -> None:
    # A reader that stops (a JobMonitor that died) closes its topic: the ranks' next puts
    # re-created it with no reader and, once the budget was full, every report() blocked.
    from dask_ddp._channel.reader import prepare

    prepare(client, "closed-topic-job")
    topic = "dask-ddp-test-closed-topic"
    assert _put(client, topic, 0, "writer-a")["accepted"] == 1
    client.sync(client.scheduler.dask_ddp_results_close, topic=topic)
    reply = _put(client, topic, 1, "writer-a")
    assert reply["accepted"] == 1 and reply.get("dropped"), reply
    assert topic not in _topics(client)
    # Another writer (a new job reusing the name) makes it anew.
    assert _put(client, topic, 0, "writer-b")["accepted"] == 1
    assert topic in _topics(client)
    client.sync(client.scheduler.dask_ddp_results_close, topic=topic)


def test_a_put_waiting_on_a_full_topic_that_is_closed_is_dropped(client: Client) -> None:
    # A put waiting for room in a full topic that its reader then closed re-created the
    # topic, without recording the writer (so it was never swept).
    from dask_ddp._channel.reader import prepare

    prepare(client, "full-topic-job")
    topic = "dask-ddp-test-full-topic"
    client.sync(client.scheduler.dask_ddp_results_open, topic=topic, budget=1500)
    assert _put(client, topic, 0, "writer-a")["accepted"] == 1
    result: dict[str, Any] = {}
    t = threading.Thread(target=lambda: result.update(_put(client, topic, 1, "writer-a", 20.0)))
    t.start()
    time.sleep(1.0)  # the put waits for room
    client.sync(client.scheduler.dask_ddp_results_close, topic=topic)
    t.join(30)
    assert not t.is_alive()
    assert result.get("dropped"), result
    assert topic not in _topics(client)


def hold_until(name: str, timeout: float) -> bool:
    """Occupy this worker's one thread until the Event ``name`` is set (at most ``timeout``)."""
    return Event(name).wait(timeout)


def test_a_rendezvous_timeout_names_the_rank_that_never_came(client: Client) -> None:
    # One worker's only thread is busy with another task, so the rank placed there never
    # starts its process; its peer gives up after rendezvous_timeout. The error names the
    # rank with no process and its worker (the stacks of the peers still running would
    # follow; none is running here), read before the abort.
    busy_worker = sorted(cluster_info(client)["workers"])[1]
    release = Event(f"release-{os.getpid()}-{time.time()}", client=client)
    busy = client.submit(hold_until, release.name, 120, workers=[busy_worker], pure=False)
    wait_until(lambda: not client.processing(workers=[busy_worker])[busy_worker], 30,
               "the busy task did not start")
    try:
        job = dask_ddp.submit(client, sleep_only, 0.1, n_workers=2, rendezvous_timeout=6,
                              stall_timeout=None, progress=False)
        waiting = job.workers.index(busy_worker)
        wait_until(lambda: job.root_error() is None, 90, "no rank gave up waiting")
        message = str(job.root_error())
        assert "no process running" in message, message
        assert f"{waiting} (worker {busy_worker})" in message, message
    finally:
        release.set()
    assert busy.result(timeout=30) is True
    # Let go of it now: a future still held keeps its key wanted, and a later test that
    # kills its worker would see it recomputed as a task with no worker (a lease's leftover).
    busy.release()
    with pytest.raises(dask_ddp.JobError):
        job.result(timeout=60)
    wait_until(lambda: client.run_on_scheduler(active_tasks, job.id), 30,
               "tasks of the job left on the scheduler")


def job_topics(job_id: str, dask_scheduler: Any = None) -> list[str]:
    """The scheduler's event topics that name ``job_id`` (``client.run_on_scheduler``)."""
    return sorted(t for t in dask_scheduler._broker._topics if job_id in t)


def test_an_ended_jobs_event_topics_are_dropped(client: Client) -> None:
    # Dask keeps an event topic for the scheduler's life: a job's progress, failure and
    # output topics, and Dask's topic of the rendezvous Variable's pseudo-client, would
    # pile up job after job on a long-lived scheduler. None stays after the job's end.
    ok = dask_ddp.submit(client, sleep_only, 3.0, n_workers=2, stream_output=True,
                         progress=False)
    wait_until(lambda: not client.run_on_scheduler(job_topics, ok.id), 60,
               "the running job made no topic (the test would prove nothing)")
    assert ok.result(timeout=120) == [0, 0]
    bad = dask_ddp.submit(client, raise_on_rank, 1, "topic test", n_workers=2,
                          progress=False)
    with pytest.raises(dask_ddp.RankFailedError):
        bad.result(timeout=120)
    for job in (ok, bad):
        wait_until(lambda j=job: client.run_on_scheduler(job_topics, j.id), 30,
                   f"event topics of job {job.name!r} left on the scheduler")
