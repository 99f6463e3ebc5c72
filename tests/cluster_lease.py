"""One self-healing Dask cluster per test process, lent to one test at a time.

A cold LocalCluster costs seconds (worker processes, their imports, a warm template's torch
import at the first job); the suite started 70-80 of them. Instead each test process (each
pytest-xdist worker) keeps one :class:`SessionCluster`, and a test leases it:
:meth:`SessionCluster.lease` scales it to exactly the workers the test asked for, so
``dispatch.run`` (every worker of the cluster) and ``dispatch.submit`` (all or ``n_workers``
of them) see the same cluster a fresh ``LocalCluster(n_workers=n)`` would have given.

When the test ends the lease checks that nothing of it is left (the checks of the chaos
tests: rank processes, active tasks, work directories, warm templates without their worker,
the client's threads), waits for the nannies to bring back a worker the test killed, scales
away the workers the test added or closed for good, and restarts the cluster when a check
fails, the test failed, or it marked the cluster with :func:`restart_after`: one test's
fault never reaches the next. Each restart is named with its reason in pytest's terminal summary.

A test makes a cluster of its own only where the cluster itself is under test (its
environment, ports, configuration read at start, ``n_workers=0``); it says why.
"""

from __future__ import annotations

import contextlib
import gc
import glob
import logging
import os
import signal
import tempfile
import threading
from collections.abc import Iterator
from typing import Any

import psutil
from distributed import Client, LocalCluster

# distributed has no public way to make a running client the default and take it back
from distributed.client import _global_clients, _set_global_client

from waits import wait_until

logger = logging.getLogger(__name__)

#: A LocalCluster (a SpecCluster) closes a worker's nanny for good when no worker of its
#: name is registered ``lost-worker-timeout`` (15 s) after one was removed: a worker killed
#: twice within 15 s (the chaos tests' rhythm) lost its nanny while it restarted the second,
#: and the test its cluster's worker. Read in the test's process, where the cluster lives,
#: when a worker is removed: set for the whole test process (:func:`hold_cluster_config`),
#: since the session cluster's nannies outlive any one test's configuration.
CLUSTER_CONFIG = {"distributed.deploy.lost-worker-timeout": "1 hour"}

#: The size each module's ``client`` leases, ``{module: (threads_per_worker, n_workers)}``
#: (:func:`cluster_util.client_fixture` notes it): the tests are ordered by it, so a test
#: process rescales its cluster seldom.
LEASE_SHAPES: dict[str, tuple[int, int]] = {}

def hold_cluster_config() -> None:
    """Set :data:`CLUSTER_CONFIG` in this process for good (not in a context a test ends)."""
    import dask

    dask.config.set(CLUSTER_CONFIG)


#: Scheduler task states of work not done yet (a test's job still running).
ACTIVE = ("processing", "waiting", "no-worker", "queued")

#: How long a finished test's leftovers may take to go (a rank process exiting, a supervisor
#: removing its work directory) before the cluster counts as dirty and is restarted.
SETTLE_S = 10.0
#: How long the nannies have to bring back the workers a test killed.
HEAL_S = 90.0
#: How long a scale to the leased size may take (worker processes starting on a busy host).
SCALE_S = 120.0


def local_cluster(n_workers: int, threads_per_worker: int = 1, **kwargs: Any) -> LocalCluster:
    """A real LocalCluster with worker processes and no fixed ports (``kwargs``: more
    of LocalCluster's options)."""
    return LocalCluster(n_workers=n_workers, threads_per_worker=threads_per_worker,
                        processes=True, dashboard_address=":0", scheduler_port=0, **kwargs)


def _active_tasks(dask_scheduler: Any = None) -> list[tuple[str, str]]:
    return [(str(k), ts.state) for k, ts in dask_scheduler.tasks.items() if ts.state in ACTIVE]


