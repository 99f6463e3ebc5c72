"""dask_ddp.predict on a GPU worker (skipped where CUDA is missing): a DataFrame and an image
folder on the GPU equal to the CPU's outputs (bf16 + channels_last within bf16's step, its
partitions read by one engine per worker thread), the process's TF32 settings restored
after the tasks, and the model built on the worker only.
The models assert that their input is on CUDA (and channels_last where asked), so these
tests fail where predict feeds a GPU model host tensors; the output's layout is given, as
the meta device and the probe's zero sample would not pass those checks."""

from __future__ import annotations

from pathlib import Path

import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest
import torch
from distributed import Client

import dask_ddp
from cluster_util import client_fixture
from dask_ddp.data import ImageFolder
from dask_ddp.predict.engines import engine_info
from dask_ddp.predict.precision import tf32_precisions
from images import file_putter, write_folder
from predict_util import (
    TRANSFORM,
    CudaChannelsLastCnn,
    CudaMlp,
    assert_close_bf16,
    assert_close_f32,
    engine_outputs,
    mlp,
)

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(240)]

client = client_fixture(1, threads_per_worker=2)


def test_a_frame_on_the_gpu_equals_the_cpu(client: Client) -> None:
    rng = np.random.default_rng(0)
    pdf = pd.DataFrame(rng.standard_normal((3000, 8)).astype(np.float32),
                       columns=[f"f{i}" for i in range(8)])
    ddf = dd.from_pandas(pdf, npartitions=6)
    before = client.run(tf32_precisions)
    layout = {"output_shape": (4,), "output_dtype": np.float32}
    got = dask_ddp.predict(CudaMlp, ddf, batch_size=256, device="cuda", tf32=False,
                           **layout).compute()
    with torch.inference_mode():
        want = mlp().eval()(torch.from_numpy(pdf.to_numpy())).numpy()
    assert_close_f32(got.to_numpy(), want)
    assert client.run(tf32_precisions) == before
    fast = dask_ddp.predict(CudaMlp, ddf, batch_size=256, precision="bf16", tf32=True,
                            **layout).compute()
    assert list(fast.dtypes) == [np.float32] * 4
    assert_close_bf16(fast.to_numpy(), want)
    assert client.run(tf32_precisions) == before


def test_images_in_bf16_and_channels_last_on_the_gpu(client: Client, tmp_path: Path) -> None:
    write_folder(file_putter(str(tmp_path)), ["a", "b", "c"], 30)
    ds = ImageFolder(str(tmp_path), transform=TRANSFORM)
    out = dask_ddp.predict(CudaChannelsLastCnn, ds, partition_size=8, batch_size=8,
                           device="cuda", precision="bf16", channels_last=True,
                           output_shape=(5,), output_dtype=np.float32)
    before = client.run(engine_info)
    got = out.compute()
    # A worker thread's engine (its pinned buffers lent, its stage's stream) read on.
    after = client.run(engine_info)
    built, reused = (sum(after[w][k] - before[w][k] for w in after) for k in ("built", "reused"))
    assert 1 <= built <= 2 and built + reused == out.npartitions == 12
    columns = [f"out_{i}" for i in range(5)]
    assert list(got.index) == list(range(90))
    want, labels = engine_outputs(ds)
    assert list(got["label"]) == list(labels)
    assert_close_bf16(got[columns].to_numpy(), want)
    infos = client.run(lambda: dask_ddp.predict.cache_info())
    assert all(i["builds"] >= 1 for info in infos.values() for i in info.values())
