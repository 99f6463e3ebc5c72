"""TableLoader (data/table/loader.py): what ``Loader(table)`` returns is the Loader over
the table's Source, made once, and ``TableLoader`` is its documented public name; read
here from Parquet files, without a cluster."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import dask_ddp
from dask_ddp.data import Loader, Source, Table, TableLoader
from dask_ddp.data.device import PinnedBudget
from dask_ddp.data.table.loader import Opens, TableSource
from table_util import feeding_threads, parquet_table
from waits import wait_until

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

ROWS = 300


@pytest.fixture
def table(tmp_path: Path) -> Table:
    return parquet_table(tmp_path, ROWS, 64)


def _ids(loader: Loader) -> list[int]:
    return [int(i) for batch in loader for i in batch["id"].tolist()]


def test_loader_of_a_table_is_a_table_loader(table: Table) -> None:
    loader = Loader(table, 32, shuffle=True, seed=1, rank=0, world_size=1)
    try:
        assert type(loader) is Loader  # one Loader, never subclassed
        assert isinstance(loader, TableLoader)
        assert isinstance(loader._source, TableSource)
        assert sorted(_ids(loader)) == list(range(ROWS))
        assert loader.skipped == 0
    finally:
        loader.close()


def test_table_loader_is_public_and_documented() -> None:
    assert "TableLoader" in dask_ddp.data.__all__
    assert dask_ddp.data.TableLoader is TableLoader
    assert TableLoader.__doc__ is not None and "Loader(table" in TableLoader.__doc__
    assert "TableLoader" in (Loader.__doc__ or "")


def test_made_once_whichever_way_it_is_called(table: Table, monkeypatch: Any) -> None:
    """Loader(table), TableLoader(table) and a user's Loader subclass given a table each
    run Loader.__init__ once, over a TableSource, and read the same batches; an image
    Loader is no TableLoader."""
    calls: list[int] = []
    init = Loader.__init__

    def counting(self: Loader, *args: Any, **kwargs: Any) -> None:
        calls.append(1)
        init(self, *args, **kwargs)

    monkeypatch.setattr(Loader, "__init__", counting)

    class Mine(Loader):
        pass

    seen = []
    for make in (Loader, TableLoader, Mine):
        calls.clear()
        loader = make(table, 50, shuffle=True, seed=3, rank=0, world_size=1)
        try:
            assert type(loader) is Loader and calls == [1], (make, calls)
            assert isinstance(loader, TableLoader)
            seen.append(_ids(loader))
        finally:
            loader.close()
    assert seen[0] == seen[1] == seen[2]
    other = Loader(Ids(), 5, rank=0, world_size=1)
    try:
        assert not isinstance(other, TableLoader) and not isinstance(object(), TableLoader)
    finally:
        other.close()


class Ids(Source):
    """Another kind: ten ids."""

    def __len__(self) -> int:
        return 10

    def read(self, ids: Any) -> tuple[Any, ...]:
        return (np.asarray(ids),)


@pytest.fixture
def mixed(tmp_path: Path) -> Table:
    """1000 rows in row groups of 97: id, two float32 features, an int16 one, a bool."""
    ids = np.arange(1000, dtype=np.int64)
    pq.write_table(pa.table({"id": ids, "f": (ids * 0.5).astype(np.float32),
                             "g": (-ids).astype(np.float32), "h": (ids % 7).astype(np.int16),
                             "b": ids % 3 == 0}), tmp_path / "m.parquet", row_group_size=97)
    return Table.from_parquet(str(tmp_path / "m.parquet"))


@pytest.mark.parametrize("cache", [True, False], ids=["cached", "window-by-window"])
@pytest.mark.parametrize("shuffle", [True, False, "local"])
@pytest.mark.parametrize("drop_last", [False, True])
def test_every_batch_is_the_plans_rows(mixed: Table, cache: bool, shuffle: Any,
                                       drop_last: bool) -> None:
    """Each batch, in every form the engine hands out, holds exactly the rows the epoch's
    plan gives this rank, in its order, cut into batch_size (the last shorter), with the
    rows' own values and dtypes; small windows put batches across windows."""
    ids = np.arange(1000)
    forms: list[tuple[dict[str, Any], Any]] = [
        ({}, lambda b: b["id"]),
        ({"features": ["f", "g"], "label": "id"}, lambda b: b[1]),
        ({"features": ["id"]}, lambda b: b),  # one column keeps its row shape
        ({"features": ["f", "h"], "label": "id"}, lambda b: b[1]),  # mixed: concatenated
    ]
    for kwargs, id_of in forms:
        for rank in (0, 1):
            loader = Loader(mixed, 33, shuffle=shuffle, seed=5, rank=rank, world_size=2,
                            drop_last=drop_last, window=2, cache=cache, prefetch=2,
                            **kwargs)
            try:
                for epoch in (0, 1):
                    loader.set_epoch(epoch)
                    plan = loader._source.plan.rows(epoch, None)[0]
                    n = len(plan) - len(plan) % 33 if drop_last else len(plan)
                    batches = list(loader)
                    assert len(batches) == len(loader) == -(-n // 33)
                    got = np.concatenate([id_of(b).numpy() for b in batches])
                    assert np.array_equal(got, ids[plan[:n]]), (kwargs, rank, epoch)
                    assert [len(id_of(b)) for b in batches[:-1]] == [33] * (len(batches) - 1)
                    for b in batches:
                        if isinstance(b, dict):
                            assert b["f"].dtype == torch.float32 and b["h"].dtype == torch.int16
                            assert torch.equal(b["f"], b["id"].float() * 0.5)
                            assert torch.equal(b["g"], -b["id"].float())
                            assert torch.equal(b["h"], (b["id"] % 7).to(torch.int16))
                            assert torch.equal(b["b"], b["id"] % 3 == 0)
                        elif isinstance(b, tuple) and "h" in kwargs["features"]:
                            assert b[0].dtype == torch.float32 and b[0].shape[1] == 2
                            assert torch.equal(b[0][:, 1], (b[1] % 7).float())
                        elif isinstance(b, tuple):
                            assert b[0].dtype == torch.float32 and b[1].dtype == torch.int64
                            assert torch.equal(b[0], torch.stack(
                                [b[1].float() * 0.5, -b[1].float()], 1))
                        else:
                            assert b.dtype == torch.int64 and b.ndim == 1
            finally:
                loader.close()


def test_a_loader_closed_mid_epoch_stops_and_reads_again(mixed: Table) -> None:
    """Leaving an epoch early (the engine still gathering ahead) and closing the loader
    end cleanly; a new iteration reads the whole epoch again."""
    loader = Loader(mixed, 10, shuffle=True, seed=1, rank=0, world_size=1, window=1,
                    cache=False, prefetch=1)
    try:
        for _ in range(3):
            it = iter(loader)
            next(it)
            del it  # the generator's cleanup closes the engine's stream
        assert sorted(int(i) for b in loader for i in b["id"].tolist()) == list(range(1000))
        it = iter(loader)
        next(it)
        loader.close()
        with pytest.raises(StopIteration):
            while True:
                next(it)
    finally:
        loader.close()


@pytest.mark.parametrize("leave", ["break", "raise"])
def test_leaving_an_epoch_early_ends_its_feeding_thread(mixed: Table, leave: str) -> None:
    """A loop that leaves an epoch early (a break, an exception in its body) ends the
    epoch's feeding thread and frees its lent buffers then, not at the next epoch; the
    state saved after it resumes with the rest of the epoch, and the next epoch reads
    every row once."""
    base = PinnedBudget.used()
    loader = Loader(mixed, 10, shuffle=True, seed=4, rank=0, world_size=1, window=1,
                    cache=False, prefetch=2, device="cpu")
    # Buffers lent as on a GPU (pageable here), counted in the budget while they live.
    loader._stage._host_buffer = lambda n: torch.empty(n, dtype=torch.uint8)
    before, feeding, seen = feeding_threads(), set[threading.Thread](), list[int]()

    def loop() -> None:
        for batch in loader:
            seen.extend(batch["id"].tolist())
            del batch  # its lent buffer goes back with it
            feeding.update(feeding_threads() - before)
            if len(seen) == 30:
                if leave == "raise":
                    raise LookupError("the loop body failed")
                break

    try:
        loader.set_epoch(0)
        if leave == "raise":
            with pytest.raises(LookupError):
                loop()
        else:
            loop()
        assert feeding, "no feeding thread was seen"
        wait_until(lambda: [t.name for t in feeding if t.is_alive()], 30,
                   "the feeding thread still runs after the loop left the epoch")
        wait_until(lambda: PinnedBudget.used() - base, 30, "bytes still lent")
        state = loader.state_dict()
        assert state["batch"] == 3
        order = loader._source.plan.rows(0, None)[0].tolist()
        loader.load_state_dict(state)
        assert seen + _ids(loader) == order, "the resume read the rest of the epoch"
        loader.set_epoch(1)
        assert sorted(_ids(loader)) == list(range(1000))
    finally:
        loader.close()


def _in_getattr(thread: threading.Thread) -> bool:
    """Whether ``thread`` runs inside a ``__getattr__`` now."""
    frame = sys._current_frames().get(thread.ident or -1)
    while frame is not None and frame.f_code.co_name != "__getattr__":
        frame = frame.f_back
    return frame is not None


def test_threads_reading_a_loader_opened_later_open_it_once(mixed: Table) -> None:
    """Two threads reading a Loader not opened yet, at once: one opens it while the other
    waits inside its attribute read, and both read the opened Loader's answer."""
    opened: list[str] = []
    readers: list[threading.Thread] = []

    class Counted(Opens):
        def open(self, loader: Loader) -> None:
            me = threading.current_thread()
            opened.append(me.name)
            # Open only once the other reader waits inside its read, or has ended.
            wait_until(lambda: [t.name for t in readers if t is not me and t.is_alive()
                                and not _in_getattr(t)], 30, "the other reader not reading")
            super().open(loader)

    loader = Loader.opened_later(Counted(mixed, {"batch_size": 10, "rank": 0,
                                                 "world_size": 1, "shuffle": False}))
    barrier = threading.Barrier(2, timeout=30)
    got: dict[str, Any] = {}

    def read() -> None:
        barrier.wait()
        try:
            got[threading.current_thread().name] = len(loader)
        except Exception as exc:  # noqa: BLE001 - the test reports it
            got[threading.current_thread().name] = exc

    readers += [threading.Thread(target=read, name=f"reader-{i}") for i in range(2)]
    try:
        for t in readers:
            t.start()
        for t in readers:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in readers), "a reader still waits"
        assert got == {"reader-0": 100, "reader-1": 100}
        assert len(opened) == 1, opened
        assert _ids(loader) == list(range(1000))
    finally:
        loader.close()
