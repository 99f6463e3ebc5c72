"""The job pages on a cluster started by hand: ``dask scheduler`` (with a dashboard prefix)
and two ``dask worker`` processes, as a user starts them, each a real subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from distributed import Client

import dask_ddp
from cluster_util import wait_no_rank_processes
from conftest import free_port, wait_for_port
from dashboard_util import fail_after, get, get_json, report_loop, wait_job

PREFIX = "ddp-dash"


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    # The workers first, while their scheduler still answers: a worker whose scheduler
    # went first spends its close trying to reach it.
    for group in (procs[1:], procs[:1]):
        for p in group:
            p.terminate()
        for p in group:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=30)


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[str, str]]:
    """(scheduler address, dashboard root URL) of a ``dask scheduler`` + 2 ``dask worker``."""
    here = Path(__file__).resolve().parents[1]  # tests/: the shared helpers
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(here.parent / "src"), str(here), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    port, dash = free_port(), free_port()
    address = f"tcp://127.0.0.1:{port}"
    procs = [subprocess.Popen(
        [sys.executable, "-m", "dask", "scheduler", "--host", "127.0.0.1", "--port", str(port),
         "--dashboard-address", f"127.0.0.1:{dash}", "--dashboard-prefix", PREFIX,
         "--no-show"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        wait_for_port(port, procs[0], timeout=60)
        for _ in range(2):
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "dask", "worker", address, "--nthreads", "1",
                 "--host", "127.0.0.1", "--no-dashboard"],
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        with Client(address, timeout=60) as c:
            c.wait_for_workers(2, timeout=120)
        yield address, f"http://127.0.0.1:{dash}/{PREFIX}/dask-ddp/"
    finally:
        _stop(procs)


def test_pages_on_a_cli_cluster(cluster: tuple[str, str], tmp_path: Path) -> None:
    address, root = cluster
    assert get(root + "api/jobs")[0] == 404, "pages before any job (they come with the first)"
    stop = tmp_path / "stop"  # the job runs until the running page was checked
    with Client(address, timeout=60) as client:
        job = dask_ddp.submit(client, report_loop, 2400, 0.05, str(stop), name="cli-train",
                              progress=False)
        try:
            live = wait_job(root, job.id, "both ranks running with a step rate",
                            lambda j: j["state"] == "running" and len(j["ranks"]) == 2
                            and all(r["steps_per_s"] for r in j["ranks"]))
            assert sorted(r["worker"] for r in live["ranks"]) == sorted(job.workers)
            status, ctype, body = get(f"{root}job/{job.id}")
            assert status == 200 and "dashboard.js" in body
            assert get(root)[0] == 200 and get(root + "static/dashboard.css")[0] == 200
        finally:
            stop.touch()
            assert job.result(timeout=180) == [0, 1]
        wait_job(root, job.id, "done", lambda j: j["state"] == "done")

        bad = dask_ddp.submit(client, fail_after, 5, 0, "rank 0 gives up", name="cli-fail",
                              progress=False)
        with pytest.raises(Exception, match="rank 0 gives up"):
            bad.result(timeout=180)
        failed = wait_job(root, bad.id, "failed", lambda j: j["state"] == "failed"
                          and j["root_cause"] is not None)
        assert failed["root_cause"]["rank"] == 0
        assert "rank 0 gives up" in failed["root_cause"]["traceback"]

        names = [j["name"] for j in get_json(root + "api/jobs")["jobs"]]
        assert names[:2] == ["cli-fail", "cli-train"]
        wait_no_rank_processes(client.scheduler.address, 30)

    # The pages live on the scheduler: they outlive the client that ran the jobs.
    rows = get_json(root + "api/jobs")["jobs"]
    assert [(r["name"], r["state"]) for r in rows] == [("cli-fail", "failed"),
                                                       ("cli-train", "done")]
