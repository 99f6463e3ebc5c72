"""The results channel end to end on a real LocalCluster with real rank subprocesses.

The rank side is a real ``python -c`` process writing to a real pipe, the worker side the
real :class:`dask_ddp._channel.Forwarder` in a Dask task, the scheduler side the real
extension, the client side the real monitor / ``process_results``.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import dask.config
import pytest
from distributed import Client, LocalCluster

from _rankproc import run_rank
from cluster_util import client_fixture
from conftest import free_port
from dask_ddp import _channel, results
from dask_ddp._channel import records as _records
from dask_ddp._channel import wire as _wire
from dask_ddp._channel.monitor import iter_job_metrics, start_job_monitor
from results_util import REPORT_N, JobLike, fake_rank_fixture, launch

pytestmark = [pytest.mark.dask, pytest.mark.timeout(300)]


client = client_fixture(2, threads_per_worker=2)
fake_rank = fake_rank_fixture()


def check_exactly_once_in_order(records: list[dict[str, Any]], world_size: int, n: int) -> None:
    by_rank: dict[int, list[int]] = {}
    for rec in records:
        by_rank.setdefault(rec["rank"], []).append(rec["step"])
    assert sorted(by_rank) == list(range(world_size))
    for rank, steps in by_rank.items():
        assert steps == list(range(n)), f"rank {rank}: out of order, missing or duplicated"


def test_report_two_ranks_50000_exactly_once_in_order(client: Any, tmp_path: Path) -> None:
    n = 50_000
    job_id, futures = launch(client, REPORT_N, env={"N": str(n)})
    job = JobLike(client, job_id, "t", futures, output_dir=tmp_path)
    monitor = start_job_monitor(job, progress=True)
    seen = list(monitor.iter())
    monitor.stop(60)
    assert [f.result()["records"] for f in futures] == [n, n]
    check_exactly_once_in_order(seen, 2, n)
    assert all(r["tag"] == "x" and isinstance(r["time"], float) for r in seen[:10])
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2 * n
    check_exactly_once_in_order([json.loads(x) for x in lines], 2, n)


def test_late_reader_gets_everything(client: Any) -> None:
    n = 3000
    job_id, futures = launch(client, REPORT_N, env={"N": str(n)})
    client.gather(futures)  # the job is over before anyone reads
    job = JobLike(client, job_id, "late", futures)
    check_exactly_once_in_order(list(iter_job_metrics(job)), 2, n)


KILLED_AFTER = """
import os, signal
import dask_ddp.results as r
for i in range(1000):
    r.report({"loss": float(i)}, step=i)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_rank_killed_right_after_submitting(client: Any) -> None:
    job_id, futures = launch(client, KILLED_AFTER)
    job = JobLike(client, job_id, "killed", futures)
    recs = list(iter_job_metrics(job))
    assert [f.result()["returncode"] for f in futures] == [-signal.SIGKILL] * 2
    check_exactly_once_in_order(recs, 2, 1000)


def test_back_pressure_with_a_tiny_budget(client: Any) -> None:
    budget = 64 * 1024
    n = 20_000  # ~200 bytes each: ~4 MB, 60x the budget
    code = REPORT_N.replace('"tag": "x"', '"tag": "x" * 120')
    job_id = uuid.uuid4().hex[:12]
    with dask.config.set({"dask-ddp.results.budget": budget}):
        job_id, futures = launch(client, code, env={"N": str(n)}, job_id=job_id)
    topic = _channel.metrics_topic(job_id)

    def used() -> int:
        info = client.sync(client.scheduler.dask_ddp_results_info, topic=topic)
        return int(info.get(topic, {}).get("used", 0))

    deadline = time.monotonic() + 120
    while used() == 0:  # the rank processes start (importing torch takes a while)
        assert time.monotonic() < deadline
        time.sleep(0.05)
    peak = 0
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:  # nobody reads: the ranks must stall, not drop
        peak = max(peak, used())
        time.sleep(0.05)
    assert not any(f.done() for f in futures), "ranks finished although nobody read"
    assert 0 < peak <= budget
    job = JobLike(client, job_id, "bp", futures)
    check_exactly_once_in_order(list(iter_job_metrics(job)), 2, n)
    assert [f.result()["records"] for f in futures] == [n, n]


FORKS = """
import os
import dask_ddp.results as r
pid = os.fork()  # as a DataLoader worker with the fork context: it inherits the pipe
for i in range(2000):
    r.report({"loss": float(i), "child": pid == 0}, step=i)
if pid == 0:
    os._exit(0)
os.waitpid(pid, 0)
"""


