"""FSDP2 on dask-ddp with sharded checkpoints: killed, resumed, then evaluated on one rank.

What it shows
-------------
- An FSDP2 model (``torch.distributed.fsdp.fully_shard``: every parameter is a DTensor
  sharded over the ranks) trained on CPU with gloo under ``dask_ddp.submit`` (2 ranks).
- ``dask_ddp.Checkpointer(..., sharded=True)``: every ``--save-every`` steps each rank
  writes its own shards of the model and the Adam state through
  ``torch.distributed.checkpoint`` and dask-ddp's ``StorageWriter``, to a folder or
  ``s3://`` (``--moto`` starts a local S3 server to try it), metadata last, so a
  checkpoint either is complete or does not count. ``--async-save`` overlaps the upload
  with training (``dcp.async_save``).
- A failure and an automatic resume: in the first attempt rank 1 is SIGKILLed at step
  ``--kill-at``; the job (``max_restarts=2``) starts again and ``Checkpointer.restore()``
  continues from the newest complete checkpoint (model, optimizer, RNG states, step).
- Resharding on load: a 1-rank job loads the same checkpoint into a plain, unsharded
  model and evaluates it on held-out data. The held-out loss must fall below
  ``--max-loss`` (a fraction of the untrained model's), else the script exits with 1.

How to run
----------
$ python examples/fsdp2_checkpoint.py                 # LocalCluster, checkpoints in OUT/ckpt
$ python examples/fsdp2_checkpoint.py --quick --moto  # fewer steps, to a local moto S3
$ python examples/fsdp2_checkpoint.py --scheduler tcp://10.0.0.5:8786 \\
      --storage s3://my-bucket/fsdp2-run

The workers must reach ``--storage`` (object store or shared file system);
``summary.json`` is written under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

import dask_ddp
from dask_ddp.checkpoint import list_sharded_checkpoints

logger = logging.getLogger("fsdp2_checkpoint")

FEATURES = 32


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(FEATURES, 128), nn.GELU(), nn.Linear(128, 128), nn.GELU(),
                         nn.Linear(128, 1))


def batch(step: int, rank: int, size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of a fixed, learnable regression problem; the same for (step, rank)."""
    g = torch.Generator().manual_seed(step * 7919 + rank)
    x = torch.randn(size, FEATURES, generator=g)
    w = torch.linspace(-1.0, 1.0, FEATURES)
    w = w / w.norm() * 1.5
    y = torch.tanh(x @ w) + 0.5 * x[:, 0] * x[:, 1]
    return x, y.unsqueeze(1)


def train(steps: int, save_every: int, kill_at: int, storage: str,
          async_save: bool) -> dict[str, Any]:
    """One rank of the FSDP2 job (dask-ddp has initialised the process group)."""
    from torch.distributed.fsdp import fully_shard

    info = dask_ddp.rank_info()
    model = make_model()
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    ckpt = dask_ddp.Checkpointer(model, opt, storage=storage, sharded=True,
                                 async_save=async_save, keep=2)
    start = int(ckpt.restore().get("step", 0))
    loss = torch.tensor(float("nan"))
    for step in range(start, steps):
        if info.restart == 0 and info.rank == 1 and step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)  # a crash: no cleanup, no last save
        x, y = batch(step, info.rank)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if (step + 1) % save_every == 0 or step + 1 == steps:
            ckpt.save(step + 1)
    ckpt.wait()  # an async save must be complete before the job's process group ends
    return {"rank": info.rank, "restart": info.restart, "resumed_at": start,
            "loss": float(loss.detach())}


def evaluate(storage: str) -> dict[str, Any]:
    """A 1-rank job: the sharded checkpoint loaded into a plain model, evaluated."""
    model = make_model()
    untrained = held_out_loss(model)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    extra = dask_ddp.Checkpointer(model, opt, storage=storage, sharded=True).restore()
    return {"step": extra.get("step"), "loss": held_out_loss(model), "untrained": untrained}


def held_out_loss(model: nn.Module) -> float:
    with torch.no_grad():
        x, y = batch(10**6, 99, size=2048)
        return float(nn.functional.mse_loss(model(x), y))


def start_moto(out: Path) -> tuple[subprocess.Popen[bytes], str]:
    """A local moto S3 server and a bucket; the AWS variables point everything at it."""
    import socket

    import boto3

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1",
                             "-p", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
                      AWS_REGION="us-east-1", AWS_ENDPOINT_URL_S3=endpoint)
    deadline = time.monotonic() + 30
    while True:
        try:
            boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="fsdp2")
            break
        except Exception:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise
            time.sleep(0.2)
    return proc, "s3://fsdp2/run"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="fsdp2-out", help="folder for summary.json (and ckpt/)")
    p.add_argument("--storage", help="checkpoint URL (default: OUT/ckpt)")
    p.add_argument("--moto", action="store_true", help="checkpoints to a local moto S3")
    p.add_argument("--scheduler", help="a Dask scheduler address (default: a LocalCluster)")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--save-every", type=int, default=20)
    p.add_argument("--kill-at", type=int, default=110,
                   help="rank 1 is SIGKILLed at this step of the first attempt (-1: never)")
    p.add_argument("--async-save", action="store_true", help="dcp.async_save")
    p.add_argument("--quick", action="store_true", help="60 steps, saves every 10, kill at 35")
    p.add_argument("--max-loss", type=float, default=0.5,
                   help="the held-out loss must fall below this fraction of the untrained")
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.save_every, args.kill_at = 60, 10, 35
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    moto = None
    if args.moto:
        moto, storage = start_moto(out)
    else:
        storage = args.storage or (out / "ckpt").as_uri()
    from distributed import Client, LocalCluster

    cluster = None
    try:
        if args.scheduler:
            client = Client(args.scheduler)
        else:
            cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                   dashboard_address=":0")
            client = Client(cluster)
        with client:
            t0 = time.monotonic()
            job = dask_ddp.submit(client, train, args.steps, args.save_every, args.kill_at,
                                  storage, args.async_save, n_workers=2, max_restarts=2,
                                  progress=False, name="fsdp2-train")
            ranks = job.result()
            restarts = [{"attempt": r.attempt, "rank": r.rank, "kind": r.kind}
                        for r in getattr(job, "restarts", [])]
            logger.info("trained %d steps in %.1fs, restarts: %s", args.steps,
                        time.monotonic() - t0, restarts)
            ev = dask_ddp.submit(client, evaluate, storage, n_workers=1, progress=False,
                                 name="fsdp2-eval").result()[0]
            kept = list_sharded_checkpoints(storage)  # keep=2: the newest two steps
    finally:
        if cluster is not None:
            cluster.close()
        if moto is not None:
            moto.terminate()
            moto.wait()
    summary = {"storage": storage, "steps": args.steps, "ranks": ranks,
               "restarts": restarts, "eval": ev, "checkpoints": kept}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    ok = ev["step"] == args.steps and ev["loss"] < args.max_loss * ev["untrained"]
    logger.info("1-rank evaluation of step %s: held-out loss %.4f (untrained %.4f): %s",
                ev["step"], ev["loss"], ev["untrained"], "OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
