"""Tables on a real LocalCluster: Dask DataFrames and Arrays passed to submit reach each
rank as a Table; the Loader reads every row once per epoch, equal batches, exact resume."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

import dask_ddp
from cluster_util import client_fixture
from dask_ddp._cluster import cluster_info
from table_util import (
    check_epoch_coverage,
    read_epochs,
    resume_exactly,
    resume_other_world,
)

dd = pytest.importorskip("dask.dataframe")
da = pytest.importorskip("dask.array")

client = client_fixture(2)

N = 10_003


def _frame(n: int = N, nparts: int = 7) -> Any:
    ids = np.arange(n, dtype=np.int64)
    pdf = pd.DataFrame({"id": ids, "a": (ids * 0.5).astype(np.float32), "b": ids % 3 == 0})
    return dd.from_pandas(pdf, npartitions=nparts, sort=False)


def _run(client: Any, fn: Any, *args: Any, timeout: float = 240, **kwargs: Any) -> list[Any]:
    job = dask_ddp.submit(client, fn, *args, progress=False, **kwargs)
    return list(job.result(timeout=timeout))


@pytest.mark.parametrize("cache", [True, False], ids=["cached", "window-by-window"])
def test_persisted_frame_every_row_once_equal_batches(client: Any, cache: bool) -> None:
    ddf = _frame().persist()
    job = dask_ddp.submit(client, read_epochs, ddf, batch_size=256, shuffle=True, seed=0,
                          cache=cache, progress=False)
    results = job.result(timeout=240)
    # The ranks got a description, not the data (130 KB of rows): the payload is small.
    assert len(job.options.payload) < 20_000, len(job.options.payload)
    assert results[0]["len"] == N
    assert results[0]["columns"] == ["id", "a", "b"]
    assert results[0]["dtypes"] == {"id": "torch.int64", "a": "torch.float32", "b": "torch.bool"}
    check_epoch_coverage(results, N, 2)
    # The ranks read different rows, and each rank's rows come from every partition.
    r0 = set(results[0]["epochs"][0]["ids"])
    assert len(r0 & set(results[1]["epochs"][0]["ids"])) <= 1
    offsets = np.cumsum([0, *ddf.map_partitions(len).compute().tolist()])
    parts = {int(np.searchsorted(offsets, i, side="right") - 1) for i in r0}
    assert parts == set(range(7))


def test_cache_reads_each_partition_once_and_keeps_the_order(client: Any) -> None:
    """With the cache, a rank reads each partition once for the whole run (none after the
    first epoch) and yields the batches the window-by-window reads yield."""
    from dask_ddp.data import TableLoader

    ddf = _frame(6007, 6).persist()  # held: the table does not hold its partitions
    table = dask_ddp.data.Table(ddf, client=client)
    seen: dict[bool, list[list[int]]] = {}
    for cache in (True, False):
        loader = TableLoader(table, 256, shuffle=True, seed=3, rank=1, world_size=2,
                             cache=cache)
        reader = loader._source.reads.reader()
        starts: list[int] = []
        start = reader.start

        def counting(partitions: Any, rows: Any, _start: Any = start,
                     _starts: list[int] = starts) -> Any:
            _starts.extend(int(p) for p in partitions)
            return _start(partitions, rows)

        reader.start = counting
        batches, per_epoch = [], []
        for epoch in range(3):
            loader.set_epoch(epoch)
            before = len(starts)
            batches.extend(b["id"].tolist() for b in loader)
            per_epoch.append(len(starts) - before)
        seen[cache] = batches
        if cache:
            assert sorted(starts) == list(range(6)), starts  # each partition once
            assert per_epoch[1:] == [0, 0], per_epoch
        else:
            assert all(n > 0 for n in per_epoch), per_epoch  # read again every epoch
        loader.close()
    assert seen[True] == seen[False]


def test_cache_is_off_when_the_rows_exceed_the_configured_size(client: Any) -> None:
    import dask

    from dask_ddp.data import TableLoader

    ddf = _frame(1000, 2).persist()
    table = dask_ddp.data.Table(ddf, client=client)
    with dask.config.set({"dask-ddp.data.table-cache": "1 KiB"}):
        assert TableLoader(table, 10, rank=0, world_size=1)._source.reads.cache is None
    with dask.config.set({"dask-ddp.data.table-cache": "1 MiB"}):
        assert TableLoader(table, 10, rank=0, world_size=1)._source.reads.cache == {}
    with dask.config.set({"dask-ddp.data.table-cache": 0}):
        assert TableLoader(table, 10, rank=0, world_size=1)._source.reads.cache is None
        assert TableLoader(table, 10, rank=0, world_size=1, cache=True)._source.reads.cache == {}


def test_kwargs_and_dispatch_run_and_unshuffled_order(client: Any) -> None:
    ddf = _frame(1001, 3).persist()
    futures = dask_ddp.dispatch.run(client, read_epochs, table=ddf, epochs=1, batch_size=100,
                                    shuffle=False)
    results = client.gather(futures)
    check_epoch_coverage(results, 1001, 2)
    # DistributedSampler's order without shuffle: rank r reads r, r + 2, ...
    assert results[0]["epochs"][0]["ids"] == list(range(0, 1001, 2))
    assert results[1]["epochs"][0]["ids"] == list(range(1, 1001, 2)) + [0]


@pytest.mark.parametrize("cache", [True, False], ids=["cached", "window-by-window"])
def test_not_persisted_frame_is_computed_as_read(client: Any, cache: bool) -> None:
    ddf = _frame(3001, 5).map_partitions(lambda d: d.assign(a=d["a"]), meta=_frame()._meta)
    table = dask_ddp.data.Table(ddf, client=client)
    assert not table.persisted and len(table) == 3001
    results = _run(client, read_epochs, table, batch_size=128, drop_last=True, cache=cache)
    for r in results:
        assert set(r["epochs"][0]["sizes"]) == {128}
    ids = np.concatenate([r["epochs"][0]["ids"] for r in results])
    assert len(ids) == len(set(ids.tolist())) == (3001 // 2 // 128) * 128 * 2


@pytest.mark.parametrize("cache", [True, False], ids=["cached", "window-by-window"])
def test_exact_resume_same_world(client: Any, cache: bool) -> None:
    ddf = _frame(4000, 6).persist()
    results = _run(client, resume_exactly, ddf, stop_after=5, batch_size=100, seed=9,
                   cache=cache)
    for r in results:
        assert r["head"] == r["full"][:5]
        assert r["tail"] == r["full"][5:]
        assert r["state"]["batch"] == 5 and r["state"]["epoch"] == 1


@pytest.mark.parametrize("edit", [{"order": None}, {"order": 1}], ids=["no-order", "older"])
def test_a_state_of_another_shuffled_order_starts_its_epoch_again(client: Any,
                                                                 edit: dict[str, Any]) -> None:
    # Saved mid-epoch by a version whose shuffled order differs (or that predates the
    # marker): the rows it has left cannot be named, so the whole epoch is read again.
    ddf = _frame(4000, 6).persist()
    results = _run(client, resume_exactly, ddf, 5, edit, batch_size=100, seed=9)
    for r in results:
        assert r["tail"] == r["full"], "the epoch was not read again from its start"
    # The same order resumes where the state was saved.
    results = _run(client, resume_exactly, ddf, 5, batch_size=100, seed=9)
    for r in results:
        assert r["tail"] == r["full"][5:]


@pytest.mark.parametrize("cache", [True, False], ids=["cached", "window-by-window"])
def test_resume_on_another_world_size_reads_every_unseen_row(client: Any, cache: bool) -> None:
    ddf = _frame(2501, 5).persist()
    (r,) = _run(client, resume_other_world, ddf, 3, 2, 2, 100, cache, n_workers=1)
    seen, rest = set(r["seen"]), r["rest"]
    assert len({len(x) for x in rest}) == 1
    got = set(np.concatenate(rest).tolist())
    assert got | seen == set(range(2501))
    assert len(np.concatenate(rest)) - len(set(range(2501)) - seen) <= 1


def test_array_and_features_label_batches(client: Any) -> None:
    n = 2000
    x = np.arange(n * 4, dtype=np.float32).reshape(n, 4)
    arr = da.from_array(x, chunks=(300, 4)).persist()
    results = _run(client, read_epochs, arr, epochs=1, batch_size=64)
    assert results[0]["shapes"]["x"] == (64, 4)
    ids = np.concatenate([r["epochs"][0]["ids"] for r in results])
    assert set((ids // 4).tolist()) == set(range(n))
    # (x, y): features stacked into one tensor, label apart.
    ddf = _frame(999, 4).persist()
    results = _run(client, read_epochs, ddf, epochs=1, batch_size=50, features=["a", "id"],
                   label="id")
    assert results[0]["shapes"] == {"x": (50, 2), "y": (50,)}
    assert results[0]["dtypes"] == {"x": "torch.float32", "y": "torch.int64"}  # torch promotion
    check_epoch_coverage(results, 999, 2)


def test_fixed_length_list_column_is_2d(client: Any) -> None:
    import pyarrow as pa

    n = 600
    emb = pa.array([[i, i + 0.5, -i] for i in range(n)], type=pa.list_(pa.float32(), 3))
    pdf = pd.DataFrame({"id": np.arange(n), "emb": pd.Series(emb, dtype=pd.ArrowDtype(emb.type))})
    ddf = dd.from_pandas(pdf, npartitions=3).persist()
    table = dask_ddp.data.Table(ddf, client=client)
    assert table.shapes["emb"] == (3,) and table.dtypes["emb"] == np.float32
    (r,) = _run(client, _check_emb, table, n_workers=1)
    assert r == n


def _check_emb(table: Any) -> int:
    from dask_ddp.data import Loader

    seen = 0
    for batch in Loader(table, batch_size=128, shuffle=True, seed=1):
        emb, ids = batch["emb"], batch["id"].to(torch.float32)
        assert emb.shape[1:] == (3,) and emb.dtype == torch.float32
        assert torch.equal(emb[:, 0], ids) and torch.equal(emb[:, 2], -ids)
        seen += len(ids)
    return seen


def test_string_column_error_names_it_unless_left_out(client: Any) -> None:
    pdf = pd.DataFrame({"id": np.arange(100), "name": [f"n{i}" for i in range(100)]})
    ddf = dd.from_pandas(pdf, npartitions=2).persist()
    with pytest.raises(TypeError, match=r"column 'name' has dtype (str|string)"):
        dask_ddp.submit(client, read_epochs, ddf, progress=False)
    with pytest.raises(ValueError, match="'name'"):
        dask_ddp.data.Table(ddf, client=client)
    table = dask_ddp.data.Table(ddf, columns=["id"], client=client)
    assert table.columns == ["id"] and len(table) == 100
    results = _run(client, read_epochs, table, epochs=1, batch_size=32)
    check_epoch_coverage(results, 100, 2)


def test_local_shuffle_with_skewed_placement(client: Any) -> None:
    workers = sorted(cluster_info(client)["workers"])
    ddf = _frame(5000, 10)
    # 9 of the 10 partitions on one worker.
    first = client.persist(ddf.partitions[:9], workers=[workers[0]])
    last = client.persist(ddf.partitions[9:], workers=[workers[1]])
    both = dd.concat([first, last]).persist()
    table = dask_ddp.data.Table(both, client=client)
    results = _run(client, read_epochs, table, batch_size=200, shuffle="local")
    check_epoch_coverage(results, 5000, 2)
    for r in results:  # the same rows every epoch, in another order
        assert set(r["epochs"][0]["ids"]) == set(r["epochs"][1]["ids"])


def test_released_partitions_fail_naming_the_partition(client: Any) -> None:
    from distributed import futures_of

    ddf = _frame(500, 2).persist()
    table = dask_ddp.data.Table(ddf, client=client)
    client.cancel(futures_of(ddf))  # the data is gone before the ranks read it
    del ddf
    job = dask_ddp.submit(client, read_epochs, table, epochs=1, batch_size=100, progress=False)
    with pytest.raises(dask_ddp.errors.JobError, match=r"reading rows of partition \d"):
        job.result(timeout=240)


@pytest.mark.parametrize("persist", [False, True], ids=["computed", "persisted"])
def test_a_frame_read_again_unpersisted_gets_a_hint_to_persist(client: Any,
                                                               persist: bool) -> None:
    from table_util import loader_warnings

    ddf = _frame(2_000, 3)
    ddf = ddf.persist() if persist else ddf
    warnings = _run(client, loader_warnings, ddf, epochs=2, cache=False)
    hints = [w for w in warnings[0] if "not persisted" in w]
    if persist:
        assert hints == []
    else:
        assert len(hints) == 1 and ".persist()" in hints[0], warnings[0]
    assert not any("not persisted" in w for w in warnings[1])  # rank 0 says it, once
