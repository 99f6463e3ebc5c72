"""The job pages on the scheduler's dashboard server: their model and flags (no cluster),
then the HTML and JSON against a real LocalCluster running real 2-rank gloo jobs."""

from __future__ import annotations

import concurrent.futures
import json
from pathlib import Path

import pytest

import dask_ddp
from cluster_util import client_fixture
from dashboard_util import (
    dashboard_root,
    fail_after,
    fail_first_attempt,
    get,
    get_json,
    loader_loop,
    report_loop,
    uneven_loop,
    wait_job,
)
from dask_ddp._dashboard import counters, events
from dask_ddp._dashboard.model import MAX_JOBS, MAX_POINTS, Board

# ---------------------------------------------------------------- the model, no cluster


def _board(world: int = 2) -> Board:
    b = Board()
    b.job_started({"job_id": "a0", "run_id": "run", "name": "train", "attempt": 0,
                   "workers": [f"tcp://10.0.0.{r}:1234" for r in range(world)],
                   "max_restarts": 1, "time": 100.0})
    return b


def _sample(rank: int, **kw: object) -> dict[str, object]:
    return {"rank": rank, "state": "running", "time": 101.0, **kw}


def test_flags_input_bound_and_straggler() -> None:
    b = _board(3)
    b.rank_sample("a0", _sample(0, steps_per_s=10.0, wait_fraction=0.5, step_source="loader"))
    b.rank_sample("a0", _sample(1, steps_per_s=10.0, wait_fraction=0.2, step_source="loader"))
    b.rank_sample("a0", _sample(2, steps_per_s=7.0, wait_fraction=0.0, step_source="loader"))
    job = b.job_json("run")["job"]  # type: ignore[index]
    assert job["state"] == "running"
    assert job["median_steps_per_s"] == 10.0
    flags = {r["rank"]: r["flags"] for r in job["ranks"]}
    assert flags == {0: ["input-bound"], 1: [], 2: ["straggler"]}
    assert job["hosts"] == ["10.0.0.0", "10.0.0.1", "10.0.0.2"]


def test_failure_root_cause_is_the_most_fundamental() -> None:
    b = _board()
    b.failure("a0", {"rank": 0, "worker": "w0", "kind": "raised", "message": "then",
                     "traceback": "tb0"})
    b.failure("a0", {"rank": 1, "worker": "w1", "kind": "raised-first", "message": "boom",
                     "traceback": "Traceback: ValueError boom"})
    b.job_state("a0", {"state": "done"})  # a recorded failure stands
    job = b.job_json("a0")["job"]  # type: ignore[index]
    assert job["state"] == "failed"
    assert job["root_cause"]["rank"] == 1 and "boom" in job["root_cause"]["traceback"]
    assert [r["flags"] for r in job["ranks"]] == [[], ["failed"]]


def test_failure_before_start_and_attempts() -> None:
    b = Board()
    b.failure("a1", {"rank": 0, "worker": "w", "kind": "died", "message": "killed"})
    b.job_started({"job_id": "a0", "run_id": "run", "name": "n", "workers": ["w", "v"]})
    b.job_state("a0", {"state": "failed"})
    b.job_started({"job_id": "a1", "run_id": "run", "name": "n", "attempt": 1,
                   "workers": ["w", "v"]})
    row = b.jobs_json()["jobs"][0]
    assert (row["id"], row["job_id"], row["attempt"], row["restarts"]) == ("run", "a1", 1, 1)
    job = b.job_json("a1")["job"]  # type: ignore[index]
    assert job["state"] == "failed" and job["root_cause"]["kind"] == "died"
    assert [a["state"] for a in job["attempts"]] == ["failed", "failed"]


def test_ranks_ending_end_the_job_without_the_client() -> None:
    b = _board()
    b.rank_sample("a0", _sample(0, state="exited", exit="exit code 0"))
    assert b.job_json("run")["job"]["state"] == "starting"  # type: ignore[index]
    b.rank_sample("a0", _sample(1, state="exited", exit="killed by SIGKILL"))
    assert b.job_json("run")["job"]["state"] == "failed"  # type: ignore[index]
    b.job_state("a0", {"state": "done"})
    assert b.job_json("run")["job"]["state"] == "failed"  # type: ignore[index]


