"""Your own ``torch.utils.data.Dataset`` on dask-ddp: tabular regression from a CSV file.

What it shows
-------------
- A plain PyTorch input pipeline inside a Dask job: your own ``Dataset`` subclass (it
  reads a CSV file through :func:`dask_ddp.storage.open`, so ``file://`` and ``s3://``
  work alike), a ``DistributedSampler`` sharding it over the ranks, and a ``DataLoader``
  with ``num_workers=2``. *dask-pytorch-ddp* ran the training function inside the Dask
  worker, a daemonic process, where ``DataLoader`` workers fail with "daemonic processes
  are not allowed to have children"; a dask-ddp rank is a process of its own, so they
  just work (each rank reports how many loader processes it saw).
- ``dask_ddp.submit(...)`` on a ``LocalCluster`` of processes (or your cluster with
  ``--scheduler``), ``dask_ddp.report()`` metrics (in ``OUT/run/metrics.jsonl``), and
  ``job.result()`` returning each rank's return value, in rank order.
- ``save_checkpoint``/``load_checkpoint``: rank 0 saves the model and optimizer every
  epoch; a run with ``--resume`` continues from the newest checkpoint (after a finished
  run it trains no further epochs and evaluates the restored model).
- A checked quality: the held-out R² (all-reduced over the ranks) must reach
  ``--min-r2`` (default 0.9), else the script exits with status 1.

The data is a synthetic but learnable regression problem, generated deterministically
from ``--seed`` and written once as ``train.csv`` and ``valid.csv`` (8 feature columns
``x0..x7`` and a target ``y``, a non-linear function of them plus noise) under ``--data``.
Replace :func:`make_tables` with your files and :class:`CsvDataset` keeps working.

How to run
----------
$ python examples/custom_dataset.py                   # LocalCluster, 2 workers, 20 epochs
$ python examples/custom_dataset.py --quick           # 6 epochs (CI)
$ python examples/custom_dataset.py --quick --resume  # resumes: no epochs left to train
$ python examples/custom_dataset.py --resume --epochs 25   # 5 more epochs after a full run
$ python examples/custom_dataset.py --scheduler tcp://10.0.0.5:8786 \\
      --data s3://my-bucket/tabular --storage s3://my-bucket/tabular-run

On a real cluster the workers must reach ``--data`` and ``--storage`` (an object store or
a shared file system); the metrics and ``summary.json`` are written here, under ``--out``.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import multiprocessing
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

import dask_ddp
from dask_ddp import storage
from dask_ddp.checkpoint import list_checkpoints

logger = logging.getLogger("custom_dataset")

N_FEATURES = 8
COLUMNS = [f"x{i}" for i in range(N_FEATURES)] + ["y"]


# --- the data: a CSV file of features and a target -------------------------------------------

def make_tables(seed: int, n_train: int = 6000, n_valid: int = 1000) -> dict[str, np.ndarray]:
    """A learnable regression problem: ``y = f(x) + noise`` with a non-linear ``f``.

    Returns ``{"train.csv": table, "valid.csv": table}``, each ``(rows, 9)`` float32, the
    last column the target. Same ``seed``, same tables.
    """
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n_train + n_valid, N_FEATURES)).astype(np.float32)
    y = (2.0 * np.sin(x[:, 0]) + x[:, 1] * x[:, 2] + 0.5 * x[:, 3] ** 2 - x[:, 4]
         + np.tanh(x[:, 5] + x[:, 6]) + 0.1 * rng.standard_normal(len(x)))
    table = np.column_stack([x, y]).astype(np.float32)
    return {"train.csv": table[:n_train], "valid.csv": table[n_train:]}


def write_tables(data_url: str, seed: int) -> None:
    """Write the CSV files under ``data_url`` (any store URL), unless they are there."""
    store = storage.open(data_url)
    for key, table in make_tables(seed).items():
        if store.exists(key):
            continue
        buf = io.StringIO()
        np.savetxt(buf, table, delimiter=",", fmt="%.6f", header=",".join(COLUMNS),
                   comments="")
        store.put(key, buf.getvalue().encode())
        logger.info("wrote %s/%s (%d rows)", data_url.rstrip("/"), key, len(table))


class CsvDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Rows of a CSV file with a header: the ``target`` column and the other columns.

    Parameters
    ----------
    url : str
        The store holding the file: a folder path, ``file://...`` or ``s3://bucket/prefix``.
    key : str
        The file's name (key) in that store.
    target : str
        The name of the target column.
    """

    def __init__(self, url: str, key: str, target: str = "y") -> None:
        raw = storage.open(url).get(key)
        header = raw.split(b"\n", 1)[0].decode().strip().split(",")
        if target not in header:
            raise ValueError(f"{url}/{key}: no column {target!r} (columns: {header})")
        table = np.loadtxt(io.BytesIO(raw), delimiter=",", skiprows=1, dtype=np.float32,
                           ndmin=2)
        col = header.index(target)
        self.feature_names = [h for h in header if h != target]
        self.features = torch.from_numpy(np.delete(table, col, axis=1))
        self.targets = torch.from_numpy(table[:, col].copy())

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.features[index], self.targets[index]


