"""Lightning and Accelerate scripts under ``dask-ddp run`` give the weights torchrun gives.

Plain scripts, written for torchrun, run unchanged through ``run_command`` on a real
LocalCluster, also on one whose workers carry the ``SLURM_*`` variables a batch system
(dask-jobqueue's SLURMCluster) leaves them: without torchrun's ``TORCHELASTIC_RUN_ID``,
Lightning takes its SLURM environment and each rank trains alone.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from distributed import Client, LocalCluster

import dask_ddp
from cluster_util import wait_no_rank_processes
from dask_ddp._launch.worker import rank_env as _rankenv

logger = logging.getLogger(__name__)

pytest.importorskip("lightning")
pytest.importorskip("accelerate")

pytestmark = [pytest.mark.dask, pytest.mark.slow, pytest.mark.timeout(300)]

# What SLURMCluster's workers carry (one task per job, as dask-jobqueue submits them).
SLURM_ENV = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "dask-worker", "SLURM_NTASKS": "1",
             "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0",
             "SLURM_NNODES": "1", "SLURM_JOB_NUM_NODES": "1", "SLURM_CPUS_ON_NODE": "1",
             "SLURM_NODELIST": "node1", "SLURM_TASKS_PER_NODE": "1"}

DATA = """
import torch
def data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=g)
    y = x @ torch.arange(8.0) + 0.1 * torch.randn(64, generator=g)
    return torch.utils.data.TensorDataset(x, y.unsqueeze(1))
"""

LIGHTNING = DATA + """
import sys, os
import lightning as L

class Reg(L.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.net = torch.nn.Linear(8, 1)
    def training_step(self, batch, i):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)

trainer = L.Trainer(strategy="ddp", accelerator="cpu", devices=2, max_epochs=2,
                    logger=False, enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False, deterministic=True)
model = Reg()
trainer.fit(model, torch.utils.data.DataLoader(data(), batch_size=8))
print(f"world={trainer.world_size} global_rank={trainer.global_rank}", flush=True)
if trainer.global_rank == 0:
    torch.save({"world": trainer.world_size, "state": model.state_dict()}, sys.argv[1])
"""

ACCELERATE = DATA + """
import sys
from accelerate import Accelerator

acc = Accelerator(cpu=True)
torch.manual_seed(1)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
dl = torch.utils.data.DataLoader(data(), batch_size=8)
model, opt, dl = acc.prepare(model, opt, dl)
for epoch in range(2):
    for x, y in dl:
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        acc.backward(loss)
        opt.step()
acc.wait_for_everyone()
if acc.is_main_process:
    torch.save({"world": acc.num_processes, "state": acc.unwrap_model(model).state_dict()},
               sys.argv[1])
"""


def _cluster(env: dict[str, str] | None) -> LocalCluster:
    return LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                        dashboard_address=":0", scheduler_port=0, env=env)


@pytest.fixture(scope="module")
def slurm_cluster() -> Iterator[LocalCluster]:
    # A cluster of its own: its workers' environment from their start is under test.
    with _cluster(SLURM_ENV) as cluster:
        yield cluster
        addr = cluster.scheduler_address
    wait_no_rank_processes(addr, 10)


@pytest.fixture(params=["plain", "slurm"])
def client(request: pytest.FixtureRequest, lease: Any) -> Iterator[Client]:
    if request.param == "plain":
        with lease(2) as c:
            yield c
    else:
        with Client(request.getfixturevalue("slurm_cluster")) as c:
            yield c


_REFERENCE: dict[str, dict[str, Any]] = {}


def _torchrun(script: Path, out: Path) -> dict[str, Any]:
    """The script's result under torchrun (once per script: it does not depend on the cluster)."""
    source = script.read_text()
    if source not in _REFERENCE:
        # This test process's start-up environment: no LocalCluster settings, no SLURM.
        env = _rankenv.start_environ(os.getpid()) or dict(os.environ)
        env["PYTHONPATH"] = os.environ.get("PYTHONPATH", "")
        # A second try, once: the baseline's own rank has aborted in torch's teardown on
        # this box now and then ("terminate called without an active exception"), a
        # process our code does not run in. Both failures are shown if it fails again.
        errors = []
        for _ in range(2):
            out.unlink(missing_ok=True)
            done = subprocess.run([sys.executable, "-m", "torch.distributed.run",
                                   "--standalone", "--nproc-per-node=2", str(script), str(out)],
                                  env=env, capture_output=True, text=True, timeout=240)
            if done.returncode == 0:
                break
            errors.append(f"torchrun exited {done.returncode}:\n{done.stderr[-3000:]}")
            logger.warning("the torchrun baseline failed; once more: %s", errors[-1][-600:])
        assert done.returncode == 0, "\n\n".join(errors)
        _REFERENCE[source] = torch.load(out, weights_only=True)
    return _REFERENCE[source]


@pytest.mark.parametrize("source", [LIGHTNING, ACCELERATE], ids=["lightning", "accelerate"])
def test_framework_script_trains_as_under_torchrun(client: Client, tmp_path: Path,
                                                   source: str) -> None:
    script = tmp_path / "train_fw.py"
    script.write_text(textwrap.dedent(source))
    reference = _torchrun(script, tmp_path / "torchrun.pt")
    assert reference["world"] == 2
    codes = dask_ddp.run_command(client, ["python", str(script), str(tmp_path / "dask.pt")],
                                 n_workers=2, timeout=240)
    assert codes == [0, 0]
    ours = torch.load(tmp_path / "dask.pt", weights_only=True)
    assert ours["world"] == 2  # one 2-rank job, not two jobs of one rank each
    assert ours["state"].keys() == reference["state"].keys()
    for key, value in reference["state"].items():
        assert torch.equal(ours["state"][key], value), key
