"""How the suite runs on its test processes: the session cluster's fixtures, the order of
the tests, and the count of the clusters a run started (conftest.py imports these hooks).

Order. ``make test`` runs with ``--dist worksteal``: pytest-xdist hands each process an
equal *count* of tests, in collection order, contiguous, and an idle process later steals
the back half of a busy one's queue. :func:`order_tests` therefore deals the tests into as
many segments as there are processes, of equal count and about equal expected time
(longest first, each to the segment with the least time so far; a module's tests sharing a
fixture of module scope, such as a cluster of its own, all to one), and orders each segment by
the size of the cluster its tests lease (a process rescales seldom: :func:`_size_order`),
longest first within one size, so a queue's back, which is stolen and runs last, holds its
shortest tests. A test's expected time is its last run's (pytest's cache, where there is
one), else a guess from its markers.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from distributed import Client

from cluster_lease import LEASE_SHAPES, SESSION, SessionCluster, hold_cluster_config

#: A test's expected seconds when no earlier run timed it, by marker.
GUESS_S = {"slow": 30.0, "dask": 5.0}
GUESS_OTHER_S = 0.2
CACHE_KEY = "dask-ddp/durations"

_CALL = pytest.StashKey[pytest.TestReport]()
#: Clusters this process started: (the test, the cluster's class, the workers asked for).
_STARTS: list[tuple[str, str, Any]] = []


# -- fixtures -------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def session_cluster() -> Iterator[SessionCluster]:
    """This test process's cluster (:mod:`cluster_lease`); closed at the end of the session,
    when nothing of its jobs may be left running."""
    yield SESSION
    left = SESSION.close()
    assert not left, f"the session cluster left processes behind: {left}"


@pytest.fixture
def lease(session_cluster: SessionCluster, request: pytest.FixtureRequest
          ) -> Callable[..., contextlib.AbstractContextManager[Client]]:
    """``with lease(n) as client:``: the session cluster at exactly ``n`` workers for this
    test (``threads_per_worker=1``, or the second argument; ``fresh=True``: a cluster
    started for it); ``client.cluster`` is the LocalCluster. A failed test's cluster is
    restarted after it."""

    @contextlib.contextmanager
    def take(n_workers: int, threads_per_worker: int = 1, fresh: bool = False
             ) -> Iterator[Client]:
        with session_cluster.lease(n_workers, threads_per_worker, request.node.nodeid,
                                   fresh) as c:
            yield c
            report = request.node.stash.get(_CALL, None)
            if report is not None and report.failed:
                session_cluster.restart_after("the test failed")

    return take


# -- hooks ----------------------------------------------------------------------------------

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        item.stash[_CALL] = report


#: Each test's seconds in this run (setup, call and teardown), for the next run's order.
_DURATIONS: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _DURATIONS[report.nodeid] = _DURATIONS.get(report.nodeid, 0.0) + report.duration


def pytest_configure(config: pytest.Config) -> None:
    hold_cluster_config()


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("dask") is not None:
        _count_cluster_starts()


def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    starts = [list(s) for s in _STARTS]
    restarts = [list(r) for r in SESSION.restarts]
    if hasattr(config, "workeroutput"):  # an xdist worker: its controller reports
        config.workeroutput["dask_ddp_starts"] = starts
        config.workeroutput["dask_ddp_restarts"] = restarts
        return
    _REPORT.setdefault("starts", []).extend(starts)
    _REPORT.setdefault("restarts", []).extend(restarts)
    cache = getattr(config, "cache", None)
    if _DURATIONS and cache is not None:
        known = dict(cache.get(CACHE_KEY, {}))
        known.update({k: round(v, 2) for k, v in _DURATIONS.items()})
        cache.set(CACHE_KEY, known)


_REPORT: dict[str, list[Any]] = {}


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    out = getattr(node, "workeroutput", {})
    _REPORT.setdefault("starts", []).extend(out.get("dask_ddp_starts", []))
    _REPORT.setdefault("restarts", []).extend(out.get("dask_ddp_restarts", []))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    starts, restarts = _REPORT.get("starts", []), _REPORT.get("restarts", [])
    if not starts and not restarts:
        return
    write = terminalreporter.write_line
    own = [s for s in starts if s[0] != "session"]
    write(f"dask clusters started: {len(starts)} ({len(starts) - len(own)} session "
          f"clusters, {len(own)} of tests' own); session cluster restarts: {len(restarts)}")
    for test, reason in restarts:
        write(f"  restarted after {test}: {reason[:300]}")
    if os.environ.get("DASK_DDP_LIST_CLUSTERS"):
        for test, kind, n in own:
            write(f"  own cluster: {test} ({kind}, n_workers={n})")


def _count_cluster_starts() -> None:
    """Count each SpecCluster (LocalCluster) started in this process, naming its test."""
    from distributed.deploy.spec import SpecCluster

    if getattr(SpecCluster.__init__, "_counted", False):
        return
    init = SpecCluster.__init__

    def counted(self: Any, *args: Any, **kwargs: Any) -> None:
        test = os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" ", 1)[0]
        n = len(kwargs.get("workers") or (args[0] if args else {}) or {})
        kind = type(self).__name__
        _STARTS.append(("session" if SESSION.starting else test, kind, n))
        init(self, *args, **kwargs)

    counted._counted = True  # type: ignore[attr-defined]
    SpecCluster.__init__ = counted  # type: ignore[method-assign]


# -- order ----------------------------------------------------------------------------------

def _expected_s(item: pytest.Item, known: dict[str, float]) -> float:
    if item.nodeid in known:
        return known[item.nodeid]
    for marker, seconds in GUESS_S.items():
        if item.get_closest_marker(marker) is not None:
            return seconds
    return GUESS_OTHER_S


def _shape(item: pytest.Item) -> tuple[int, int]:
    """The cluster size a test leases through its module's ``client``; (0, 0) for none."""
    module = getattr(getattr(item, "module", None), "__name__", "")
    if "client" in getattr(item, "fixturenames", ()) and module in LEASE_SHAPES:
        return LEASE_SHAPES[module]
    return (0, 0)


