"""The scheduler's list of workers as the launcher reads it (_cluster.py), under a client
whose own periodic refresh (which fetches no workers) runs as often as it can."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import dask
import pytest
from distributed import Client

from dask_ddp._cluster import cluster_info

READS = 300


@pytest.fixture
def busy_client(lease: Any) -> Iterator[Client]:
    with lease(2) as client, \
            dask.config.set({"distributed.client.scheduler-info-interval": "1ms"}), \
            Client(client.scheduler.address) as c:
        yield c


def test_every_read_lists_every_worker(busy_client: Client) -> None:
    # client.scheduler_info(n_workers=-1) returned no workers in 46 of these 300
    # reads: the refresh overwrote the client's shared cache between fetch and return.
    seen = [len(cluster_info(busy_client)["workers"]) for _ in range(READS)]
    assert seen == [2] * READS, f"reads listing fewer than 2 workers: {[n for n in seen if n != 2]}"


def test_an_asynchronous_client_is_refused() -> None:
    class Async:
        asynchronous = True

    with pytest.raises(RuntimeError, match="asynchronous Client"):
        cluster_info(Async())