def test_forked_children_are_their_own_streams(client: Any) -> None:
    job_id, futures = launch(client, FORKS, world_size=1)
    recs = list(iter_job_metrics(JobLike(client, job_id, "fork", futures)))
    for child in (False, True):
        assert [x["step"] for x in recs if x["child"] is child] == list(range(2000))


THREADS = """
import threading
import dask_ddp.results as r
def work(t):
    for i in range(2000):
        r.report({"thread": t, "i": i})
threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
"""


def test_threads_of_one_rank_share_its_stream(client: Any) -> None:
    job_id, futures = launch(client, THREADS, world_size=1)
    recs = list(iter_job_metrics(JobLike(client, job_id, "threads", futures)))
    assert len(recs) == 8000
    for t in range(4):
        assert [x["i"] for x in recs if x["thread"] == t] == list(range(2000))


FORK_RESULTS = """
import os
from dask_ddp.results import DaskResultsHandler
rh = DaskResultsHandler(os.environ["KEY"])
pid = os.fork()
who = "child" if pid == 0 else "parent"
for i in range(100):  # large records from two processes at once share the pipe
    rh.submit_result(f"{who}/{i}.bin", bytes([i]) * (50_000 + i))
    rh.submit_result(f"{who}.txt", str(i))
if pid == 0:
    os._exit(0)
os.waitpid(pid, 0)
"""


def test_large_records_from_forked_processes_stay_whole(client: Any, tmp_path: Path) -> None:
    key = uuid.uuid4().hex
    with dask.config.set({"dask-ddp.results.budget": "64 KiB"}):
        rh = results.DaskResultsHandler(key)  # a full pipe: writers block mid-record
    _, futures = launch(client, FORK_RESULTS, world_size=1, env={"KEY": key})
    time.sleep(3)
    rh.process_results(tmp_path, futures)
    for who in ("child", "parent"):
        assert (tmp_path / f"{who}.txt").read_text().split() == [str(i) for i in range(100)]
        for i in range(100):
            assert (tmp_path / who / f"{i}.bin").read_bytes() == bytes([i]) * (50_000 + i)


SEED_RESULTS = """
import json, os, pickle
from dask_ddp.results import DaskResultsHandler
rank = int(os.environ["RANK"])
rh = DaskResultsHandler(os.environ["KEY"])
for count in range(1, 201):
    rh.submit_result(f"worker/{rank}.json", json.dumps(
        {"loss": 1.0 / count, "correct": count % 7, "count": count, "worker": rank,
         "sample": "train", "epoch": count // 100, "learning_rate": 0.01}))
    if count % 100 == 0 and rank == 0:
        blob = pickle.dumps({"w": bytes(3_000_000), "c": count})
        rh.submit_result(f"checkpoint-{count}.pkl", blob)
"""


def test_process_results_writes_files(client: Any, tmp_path: Path) -> None:
    key = uuid.uuid4().hex
    rh = results.DaskResultsHandler(key)
    _, futures = launch(client, SEED_RESULTS, env={"KEY": key})
    rh.process_results(str(tmp_path / "out"), futures, raise_errors=True)
    for rank in range(2):
        text = (tmp_path / "out" / "worker" / f"{rank}.json").read_text()
        rows = [json.loads(x) for x in text.splitlines()]
        assert [r["count"] for r in rows] == list(range(1, 201))
        assert {r["worker"] for r in rows} == {rank}
    import pickle

    for count in (100, 200):
        obj = pickle.loads((tmp_path / "out" / f"checkpoint-{count}.pkl").read_bytes())
        assert obj == {"w": bytes(3_000_000), "c": count}


FAILS = """
import os, sys
from dask_ddp.results import DaskResultsHandler
rh = DaskResultsHandler(os.environ["KEY"])
rh.submit_result(f"r{os.environ['RANK']}.txt", "before the error")
sys.exit(3 if os.environ["RANK"] == "1" else 0)
"""


def _failing(job_id: str, rank: int, code: str, env: dict[str, str]) -> dict[str, int]:
    out = run_rank(job_id, rank, 2, code, env)
    if out["returncode"] != 0:
        raise RuntimeError(f"rank {rank} exited with {out['returncode']}")
    return out


