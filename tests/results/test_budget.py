"""The scheduler's memory for results: one budget over all topics besides each topic's own,
and a topic nobody reads while its writers wait is logged (a real scheduler, in-process)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import dask.config
import pytest
from distributed import Client, LocalCluster

from dask_ddp._channel import reader as _reader
from dask_ddp._channel.wire import Entry, FrameHeader

pytestmark = [pytest.mark.dask, pytest.mark.timeout(120)]

LIMITS = {"dask-ddp.results.budget": "400 KiB", "dask-ddp.results.total-budget": "1 MiB",
          "dask-ddp.results.unread-warning": "1 s"}


@pytest.fixture(scope="module")
def client() -> Iterator[Client]:
    # A cluster of its own, in this process: its scheduler's budgets are under test.
    with dask.config.set(LIMITS), LocalCluster(
            n_workers=1, processes=False, dashboard_address=":0",
            scheduler_port=0) as cluster, Client(cluster) as c:
        yield c


def run_of(topic: str, source: str, seq: int, size: int) -> list[Any]:
    t = topic.encode()
    data = b"x" * size
    return list(Entry.run(source, seq, 1, FrameHeader(len(data), seq, 1, len(t), 0, 1).pack()
                          + t + data))


def fill(client: Client, topic: str, size: int, tries: int = 40, stream: str = "n.1") -> int:
    """Put entries of ``size`` bytes into ``topic`` until one is refused; how many went."""
    for seq in range(tries):
        reply = client.sync(client.scheduler.dask_ddp_results_put, topic=topic,
                            entries=[run_of(topic, f"{topic}/0/{stream}", seq, size)],
                            wait=0.05, writer=f"writer-{topic}")
        if reply["accepted"] == 0:
            return seq
    return tries


def test_all_topics_together_stay_within_the_total_budget(
        client: Client, caplog: pytest.LogCaptureFixture) -> None:
    """20 topics of 400 KiB each held 15.6 MiB against a 1 MiB budget; now the puts stop
    when all topics together hold the total budget, and a topic whose writers wait while
    nobody reads it is logged by name."""
    topics = [f"dask-ddp-budget-{i}-{client.id[-6:]}" for i in range(20)]
    with caplog.at_level(logging.WARNING, logger="dask_ddp._channel.scheduler"):
        for topic in topics:
            _reader.open_topic(client, topic)
            fill(client, topic, 50_000)
        info = client.sync(client.scheduler.dask_ddp_results_info)
        held = sum(v["used"] for k, v in info.items() if k in topics)
        assert held <= 1 << 20, f"{held} bytes held against a 1 MiB total budget"
        assert all(v["used"] <= 400 << 10 for k, v in info.items() if k in topics)
        deadline = time.monotonic() + 10  # the sweep runs every second; 1 s to warn
        while time.monotonic() < deadline and not any(
                "nobody read it" in r.getMessage() for r in caplog.records):
            time.sleep(0.2)
    warned = [r.getMessage() for r in caplog.records if "nobody read it" in r.getMessage()]
    assert warned, "no warning named the full topic nobody reads"
    assert any(t in w for w in warned for t in topics) and "writer-dask-ddp-budget" in warned[0]
    # Reading one topic frees its memory: another topic's writer goes on.
    assert fill(client, topics[-1], 50_000, tries=1, stream="new.2") == 0  # all full
    rd = _reader.Reader(client, topics[0])
    got = 0
    for _ in range(20):
        got += len(rd.fetch(timeout=0.2))
        if got and not client.sync(client.scheduler.dask_ddp_results_info)[topics[0]]["used"]:
            break
    assert got > 0
    assert fill(client, topics[-1], 50_000, tries=1, stream="new.3") == 1  # room again
    rd.close()
    for topic in topics[1:]:
        client.sync(client.scheduler.dask_ddp_results_close, topic=topic)


def unread_results(key: str, n: int, size: int) -> int:
    """A rank that submits more results than the topic's budget holds."""
    from dask_ddp.results import DaskResultsHandler

    rh = DaskResultsHandler(key)
    for i in range(n):
        rh.submit_result(f"part-{i}.bin", b"x" * size)
    return n


def test_a_topic_nobody_reads_is_on_the_job_page(client: Client, tmp_path: Any) -> None:
    """A job whose results nobody reads blocked its ranks silently; now its page lists the
    topic while it is full and unread, and drops it once a client reads it."""
    import dask_ddp
    from dashboard_util import dashboard_root, wait_job
    from dask_ddp.results import DaskResultsHandler

    key = f"unread-{client.id[-8:]}"
    rh = DaskResultsHandler(key)
    job = dask_ddp.submit(client, unread_results, key, 12, 100_000, name="unread",
                          progress=False, n_workers=1)
    root = dashboard_root(client)
    try:
        seen = wait_job(root, job.id, "the unread results topic listed",
                        lambda j: any(key in u["topic"] for u in j.get("unread", [])),
                        timeout=60)
        u = next(u for u in seen["unread"] if key in u["topic"])
        assert u["used"] <= u["budget"] == 400 << 10 and u["seconds"] >= 0.5, u
        rh.process_results(tmp_path / "res", job.futures, raise_errors=True)
        wait_job(root, job.id, "the topic dropped once read",
                 lambda j: not any(key in x["topic"] for x in j.get("unread", [])),
                 timeout=60)
    finally:
        assert job.result(timeout=60) == [12]
    assert len(list((tmp_path / "res").glob("part-*.bin"))) == 12
