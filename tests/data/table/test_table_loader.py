"""TableLoader (data/table/loader.py): what ``Loader(table)`` returns is a documented,
public subclass of Loader, made once; read here from Parquet files, without a cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import dask_ddp
from dask_ddp.data import Loader, Table, TableLoader

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

ROWS = 300


@pytest.fixture
def table(tmp_path: Path) -> Table:
    ids = np.arange(ROWS, dtype=np.int64)
    pq.write_table(pa.table({"id": ids, "a": (ids * 0.5).astype(np.float32)}),
                   tmp_path / "t.parquet", row_group_size=64)
    return Table.from_parquet(str(tmp_path / "t.parquet"))


def _ids(loader: Loader) -> list[int]:
    return [int(i) for batch in loader for i in batch["id"].tolist()]


def test_loader_of_a_table_is_a_table_loader(table: Table) -> None:
    loader = Loader(table, 32, shuffle=True, seed=1, rank=0, world_size=1)
    try:
        assert type(loader) is TableLoader
        assert isinstance(loader, Loader)
        assert sorted(_ids(loader)) == list(range(ROWS))
        assert loader.skipped == 0
    finally:
        loader.close()


def test_table_loader_is_public_and_documented() -> None:
    assert "TableLoader" in dask_ddp.data.__all__
    assert dask_ddp.data.TableLoader is TableLoader
    assert issubclass(TableLoader, Loader)
    assert TableLoader.__doc__ is not None and "Loader(table" in TableLoader.__doc__
    assert Loader.__new__.__doc__ is not None and "TableLoader" in Loader.__new__.__doc__
    assert "TableLoader" in (Loader.__doc__ or "")


def test_made_once_whichever_way_it_is_called(table: Table, monkeypatch: Any) -> None:
    """Loader(table), TableLoader(table) and a user's Loader subclass given a table each
    run TableLoader.__init__ once and read the same batches."""
    calls: list[int] = []
    init = TableLoader.__init__

    def counting(self: TableLoader, *args: Any, **kwargs: Any) -> None:
        calls.append(1)
        init(self, *args, **kwargs)

    monkeypatch.setattr(TableLoader, "__init__", counting)

    class Mine(Loader):
        pass

    seen = []
    for make in (Loader, TableLoader, Mine):
        calls.clear()
        loader = make(table, 50, shuffle=True, seed=3, rank=0, world_size=1)
        try:
            assert type(loader) is TableLoader and calls == [1], (make, calls)
            seen.append(_ids(loader))
        finally:
            loader.close()
    assert seen[0] == seen[1] == seen[2]
