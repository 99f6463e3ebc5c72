"""``run_command``/``dask-ddp run`` with ``recovery="live"``: a plain DDP script whose own
``init_process_group`` makes the live group; a rank killed mid-training costs the others
one step, and they finish with identical state."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from distributed import Client

import dask_ddp
from cluster_util import client_fixture
from waits import wait_until

pytestmark = pytest.mark.timeout(300)

client = client_fixture(3)

SCRIPT = '''
import hashlib, json, os, sys, time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import dask_ddp

out, steps = Path(sys.argv[1]), int(sys.argv[2])
dist.init_process_group("gloo")
rank = dist.get_rank()
(out / f"pid{rank}").write_text(str(os.getpid()))
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
dask_ddp.Checkpointer(model, opt)
gen = torch.Generator().manual_seed(rank)
for step in range(1, steps + 1):
    loss = model(torch.randn(16, 8, generator=gen)).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    (out / f"step{rank}").write_text(str(step))
    time.sleep(0.01)
h = hashlib.sha256()
for p in model.parameters():
    h.update(p.detach().numpy().tobytes())
for s in opt.state_dict()["state"].values():
    h.update(s["momentum_buffer"].numpy().tobytes())
(out / f"done{rank}").write_text(json.dumps({
    "hash": h.hexdigest(), "world": dist.get_world_size(), "rank": dist.get_rank(),
    "generation": dask_ddp.rank_info().generation}))
dist.destroy_process_group()
'''


def _script(tmp_path: Path) -> Path:
    path = tmp_path / "train_live.py"
    path.write_text(SCRIPT)
    return path


def _step(out: Path, rank: int) -> int:
    try:
        return int((out / f"step{rank}").read_text() or -1)
    except (FileNotFoundError, ValueError):
        return -1


def _done(out: Path) -> list[dict[str, object]]:
    return [json.loads(p.read_text()) for p in sorted(out.glob("done*"))]


def test_a_killed_rank_of_a_live_script(client: Client, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    with ThreadPoolExecutor(1) as pool:
        run = pool.submit(dask_ddp.run_command, client,
                          ["python", str(_script(tmp_path)), str(out), "150"],
                          recovery="live", stream_output=False, timeout=240)
        wait_until(lambda: None if _step(out, 1) >= 20 else
                   (run.result() if run.done() else f"rank 1 at step {_step(out, 1)}"),
                   120, "rank 1 to reach step 20")
        os.kill(int((out / "pid1").read_text()), signal.SIGKILL)
        codes = run.result(timeout=240)
    assert codes == [0, 0], codes
    done = _done(out)
    assert len(done) == 2 and len({d["hash"] for d in done}) == 1, done
    assert {(d["world"], d["generation"]) for d in done} == {(2, 1)}, done
    assert sorted(d["rank"] for d in done) == [0, 1], done


@pytest.mark.dask  # `dask-ddp run` starts a LocalCluster (in its own process)
def test_dask_ddp_run_takes_recovery_live(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(Path(dask_ddp.__file__).parents[1]), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-m", "dask_ddp", "run", "--n-workers", "2", "--recovery", "live",
         str(_script(tmp_path)), str(out), "20"],
        capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    done = _done(out)
    assert len(done) == 2 and len({d["hash"] for d in done}) == 1, done
    assert {(d["world"], d["generation"]) for d in done} == {(2, 0)}, done


def test_live_needs_a_python_script(client: Client) -> None:
    with pytest.raises(ValueError, match="recovery='live' needs a Python script.*'sleep 1'"):
        dask_ddp.run_command(client, ["sleep", "1"], recovery="live")