def test_stall_event_and_clear() -> None:
    b = _board()
    b.job_state("a0", {"state": "stalled", "ranks": [1], "collective": "all_reduce",
                       "stacks": {"1": "File train.py, line 3"}})
    job = b.job_json("run")["job"]  # type: ignore[index]
    assert job["state"] == "stalled" and job["stall"]["collective"] == "all_reduce"
    assert [r["flags"] for r in job["ranks"]] == [[], ["stalled"]]
    b.job_state("a0", {"state": "running"})
    job = b.job_json("run")["job"]  # type: ignore[index]
    assert job["stall"] is None and [r["flags"] for r in job["ranks"]] == [[], []]


STALL_RECORD = {"rank": 1, "worker": "tcp://10.0.0.1:1234", "kind": "stalled",
                "message": "job 'train' stalled: rank 1 stuck in all_reduce\n\nstacks...",
                "traceback": "", "ranks": [1], "collective": "all_reduce",
                "stacks": {"0": "File train.py, line 9", "1": "File train.py, line 3"}}


def test_a_stall_that_ended_the_job_stands() -> None:
    b = _board()
    b.failure("a0", STALL_RECORD)
    b.failure("a0", {"rank": 0, "worker": "w0", "kind": "raised", "message": "then"})
    b.job_state("a0", {"state": "failed"})
    b.rank_sample("a0", _sample(0, state="exited", exit="exit code 1"))
    b.rank_sample("a0", _sample(1, state="exited", exit="exit code 1"))
    job = b.job_json("run")["job"]  # type: ignore[index]
    assert job["state"] == "stalled" and job["end"] is not None
    assert job["stall"]["final"] and job["stall"]["ranks"] == [1]
    assert job["stall"]["message"] == "job 'train' stalled: rank 1 stuck in all_reduce"
    assert job["stall"]["stacks"]["0"] == "File train.py, line 9"
    assert [r["flags"] for r in job["ranks"]] == [[], ["stalled"]]
    assert job["attempts"][0]["root_cause"]["kind"] == "stalled"


def test_curves_stay_bounded_and_unknown_jobs() -> None:
    b = _board()
    for i in range(3 * MAX_POINTS):
        b.rank_sample("a0", _sample(0, points={"loss": [[i, 1.0 / (i + 1)]]},
                                    metrics={"loss": 1.0 / (i + 1)}, step=i))
    curve = b.job_json("run")["job"]["curves"]["0"]["loss"]  # type: ignore[index]
    assert len(curve) <= MAX_POINTS and curve[0][0] == 0 and curve[-1][0] == 3 * MAX_POINTS - 1
    assert b.job_json("nope") is None
    b.rank_sample("nope", _sample(0))  # a sample of an unknown job is ignored


def test_the_board_keeps_the_last_jobs_running_ones_first() -> None:
    b = Board()
    b.job_started({"job_id": "live", "name": "live", "workers": ["w"]})
    for i in range(MAX_JOBS + 5):
        b.job_started({"job_id": f"j{i}", "name": f"n{i}", "workers": ["w"]})
        b.job_state(f"j{i}", {"state": "done"})
    ids = [j["id"] for j in b.jobs_json()["jobs"]]
    assert len(ids) == MAX_JOBS and "live" in ids and f"j{MAX_JOBS + 4}" in ids
    assert "j0" not in ids and b.job_json("j0") is None


def test_counters_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = str(tmp_path / "c")
    reader = counters.create(path)
    monkeypatch.setenv(counters.ENV_STATS, path)
    monkeypatch.setattr(counters, "_pid", -1)
    mine = counters.rank_counters()
    assert mine is not None
    mine.add_batch(1500)
    mine.add_batch(500)
    assert reader.read() == {"batches": 2, "wait_ns": 2000}
    monkeypatch.delenv(counters.ENV_STATS)
    monkeypatch.setattr(counters, "_pid", -1)
    assert counters.rank_counters() is None


# ---------------------------------------------------------------- a real cluster

client = client_fixture(2)


