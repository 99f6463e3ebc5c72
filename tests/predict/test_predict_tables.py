"""dask_ddp.predict over Dask DataFrames, Series and Arrays on a real LocalCluster: every row
once and in order, the model built once per worker process, checkpoints, bad rows, threads."""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dask.array as da
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest
import torch
from distributed import Client

import dask_ddp
from cluster_util import client_fixture
from predict_util import assert_close_bf16, assert_close_f32

pytestmark = pytest.mark.timeout(240)

client = client_fixture(2)

N_FEATURES = 6


class Mlp(torch.nn.Module):
    def __init__(self, outputs: int = 3) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(N_FEATURES, 16), torch.nn.ReLU(),
                                       torch.nn.Linear(16, outputs))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class CountingBuilder:
    """Builds an Mlp and appends this process's pid to a file each time it is called."""

    def __init__(self, log: str, outputs: int = 3) -> None:
        self.log, self.outputs = log, outputs

    def __call__(self) -> torch.nn.Module:
        with open(self.log, "a") as f:
            f.write(f"{os.getpid()}\n")
        return Mlp(self.outputs)


class ThreadsModel(torch.nn.Module):
    """Outputs torch's intra-op thread count at forward time, one value per row."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.full((len(x),), float(torch.get_num_threads()))


def frame(rows: int = 1000, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    data = rng.standard_normal((rows, N_FEATURES)).astype(np.float32)
    df = pd.DataFrame(data, columns=[f"f{i}" for i in range(N_FEATURES)])
    df.index = pd.Index(rng.permutation(rows * 3)[:rows], name="event")  # unsorted keys
    df["tag"] = "x"
    return df


def local(model: torch.nn.Module, x: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        return model.eval()(torch.from_numpy(np.array(x, dtype=np.float32))).numpy()


FEATURES = [f"f{i}" for i in range(N_FEATURES)]


def builds_per_pid(log: Path) -> dict[int, int]:
    pids = [int(line) for line in log.read_text().split()] if log.exists() else []
    return {p: pids.count(p) for p in set(pids)}


def test_every_row_once_in_order_with_its_index(client: Client, tmp_path: Path) -> None:
    pdf = frame()
    ddf = dd.from_pandas(pdf, npartitions=7, sort=False)
    out = dask_ddp.predict(Mlp, ddf, columns=FEATURES, batch_size=50)
    assert out.npartitions == ddf.npartitions
    assert list(out.columns) == ["out_0", "out_1", "out_2"]
    got = out.compute()
    assert list(got.index) == list(pdf.index)
    assert_close_f32(got.to_numpy(), local(Mlp(), pdf[FEATURES]))
    # A fixed-size list column, through Parquet and back.
    listed = dask_ddp.predict(Mlp, ddf, columns=FEATURES, output="list", name="logits")
    listed.to_parquet(str(tmp_path / "scores"))
    back = pd.read_parquet(tmp_path / "scores", dtype_backend="pyarrow")  # list types
    assert list(back.index) == list(pdf.index)
    assert_close_f32(np.stack(back["logits"].tolist()), got.to_numpy())  # other batch sizes


def test_series_and_scalar_output(client: Client) -> None:
    s = pd.Series(np.linspace(-1, 1, 300, dtype=np.float32), name="x")
    one = torch.nn.Linear(1, 1)
    got = dask_ddp.predict(one, dd.from_pandas(s, npartitions=3)).compute()
    assert list(got.columns) == ["out_0"]
    assert_close_f32(got["out_0"], local(one, s.to_numpy()[:, None])[:, 0])


def test_model_built_once_per_worker_process(client: Client, tmp_path: Path) -> None:
    log = tmp_path / "builds.log"
    builder = CountingBuilder(str(log))
    ddf = dd.from_pandas(frame(2000), npartitions=16, sort=False)
    out = dask_ddp.predict(builder, ddf, columns=FEATURES, batch_size=64,
                           output_shape=(3,), output_dtype="float32")
    graph = dict(out.__dask_graph__())
    holding = [k for k, v in graph.items() if "predict-model-" in str(k)]
    assert len(holding) == 1, holding  # the model travels as one key, not in every task
    out.compute()
    dask_ddp.predict(builder, ddf, columns=FEATURES, batch_size=64, output_shape=(3,),
                     output_dtype="float32").compute()  # a second call: cached
    counts = builds_per_pid(log)
    worker_pids = set(client.run(os.getpid).values())
    assert set(counts) <= worker_pids and counts, counts
    assert all(n == 1 for n in counts.values()), counts


def test_checkpoint_state_dict_file_loaded_once_per_worker(client: Client,
                                                           tmp_path: Path) -> None:
    trained = Mlp()
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(0.5)
    path = tmp_path / "weights.pt"
    torch.save(trained.state_dict(), path)
    pdf = frame(600)
    ddf = dd.from_pandas(pdf, npartitions=6, sort=False)
    out = dask_ddp.predict(Mlp, ddf, columns=FEATURES, checkpoint=str(path))
    assert_close_f32(out.compute().to_numpy(), local(trained, pdf[FEATURES]))
    infos = client.run(lambda: dask_ddp.predict.cache_info())
    loads = [i["loads"] for info in infos.values() for i in info.values() if i["loads"]]
    assert loads and all(n == 1 for n in loads), infos


def test_full_checkpoint_of_a_checkpointer(client: Client, tmp_path: Path) -> None:
    trained = Mlp(2)
    with torch.no_grad():
        for p in trained.parameters():
            p.mul_(-1)
    storage = tmp_path.as_uri()
    opt = torch.optim.SGD(trained.parameters(), lr=0.1)
    dask_ddp.Checkpointer(trained, opt, storage=storage).save(7)
    dask_ddp.checkpoint.wait_checkpoints(60)
    pdf = frame(200)
    ddf = dd.from_pandas(pdf, npartitions=2, sort=False)
    out = dask_ddp.predict(lambda: Mlp(2), ddf, columns=FEATURES, checkpoint=storage).compute()
    assert_close_f32(out.to_numpy(), local(trained, pdf[FEATURES]))
    with pytest.raises(FileNotFoundError, match="no checkpoint of step 8"):
        dask_ddp.predict(Mlp, ddf, columns=FEATURES, checkpoint=storage,
                         checkpoint_step=8).compute()


def test_bad_rows_raise_naming_the_key_or_are_skipped_and_counted(client: Client) -> None:
    pdf = frame(400)
    bad_key = pdf.index[123]
    pdf.loc[bad_key, "f2"] = np.nan
    ddf = dd.from_pandas(pdf, npartitions=4, sort=False)
    with pytest.raises(ValueError, match=rf"row {bad_key} \(partition 1\): column 'f2' is nan"):
        dask_ddp.predict(Mlp, ddf, columns=FEATURES).compute()
    pdf.loc[pdf.index[300], "f4"] = np.inf
    ddf = dd.from_pandas(pdf, npartitions=4, sort=False)
    out = dask_ddp.predict(Mlp, ddf, columns=FEATURES, on_error="skip")
    got = out.compute()
    assert len(got) == 398 and bad_key not in got.index
    assert dask_ddp.predict.skipped(out, client) == 2


def test_array_rows_and_an_output_axis(client: Client) -> None:
    x = np.random.default_rng(1).standard_normal((500, N_FEATURES)).astype(np.float32)
    arr = da.from_array(x, chunks=(70, 4))  # a row split across blocks is rechunked whole
    out = dask_ddp.predict(Mlp, arr, batch_size=32)
    assert out.shape == (500, 3) and out.chunks[0] == arr.chunks[0]
    assert_close_f32(out.compute(), local(Mlp(), x))
    x[10, 1] = np.nan
    skipped = dask_ddp.predict(Mlp, da.from_array(x, chunks=(70, -1)), on_error="skip")
    got = skipped.compute()
    assert np.isnan(got[10]).all() and not np.isnan(np.delete(got, 10, axis=0)).any()
    with pytest.raises(ValueError, match=r"row 10 \(block 0\)"):
        dask_ddp.predict(Mlp, da.from_array(x, chunks=(70, -1))).compute()


def test_array_result_written_with_to_zarr(client: Client, tmp_path: Path) -> None:
    import zarr  # the test extra's

    x = np.random.default_rng(2).standard_normal((300, N_FEATURES)).astype(np.float32)
    out = dask_ddp.predict(Mlp, da.from_array(x, chunks=(70, -1)), batch_size=32)
    out.to_zarr(str(tmp_path / "scores.zarr"))
    back = zarr.open_array(str(tmp_path / "scores.zarr"), mode="r")
    assert back.shape == (300, 3) and back.chunks == (70, 3) and back.dtype == np.float32
    assert_close_f32(np.asarray(back[:]), local(Mlp(), x))


def test_torch_threads_sized_to_the_workers_share_and_restored(client: Client) -> None:
    before = client.run(torch.get_num_threads)
    ddf = dd.from_pandas(frame(100), npartitions=4, sort=False)
    got = dask_ddp.predict(ThreadsModel(), ddf, columns=FEATURES).compute()
    cores = len(os.sched_getaffinity(0))
    assert set(got["out"]) == {max(1, cores // 2)}  # 2 workers x 1 thread on this host
    assert client.run(torch.get_num_threads) == before


def mmapped_for_4mib() -> int:
    """The bytes glibc hands out as fresh mmaps for a 4 MiB tensor allocated now."""
    import ctypes

    class Info(ctypes.Structure):  # struct mallinfo2: ten size_t fields
        _fields_ = [(f, ctypes.c_size_t) for f in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
            "uordblks", "fordblks", "keepcost")]

    mallinfo2 = ctypes.CDLL("libc.so.6").mallinfo2
    mallinfo2.restype = Info
    before = mallinfo2().hblkhd
    held = torch.empty(4 << 20, dtype=torch.uint8)
    grown = mallinfo2().hblkhd - before
    del held
    return int(grown)


class MmapModel(torch.nn.Module):
    """Outputs, per row, :func:`mmapped_for_4mib` at forward time."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.full((len(x),), float(mmapped_for_4mib()))


