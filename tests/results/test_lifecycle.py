"""The results channel leaves nothing behind and never hangs.

Real LocalCluster, real rank subprocesses behind real Forwarders, a real client process
killed with SIGKILL. Each test names the defect it proves fixed.
"""

from __future__ import annotations

import logging
import os
import signal
import struct
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import dask.config
import pytest
from distributed.core import rpc

from cluster_util import client_fixture
from conftest import free_port
from dask_ddp import _channel, results
from dask_ddp._channel.monitor import iter_job_metrics, start_job_monitor
from results_util import REPORT_N, JobLike, launch
from waits import wait_until

pytestmark = [pytest.mark.dask, pytest.mark.timeout(300)]

# A rank's frame header as it is on the pipe (kept literal: the wire format is the contract).
_FRAME = struct.Struct("!IQIHII")


client = client_fixture(2, threads_per_worker=2)


def topics(client: Any) -> dict[str, Any]:
    return dict(client.sync(client.scheduler.dask_ddp_results_info))


def wait_gone(client: Any, names: list[str], timeout: float) -> float:
    """Seconds until none of ``names`` is a topic on the scheduler; fails after ``timeout``."""
    return wait_until(lambda: [n for n in names if n in topics(client)], timeout,
                      "topics still on the scheduler")


def frames(topic: str, n: int, size: int) -> bytes:
    tb = topic.encode()
    data = b"x" * size
    return b"".join(_FRAME.pack(size, i, os.getpid(), len(tb), 0, 1) + tb + data for i in range(n))


def forward_without_reader(job_id: str, topic: str, n: int, timeout: float) -> dict[str, Any]:
    """In a worker: forward ``n`` records to ``topic`` that nobody reads, then close."""
    r, w = os.pipe()
    fwd = _channel.Forwarder(job_id, 0, r)
    fwd.start()
    os.write(w, frames(topic, n, 3000))
    os.close(w)  # the rank has exited
    t0 = time.monotonic()
    try:
        fwd.close(timeout=timeout)
        error = ""
    except Exception as e:  # noqa: BLE001 - the answer
        error = f"{type(e).__name__}: {e}"
    took = time.monotonic() - t0
    deadline = time.monotonic() + 10
    while fwd._thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    return {"took": took, "error": error, "alive": fwd._thread.is_alive()}


def test_forwarder_close_stops_it_when_nobody_reads(client: Any) -> None:
    """(a) close(timeout) raises promptly and the Forwarder stops: it used to go on
    retrying into the full topic forever."""
    job_id = uuid.uuid4().hex[:12]
    topic = _channel.metrics_topic(job_id)
    _channel.open_topic(client, topic, budget=64 * 1024)
    out = client.submit(forward_without_reader, job_id, topic, 200, 2.0, pure=False).result()
    assert out["error"].startswith("TimeoutError") and "not all delivered" in out["error"]
    assert out["took"] < 10
    assert not out["alive"], "the forwarder still retries after close() gave up"
    _channel.Reader(client, topic).close()


def test_forwarder_gives_up_on_a_scheduler_that_does_not_answer(client: Any) -> None:
    """(a) A put to a scheduler that does not answer is retried for
    dask-ddp.results.put-retry, then fails naming it: it used to retry forever."""
    dead = f"tcp://127.0.0.1:{free_port()}"  # nothing listens there
    worker = SimpleNamespace(scheduler=rpc(dead), loop=client.loop)
    r, w = os.pipe()
    with dask.config.set({"dask-ddp.results.put-retry": "2 s"}):
        fwd = _channel.Forwarder("j", 0, r, worker=worker)
    fwd.start()
    os.write(w, frames("metrics/j", 3, 10))
    os.close(w)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=rf"scheduler at {dead} did not take the records"):
        fwd.close(timeout=20)
    assert time.monotonic() - t0 < 15
    assert not fwd._thread.is_alive()
    client.sync(worker.scheduler.close_rpc)


def test_topics_of_a_read_job_are_gone(client: Any, tmp_path: Path) -> None:
    """(b) Once read, neither the metrics topic nor the results topic is left."""
    key = uuid.uuid4().hex
    rh = results.DaskResultsHandler(key)
    code = REPORT_N + "\nfrom dask_ddp.results import DaskResultsHandler\n" + (
        "DaskResultsHandler(os.environ['KEY']).submit_result('r.txt', 'x')\n"
    )
    job_id, futures = launch(client, code, env={"N": "100", "KEY": key})
    job = JobLike(client, job_id, "read", futures)
    assert len(list(iter_job_metrics(job))) == 200
    rh.process_results(tmp_path, futures)
    assert (tmp_path / "r.txt").read_text() == "x\nx\n"
    wait_gone(client, [_channel.metrics_topic(job_id), rh.topic], 2)


def test_topics_of_released_futures_are_removed(client: Any) -> None:
    """(b) A job nobody read whose futures were released leaves no topic behind."""
    job_id, futures = launch(client, REPORT_N, env={"N": "300"})
    client.gather(futures)
    topic = _channel.metrics_topic(job_id)
    assert topics(client)[topic]["length"] > 0  # unread records wait there
    del futures
    wait_gone(client, [topic], 30)