class SessionCluster:
    """This test process's cluster: started at the first lease, scaled per lease, restarted
    when a lease leaves it dirty, closed at the end of the session."""

    def __init__(self) -> None:
        self.cluster: LocalCluster | None = None
        self.client: Client | None = None
        self.threads = 0
        #: Clusters started, and why each restart happened (test, reason).
        self.starts = 0
        self.restarts: list[tuple[str, str]] = []
        self._dirty: str | None = None
        self._leased = False
        self._pids: set[int] = set()  # the leased workers' processes, killed ones included
        #: True while this starts a cluster (the count of cluster starts tells it apart).
        self.starting = False

    # -- the lease -------------------------------------------------------------------------

    @contextlib.contextmanager
    def lease(self, n_workers: int, threads_per_worker: int = 1, test: str = "",
              fresh: bool = False) -> Iterator[Client]:
        """A client of this cluster with exactly ``n_workers`` workers of
        ``threads_per_worker`` threads, all running, for one test (``test``: its id, for
        the restart record). ``fresh``: a newly started cluster (a test of what a worker
        holds from its start, as its warm templates)."""
        if n_workers < 1:
            raise ValueError(f"a lease needs at least one worker, got {n_workers}: a test of a "
                             "cluster without workers makes its own")
        if self._leased:
            raise RuntimeError("the session cluster is already leased: one lease at a time")
        if self.cluster is not None and (fresh or self.threads != threads_per_worker
                                         or self.client is None
                                         or self.client.status != "running"):
            self._close()
        if self.cluster is None:
            self._start(n_workers, threads_per_worker)
        else:
            self._scale(n_workers)
        assert self.client is not None and self.cluster is not None
        names = set(self.cluster.worker_spec)
        threads = set(threading.enumerate())
        self._pids = set(self._worker_pids())
        self._dirty = None
        self._leased = True
        # The process's default client only while leased, as a module's own Client was: a
        # test that leases nothing runs without one (predict's probe, results' handler).
        _set_global_client(self.client)
        try:
            yield self.client
        except BaseException as exc:
            self._dirty = f"the test raised {type(exc).__name__}"
            raise
        finally:
            _unset_global_client(self.client)
            self._leased = False
            self._end(test, names, threads)

    def restart_after(self, reason: str) -> None:
        """The leased cluster is restarted when the lease ends (the test failed, or changed
        its workers' state in a way no check sees: a probe installed, a config changed)."""
        self._dirty = self._dirty or reason

    def close(self) -> list[str]:
        """Close the cluster; what it left running (rank processes, warm templates)."""
        return self._close()

    # -- mechanics ---------------------------------------------------------------------------

    def _start(self, n_workers: int, threads_per_worker: int) -> None:
        self.starting = True
        try:
            self.cluster = local_cluster(n_workers, threads_per_worker)
        finally:
            self.starting = False
        self.client = Client(self.cluster, set_as_default=False)
        self.threads = threads_per_worker
        self.starts += 1
        self._wait_workers(n_workers, SCALE_S)

    def _scale(self, n_workers: int) -> None:
        assert self.cluster is not None
        if len(self.cluster.worker_spec) != n_workers:
            self.cluster.scale(n_workers)
        self._wait_workers(n_workers, SCALE_S)

    def _running(self) -> dict[str, Any]:
        assert self.client is not None
        from dask_ddp._cluster import cluster_info

        return {a: w for a, w in cluster_info(self.client)["workers"].items()
                if w.get("status", "running") == "running"}

    def _wait_workers(self, n_workers: int, timeout: float) -> None:
        """Until the scheduler has exactly ``n_workers`` running workers and the cluster
        as many worker processes."""
        assert self.cluster is not None

        def off() -> str | None:
            assert self.cluster is not None
            running = len(self._running())
            spec = len(self.cluster.worker_spec)
            up = len(self.cluster.workers)
            if running == n_workers == spec == up:
                return None
            return f"{running} running workers, {up} started, {spec} specified"

        wait_until(off, timeout, f"the session cluster at {n_workers} workers", interval=0.1)

    def _worker_pids(self) -> list[int]:
        assert self.client is not None
        with contextlib.suppress(Exception):
            return list(self.client.run(os.getpid, nanny=False).values())
        return []

    def _end(self, test: str, names: set[str], threads: set[threading.Thread]) -> None:
        """After a lease: heal, check, and restart when anything was left."""
        assert self.cluster is not None
        gc.collect()  # the test's futures and jobs, released
        reason = self._dirty
        # Workers the test added (under its own configuration, perhaps) or closed for good
        # (retired, their nanny closed) leave the cluster; the next lease scales it up.
        drop = (set(self.cluster.worker_spec) - names) | set(_closed_nannies(self.cluster))
        if reason is None and drop:
            try:
                self.cluster.sync(self.cluster.scale_down, list(drop))
            except Exception as exc:  # noqa: BLE001 - a cluster that cannot scale restarts
                reason = f"scaling away the workers it added or closed failed: {exc!r}"
        if reason is None:
            reason = self._leftovers(len(self.cluster.worker_spec), threads)
        if reason is not None:
            logger.warning("session cluster restarted after %s: %s", test, reason)
            self.restarts.append((test, reason))
            left = self._close()
            if left:
                self.restarts.append((test, "after its close: " + "; ".join(left)))

    def _leftovers(self, n_workers: int, threads: set[threading.Thread]) -> str | None:
        """The first thing a test left behind, or None."""
        from cluster_util import rank_processes, template_processes

        assert self.client is not None
        addr = self.client.scheduler.address
        checks = (
            (HEAL_S, "workers missing", lambda: _missing_workers(self, n_workers)),
            (SETTLE_S, "rank processes alive", lambda: _pid_list(rank_processes(addr))),
            (SETTLE_S, "tasks active on the scheduler",
             lambda: self.client.run_on_scheduler(_active_tasks)),  # type: ignore[union-attr]
            (SETTLE_S, "warm templates without their worker",
             lambda: _orphan_templates(template_processes(addr), self._worker_pids())),
            (SETTLE_S, "work dirs of its workers left",
             lambda: _work_dirs(self._pids | set(self._worker_pids()))),
            (SETTLE_S, "client threads left running", lambda: _new_threads(threads)),
        )
        for timeout, what, check in checks:
            try:
                wait_until(check, timeout, what, interval=0.1)
            except AssertionError as exc:
                return str(exc)
            except Exception as exc:  # the cluster cannot answer: as dirty as it gets
                return f"{what}: checking failed with {type(exc).__name__}: {exc}"
        return None

    def _close(self) -> list[str]:
        from cluster_util import rank_processes, template_processes

        if self.cluster is None:
            return []
        addr = self.cluster.scheduler_address
        with contextlib.suppress(Exception):
            assert self.client is not None
            self.client.close(timeout=30)
        with contextlib.suppress(Exception):
            self.cluster.close(timeout=30)
        self.cluster = self.client = None
        left = []
        for what, find in (("rank processes", lambda: rank_processes(addr)),
                           ("warm templates", lambda: template_processes(addr))):
            try:
                wait_until(lambda f=find: _pid_list(f()), SETTLE_S, f"{what} of a closed cluster")
            except AssertionError as exc:
                left.append(str(exc))
                for p in find():
                    with contextlib.suppress(psutil.Error, OSError):
                        os.kill(p.pid, signal.SIGKILL)
        return left