@pytest.mark.skipif(not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
                    reason="glibc's malloc thresholds")
def test_activations_reuse_the_heap_in_a_worker_and_the_thresholds_are_restored(
        lease: Any) -> None:
    # The nanny's MALLOC_TRIM_THRESHOLD_ fixes glibc's mmap threshold at 128 KiB in workers:
    # outside predict, a 4 MiB tensor is a fresh mmap each time. The thresholds are the
    # process's: a cluster of its own, where no task of an earlier test can still be
    # running a model (a cancelled task's thread runs on; CI once met a worker still
    # holding them after this test's own predict had returned).
    with lease(2, fresh=True) as client:
        assert set(client.run(os.environ.get, "MALLOC_TRIM_THRESHOLD_").values()) == {"65536"}
        assert min(client.run(mmapped_for_4mib).values()) >= 4 << 20
        ddf = dd.from_pandas(frame(100), npartitions=4, sort=False)
        got = dask_ddp.predict(MmapModel(), ddf, columns=FEATURES).compute()
        assert set(got["out"]) == {0.0}  # inside: taken from the heap
        after = client.run(mmapped_for_4mib)
        users = client.run(predicts_running)
        assert min(after.values()) >= 4 << 20, (after, users)  # restored after


def predicts_running() -> int:
    """How many predict tasks of this worker hold glibc's thresholds raised now."""
    from dask_ddp.predict import heap

    return heap._users  # noqa: SLF001 (the count the restore waits on)