def _processes(config: pytest.Config) -> int:
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        return int(workerinput.get("workercount", 1))
    n = getattr(config.option, "numprocesses", None)
    return n if isinstance(n, int) and n > 0 else 1


def order_tests(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Order ``items`` in place for ``--dist worksteal`` (the module's docstring)."""
    cache = getattr(config, "cache", None)  # None under -p no:cacheprovider (make stress)
    known: dict[str, float] = dict(cache.get(CACHE_KEY, {})) if cache is not None else {}
    seconds = {id(item): _expected_s(item, known) for item in items}
    n = max(1, min(_processes(config), len(items)))
    # xdist sends the first len // n tests to the first process, and so on.
    counts = [len(items) // n] * n
    counts[-1] += len(items) - sum(counts)
    segments: list[list[pytest.Item]] = [[] for _ in range(n)]
    totals = [0.0] * n
    # A module's tests that share a fixture of module scope (a cluster of its own, a built
    # site) go to one process, which makes it once; the other tests go one by one.
    shared: dict[str, list[pytest.Item]] = {}
    units: list[list[pytest.Item]] = []
    for item in items:
        module = _shares_module_fixture(item)
        if module is None:
            units.append([item])
        elif module in shared:
            shared[module].append(item)
        else:
            units.append(shared.setdefault(module, [item]))

    def unit_s(unit: list[pytest.Item]) -> float:
        return sum(seconds[id(i)] for i in unit)

    # Shared units first (each needs room for all its tests), then longest first.
    for unit in sorted(units, key=lambda u: (len(u) == 1, -unit_s(u))):  # stable
        room = [k for k in range(n) if counts[k] - len(segments[k]) >= len(unit)]
        k = min(room or range(n), key=lambda j: (totals[j], -counts[j] + len(segments[j])))
        segments[k].extend(unit)
        totals[k] += unit_s(unit)
    items[:] = [item for segment in segments
                for item in sorted(segment, key=lambda i: (_size_order(i), -seconds[id(i)]))]


def _shares_module_fixture(item: pytest.Item) -> str | None:
    """The test's module when it uses a fixture of module (or class, package) scope."""
    info = getattr(item, "_fixtureinfo", None)
    for defs in getattr(info, "name2fixturedefs", {}).values():
        if any(d.scope in ("module", "class", "package") for d in defs):
            return item.nodeid.split("::")[0]
    return None


def _size_order(item: pytest.Item) -> tuple[int, int]:
    """Tests of one cluster shape together: one thread per worker first, by growing size
    (each step starts workers beside the warm ones), then two threads (one restart), by
    shrinking size (each step only stops workers)."""
    threads, n = _shape(item)
    return (threads, n if threads <= 1 else -n)
