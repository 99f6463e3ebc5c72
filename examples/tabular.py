"""Train an MLP on a Dask DataFrame: the table stays on the workers, the ranks read it.

What it shows
-------------
- A Dask DataFrame passed to :func:`dask_ddp.submit` reaches each rank as a
  :class:`dask_ddp.data.Table` (columns, dtypes, row counts, where each partition is):
  the frame is never computed onto the client nor pickled into the tasks.
- ``dask_ddp.data.Loader(table, batch_size=..., features=[...], label="y")`` in each rank:
  every row once per epoch across the ranks (``DistributedSampler``'s semantics), equal
  batch counts, a new order each epoch; rows are read from the worker holding them
  through shared memory and gathered into ``(x, y)`` tensors in C++.
- A held-out table (another Dask DataFrame, a keyword argument) evaluated with
  ``shuffle=False``; the R² is all-reduced over the ranks and must reach ``--min-r2``
  (default 0.9), else the script exits with status 1.

The data is a synthetic regression built offline with Dask itself (no download): 16
float32 features ``f0..f15`` and a target ``y``, a non-linear function of them plus noise,
in partitions made on the workers and persisted there.

How to run
----------
$ python examples/tabular.py                 # LocalCluster of 2 workers, 2 ranks, 8 epochs
$ python examples/tabular.py --quick         # fewer rows and epochs (CI)
$ python examples/tabular.py --scheduler tcp://10.0.0.5:8786
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import dask_ddp

logger = logging.getLogger("tabular")

FEATURES = [f"f{i}" for i in range(16)]


def make_partition(seed: int, part: int, rows: int) -> Any:
    """One partition of the synthetic regression (made on a worker)."""
    import pandas as pd

    rng = np.random.default_rng([seed, part])
    x = rng.standard_normal((rows, len(FEATURES))).astype(np.float32)
    w = np.linspace(-1.0, 1.0, len(FEATURES)).astype(np.float32)
    y = x @ w + 0.5 * np.sin(2.0 * x[:, 0]) * x[:, 1] + 0.3 * x[:, 2] ** 2
    y = y + 0.1 * rng.standard_normal(rows)
    frame = pd.DataFrame(x, columns=FEATURES)
    frame["y"] = y.astype(np.float32)
    return frame


def make_frame(seed: int, partitions: int, rows: int) -> Any:
    """A Dask DataFrame of ``partitions`` partitions, each built by a task on the cluster."""
    import dask
    import dask.dataframe as dd

    meta = make_partition(seed, 0, 0)
    parts = [dask.delayed(make_partition)(seed, p, rows) for p in range(partitions)]
    return dd.from_delayed(parts, meta=meta, verify_meta=False)


def train(table: Any, *, valid: Any, epochs: int, batch_size: int, lr: float) -> dict[str, Any]:
    """One rank: DDP over an MLP, batches from the table's Loader."""
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = DDP(nn.Sequential(nn.Linear(len(FEATURES), 64), nn.ReLU(), nn.Linear(64, 64),
                              nn.ReLU(), nn.Linear(64, 1)))
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    loader = dask_ddp.data.Loader(table, batch_size=batch_size, shuffle=True, seed=0,
                                  features=FEATURES, label="y")
    steps = 0
    t0 = time.monotonic()
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x).squeeze(1), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            steps += 1
        dask_ddp.report({"epoch": epoch, "loss": loss})
    # Held-out R²: sums over every row of the held-out table, all-reduced.
    evaluator = dask_ddp.data.Loader(valid, batch_size=4096, shuffle=False,
                                     features=FEATURES, label="y", drop_last=False)
    sums = torch.zeros(4, dtype=torch.float64)
    with torch.no_grad():
        for x, y in evaluator:
            pred = model(x).squeeze(1).double()
            y = y.double()
            sums += torch.stack([((pred - y) ** 2).sum(), y.sum(), (y ** 2).sum(),
                                 torch.tensor(float(len(y)), dtype=torch.float64)])
    dist.all_reduce(sums)
    sse, sy, syy, n = sums.tolist()
    r2 = 1.0 - sse / (syy - sy * sy / n)
    return {"rank": rank, "world_size": world, "steps": steps, "rows": len(table),
            "r2": r2, "mse": sse / n, "seconds": time.monotonic() - t0}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--scheduler", help="a running Dask scheduler (default: a LocalCluster)")
    p.add_argument("--n-workers", type=int, default=2)
    p.add_argument("--partitions", type=int, default=8)
    p.add_argument("--rows", type=int, default=25_000, help="rows per training partition")
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--min-r2", type=float, default=0.9)
    p.add_argument("--quick", action="store_true", help="8 x 6,000 rows, 6 epochs")
    p.add_argument("--out", type=Path, default=Path("tabular-out"))
    args = p.parse_args(argv)
    if args.quick:
        args.rows, args.epochs = 6_000, 6
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    from dask.distributed import Client, LocalCluster

    cluster = None
    if args.scheduler:
        client = Client(args.scheduler)
    else:
        cluster = LocalCluster(n_workers=args.n_workers, threads_per_worker=1,
                               processes=True, dashboard_address=":0")
        client = Client(cluster)
    try:
        train_df = make_frame(1, args.partitions, args.rows).persist()
        valid_df = make_frame(2, 2, args.rows // 2).persist()
        job = dask_ddp.submit(client, train, train_df, valid=valid_df, epochs=args.epochs,
                              batch_size=args.batch_size, lr=args.lr, progress=False)
        ranks = job.result()
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
    r2 = ranks[0]["r2"]
    args.out.mkdir(parents=True, exist_ok=True)
    summary = {"r2": r2, "min_r2": args.min_r2, "epochs": args.epochs, "ranks": ranks}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    logger.info("held-out R² %.4f (min %.2f), %d rows, %d steps per rank, %.1f s", r2,
                args.min_r2, ranks[0]["rows"], ranks[0]["steps"], ranks[0]["seconds"])
    return 0 if r2 >= args.min_r2 else 1


if __name__ == "__main__":
    sys.exit(main())