class BuiltOnlyOnMetaHere:
    """Builds an Mlp, and refuses to in the process ``client_pid`` unless the default device
    is meta (the client may find the output's shape on the meta device, never build it);
    each build's pid and device type is appended to ``log``."""

    def __init__(self, client_pid: int, log: str) -> None:
        self.client_pid, self.log = client_pid, log

    def __call__(self) -> torch.nn.Module:
        where = torch.empty(0).device.type
        with open(self.log, "a") as f:
            f.write(f"{os.getpid()} {where}\n")
        if os.getpid() == self.client_pid and where != "meta":
            raise RuntimeError("the model was built in the client process")
        return Mlp()


class ReadsAValue(Mlp):
    """An Mlp whose forward reads a value (``.item()``), which the meta device cannot give."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x) * (1.0 if float(x.abs().sum().item()) >= 0 else 0.0)


class NeverInTheClient:
    """Builds ``ReadsAValue``; raises in the process ``client_pid``; logs each build's pid."""

    def __init__(self, client_pid: int, log: str) -> None:
        self.client_pid, self.log = client_pid, log

    def __call__(self) -> torch.nn.Module:
        if os.getpid() == self.client_pid:
            raise RuntimeError("the model was built in the client process")
        with open(self.log, "a") as f:
            f.write(f"{os.getpid()}\n")
        return ReadsAValue()