def test_expired_topic_is_removed(client: Any) -> None:
    """(b) A topic nobody reads and nobody writes goes after dask-ddp.results.expiry,
    even while its client lives."""
    topic = f"results/{uuid.uuid4().hex}"
    with dask.config.set({"dask-ddp.results.expiry": "1 s"}):
        _channel.open_topic(client, topic)
    assert topic in topics(client)
    wait_gone(client, [topic], 30)


KILLED_CLIENT = """
import os, signal, sys
from distributed import Client
from dask_ddp import _channel
from dask_ddp.results import DaskResultsHandler
c = Client(sys.argv[1])
rh = DaskResultsHandler(sys.argv[2])
_channel.prepare(c, sys.argv[3])
print("ready", flush=True)
sys.stdin.readline()
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_topics_of_a_killed_client_are_removed(client: Any) -> None:
    """(b) A client killed with SIGKILL leaves no topic on the scheduler."""
    key, job_id = uuid.uuid4().hex, uuid.uuid4().hex[:12]
    names = [f"results/{key}", _channel.metrics_topic(job_id)]
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_CLIENT, client.scheduler.address, key, job_id],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline().strip() == "ready"
        assert set(names) <= set(topics(client))
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.wait(30) == -signal.SIGKILL
    finally:
        proc.kill()
    took = wait_gone(client, names, 10)
    assert took < 10


SLOW = """
import os, time
from dask_ddp.results import DaskResultsHandler
DaskResultsHandler(os.environ["KEY"]).submit_result("a.txt", "first")
if os.environ.get("MARK"):  # when the record was handed to the channel
    with open(os.environ["MARK"] + ".tmp", "w") as f:
        f.write(repr(time.time()))
    os.replace(os.environ["MARK"] + ".tmp", os.environ["MARK"])