@pytest.mark.parametrize("raise_errors", [True, False])
def test_process_results_rank_error(client: Any, tmp_path: Path, raise_errors: bool) -> None:
    key = uuid.uuid4().hex
    rh = results.DaskResultsHandler(key)
    job_id = uuid.uuid4().hex[:12]
    _channel.prepare(client, job_id)
    futures = [
        client.submit(_failing, job_id, r, FAILS, {"KEY": key}, pure=False) for r in range(2)
    ]
    if raise_errors:
        with pytest.raises(RuntimeError, match="rank 1 exited with 3"):
            rh.process_results(tmp_path, futures, raise_errors=True)
    else:
        rh.process_results(tmp_path, futures, raise_errors=False)
    for r in range(2):  # what was submitted before the error still arrived
        assert (tmp_path / f"r{r}.txt").read_text() == "before the error\n"


def frame(seq: int, payload: bytes) -> bytes:
    """A frame as a rank writes it (with an empty topic, as the forwarder may send)."""
    return _wire.FrameHeader(len(payload), seq, 0, 0, 0, 1).pack() + payload


def test_gaps_are_reported_and_duplicates_dropped(
    client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    topic = f"results/{uuid.uuid4().hex}"
    _channel.open_topic(client, topic)
    put = client.scheduler.dask_ddp_results_put
    src = "job/0/abc.1"
    e = [[src, 0, 1, 0, 1, frame(0, b"a")], [src, 1, 1, 0, 1, frame(1, b"b")]]
    assert client.sync(put, topic=topic, entries=e)["accepted"] == 2
    assert client.sync(put, topic=topic, entries=e)["accepted"] == 2  # a retry: no copies
    client.sync(
        put, topic=topic, entries=[[src, 3, 1, 0, 1, frame(3, b"d")], [src, 4, 0, 0, 0, b""]]
    )
    gaps: list[Exception] = []
    reader = _channel.Reader(client, topic, on_gap=gaps.append)
    got = reader.fetch(timeout=1) + reader.fetch(timeout=0)
    assert [r.payload for r in got] == [b"a", b"b", b"d"]
    assert len(gaps) == 1 and "records 2..2 are missing" in str(gaps[0])
    other = "job/1/def.2"  # a stream whose worker died: no end marker
    client.sync(put, topic=topic, entries=[[other, 0, 2, 0, 1, frame(0, b"x") + frame(1, b"y")]])
    assert [(r.seq, r.payload) for r in reader.fetch(timeout=1)] == [(0, b"x"), (1, b"y")]
    assert reader.unfinished() == [other]
    with caplog.at_level(logging.WARNING, logger="dask_ddp._channel.reader"):
        reader.close()
    assert "job/1/def.2 (rank 1) has no end marker after 2 records" in caplog.text
    strict = _channel.Reader(client, f"results/{uuid.uuid4().hex}")
    client.sync(
        put, topic=strict.topic, entries=[[src, 0, 1, 0, 1, frame(0, b"a")], [src, 2, 0, 0, 0, b""]]
    )
    with pytest.raises(_channel.GapError, match="ended after 2 records, 1 arrived"):
        strict.fetch(timeout=1)


def test_bad_payloads_are_type_errors_naming_the_key(fake_rank: int) -> None:
    with pytest.raises(TypeError, match="'weights'"):
        results.report({"loss": 1.0, "weights": [1, 2]})
    with pytest.raises(TypeError, match="'note'"):
        results.report({"note": "x" * 5000})
    with pytest.raises(ValueError, match="'rank'"):
        results.report({"rank": 3})
    rh = results.DaskResultsHandler("k")
    with pytest.raises(TypeError, match="'worker/0.json'"):
        rh.submit_result("worker/0.json", {"loss": 1})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="inside the results folder"):
        rh.submit_result("../escape.json", "x")
    import numpy as np
    import torch

    results.report({"loss": torch.tensor(0.5), "acc": np.float32(0.25), "ok": True}, step=1)
    frame = os.read(fake_rank, 4096)
    rec = json.loads(frame[_wire.HEADER_SIZE + len("metrics/unit") + 1 :])
    assert rec["loss"] == 0.5 and rec["acc"] == 0.25 and rec["rank"] == 0 and rec["step"] == 1


