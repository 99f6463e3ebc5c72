"""Train a classifier with dask-ddp, then score a held-out Dask DataFrame with it and write Parquet.

What it shows
-------------
- :func:`dask_ddp.submit` trains an MLP (8 features, 3 classes) on 2 ranks from a
  persisted Dask DataFrame (each rank reads it through ``dask_ddp.data.Loader``, as
  ``examples/tabular.py`` does); a :class:`dask_ddp.Checkpointer` saves the training state
  into the job's storage (``storage=`` of ``submit``) after every epoch.
- :func:`dask_ddp.predict` scores a held-out Dask DataFrame of events with the newest
  checkpoint of that storage (``checkpoint=``, the URL given to ``submit``): a lazy Dask
  DataFrame with the held-out frame's partitions, divisions and index (the event ids), one
  column per class logit. The model builder reaches each worker once, the model is built
  there once and its weights are read once per worker process, whatever the number of
  partitions.
- The scores are an ordinary Dask collection: the held-out labels are assigned beside them
  (same divisions: partition by partition), the predicted class is added per partition
  and the whole is written with ``to_parquet``; the accuracy is computed from the Parquet
  files read back and must reach ``--min-accuracy`` (default 0.85), else the script exits
  with status 1.

The data is a synthetic 3-class problem made on the workers by Dask itself (no download):
8 float32 features ``f0..f7``, a label that is the argmax of a fixed non-linear score plus
noise, and an index of event ids (``id``) known per partition.

How to run
----------
$ python examples/predict.py                 # LocalCluster of 2 workers, 2 ranks, 6 epochs
$ python examples/predict.py --quick         # fewer rows and epochs (CI)
$ python examples/predict.py --scheduler tcp://10.0.0.5:8786 \\
      --storage s3://bucket/predict-example --out /shared/predict-out

``--out`` (where the scores are written) and ``--storage`` must be reachable from every
worker (a shared file system or an object store); the defaults are local directories.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import dask_ddp

logger = logging.getLogger("predict")

FEATURES = [f"f{i}" for i in range(8)]
CLASSES = 3
#: The columns predict() writes: one logit per class (``name="logit"``).
LOGITS = [f"logit_{c}" for c in range(CLASSES)]


def make_model() -> nn.Module:
    """The classifier: built by the ranks to train, and by predict() on each worker."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(len(FEATURES), 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                         nn.Linear(64, CLASSES))


def make_partition(seed: int, part: int, rows: int) -> Any:
    """One partition of the synthetic classification (made on a worker): features, label,
    indexed by event ids ``part * rows ...``."""
    import pandas as pd

    rng = np.random.default_rng([seed, part])
    x = rng.standard_normal((rows, len(FEATURES))).astype(np.float32)
    w = np.random.default_rng(7).standard_normal((len(FEATURES), CLASSES))
    score = x @ w + np.stack([x[:, 0] ** 2, np.sin(2.0 * x[:, 1]), x[:, 2] * x[:, 3]], axis=1)
    label = np.argmax(score + 0.2 * rng.standard_normal(score.shape), axis=1)
    frame = pd.DataFrame(x, columns=FEATURES,
                         index=pd.RangeIndex(part * rows, (part + 1) * rows, name="id"))
    frame["label"] = label.astype(np.int64)
    return frame


def make_frame(seed: int, partitions: int, rows: int) -> Any:
    """A Dask DataFrame of ``partitions`` partitions, each built by a task on the cluster;
    its divisions are known (the event ids of each partition)."""
    import dask
    import dask.dataframe as dd

    meta = make_partition(seed, 0, 0)
    parts = [dask.delayed(make_partition)(seed, p, rows) for p in range(partitions)]
    divisions = (*(p * rows for p in range(partitions)), partitions * rows - 1)
    return dd.from_delayed(parts, meta=meta, divisions=divisions, verify_meta=False)


