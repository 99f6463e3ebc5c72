"""The job page in a real browser: Debian's ``chromium --headless`` renders the page of a
running 2-rank job (a healthy, an input-bound and a failed one), dumps its DOM (checked
for the ranks, flags and curves the page must show) and takes a screenshot, kept under
the build directory (``build/dev/artifacts/``, or ``$DASK_DDP_ARTIFACTS``) for CI."""

from __future__ import annotations

import concurrent.futures
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import dask_ddp
from cluster_util import client_fixture
from dashboard_util import (
    dashboard_root,
    diverging,
    fail_after,
    loader_loop,
    report_loop,
    wait_job,
)

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="Debian's chromium is not installed (tools/setup_apt.sh installs it)")

#: Seconds a page render may take (the browser's virtual time runs the page's scripts).
RENDER_TIMEOUT_S = 120.0

client = client_fixture(2)


def artifacts() -> Path:
    """Where the screenshots go: the build directory, kept by CI as artifacts."""
    default = Path(__file__).resolve().parents[2] / "build" / "dev" / "artifacts"
    out = Path(os.environ.get("DASK_DDP_ARTIFACTS", default))
    out.mkdir(parents=True, exist_ok=True)
    return out


def chromium(url: str, *args: str) -> str:
    """Run headless chromium on ``url`` with ``args``; its stdout. Its own profile directory,
    removed after; bounded by :data:`RENDER_TIMEOUT_S`."""
    assert CHROMIUM is not None
    with tempfile.TemporaryDirectory(prefix="dask-ddp-chromium-") as profile:
        argv = [CHROMIUM, "--headless", "--disable-gpu", "--no-sandbox",
                "--no-first-run", "--disable-dev-shm-usage", "--hide-scrollbars",
                f"--user-data-dir={profile}", "--virtual-time-budget=6000",
                "--window-size=1500,1150", *args, url]
        try:
            done = subprocess.run(argv, capture_output=True, timeout=RENDER_TIMEOUT_S,
                                  check=False)
        except subprocess.TimeoutExpired as e:
            raise AssertionError(f"chromium did not render {url} within "
                                 f"{RENDER_TIMEOUT_S:g} s: {e.stderr!r}") from e
    assert done.returncode == 0, (f"chromium failed on {url} ({done.returncode}): "
                                  f"{done.stderr.decode(errors='replace')[-2000:]}")
    return done.stdout.decode(errors="replace")


def render(url: str, name: str) -> str:
    """The page's DOM after its scripts ran, and its screenshot as ``<artifacts>/<name>``."""
    dom = chromium(url, "--dump-dom")
    png = artifacts() / name
    png.unlink(missing_ok=True)
    chromium(url, f"--screenshot={png}")
    data = png.read_bytes() if png.exists() else b""
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000, \
        f"no screenshot of {url} at {png} ({len(data)} bytes)"
    return dom


def rank_rows(dom: str) -> dict[int, str]:
    """The rendered rows of the ranks table, by rank."""
    return {int(m.group(1)): m.group(0)
            for m in re.finditer(r'<tr[^>]*data-rank="(\d+)"[^>]*>.*?</tr>', dom, re.S)}


def check_page(dom: str, state: str) -> dict[int, str]:
    rows = rank_rows(dom)
    assert sorted(rows) == [0, 1], f"the page did not render both ranks:\n{dom[:3000]}"
    assert f'id="state" class="badge s-{state}"' in dom, f"state {state} not shown"
    for r in (0, 1):
        assert f'data-rank="{r}"' in dom.split('id="chart"', 1)[1], f"no curve of rank {r}"
    return rows


def run_and_render(client: Any, name: str, fn: Callable[..., Any], *args: Any,
                   ready: Callable[[dict[str, Any]], bool], what: str,
                   end: Callable[[Any], None]) -> tuple[dict[str, Any], str]:
    root = dashboard_root(client)
    job = dask_ddp.submit(client, fn, *args, name=name, progress=False)
    try:
        seen = wait_job(root, job.id, what, ready, timeout=180)
        dom = render(f"{root}job/{job.id}", f"dashboard-{name}.png")
        listing = chromium(root, "--dump-dom")
        assert f'data-job="{job.id}"' in listing and f"job/{job.id}" in listing
    finally:
        end(job)
    return seen, dom