def test_output_shape_found_on_the_meta_device_in_the_client(client: Client,
                                                             tmp_path: Path) -> None:
    log = tmp_path / "builds.log"
    pdf = frame(300)
    ddf = dd.from_pandas(pdf, npartitions=3, sort=False)
    out = dask_ddp.predict(BuiltOnlyOnMetaHere(os.getpid(), str(log)), ddf, columns=FEATURES)
    assert list(out.columns) == ["out_0", "out_1", "out_2"]
    assert_close_f32(out.compute().to_numpy(), local(Mlp(), pdf[FEATURES]))
    here = [line.split()[1] for line in log.read_text().splitlines()
            if int(line.split()[0]) == os.getpid()]
    assert here == ["meta"], log.read_text()


def test_output_shape_from_a_probe_task_when_meta_fails(client: Client, tmp_path: Path) -> None:
    log = tmp_path / "builds.log"
    pdf = frame(300)
    ddf = dd.from_pandas(pdf, npartitions=3, sort=False)
    out = dask_ddp.predict(NeverInTheClient(os.getpid(), str(log)), ddf, columns=FEATURES)
    assert list(out.columns) == ["out_0", "out_1", "out_2"]
    probed = builds_per_pid(log)
    assert len(probed) == 1 and os.getpid() not in probed, probed  # one worker built it
    assert_close_f32(out.compute().to_numpy(), local(ReadsAValue(), pdf[FEATURES]))
    counts = builds_per_pid(log)
    assert os.getpid() not in counts and all(n == 1 for n in counts.values()), counts


def test_bf16_on_the_cpu_close_to_fp32_in_float32(client: Client) -> None:
    pdf = frame(500)
    ddf = dd.from_pandas(pdf, npartitions=3, sort=False)
    fp32 = dask_ddp.predict(Mlp, ddf, columns=FEATURES, batch_size=64).compute()
    out = dask_ddp.predict(Mlp, ddf, columns=FEATURES, batch_size=64, precision="bf16",
                           tf32=False)
    assert list(out.dtypes) == [np.float32] * 3
    got = out.compute()
    assert list(got.dtypes) == [np.float32] * 3 and list(got.index) == list(pdf.index)
    assert_close_bf16(got.to_numpy(), fp32.to_numpy())
    assert not np.array_equal(got.to_numpy(), fp32.to_numpy())  # bf16 did run
    x = np.random.default_rng(3).standard_normal((200, N_FEATURES)).astype(np.float32)
    arr = dask_ddp.predict(Mlp, da.from_array(x, chunks=(70, -1)), precision="fp16")
    assert arr.dtype == np.float32
    assert_close_bf16(arr.compute(), local(Mlp(), x))  # fp16: a finer step than bf16's


def test_wrong_inputs_are_named() -> None:
    with pytest.raises(TypeError, match="not list"):
        dask_ddp.predict(Mlp, [1, 2])
    with pytest.raises(ValueError, match="on_error"):
        dask_ddp.predict(Mlp, [1, 2], on_error="ignore")
    ddf = dd.from_pandas(frame(10), npartitions=1)
    with pytest.raises(KeyError, match="'nope'"):
        dask_ddp.predict(Mlp, ddf, columns=["nope"])
    with pytest.raises(TypeError, match="'tag'"):
        dask_ddp.predict(Mlp, ddf)
    with pytest.raises(ValueError, match="'fp8'"):
        dask_ddp.predict(Mlp, ddf, columns=FEATURES, precision="fp8")
    with pytest.raises(ValueError, match="channels_last"):
        dask_ddp.predict(Mlp, ddf, columns=FEATURES, channels_last=True)


@pytest.fixture(autouse=True)
def _no_leftover_threads_setting() -> Iterator[None]:
    yield
