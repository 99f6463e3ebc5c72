"""Table.from_parquet: the ranks read row groups themselves through the engine's stores
(files and a real moto S3 server), pyarrow decoding; errors name the column and file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import dask_ddp
from cluster_util import client_fixture
from table_util import check_epoch_coverage, read_epochs

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

client = client_fixture(2)


def _write(folder: Path, files: int = 3, rows: int = 700, row_group: int = 256) -> int:
    """Parquet files of ids, a float column, a bool column and a 2-wide list; the count."""
    folder.mkdir(parents=True, exist_ok=True)
    start = 0
    for f in range(files):
        ids = np.arange(start, start + rows + f, dtype=np.int64)
        emb = pa.FixedSizeListArray.from_arrays(
            pa.array(np.stack([ids, -ids], 1).reshape(-1).astype(np.float32)), 2)
        t = pa.table({"id": ids, "a": (ids * 0.5).astype(np.float32), "b": ids % 3 == 0,
                      "emb": emb, "name": [f"n{i}" for i in ids]})
        pq.write_table(t, folder / f"part-{f}.parquet", row_group_size=row_group)
        start += len(ids)
    return start


def test_from_parquet_files_describes_row_groups(tmp_path: Path) -> None:
    n = _write(tmp_path / "t")
    with pytest.raises(TypeError, match=r"column 'name' of .*part-0.parquet.* has dtype"):
        dask_ddp.data.Table.from_parquet(str(tmp_path / "t"))
    table = dask_ddp.data.Table.from_parquet(str(tmp_path / "t"), columns=["id", "a", "emb"])
    assert len(table) == n and table.columns == ["id", "a", "emb"]
    assert table.shapes["emb"] == (2,) and table.npartitions == 9
    one = dask_ddp.data.Table.from_parquet(f"file://{tmp_path}/t/part-1.parquet",
                                           columns=["id"])
    assert len(one) == 701
    with pytest.raises(FileNotFoundError, match="nothing"):
        dask_ddp.data.Table.from_parquet(str(tmp_path / "nothing"))


@pytest.mark.parametrize("cache", [True, False], ids=["cached", "window-by-window"])
def test_parquet_files_read_by_the_ranks(client: Any, tmp_path: Path, cache: bool) -> None:
    n = _write(tmp_path / "t")
    table = dask_ddp.data.Table.from_parquet(str(tmp_path / "t"), columns=["id", "a", "b", "emb"])
    job = dask_ddp.submit(client, read_epochs, table, batch_size=128, cache=cache,
                          progress=False)
    results = job.result(timeout=240)
    check_epoch_coverage(results, n, 2)
    assert results[0]["shapes"]["emb"] == (128, 2)


def test_parquet_on_s3_read_by_the_ranks(client: Any, tmp_path: Path, s3_server: str,
                                         s3_bucket: str) -> None:
    n = _write(tmp_path / "t", files=2, rows=500, row_group=200)
    store = dask_ddp.storage.open(f"s3://{s3_bucket}/events")
    for f in sorted((tmp_path / "t").iterdir()):
        store.put(f.name, f.read_bytes())
    table = dask_ddp.data.Table.from_parquet(f"s3://{s3_bucket}/events/",
                                             columns=["id", "a", "b"], endpoint_url=s3_server)
    assert len(table) == n and table.npartitions == 6
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_REGION": "us-east-1"}
    job = dask_ddp.submit(client, read_epochs, table, epochs=1, batch_size=100, shuffle=False,
                          env=env, progress=False)
    results = job.result(timeout=240)
    check_epoch_coverage(results, n, 2)
