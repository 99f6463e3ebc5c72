"""The session cluster the tests lease (tests/cluster_lease.py): exactly the workers asked
for, seen as such by the launcher, and healed after a test that killed, closed or added
workers or left a rank running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import Any

import pytest
from distributed import Client

import dask_ddp
from cluster_lease import SESSION, SessionCluster
from cluster_util import sleep_only
from dask_ddp import dispatch

pytestmark = [pytest.mark.dask, pytest.mark.timeout(300)]


def _pids(client: Client) -> set[int]:
    return set(client.run(os.getpid).values())


def test_a_lease_has_exactly_the_workers_asked_for(lease: Any) -> None:
    for n in (3, 1, 2):
        with lease(n) as client:
            assert len(client.scheduler_info(n_workers=-1)["workers"]) == n
            # The seed's dispatch.run takes every worker of the cluster: n ranks.
            futures = dispatch.run(client, sleep_only, 0.0)
            assert client.gather(futures) == [0] * n
            with pytest.raises(dask_ddp.GangStartError, match=f"only {n} can take a rank"):
                dask_ddp.submit(client, sleep_only, 0.0, n_workers=n + 1, progress=False)


def test_killed_and_closed_workers_are_replaced_before_the_next_lease(lease: Any) -> None:
    with lease(2) as client:
        starts = SESSION.starts
        before = _pids(client)
        victim, closed = sorted(client.scheduler_info(n_workers=-1)["workers"])
        os.kill(client.run(os.getpid, workers=[victim])[victim], signal.SIGKILL)
        cluster: Any = client.cluster
        nanny = next(n for n in cluster.workers.values() if n.worker_address == closed)
        cluster.sync(nanny.close, timeout=30)
    with lease(2) as client:
        after = _pids(client)
        assert len(after) == 2 and len(after & before) == 0, (before, after)
        assert dask_ddp.submit(client, sleep_only, 0.0, progress=False).result(120) == [0, 0]
    assert SESSION.starts == starts, "healed by its nannies and a rescale, not a restart"


def test_a_rank_left_running_restarts_the_cluster(lease: Any) -> None:
    restarts = len(SESSION.restarts)
    with lease(1) as client:
        addr = client.scheduler.address
        # What a rank process of the cluster looks like to the checks: its module on its
        # command line, the cluster's scheduler in its environment; nothing will stop it.
        stray = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(600)", "dask_ddp._launch.rank.main"],
            env={**os.environ, "DASK_DDP_SCHEDULER": addr})
    try:
        assert len(SESSION.restarts) > restarts
        assert "rank processes alive" in SESSION.restarts[restarts][1], SESSION.restarts
        # The closed cluster's leftovers are killed.
        assert stray.wait(timeout=60) == -signal.SIGKILL
        with lease(1) as client:
            assert client.scheduler.address != addr
    finally:
        stray.kill()
        stray.wait()


def test_a_lease_needs_a_worker() -> None:
    with pytest.raises(ValueError, match="at least one worker"):
        with SessionCluster().lease(0):
            pass