def test_large_result_goes_through_storage(
    fake_rank: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = (tmp_path / "store").as_uri()
    monkeypatch.setenv("DASK_DDP_STORAGE", url)
    monkeypatch.setenv("DASK_DDP_JOB_ID", "j")  # the job of the record's stream, j/0/n
    rh = results.DaskResultsHandler("k")
    with dask.config.set({"dask-ddp.results.inline-max": 1000}):
        rh.submit_result("big.bin", b"x" * 5000)
    frame = os.read(fake_rank, 1 << 16)
    assert len(frame) < 500  # only the reference went through the channel
    ref = json.loads(frame[_wire.HEADER_SIZE + len("results/k") + 1 :])
    stored = tmp_path / "store" / ref["key"]
    assert stored.read_bytes() == b"x" * 5000
    # The client fetches it from the storage job j declared, under _results/j/ only.
    writer = _records.ResultWriter(tmp_path / "out", storage_of={"j": url}.get)
    writer.write(_channel.Record("j/0/n", 0, 0, frame[_wire.HEADER_SIZE + len("results/k") :]))
    writer.close()
    assert (tmp_path / "out" / "big.bin").read_bytes() == b"x" * 5000
    assert not stored.exists()  # the client removes it once written


def test_second_job_in_same_output_dir_replays_only_its_own(client: Any, tmp_path: Path) -> None:
    counts, ids = [], []
    for n in (300, 200):
        job_id, futures = launch(client, REPORT_N, env={"N": str(n)})
        job = JobLike(client, job_id, "again", futures, output_dir=tmp_path)
        recs = list(start_job_monitor(job, progress=False).iter())
        check_exactly_once_in_order(recs, 2, n)
        assert {r["job"] for r in recs} == {job_id}
        counts.append(len(recs))
        ids.append(job_id)
    assert counts == [600, 400]
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    # One file for both jobs, each line naming the job whose rank sent it.
    assert [sum(rec["job"] == i for rec in lines) for i in ids] == [600, 400]
    assert all(next(iter(rec)) == "job" for rec in lines)


BAD_METRICS = """
import dask_ddp.results as r
from dask_ddp._channel import rank_writer, wire
import dask_ddp
topic = wire.metrics_topic(dask_ddp.rank_info().job_id)
r.report({"loss": 1.0}, step=0)
for bad in (b"M", b"Mnot json", b"M[1, 2]", b"M{}", b'M{"a": 1'):
    rank_writer.write(topic, bad)
r.report({"loss": 2.0}, step=1)
"""


def test_a_damaged_metric_record_is_skipped_and_the_others_kept(
    client: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    job_id, futures = launch(client, BAD_METRICS, world_size=1)
    job = JobLike(client, job_id, "bad", futures, output_dir=tmp_path)
    monitor = start_job_monitor(job, progress=False)
    with caplog.at_level(logging.ERROR, logger="dask_ddp._channel.monitor"):
        recs = list(monitor.iter())
        monitor.stop(60)
    assert [(r["step"], r["loss"]) for r in recs] == [(0, 1.0), (1, 2.0)]
    assert monitor.error is None
    skipped = [m for m in caplog.messages if "not a JSON object: skipped" in m]
    assert len(skipped) == 5, caplog.messages
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [0, 1]


def test_a_new_scheduler_on_a_reused_address_gets_the_extension() -> None:
    """Port reuse: a scheduler that replaces one on the same address still gets the
    handlers (a cache keyed by address once skipped the install, and CI failed)."""
    port = free_port()
    topic = f"results/{uuid.uuid4().hex}"
    for _ in range(2):  # clusters of its own: a scheduler at a fixed port, twice
        with LocalCluster(n_workers=0, processes=False, scheduler_port=port,
                          dashboard_address=":0") as cluster, Client(cluster) as c:
            assert c.scheduler.address.endswith(f":{port}")
            _channel.open_topic(c, topic)
            src = "job/0/abc.1"
            c.sync(c.scheduler.dask_ddp_results_put, topic=topic,
                   entries=[[src, 0, 1, 0, 1, frame(0, b"a")], [src, 1, 0, 0, 0, b""]])
            reader = _channel.Reader(c, topic)
            assert [r.payload for r in reader.fetch(timeout=1)] == [b"a"]
            reader.close()


def test_a_scheduler_without_the_extension_is_named() -> None:
    # A cluster of its own: its scheduler, without the results extension, is under test.
    with LocalCluster(n_workers=0, processes=False, scheduler_port=0,
                      dashboard_address=":0") as cluster, Client(cluster) as c:
        reply = c.sync(c.scheduler.dask_ddp_results_get, topic="t", cursor=0, timeout=0)
        with pytest.raises(RuntimeError, match=rf"scheduler at {c.scheduler.address} has no "
                           "dask-ddp results handler 'dask_ddp_results_get'"):
            _channel.checked_reply(reply, "dask_ddp_results_get", c.scheduler.address)
