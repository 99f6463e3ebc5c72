"""Loaders across fork(): a child (a DataLoader worker, a multiprocessing Pool task) that
frees its parent's Loaders does not crash, reads none of them (RuntimeError naming fork()),
and reads Loaders of its own; the parent's epoch goes on, every sample once. Images, tar
shards and tables, read by the real engine from files."""

from __future__ import annotations

import gc
import multiprocessing
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from test_shards import file_put, images, write_tar_shards
from torch.utils.data import DataLoader, Dataset

from dask_ddp.data import ImageList, Loader, TarShards
from dask_ddp.data import transforms as T
from images import encode, photo
from table_util import parquet_table

pytestmark = pytest.mark.timeout(120)

N = 48  # samples of each dataset; a sample's id is its label (tables: its "id")
KINDS = ["images", "shards", "table"]
EXACT = T.Compose([T.Resize(20), T.CenterCrop(20), T.PILToTensor()])
WAIT_S = 60  # for a DataLoader's batch or a Pool's answer: a hung child fails, not hangs


def _loaders(kind: str, root: Path) -> Callable[[], Loader]:
    """A factory of Loaders (batches of 4, two engine threads) over N samples."""
    if kind == "images":
        keys = [f"img_{i:03d}.jpg" for i in range(N)]
        for i, key in enumerate(keys):
            (root / key).write_bytes(encode(photo(40, 32, i), "jpeg"))
        data = ImageList(str(root), keys, list(range(N)))
        return lambda: Loader(data, 4, transform=EXACT, shuffle=True, seed=1, rank=0,
                              world_size=1, num_threads=2, prefetch=3)
    if kind == "shards":
        keys = write_tar_shards(file_put(root), images(N), [16, 16, 16])
        shards = TarShards([str(root / k) for k in keys])
        return lambda: Loader(shards, 4, transform=EXACT, shuffle=True, seed=1, rank=0,
                              world_size=1, num_threads=2, prefetch=3)
    pytest.importorskip("pyarrow")
    table = parquet_table(root, N, 8)
    return lambda: Loader(table, 4, shuffle=True, seed=1, rank=0, world_size=1,
                          num_threads=2, prefetch=3)


def _ids(batch: Any) -> list[int]:
    ids = batch["id"] if isinstance(batch, dict) else batch[1]
    return [int(i) for i in ids.tolist()]


@pytest.fixture(params=KINDS)
def make(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], Loader]:
    return _loaders(request.param, tmp_path)


class _Collecting(Dataset[int]):
    """Runs the garbage collector in each DataLoader worker, at its first item."""

    collected_in = -1  # the process that last collected

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> int:
        if _Collecting.collected_in != os.getpid():
            gc.collect()
            _Collecting.collected_in = os.getpid()
        return i


def test_dataloader_workers_free_the_parents_loaders_left_to_the_collector(
        make: Callable[[], Loader]) -> None:
    """Three Loaders left mid-epoch in reference cycles, so that only the collector frees
    them: the workers of a fork-started DataLoader that collect must not crash (they died
    of a segmentation fault in std::thread::join of the parent's engine threads)."""
    gc.collect()
    gc.disable()  # the cycles must reach the fork: only the workers collect them
    try:
        for _ in range(3):
            loader = make()
            it = iter(loader)
            next(it)
            cycle: dict[str, Any] = {"loader": loader, "it": it}
            cycle["self"] = cycle
            del loader, it, cycle
        got = DataLoader(_Collecting(), batch_size=2, num_workers=2,
                         multiprocessing_context="fork", timeout=WAIT_S)
        assert [int(i) for b in got for i in b.tolist()] == list(range(4))
    finally:
        gc.enable()
        gc.collect()  # the parent frees its Loaders: threads stopped and joined


# What a Pool child inherits: the parent's Loader mid-epoch and its iterator.
_parent: dict[str, Any] = {}


def _in_child(task: int) -> dict[str, Any]:
    """A Pool task: the inherited Loader refuses to read, answers len() and state_dict();
    a Loader of the child's own reads a whole epoch."""
    inherited: Loader = _parent["loader"]
    out: dict[str, Any] = {"pid": os.getpid(), "task": task, "errors": []}
    for use in (lambda: next(_parent["it"]), lambda: next(iter(inherited)),
                lambda: inherited.set_epoch(1)):
        try:
            use()
            out["errors"].append(None)
        except RuntimeError as e:
            out["errors"].append(str(e))
    out["len"] = len(inherited)
    out["state"] = {k: v for k, v in inherited.state_dict().items()
                    if k in ("epoch", "batch", "num_batches")}
    own = _parent["make"]()
    try:
        own.set_epoch(task)
        out["ids"] = sorted(i for batch in own for i in _ids(batch))
    finally:
        own.close()
    return out


def test_pool_children_read_loaders_of_their_own_while_the_parents_is_mid_epoch(
        make: Callable[[], Loader]) -> None:
    loader = make()
    it: Iterator[Any] = iter(loader)
    ids = _ids(next(it)) + _ids(next(it))
    _parent.update(loader=loader, it=it, make=make)
    try:
        with multiprocessing.get_context("fork").Pool(2) as pool:
            answers = pool.map_async(_in_child, [0, 1]).get(timeout=WAIT_S)
        for a in answers:
            assert a["pid"] != os.getpid()
            assert a["ids"] == list(range(N)), a["task"]
            for message in a["errors"]:
                assert message is not None and "fork()" in message, a["errors"]
                assert "build a new Loader in this process" in message
            assert a["len"] == len(loader) == N // 4
            assert a["state"] == {"epoch": 0, "batch": 2, "num_batches": N // 4}
        ids += [i for batch in it for i in _ids(batch)]  # the parent's epoch goes on
        assert sorted(ids) == list(range(N))
    finally:
        _parent.clear()
        loader.close()


def test_a_child_can_close_and_drop_the_parents_loader(make: Callable[[], Loader]) -> None:
    """close() in the child frees nothing of the parent's; the parent's Loader reads on."""
    loader = make()
    it = iter(loader)
    first = _ids(next(it))
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        code = 1
        try:
            loader.close()
            del it
            gc.collect()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    rest = [i for batch in it for i in _ids(batch)]
    assert sorted(first + rest) == list(range(N))
    loader.close()
    assert torch.is_tensor(torch.zeros(1))  # the parent's torch is intact