time.sleep(float(os.environ["SLEEP"]))
"""


def test_process_results_closes_its_topic_on_error(client: Any, tmp_path: Path) -> None:
    """(c) An error while writing the results (here: the folder is a file) still
    removes the topic: it used to stay on the scheduler."""
    key = uuid.uuid4().hex
    rh = results.DaskResultsHandler(key)
    _, futures = launch(client, SLOW, world_size=1, env={"KEY": key, "SLEEP": "0"})
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    with pytest.raises(OSError):
        rh.process_results(not_a_dir, futures)
    wait_gone(client, [rh.topic], 2)


def test_process_results_closes_its_topic_on_interrupt(client: Any, tmp_path: Path) -> None:
    """(c) Ctrl-C in process_results removes the topic. The rank's first record reaches
    the client within 5 s of its submit_result, while the rank still runs.

    The 5 s used to count from the launch, so a rank process slow to start (python and
    the package's imports on a loaded machine) was interrupted before it had written its
    record; the window now starts when the rank handed the record over (its MARK file).

    Ctrl-C is Python's default SIGINT handler, installed here: a pytest started in the
    background by a non-interactive shell (``make stress``, CI) inherits SIGINT ignored,
    and Python then leaves it ignored, so the interrupt never came and the test waited
    for the rank's end (found by ``make stress``: 3 of 3 runs, record seen 26 ms after its
    submit, the SIGINT sent and ignored).
    """
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _interrupt_process_results(client, tmp_path)
    finally:
        signal.signal(signal.SIGINT, previous)


def _interrupt_process_results(client: Any, tmp_path: Path) -> None:
    key = uuid.uuid4().hex
    rh = results.DaskResultsHandler(key)
    out, mark = tmp_path / "out", tmp_path / "mark"
    _, futures = launch(client, SLOW, world_size=1,
                        env={"KEY": key, "SLEEP": "60", "MARK": str(mark)})
    main = threading.main_thread().ident
    stop = threading.Event()
    seen: dict[str, Any] = {}

    def interrupt() -> None:
        # Wait for the record (bounded: the rank may be slow to start), note when it
        # came, then interrupt process_results; stop early when the test ends first.
        deadline = time.monotonic() + 90
        while not (out / "a.txt").exists():
            if stop.wait(0.05) or time.monotonic() > deadline:
                seen["missing"] = True
                break
        seen["arrived"] = time.time()
        seen["rank_running"] = not any(f.done() for f in futures)
        if not stop.is_set():
            seen["interrupted"] = time.time()
            signal.pthread_kill(main, signal.SIGINT)  # type: ignore[arg-type]

    watcher = threading.Thread(target=interrupt, daemon=True)
    watcher.start()
    try:
        rh.process_results(out, futures)
    except KeyboardInterrupt:
        pass
    else:  # the rank must still be sleeping: say what ended it
        outcome = [(f.status, f.result(5) if f.status == "finished" else None) for f in futures]
        returned = time.time()
        stop.set()
        watcher.join(10)
        submitted = float(mark.read_text()) if mark.exists() else None
        pytest.fail(f"process_results returned without the interrupt at {returned:.2f}; rank "
                    f"tasks: {outcome}; record submitted at {submitted}, seen by the "
                    f"watcher: {seen}")
    finally:
        stop.set()
        watcher.join(10)
    assert not watcher.is_alive()
    submitted = float(mark.read_text()) if mark.exists() else None
    assert not seen.get("missing"), f"the first record never arrived (rank submitted it " \
                                    f"at {submitted})"
    assert submitted is not None and seen["arrived"] - submitted < 5.0, (seen, submitted)
    assert seen["rank_running"], "the record arrived only as the rank ended"
    wait_gone(client, [rh.topic], 2)
    client.cancel(futures)


def test_metrics_without_output_dir_stay_bounded(
    client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """(d) Without output_dir the client keeps at most dask-ddp.results.metrics-buffer
    records (the oldest go, with a warning): it used to keep every record."""
    n = 5000
    job_id, futures = launch(client, REPORT_N, world_size=1, env={"N": str(n)})
    job = JobLike(client, job_id, "bounded", futures)
    with dask.config.set({"dask-ddp.results.metrics-buffer": 1000}):
        monitor = start_job_monitor(job, progress=False)
    monitor.stop(120)
    with caplog.at_level(logging.WARNING):
        recs = list(monitor.iter())
    assert [r["step"] for r in recs] == list(range(n - 1000, n))
    assert f"{n - 1000} metric records were dropped" in caplog.text


def test_follow_closes_the_topic_on_a_gap(client: Any) -> None:
    """The shared fetch loop: a gap raises (strict reader) or is handed to on_gap, and
    the topic is removed either way."""
    put = client.scheduler.dask_ddp_results_put
    src = "job/0/abc.1"

    def entry(seq: int, data: bytes) -> list[Any]:
        return [src, seq, 1, 0, 1, _FRAME.pack(len(data), seq, 0, 0, 0, 1) + data]

    for strict in (True, False):
        topic = f"results/{uuid.uuid4().hex}"
        _channel.open_topic(client, topic)
        end = [src, 3, 0, 0, 0, b""]
        client.sync(put, topic=topic, entries=[entry(0, b"a"), entry(2, b"c"), end])
        gaps: list[Exception] = []
        reader = _channel.Reader(client, topic, on_gap=None if strict else gaps.append)
        got: list[bytes] = []
        done = client.submit(lambda: 0, pure=False)
        done.result()

        def handle(recs: list[Any], out: list[bytes] = got) -> None:
            out.extend(r.payload for r in recs)

        if strict:
            with pytest.raises(_channel.GapError, match="records 1..1 are missing"):
                _channel.follow(reader, [done], handle, poll=0.1)
        else:
            _channel.follow(reader, [done], handle, poll=0.1)
            assert got == [b"a", b"c"] and len(gaps) == 1
        wait_gone(client, [topic], 2)


BLOCKED_RANK = """
import os
import dask_ddp.results as r
for i in range(5000):  # 5 MB: fills the pipe while the topic's budget is full
    r.report({"pad": "x" * 1000}, step=i)
open(os.environ["DONE"], "w").close()
"""

LAUNCHING_CLIENT = """
import os, signal, sys
import dask.config
from distributed import Client
from _rankproc import run_rank
from dask_ddp import _channel
c = Client(sys.argv[1])
job_id = sys.argv[2]
with dask.config.set({"dask-ddp.results.budget": "64 KiB"}):
    _channel.prepare(c, job_id)
fut = c.submit(run_rank, job_id, 0, 1, sys.argv[4], {"DONE": sys.argv[3]}, pure=False)
print("ready", flush=True)
sys.stdin.readline()
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_rank_blocked_on_a_killed_clients_topic_goes_on(client: Any, tmp_path: Path) -> None:
    """(b) A rank blocked because nobody reads its topic is let go once the client that
    would have read it is killed: the topic is removed and its late records dropped."""
    job_id = uuid.uuid4().hex[:12]
    topic = _channel.metrics_topic(job_id)
    done = tmp_path / "done"
    tests = str(Path(__file__).resolve().parents[1])  # tests/: the shared helpers
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([tests, *sys.path]))
    proc = subprocess.Popen(
        [sys.executable, "-c", LAUNCHING_CLIENT, client.scheduler.address, job_id, str(done),
         BLOCKED_RANK],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 120
        while topics(client).get(topic, {}).get("used", 0) < 32 * 1024:
            assert time.monotonic() < deadline, "the rank never filled its topic"
            time.sleep(0.2)
        time.sleep(2)
        assert not done.exists(), "the rank did not block on the full topic"
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.wait(30) == -signal.SIGKILL
    finally:
        proc.kill()
    wait_gone(client, [topic], 10)
    deadline = time.monotonic() + 60
    while not done.exists():
        assert time.monotonic() < deadline, "the rank is still blocked"
        time.sleep(0.2)
    assert topic not in topics(client)  # the late records did not bring it back