def _finish(stop: Path) -> Callable[[Any], None]:
    """The end of a job that runs until ``stop`` exists (or its own cap): the page was
    rendered while it ran, so it is told to stop rather than waited out."""
    def end(job: Any) -> None:
        stop.touch()
        job.result(timeout=240)
    return end


def test_healthy_job_page(client: Any, tmp_path: Path) -> None:
    stop = tmp_path / "stop"
    seen, dom = run_and_render(
        client, "healthy", report_loop, 2400, 0.05, str(stop),
        what="both ranks running with a loss curve",
        ready=lambda j: j["state"] == "running" and all(
            len(j["curves"].get(str(r["rank"]), {}).get("loss", [])) >= 3
            and r["cpu_percent"] is not None for r in j["ranks"]),
        end=_finish(stop))
    rows = check_page(dom, "running")
    assert "Healthy" in dom
    listing = render(dashboard_root(client), "dashboard-jobs.png")
    assert re.search(r'<a href="[^"]*job/[0-9a-f]+">healthy</a>', listing), listing[:3000]
    for row in rows.values():
        assert "loss=" in row and "127.0.0.1" in row and "f-healthy" in row


def test_input_bound_job_page(client: Any, tmp_path: Path) -> None:
    from images import file_putter, write_folder

    folder = tmp_path / "big-images"
    write_folder(file_putter(str(folder)), ("a", "b"), 12, sizes=((1600, 1200),))
    stop = tmp_path / "stop"
    seen, dom = run_and_render(
        client, "input-bound", loader_loop, str(folder), 120.0, 1, 0.0, str(stop),
        what="both ranks input-bound with a curve",
        ready=lambda j: all("input-bound" in r["flags"] and len(
            j["curves"].get(str(r["rank"]), {}).get("loss", [])) >= 2 for r in j["ranks"])
        and len(j["ranks"]) == 2,
        end=_finish(stop))
    rows = check_page(dom, "running")
    assert "Input-bound: rank(s) 0, 1" in dom
    for row in rows.values():
        assert "f-input-bound" in row and "ms (" in row  # data wait: "x ms (y%)"


def test_failed_job_page(client: Any) -> None:
    def fail_and_wait(job: Any) -> None:
        with pytest.raises(Exception, match="corrupt shard"):
            job.result(timeout=240)

    root = dashboard_root(client)
    job = dask_ddp.submit(client, fail_after, 30, 1, "corrupt shard 17 on purpose",
                          name="failed", progress=False)
    fail_and_wait(job)
    wait_job(root, job.id, "failed with its root cause",
             lambda j: j["state"] == "failed" and j["root_cause"] is not None
             and all(r["state"] == "exited" for r in j["ranks"]))
    dom = render(f"{root}job/{job.id}", "dashboard-failed.png")
    rows = check_page(dom, "failed")
    assert "Failed: rank 1" in dom and "ValueError: corrupt shard 17 on purpose" in dom
    assert "f-failed" in rows[1] and "f-failed" not in rows[0]