# --- the training function: runs in every rank ----------------------------------------------

def make_model(n_features: int) -> nn.Module:
    """A small MLP regressor."""
    return nn.Sequential(nn.Linear(n_features, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                         nn.Linear(64, 1))


def train(data_url: str, epochs: int, batch_size: int, lr: float,
          num_workers: int) -> dict[str, Any]:
    """Train and evaluate the regressor; return this rank's summary.

    The process group is up when dask-ddp calls this; checkpoints go to the job's
    ``storage=`` (``save_checkpoint``/``load_checkpoint`` without a URL).
    """
    info = dask_ddp.rank_info()
    torch.manual_seed(0)  # DDP broadcasts rank 0's initial weights; this makes runs repeat
    train_set = CsvDataset(data_url, "train.csv")
    valid_set = CsvDataset(data_url, "valid.csv")
    train_sampler = DistributedSampler(train_set, shuffle=True, seed=0)
    train_loader = DataLoader(train_set, batch_size=batch_size, sampler=train_sampler,
                              num_workers=num_workers, persistent_workers=num_workers > 0)
    valid_loader = DataLoader(valid_set, batch_size=256,
                              sampler=DistributedSampler(valid_set, shuffle=False),
                              num_workers=num_workers, persistent_workers=num_workers > 0)

    model = DDP(make_model(len(train_set.feature_names)))
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    start_epoch = 0
    state = dask_ddp.load_checkpoint()  # None on a fresh run
    if state is not None:
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start_epoch = state["epoch"] + 1

    def evaluate() -> tuple[float, float]:
        """Held-out (R², MSE) over the whole validation set, all ranks together.

        (``DistributedSampler`` repeats up to ``world_size - 1`` rows so that every rank
        gets as many: with 1000 rows and 2 or 4 ranks, none.)
        """
        model.eval()
        sums = torch.zeros(4, dtype=torch.float64)  # squared error, sum y, sum y², rows
        with torch.no_grad():
            for x, y in valid_loader:
                pred = model(x).squeeze(1)
                sums += torch.stack([((pred - y) ** 2).sum(), y.sum(), (y ** 2).sum(),
                                     torch.tensor(float(len(y)))]).double()
        dist.all_reduce(sums)
        sse, sy, syy, n = sums.tolist()
        return 1.0 - sse / (syy - sy * sy / n), sse / n

    steps, loader_processes, started = 0, 0, time.perf_counter()
    r2, mse = float("nan"), float("nan")
    for epoch in range(start_epoch, epochs):
        train_sampler.set_epoch(epoch)
        model.train()
        for x, y in train_loader:
            loss = nn.functional.mse_loss(model(x).squeeze(1), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            steps += 1
            dask_ddp.report({"loss": loss, "epoch": epoch, "sample": "train"},
                            step=steps)
            # The DataLoader's worker processes, children of this rank process.
            loader_processes = max(loader_processes, len(multiprocessing.active_children()))
        r2, mse = evaluate()
        dask_ddp.report({"r2": r2, "mse": mse, "epoch": epoch, "sample": "valid",
                         "loader_processes": loader_processes}, step=steps)
        dask_ddp.save_checkpoint({"model": model.module.state_dict(),
                                  "optimizer": optimizer.state_dict(), "epoch": epoch},
                                 step=epoch)  # rank 0 only; uploaded off this thread
    if start_epoch >= epochs:  # resumed a finished run: nothing left to train
        r2, mse = evaluate()
    return {"rank": info.rank, "world_size": info.world_size, "start_epoch": start_epoch,
            "epochs_run": epochs - min(start_epoch, epochs), "steps": steps, "r2": r2,
            "mse": mse, "loader_processes": loader_processes,
            "train_seconds": time.perf_counter() - started}


# --- the driver: runs on the client ---------------------------------------------------------

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--scheduler", metavar="ADDR",
                   help="a running Dask scheduler (default: a LocalCluster of processes)")
    p.add_argument("--n-workers", type=int, default=2,
                   help="ranks: workers of the LocalCluster, or of your cluster (default 2)")
    p.add_argument("--out", default="out/custom_dataset",
                   help="where the metrics and summary.json go (default %(default)s)")
    p.add_argument("--data", help="store URL of train.csv and valid.csv, written there if "
                   "missing (default: OUT/data)")
    p.add_argument("--storage", help="checkpoint store URL (default: OUT/checkpoints)")
    p.add_argument("--epochs", type=int, help="epochs in all, counting resumed ones "
                   "(default 20; 6 with --quick)")
    p.add_argument("--quick", action="store_true", help="a short run (CI)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--num-workers", type=int, default=2,
                   help="DataLoader worker processes per rank (default 2)")
    p.add_argument("--seed", type=int, default=42, help="seed of the generated data")
    p.add_argument("--min-r2", type=float, default=0.9,
                   help="held-out R² to reach; below it the exit status is 1")
    p.add_argument("--resume", action="store_true",
                   help="continue from the newest checkpoint (default: start afresh)")
    args = p.parse_args(argv)
    if args.n_workers < 1:
        p.error(f"--n-workers must be >= 1, got {args.n_workers}")
    if args.epochs is None:
        args.epochs = 6 if args.quick else 20
    if args.epochs < 1:
        p.error(f"--epochs must be >= 1, got {args.epochs}")
    return args


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args = parse_args(argv)
    from dask.distributed import Client, LocalCluster

    out = Path(args.out).resolve()
    run_dir = out / "run"
    data_url = args.data or (out / "data").as_uri()
    storage_url = args.storage or (out / "checkpoints").as_uri()
    if not args.resume:
        # A fresh run: the old checkpoints would be resumed from, the old metrics mixed in.
        for old in (run_dir, None if args.storage else out / "checkpoints"):
            if old is not None and old.exists():
                logger.info("removing the previous run's %s (--resume keeps it)", old)
                shutil.rmtree(old)
        if args.storage and list_checkpoints(storage_url):
            logger.error("%s already holds checkpoints: pass --resume to continue from "
                         "them, or an empty --storage", storage_url)
            return 2
    out.mkdir(parents=True, exist_ok=True)
    write_tables(data_url, args.seed)

    cluster = None
    if args.scheduler:
        for what, url in (("--data", data_url), ("--storage", storage_url)):
            if url.startswith("file://"):
                logger.warning("%s %s is a local folder: the workers must share it (else "
                               "give an s3:// URL)", what, url)
        client = Client(args.scheduler)
    else:
        cluster = LocalCluster(n_workers=args.n_workers, threads_per_worker=1,
                               processes=True, dashboard_address=":0")
        client = Client(cluster)
    try:
        job = dask_ddp.submit(client, train, data_url, args.epochs, args.batch_size, args.lr,
                              args.num_workers, n_workers=args.n_workers, name="tabular",
                              output_dir=run_dir, storage=storage_url)
        ranks = job.result()  # one dict per rank, in rank order
    finally:
        client.close()
        if cluster is not None:
            cluster.close()

    for r in ranks:
        logger.info("rank %d: started at epoch %d, trained %d epochs (%d steps), R² %.4f, "
                    "%d DataLoader processes, %.1f s", r["rank"], r["start_epoch"],
                    r["epochs_run"], r["steps"], r["r2"], r["loader_processes"],
                    r["train_seconds"])
    curve = [m for m in read_metrics(run_dir / "metrics.jsonl")
             if m.get("sample") == "valid" and m["rank"] == 0]
    for m in curve:
        logger.info("epoch %2d: held-out R² %.4f, MSE %.4f", m["epoch"], m["r2"], m["mse"])
    r2 = ranks[0]["r2"]
    summary = {"r2": r2, "min_r2": args.min_r2, "epochs": args.epochs, "ranks": ranks,
               "run_dir": str(run_dir), "storage": storage_url, "data": data_url}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    if r2 < args.min_r2:
        logger.error("held-out R² %.4f is below --min-r2 %g", r2, args.min_r2)
        return 1
    logger.info("held-out R² %.4f >= %g; summary in %s", r2, args.min_r2,
                out / "summary.json")
    return 0


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The metric records of a job's ``metrics.jsonl`` (none if it is missing)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


if __name__ == "__main__":
    sys.exit(main())
