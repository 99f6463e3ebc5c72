"""dask_ddp.predict over image datasets on a real LocalCluster: a local ImageFolder and tar
shards decoded by the engine, compared with the engine's Loader in this process; bad images;
a forward that raises leaves no engine running behind the traceback that keeps its error."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from distributed import Client

import dask_ddp
from cluster_util import client_fixture
from dask_ddp.data import ImageFolder, TarShards
from images import encode, file_putter, photo, write_folder
from predict_util import (
    TRANSFORM,
    TinyCnn,
    assert_close_bf16,
    assert_close_f32,
    engine_outputs,
    tar_shard,
)
from waits import wait_until

pytestmark = pytest.mark.timeout(240)

client = client_fixture(2)


def test_image_folder_every_sample_once_in_order(client: Client, tmp_path: Path) -> None:
    written = write_folder(file_putter(str(tmp_path)), ["cat", "dog", "owl"], 9)
    ds = ImageFolder(str(tmp_path), transform=TRANSFORM)
    out = dask_ddp.predict(TinyCnn, ds, partition_size=10, batch_size=4)
    assert out.npartitions == 3
    got = out.compute()
    assert list(got.index) == list(range(27))
    assert list(got["key"]) == [str(tmp_path / k) for k, _ in written]
    want, labels = engine_outputs(ds)
    assert list(got["label"]) == list(labels)
    assert_close_f32(got[[f"out_{i}" for i in range(5)]].to_numpy(), want)


def test_bad_image_named_or_skipped_and_counted(client: Client, tmp_path: Path) -> None:
    write_folder(file_putter(str(tmp_path)), ["a", "b"], 6)
    bad = tmp_path / "b" / "img_0003.jpg"
    bad.write_bytes(bad.read_bytes()[:100])  # truncated
    ds = ImageFolder(str(tmp_path))
    with pytest.raises(Exception, match="img_0003.jpg"):
        dask_ddp.predict(TinyCnn, ds, transform=TRANSFORM, partition_size=5).compute()
    out = dask_ddp.predict(TinyCnn, ds, transform=TRANSFORM, partition_size=5,
                           on_error="skip")
    got = out.compute()
    assert len(got) == 11 and str(bad) not in set(got["key"])
    assert dask_ddp.predict.skipped(out, client) == 1


def test_tar_shards_one_partition_per_shard(client: Client, tmp_path: Path) -> None:
    for s in range(3):
        samples = [(f"s{s}_{i}", encode(photo(40, 30, 10 * s + i), "jpeg"), i % 2)
                   for i in range(4 + s)]
        (tmp_path / f"shard-{s:03d}.tar").write_bytes(tar_shard(samples))
    ds = TarShards(str(tmp_path / "shard-{000..002}.tar"), transform=TRANSFORM)
    out = dask_ddp.predict(TinyCnn, ds)
    assert out.npartitions == 3
    got = out.compute()
    assert list(got.index) == list(range(15))
    assert got["key"].iloc[4] == f"{ds.urls[1]}#0"
    want, labels = engine_outputs(ds)
    assert_close_f32(got[[f"out_{i}" for i in range(5)]].to_numpy(), want)
    assert list(got["label"]) == list(labels)


def test_bf16_and_channels_last_on_the_cpu_in_float32(client: Client, tmp_path: Path) -> None:
    write_folder(file_putter(str(tmp_path)), ["cat", "dog"], 8)
    ds = ImageFolder(str(tmp_path), transform=TRANSFORM)
    out = dask_ddp.predict(TinyCnn, ds, partition_size=6, batch_size=4, precision="bf16",
                           channels_last=True)
    columns = [f"out_{i}" for i in range(5)]
    assert all(out.dtypes[c] == "float32" for c in columns)
    got = out.compute()
    assert list(got.index) == list(range(16))
    want, _ = engine_outputs(ds)
    assert_close_bf16(got[columns].to_numpy(), want)


class RaisesOnTheSecondBatch(TinyCnn):
    """A model whose forward fails on its second batch, with decode work still to come."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls == 2:
            raise RuntimeError("the model failed on its second batch")
        return super().forward(x)


def native_threads() -> set[int]:
    """The ids of this process's threads that Python did not start (the engine's are)."""
    python = {t.native_id for t in threading.enumerate()}
    return {int(tid) for tid in os.listdir("/proc/self/task")} - python


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")
def test_a_failed_forward_leaves_no_engine_behind_its_traceback(tmp_path: Path) -> None:
    write_folder(file_putter(str(tmp_path)), ["a", "b"], 12)
    ds = ImageFolder(str(tmp_path), transform=TRANSFORM)
    layout = {"output_shape": (5,), "output_dtype": np.float32}
    # In this process (the sync scheduler), once whole: the folder's store, torch's threads.
    dask_ddp.predict(TinyCnn, ds, batch_size=4, **layout).compute(scheduler="sync")
    before = native_threads()
    failing = dask_ddp.predict(RaisesOnTheSecondBatch, ds, batch_size=4, **layout)
    with pytest.raises(RuntimeError, match="second batch") as caught:
        failing.compute(scheduler="sync")
    # The error is kept with its traceback, as Dask keeps a failed task's: the frames of the
    # task stay alive, the engine, its decode threads and its buffers must not.
    assert caught.value.__traceback__ is not None
    wait_until(lambda: native_threads() - before, 60,
               "the engine's threads outlive the failed task")
