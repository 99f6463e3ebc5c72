"""A worker process killed (SIGKILL) in the middle of a predict: its partitions are computed
again elsewhere and the result is complete and equal to a local computation."""

from __future__ import annotations

import os
import signal
import time

import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest
import torch
from distributed import Client, futures_of, wait

import dask_ddp
from cluster_util import client_fixture
from dask_ddp._cluster import cluster_info
from predict_util import assert_close_f32
from waits import wait_until

pytestmark = pytest.mark.timeout(240)

client = client_fixture(2)


class SlowLinear(torch.nn.Module):
    """A linear model that takes 50 ms per batch, so a predict lasts a few seconds."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.05)
        return self.lin(x)


def test_worker_killed_mid_predict_result_complete_and_correct(client: Client) -> None:
    rng = np.random.default_rng(0)
    pdf = pd.DataFrame(rng.standard_normal((2400, 4)).astype(np.float32), columns=list("abcd"))
    ddf = dd.from_pandas(pdf, npartitions=24)
    out = dask_ddp.predict(SlowLinear, ddf, batch_size=25).persist()
    futures = futures_of(out)

    def finished() -> str:
        done = [f for f in futures if f.status == "finished"]
        return "" if len(done) >= 4 else f"{len(done)} of {len(futures)} partitions done"

    wait_until(finished, 120, "no partition finished")
    holders = {addr for addrs in client.who_has(futures).values() for addr in addrs}
    victim = sorted(holders)[0]
    pid = client.run(os.getpid, workers=[victim])[victim]
    assert any(f.status != "finished" for f in futures), "killed too late: all done"
    os.kill(pid, signal.SIGKILL)
    wait(futures, timeout=180)
    got = out.compute()
    with torch.inference_mode():
        want = SlowLinear().eval().lin(torch.from_numpy(pdf.to_numpy().copy())).numpy()
    assert list(got.index) == list(pdf.index)
    assert_close_f32(got.to_numpy(), want)
    assert victim not in cluster_info(client)["workers"]