def train(table: Any, *, epochs: int, batch_size: int, lr: float) -> dict[str, Any]:
    """One rank: DDP over the classifier, a checkpoint into the job's storage each epoch."""
    torch.set_num_threads(1)
    model = DDP(make_model())
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    ckpt = dask_ddp.Checkpointer(model, opt)  # storage: the job's (submit's storage=)
    loader = dask_ddp.data.Loader(table, batch_size=batch_size, shuffle=True, seed=0,
                                  features=FEATURES, label="label")
    steps = 0
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y.long())
            opt.zero_grad()
            loss.backward()
            opt.step()
            steps += 1
        dask_ddp.report({"epoch": epoch, "loss": loss}, step=steps)
        ckpt.save(epoch)  # collective; rank 0 uploads in the background
    return {"rank": dist.get_rank(), "steps": steps, "loss": loss.item()}


def with_prediction(part: Any) -> Any:
    """A partition of scores with its predicted class (the largest logit)."""
    return part.assign(pred=part[LOGITS].to_numpy().argmax(axis=1).astype(np.int64))


def score(held_out: Any, storage: str, scores_dir: str) -> float:
    """Score ``held_out`` with the newest checkpoint in ``storage``, write the scores to
    Parquet in ``scores_dir``; returns the accuracy read back from the files."""
    import dask.dataframe as dd

    scores = dask_ddp.predict(make_model, held_out, columns=FEATURES, checkpoint=storage,
                              batch_size=4096, name="logit")
    # Same partitions and divisions as held_out: the labels line up partition by partition.
    scores = scores.assign(label=held_out["label"]).map_partitions(with_prediction)
    scores.to_parquet(scores_dir)
    written = dd.read_parquet(scores_dir)
    return float((written["pred"] == written["label"]).mean().compute())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--scheduler", help="a running Dask scheduler (default: a LocalCluster)")
    p.add_argument("--n-workers", type=int, default=2)
    p.add_argument("--partitions", type=int, default=8, help="training partitions")
    p.add_argument("--rows", type=int, default=25_000, help="rows per training partition")
    p.add_argument("--held-out-partitions", type=int, default=4)
    p.add_argument("--held-out-rows", type=int, default=50_000,
                   help="rows per held-out partition")
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--min-accuracy", type=float, default=0.85)
    p.add_argument("--quick", action="store_true",
                   help="4 x 4,000 training rows, 5 epochs, 3 x 2,000 held-out rows")
    p.add_argument("--storage", help="the job's storage URL (default: file:// under --out)")
    p.add_argument("--out", type=Path, default=Path("predict-out"))
    args = p.parse_args(argv)
    if args.quick:
        args.partitions, args.rows, args.epochs = 4, 4_000, 5
        args.held_out_partitions, args.held_out_rows = 3, 2_000
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args.out.mkdir(parents=True, exist_ok=True)
    storage = args.storage or (args.out / "checkpoints").resolve().as_uri()
    scores_dir = str((args.out / "scores").resolve())
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
        job = dask_ddp.submit(client, train, train_df, epochs=args.epochs,
                              batch_size=args.batch_size, lr=args.lr, storage=storage,
                              progress=False, name="predict-example")
        ranks = job.result()
        held_out = make_frame(2, args.held_out_partitions, args.held_out_rows)
        accuracy = score(held_out, storage, scores_dir)  # the job's storage
        steps = dask_ddp.checkpoint.list_checkpoints(storage)
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
    summary = {"accuracy": accuracy, "min_accuracy": args.min_accuracy, "storage": storage,
               "checkpoints": steps, "scores": scores_dir, "epochs": args.epochs,
               "held_out": {"seed": 2, "partitions": args.held_out_partitions,
                            "rows": args.held_out_rows},
               "ranks": ranks}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    logger.info("held-out accuracy %.4f (min %.2f) over %d rows scored with checkpoint %d; "
                "scores in %s", accuracy, args.min_accuracy,
                args.held_out_partitions * args.held_out_rows, steps[-1], scores_dir)
    return 0 if accuracy >= args.min_accuracy else 1


if __name__ == "__main__":
    sys.exit(main())