def test_running_job_pages_and_json(client: object) -> None:
    root = dashboard_root(client)
    job = dask_ddp.submit(client, report_loop, 400, 0.05, name="healthy-train",
                          progress=False)
    try:
        live = wait_job(root, job.id, "both ranks running with a step rate and a loss",
                        lambda j: j["state"] == "running" and len(j["ranks"]) == 2 and all(
                            r["steps_per_s"] and r["metrics"].get("loss") is not None
                            and r["cpu_percent"] is not None and r["rss_bytes"]
                            for r in j["ranks"]))
        assert live["name"] == "healthy-train" and live["world_size"] == 2
        assert live["attempt"] == 0 and live["id"] == job.id
        workers = sorted(client.scheduler_info()["workers"])  # type: ignore[attr-defined]
        assert sorted(r["worker"] for r in live["ranks"]) == workers
        for r in live["ranks"]:
            assert r["step_source"] == "report" and r["wait_fraction"] is None
            assert r["state"] == "running" and r["host"] == "127.0.0.1"
            assert r["metrics"]["lr"] == 0.1 and isinstance(r["step"], int)
        assert live["default_metric"] == "loss" and set(live["metric_names"]) == {"loss", "lr"}
        # the list and both pages
        listing = get_json(root + "api/jobs")
        row = next(j for j in listing["jobs"] if j["id"] == job.id)
        assert row["state"] == "running" and row["url"] == f"job/{job.id}"
        assert row["hosts"] == ["127.0.0.1"] and row["duration_s"] > 0
        for page in ("", f"job/{job.id}", f"job/{job.id[:10]}"):
            status, ctype, body = get(root + page)
            assert status == 200 and ctype.startswith("text/html"), (page, status)
            assert "dashboard.js" in body
        status, _, body = get(root + "static/dashboard.js")
        assert status == 200 and "api/job/" in body
    finally:
        result = job.result(timeout=180)
    assert result == [0, 1]
    done = wait_job(root, job.id, "done, both ranks exited with code 0",
                    lambda j: j["state"] == "done" and all(
                        r["state"] == "exited" and r["exit"] == "exit code 0"
                        for r in j["ranks"]))
    assert done["end"] is not None and done["root_cause"] is None
    for r in done["ranks"]:
        loss = done["curves"][str(r["rank"])]["loss"]
        assert len(loss) >= 3 and loss[-1][0] > loss[0][0]
        assert r["step"] == 399 and r["steps_per_s"] > 0  # the rate measured while running
    # curves: the default metric's, one chosen, or all
    base = f"{root}api/job/{job.id}"
    assert [set(c) for c in done["curves"].values()] == [{"loss"}, {"loss"}]
    chosen = get_json(base + "?metric=lr")["job"]["curves"]
    assert [set(c) for c in chosen.values()] == [{"lr"}, {"lr"}]
    every = get_json(base + "?metric=*")["job"]["curves"]
    assert [set(c) for c in every.values()] == [{"loss", "lr"}, {"loss", "lr"}]


def test_failed_job_shows_root_cause_and_traceback(client: object) -> None:
    root = dashboard_root(client)
    job = dask_ddp.submit(client, fail_after, 10, 1, "bad batch 7 on purpose",
                          name="failing-train", progress=False)
    with pytest.raises(Exception, match="bad batch 7"):
        job.result(timeout=180)
    failed = wait_job(root, job.id, "failed with rank 1's traceback",
                      lambda j: j["state"] == "failed" and j["root_cause"] is not None)
    cause = failed["root_cause"]
    assert cause["rank"] == 1 and cause["kind"] in ("raised", "raised-first")
    assert "ValueError: bad batch 7 on purpose" in cause["traceback"]
    assert "fail_after" in cause["traceback"]
    flags = {r["rank"]: r["flags"] for r in failed["ranks"]}
    assert "failed" in flags[1] and "failed" not in flags[0]
    assert get_json(root + f"api/job/{job.id}")["job"]["state"] == "failed"


def test_straggler_by_step_rate(client: object) -> None:
    root = dashboard_root(client)
    job = dask_ddp.submit(client, uneven_loop, 30.0, [0.02, 0.2], name="uneven",
                          progress=False)
    try:
        seen = wait_job(root, job.id, "rank 1 flagged straggler",
                        lambda j: len(j["ranks"]) == 2
                        and "straggler" in j["ranks"][1]["flags"])
        assert "straggler" not in seen["ranks"][0]["flags"]
    finally:
        job.cancel()
        with pytest.raises(concurrent.futures.CancelledError):
            job.result(timeout=60)
    wait_job(root, job.id, "cancelled", lambda j: j["state"] == "cancelled")


def test_stall_event_from_the_launcher(client: object) -> None:
    root = dashboard_root(client)
    job = dask_ddp.submit(client, report_loop, 100, 0.1, name="stall-shown", progress=False)
    try:
        wait_job(root, job.id, "running", lambda j: j["state"] == "running")
        events.job_stalled(client, job.id, [1], "all_reduce",
                           {1: 'File "train.py", line 12, in step\n    dist.all_reduce(t)'})
        stalled = wait_job(root, job.id, "stalled", lambda j: j["state"] == "stalled")
        assert stalled["stall"]["ranks"] == [1]
        assert stalled["stall"]["collective"] == "all_reduce"
        assert "dist.all_reduce" in stalled["stall"]["stacks"]["1"]
        assert "stalled" in stalled["ranks"][1]["flags"]
    finally:
        assert job.result(timeout=180) == [0, 1]
    wait_job(root, job.id, "done after the stall cleared", lambda j: j["state"] == "done")