def test_stalled_job_page(client: Any) -> None:
    from dask_ddp._launch.wire.names import failure_topic

    def stall_then_cancel(job: Any) -> None:
        job.cancel()
        with pytest.raises(concurrent.futures.CancelledError):
            job.result(timeout=60)

    root = dashboard_root(client)
    job = dask_ddp.submit(client, report_loop, 2000, 0.05, name="stalled", progress=False)
    try:
        wait_job(root, job.id, "running with curves", lambda j: j["state"] == "running"
                 and all(len(c.get("loss", [])) >= 2 for c in j["curves"].values())
                 and len(j["curves"]) == 2)
        # The record the launcher's stall detection puts on the failure topic.
        client.log_event(failure_topic(job.id), {
            "rank": 1, "worker": job.workers[1], "kind": "stalled",
            "message": "job 'stalled' stalled: rank 1 stuck in all_reduce, a collective "
                       "its peers will never join\n\nPython stacks of the ranks: ...",
            "traceback": "", "ranks": [1], "collective": "all_reduce",
            "stacks": {"0": 'File "train.py", line 30, in main\n    evaluate(model)',
                       "1": 'File "train.py", line 21, in step\n    dist.all_reduce(t)'}})
        wait_job(root, job.id, "stalled", lambda j: j["state"] == "stalled")
        dom = render(f"{root}job/{job.id}", "dashboard-stalled.png")
    finally:
        stall_then_cancel(job)
    rows = check_page(dom, "stalled")
    assert "Stalled: rank(s) 1 blocked in all_reduce (the stall ended the job)" in dom
    assert "dist.all_reduce(t)" in dom and "evaluate(model)" in dom
    assert "f-stalled" in rows[1] and "f-stalled" not in rows[0]


def test_diverged_loss_job_page(client: Any, tmp_path: Path) -> None:
    """A NaN loss made the page's JSON unparsable: the page showed no rank and "scheduler
    not answering" for good. Now it renders both ranks and says since when the loss is
    NaN."""
    root = dashboard_root(client)
    stop = tmp_path / "stop"
    job = dask_ddp.submit(client, diverging, 8, 120.0, str(stop), name="diverged",
                          progress=False)
    try:
        wait_job(root, job.id, "both ranks' loss diverged",
                 lambda j: all((r.get("diverged") or {}).get("step") == 3 for r in j["ranks"])
                 and len(j["ranks"]) == 2, timeout=180)
        dom = chromium(f"{root}job/{job.id}", "--dump-dom")
    finally:
        _finish(stop)(job)
    assert sorted(rank_rows(dom)) == [0, 1], f"the page did not render both ranks:\n{dom[:3000]}"
    assert "loss is NaN since step 3" in dom, dom[:3000]
    assert "not answering" not in dom


def test_unread_results_job_page(client: Any) -> None:
    """A results topic nobody reads blocks its ranks: the page says which topic, for how
    long, and what to do."""
    import time

    root = dashboard_root(client)
    job = dask_ddp.submit(client, report_loop, 2000, 0.05, name="unread", progress=False)
    try:
        wait_job(root, job.id, "running", lambda j: j["state"] == "running"
                 and len(j["ranks"]) == 2)
        # The event the results extension logs when a topic of the job is full and unread.
        since = time.time() - 75.0
        client.log_event("dask-ddp-results-unread", {
            "state": "unread", "topic": "results/forgotten-handler",
            "writers": [f.key for f in job.futures], "since": since,
            "used": 1 << 20, "budget": 1 << 20})
        wait_job(root, job.id, "the unread topic listed", lambda j: bool(j["unread"]))
        dom = chromium(f"{root}job/{job.id}", "--dump-dom")
        dumped = time.time() - since  # the page's age of the topic is at most this
        client.log_event("dask-ddp-results-unread",
                         {"state": "read", "topic": "results/forgotten-handler"})
        wait_job(root, job.id, "the topic read again", lambda j: not j["unread"])
    finally:
        job.cancel()
        with pytest.raises(concurrent.futures.CancelledError):
            job.result(timeout=60)
    assert "Results nobody reads: results/forgotten-handler" in dom, dom[:3000]
    # "full for 1m 15s": the topic's age when the page rendered (a loaded machine takes
    # longer between the event and the dump).
    shown = re.search(r"full for (\d+)m (\d+)s \(1\.0 MiB of 1\.0 MiB\)", dom)
    assert shown, dom[:3000]
    assert 75 <= 60 * int(shown[1]) + int(shown[2]) <= dumped + 1, (shown[0], dumped)
    assert "Healthy" not in dom