def _pid_list(procs: list[psutil.Process]) -> list[int]:
    return [p.pid for p in procs]


def _missing_workers(session: SessionCluster, n_workers: int) -> str | None:
    assert session.cluster is not None
    running, up = len(session._running()), len(session.cluster.workers)
    if running == up == n_workers:
        return None
    return f"{running} of {n_workers} workers running ({up} started)"


def _closed_nannies(cluster: LocalCluster) -> list[Any]:
    """Workers whose nanny is closed (retired, closed by the test): nothing brings them
    back, so there is no waiting for them."""
    from distributed.core import Status

    gone = (Status.closing, Status.closed, Status.closing_gracefully, Status.failed)
    return [name for name, w in cluster.workers.items() if w.status in gone]


def _orphan_templates(templates: list[psutil.Process], workers: list[int]) -> list[int]:
    found = []
    for p in templates:
        with contextlib.suppress(psutil.Error):
            if p.ppid() not in workers:
                found.append(p.pid)
    return found


def _work_dirs(workers: list[int]) -> list[str]:
    """Rank work directories (``$TMPDIR/dask-ddp-*``) owned by one of ``workers``."""
    found = []
    for owner in glob.glob(os.path.join(tempfile.gettempdir(), "dask-ddp-*", ".owner")):
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open(owner) as f:
                if int(f.read().split()[0]) in workers:
                    found.append(os.path.dirname(owner))
    return found


def _new_threads(before: set[threading.Thread]) -> list[str]:
    """dask-ddp's threads in this process that the test started and that still run (a
    job's driver, a poller); Dask's and the executors' pools (a Checkpointer's) live on by
    design."""
    def ours(t: threading.Thread) -> bool:
        module = str(getattr(getattr(t, "_target", None), "__module__", ""))
        if module == "concurrent.futures.thread":  # an executor's pool (a Checkpointer's)
            return False
        return t.name.startswith("dask-ddp") or module.startswith("dask_ddp")

    return [t.name for t in threading.enumerate()
            if t not in before and t.is_alive() and ours(t)]


def restart_after(client: Client, reason: str) -> None:
    """Restart the session cluster when this test's lease of it ends: ``reason``, the
    state the test left on it that no check sees (a probe installed on its workers)."""
    if client is not SESSION.client:
        raise ValueError(f"{client} is not the session cluster's client: nothing to restart")
    SESSION.restart_after(reason)


#: This process's cluster (tests/conftest.py's ``session_cluster`` fixture hands it out).
SESSION = SessionCluster()


def _unset_global_client(client: Client) -> None:
    """``client`` no longer the process's default client (the inverse of distributed's
    ``_set_global_client``, which has none)."""
    for key, value in list(_global_clients.items()):
        if value is client:
            del _global_clients[key]
