"""The order the suite's tests are dealt to pytest-xdist's processes (tests/scheduling.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

import scheduling
from cluster_lease import LEASE_SHAPES


class Item:
    """What order_tests reads of a pytest item."""

    def __init__(self, name: str, module: str = "m", markers: tuple[str, ...] = (),
                 client: bool = False, shared: bool = False) -> None:
        self.nodeid = f"tests/{module}.py::{name}"
        self.module = SimpleNamespace(__name__=module)
        self.fixturenames = ["client"] if client else []
        self.markers = markers
        scope = "module" if shared else "function"
        self._fixtureinfo = SimpleNamespace(
            name2fixturedefs={"fixture": [SimpleNamespace(scope=scope)]})

    def get_closest_marker(self, name: str) -> Any:
        return object() if name in self.markers else None


def _order(items: list[Item], processes: int, known: dict[str, float]) -> list[str]:
    cache = SimpleNamespace(get=lambda key, default: known)
    config = SimpleNamespace(cache=cache, option=SimpleNamespace(numprocesses=processes))
    scheduling.order_tests(config, items)  # type: ignore[arg-type]
    return [i.nodeid.split("::")[1] for i in items]


def test_each_process_gets_as_many_tests_and_about_as_much_time() -> None:
    known = {f"tests/m.py::t{i}": float(s) for i, s in enumerate([100, 90, 10, 5, 1, 1])}
    order = _order([Item(f"t{i}") for i in range(6)], 2, known)
    first, second = order[:3], order[3:]  # xdist's first hand-out: 3 tests each
    time = {n: known[f"tests/m.py::{n}"] for n in order}
    assert abs(sum(time[n] for n in first) - sum(time[n] for n in second)) <= 5, order
    assert {first[0], second[0]} == {"t0", "t1"}  # each process starts with a long one
    assert time[first[1]] >= time[first[2]] and time[second[1]] >= time[second[2]]


def test_tests_of_one_cluster_size_run_together(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(LEASE_SHAPES, "one", (1, 1))
    monkeypatch.setitem(LEASE_SHAPES, "three", (1, 3))
    monkeypatch.setitem(LEASE_SHAPES, "wide", (2, 4))
    monkeypatch.setitem(LEASE_SHAPES, "narrow", (2, 2))
    items = [Item(f"{m}{i}", m, client=True) for i in range(2)
             for m in ("three", "narrow", "one", "wide")] + [Item("plain")]
    order = _order(items, 1, {})
    # No cluster first; then one thread per worker, growing; then two, shrinking.
    assert order == ["plain", "one0", "one1", "three0", "three1", "wide0", "wide1",
                     "narrow0", "narrow1"]


def test_without_timings_the_markers_guess() -> None:
    items = [Item("quick"), Item("cluster", markers=("dask",)),
             Item("slow", markers=("slow", "dask"))]
    assert _order(items, 1, {}) == ["slow", "cluster", "quick"]


def test_tests_sharing_a_module_fixture_go_to_one_process() -> None:
    items = [Item(f"own{i}", "own", markers=("slow",), shared=True) for i in range(3)]
    items += [Item(f"t{i}") for i in range(5)]
    order = _order(items, 2, {})
    first, second = order[:4], order[4:]
    assert {"own0", "own1", "own2"} <= set(first) or {"own0", "own1", "own2"} <= set(second)
