"""One table cache per host: 2 ranks of a real job on one host read each partition once
between them, hold it once (files in /dev/shm both map), yield the batches of the per-rank
cache, and leave nothing behind, after the job and after a killed rank; the directory
sweep and the fallback without a memory file system, in this process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import dask_ddp
from cluster_util import client_fixture
from dask_ddp.data.table import host_cache
from table_util import read_host_cached

dd = pytest.importorskip("dask.dataframe")

pytestmark = pytest.mark.skipif(host_cache.host_root() is None,
                                reason="no writable /dev/shm on this host")

client = client_fixture(2)

N, PARTS, RECORD = 6007, 6, 8 + 4 + 1  # id int64, a float32, b bool


def _frame() -> Any:
    ids = np.arange(N, dtype=np.int64)
    pdf = pd.DataFrame({"id": ids, "a": (ids * 0.5).astype(np.float32), "b": ids % 3 == 0})
    return dd.from_pandas(pdf, npartitions=PARTS, sort=False).persist()


def _job_dir(job: Any) -> Path:
    root = host_cache.host_root()
    assert root is not None
    return Path(root) / f"{host_cache.PREFIX}{job.id}"


def _gone(path: Path, timeout: float = 60.0) -> None:
    """Wait (bounded) for ``path`` to be removed, failing with what is left."""
    deadline = time.monotonic() + timeout
    while path.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    left = sorted(p.name for p in path.rglob("*")) if path.exists() else []
    assert not path.exists(), f"{path} still holds {left} {timeout:.0f} s after the job"


def test_two_ranks_read_each_partition_once_per_host(client: Any, monkeypatch: Any) -> None:
    from dask_ddp.data import TableLoader

    ddf = _frame()
    job = dask_ddp.submit(client, read_host_cached, ddf, epochs=2, batch_size=256,
                          shuffle=True, seed=5, progress=False)
    results = list(job.result(timeout=240))
    # Both ranks ran on this host and shared one cache: each partition read once.
    assert [r["dir"] for r in results] == [str(_job_dir(job))] * 2
    assert sum(r["fetched"] for r in results) == PARTS, [r["fetched"] for r in results]
    # Held once: one file per partition, the table's records and a header each.
    recs = {f: n for f, n in results[0]["files"].items() if f.endswith(".rec")}
    assert len(recs) == PARTS and sum(recs.values()) == N * RECORD + PARTS * host_cache.HEADER
    # The workers wrote the files themselves: no temporary file is left.
    assert not [f for f in results[0]["files"] if ".tmp." in f], results[0]["files"]
    # The batches the per-rank cache yields (loaders in this process, outside any job).
    monkeypatch.delenv("DASK_DDP_JOB_ID", raising=False)
    table = dask_ddp.data.Table(ddf, client=client)
    for rank, got in enumerate(results):
        loader = TableLoader(table, 256, shuffle=True, seed=5, rank=rank, world_size=2,
                             cache=True)
        assert loader._source.reads.cache == {}
        want = []
        for epoch in range(2):
            loader.set_epoch(epoch)
            want.append([b["id"].tolist() for b in loader])
        assert loader._source.reads.host is None and loader._source.reads.fetched == PARTS
        loader.close()
        assert got["epochs"] == want, f"rank {rank}"
    _gone(_job_dir(job))


def test_a_worker_writes_the_host_file_and_a_dropped_read_leaves_nothing(
        client: Any, tmp_path: Path) -> None:
    """A Dask table's read into a host cache file: the worker holding the partition
    writes the records into the temporary file, which the rank links into place; a read
    dropped before it finished removes its temporary file."""
    from dask_ddp import _core
    from dask_ddp.data.table.fetch import DaskReader

    ddf = _frame()
    table = dask_ddp.data.Table(ddf, client=client)
    reader = DaskReader(table)
    rows = np.arange(table.partition_rows[2], dtype=np.int64)
    final = str(tmp_path / "p2.rec")
    pend = reader.start([2], [rows], into=[(final + ".tmp.a", final)])[0]
    records = reader.finish(pend)
    assert sorted(os.listdir(tmp_path)) == ["p2.rec"]
    again = _core.map_records(final, RECORD)
    ids = records[:, :8].copy().view(np.int64).ravel()
    first = int(np.cumsum([0, *table.partition_rows])[2])
    assert ids.tolist() == list(range(first, first + len(rows)))
    assert np.array_equal(records, again)
    dropped = reader.start([3], [rows[:10]], into=[(str(tmp_path / "p3.rec.tmp.b"),
                                                    str(tmp_path / "p3.rec"))])[0]
    reader.cancel(dropped)
    assert sorted(os.listdir(tmp_path)) == ["p2.rec"]


def test_a_killed_rank_leaves_no_cache_behind(client: Any, tmp_path: Path) -> None:
    ddf = _frame()
    marker = tmp_path / "killed.json"
    job = dask_ddp.submit(client, read_host_cached, ddf, batch_size=256, kill_rank=1,
                          marker=str(marker), progress=False)
    with pytest.raises(Exception):  # noqa: B017 - the job fails: its rank 1 was killed
        job.result(timeout=240)
    seen = json.loads(marker.read_text())
    assert seen["dir"] == str(_job_dir(job))
    assert sum(f.endswith(".rec") for f in seen["files"]) == PARTS  # it held the table
    _gone(_job_dir(job))


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=60)
    return proc.pid


def test_sweep_removes_only_directories_whose_ranks_are_gone(tmp_path: Path) -> None:
    import psutil

    def job_dir(name: str, users: list[str]) -> Path:
        d = tmp_path / f"{host_cache.PREFIX}{name}"
        (d / "users").mkdir(parents=True)
        (d / "t1-p0.rec").write_bytes(b"x" * 100)
        for u in users:
            (d / "users" / u).touch()
        return d

    me = f"{os.getpid()}-{psutil.Process().create_time():.3f}-abcd"
    dead = job_dir("dead", [f"{_dead_pid()}-1.000-abcd"])
    live = job_dir("live", [f"{_dead_pid()}-1.000-abcd", me])
    reused = job_dir("reused", [f"{os.getpid()}-1.000-abcd"])  # a pid since reused
    other = tmp_path / "unrelated"
    other.mkdir()
    removed = host_cache.clean_orphans(str(tmp_path))
    assert sorted(removed) == sorted([str(dead), str(reused)])
    assert live.exists() and other.exists() and not dead.exists() and not reused.exists()


def test_no_memory_file_system_falls_back_to_the_rank_with_one_warning(
        tmp_path: Path, monkeypatch: Any, caplog: Any) -> None:
    from dask_ddp.data.table.columns import Column
    from dask_ddp.data.table.table import Table

    table = Table._from_fields(_columns=[Column("id", "<i8")], partition_rows=[5, 5],
                               workers=[None, None], source="dask", keys=None)
    monkeypatch.setenv("DASK_DDP_JOB_ID", "job-x")
    monkeypatch.setenv(host_cache.ROOT_ENV, str(tmp_path / "absent"))
    monkeypatch.setattr(host_cache, "_warned", set())
    with caplog.at_level("WARNING", logger=host_cache.__name__):
        assert host_cache.HostCache.open(table, table._columns, 8) is None
        assert host_cache.HostCache.open(table, table._columns, 8) is None
    warned = [r.getMessage() for r in caplog.records if r.name == host_cache.__name__]
    assert len(warned) == 1 and "absent" in warned[0], warned
    # With a root: the rank registers, maps what another wrote, and the last one out
    # removes the directory.
    monkeypatch.setenv(host_cache.ROOT_ENV, str(tmp_path))
    a = host_cache.HostCache.open(table, table._columns, 8)
    b = host_cache.HostCache.open(table, table._columns, 8)
    assert a is not None and b is not None and a.directory == b.directory
    assert a.claim(0, 0) and not b.claim(0, 0)
    assert b.get(0) is None
    a.put(0, np.arange(5, dtype=np.int64).view(np.uint8).reshape(5, 8))
    a.release(0)
    assert b.claim(0, 0)
    got = b.get(0)
    assert got is not None and not got.flags.writeable
    assert got.view(np.int64).ravel().tolist() == [0, 1, 2, 3, 4]
    assert oct(os.stat(a.path(0)).st_mode & 0o777) == "0o600"
    del got
    a.close()
    assert Path(a.directory).exists()  # b still uses it
    b.close()
    assert not Path(a.directory).exists()