def test_stall_record_on_the_failure_topic(client: object) -> None:
    from dask_ddp._launch.wire.names import failure_topic

    root = dashboard_root(client)
    job = dask_ddp.submit(client, report_loop, 1000, 0.1, name="stall-ended",
                          progress=False)
    try:
        wait_job(root, job.id, "running", lambda j: j["state"] == "running")
        client.log_event(failure_topic(job.id), STALL_RECORD)  # type: ignore[attr-defined]
        stalled = wait_job(root, job.id, "stalled by the record",
                           lambda j: j["state"] == "stalled")
        assert stalled["stall"]["final"] and stalled["stall"]["collective"] == "all_reduce"
        assert stalled["end"] is not None and "stalled" in stalled["ranks"][1]["flags"]
    finally:
        job.cancel()
        with pytest.raises(concurrent.futures.CancelledError):
            job.result(timeout=60)
    wait_job(root, job.id, "cancelled (a cancel wins)", lambda j: j["state"] == "cancelled")


def test_elastic_attempts_and_unknown_job(client: object) -> None:
    root = dashboard_root(client)
    job = dask_ddp.submit(client, fail_first_attempt, 40, max_restarts=1, name="restarted",
                          progress=False)
    assert job.result(timeout=240) == [1, 1]
    run = wait_job(root, job.run_id, "attempt 1 done after attempt 0 failed",  # type: ignore[attr-defined]
                   lambda j: j["state"] == "done" and j["attempt"] == 1)
    assert run["restarts"] == 1 and run["max_restarts"] == 1
    first, second = run["attempts"]
    assert first["state"] == "failed" and first["root_cause"]["rank"] == 1
    assert "fails on purpose" in first["root_cause"]["message"]
    assert second["state"] == "done" and second["job_id"] == job.id
    # the attempt's own id finds the run too; an unknown id is a 404 with a reason
    assert get_json(root + f"api/job/{first['job_id']}")["job"]["id"] == run["id"]
    status, ctype, body = get(root + "api/job/0123456789abcdef")
    assert status == 404 and ctype.startswith("application/json")
    assert "no dask-ddp job" in json.loads(body)["error"]
    assert get(root + "job/0123456789abcdef")[0] == 404


@pytest.fixture(scope="module")
def big_images(tmp_path_factory: pytest.TempPathFactory) -> str:
    from images import file_putter, write_folder

    root = tmp_path_factory.mktemp("big-images")
    write_folder(file_putter(str(root)), ("a", "b"), 12, sizes=((1600, 1200),))
    return str(root)


def test_loader_rank_measures_data_wait(client: object, big_images: str) -> None:
    root = dashboard_root(client)
    job = dask_ddp.submit(client, loader_loop, big_images, 25.0, 1, 0.0,
                          name="input-bound", progress=False)
    try:
        seen = wait_job(root, job.id, "both ranks input-bound from their Loader",
                        lambda j: len(j["ranks"]) == 2 and all(
                            r["step_source"] == "loader" and "input-bound" in r["flags"]
                            for r in j["ranks"]))
        for r in seen["ranks"]:
            assert r["wait_fraction"] > 1 / 3 and r["wait_ms_per_step"] > 0
            assert r["steps"] > 0
    finally:
        assert job.result(timeout=180) == [0, 1]



def test_tab_in_the_bokeh_dashboard(client: object) -> None:
    pytest.importorskip("bokeh", reason="the standard (Bokeh) dashboard is not installed")
    link = client.dashboard_link  # type: ignore[attr-defined]
    job = dask_ddp.submit(client, report_loop, 3, 0.01, name="tab", progress=False)
    assert job.result(timeout=120) == [0, 1]
    for page in ("status", "workers"):
        status, _, body = get(link.rsplit("/", 1)[0] + "/" + page)
        assert status == 200 and '<a href="dask-ddp">Dask-Ddp</a>' in body, page
    status, ctype, _ = get(link.rsplit("/", 1)[0] + "/dask-ddp")  # the tab's link
    assert status == 200 and ctype.startswith("text/html")
