"""dask_ddp.predict over image datasets on a real LocalCluster: a local ImageFolder and tar
shards decoded by the engine, compared with the engine's Loader in this process; bad images;
a forward that raises leaves no engine running behind the traceback that keeps its error;
a worker thread reads an image list's partitions with one engine, closed with its thread."""

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
from dask_ddp.predict.engines import close_engine, engine_info
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


class RaisesOnItsSecondBatch(RaisesOnTheSecondBatch):
    """The same, for a test of its own (the worker's model cache keeps one instance of a
    model class, and its count of calls, across tests)."""


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


def engine_counts(client: Client) -> dict[str, int]:
    """The engines the cluster's workers built and reused, summed, and those open now."""
    got = client.run(engine_info)
    return {k: sum(info[k] for info in got.values()) for k in ("built", "reused", "open")}


def test_a_worker_thread_reuses_its_engine_across_partitions(client: Client,
                                                             tmp_path: Path) -> None:
    written = write_folder(file_putter(str(tmp_path)), ["cat", "dog"], 11)
    ds = ImageFolder(str(tmp_path), transform=TRANSFORM)
    want, labels = engine_outputs(ds)
    threads = sum(client.nthreads().values())
    columns = [f"out_{i}" for i in range(5)]
    for batch_size in (3, 4):  # the second call's options differ: engines built anew
        before = engine_counts(client)
        out = dask_ddp.predict(TinyCnn, ds, partition_size=2, batch_size=batch_size)
        got = out.compute()
        after = engine_counts(client)
        built, reused = after["built"] - before["built"], after["reused"] - before["reused"]
        # One engine per worker thread at most, every other partition a reuse of one.
        assert 1 <= built <= threads and built + reused == out.npartitions == 11
        assert after["open"] <= threads
        assert list(got.index) == list(range(22))
        assert list(got["key"]) == [str(tmp_path / k) for k, _ in written]
        assert list(got["label"]) == list(labels)
        assert_close_f32(got[columns].to_numpy(), want)


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")
def test_the_cached_engine_is_the_only_one_left_and_goes_with_a_failure_or_its_thread(
        tmp_path: Path) -> None:
    write_folder(file_putter(str(tmp_path)), ["a", "b"], 7)
    ds = ImageFolder(str(tmp_path), transform=TRANSFORM)
    layout = {"output_shape": (5,), "output_dtype": np.float32, "partition_size": 3}
    # In this process (the sync scheduler): torch's threads and the folder's store once,
    # then no engine of this thread's left.
    dask_ddp.predict(TinyCnn, ds, batch_size=2, **layout).compute(scheduler="sync")
    close_engine()
    none = native_threads()

    def run(model: type[TinyCnn]) -> tuple[int, int]:
        start = engine_info()
        dask_ddp.predict(model, ds, batch_size=2, **layout).compute(scheduler="sync")
        end = engine_info()
        return end["built"] - start["built"], end["reused"] - start["reused"]

    assert run(TinyCnn) == (1, 4)  # 5 partitions, one engine
    cached = native_threads() - none
    assert cached  # its decode threads, waiting for the next partition
    assert run(TinyCnn) == (0, 5)
    assert native_threads() - none == cached  # the same threads read every partition
    with pytest.raises(RuntimeError, match="second batch") as caught:
        run(RaisesOnItsSecondBatch)
    assert caught.value.__traceback__ is not None  # kept, as Dask keeps a failed task's
    wait_until(lambda: native_threads() - none, 60, "the failed task's engine's threads")
    assert engine_info()["open"] == 0
    # A thread's engine is closed when the thread ends.
    worker = threading.Thread(target=run, args=(TinyCnn,))
    worker.start()
    worker.join(60)
    assert not worker.is_alive()
    wait_until(lambda: native_threads() - none, 60, "the ended thread's engine's threads")
    assert engine_info()["open"] == 0
