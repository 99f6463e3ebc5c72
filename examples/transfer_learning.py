"""The seed's transfer-learning tutorial on dask-ddp, end to end, on 2 CPU cores.

This is the tutorial of *dask-pytorch-ddp* (``prepro_batches``, ``get_splits_parallel``,
``run_transfer_learning`` with train and eval phases per epoch, ``ReduceLROnPlateau``, the
learning rate scaled by the world size, statistics per iteration through
``DaskResultsHandler``, a checkpoint every N steps from rank 0, ``dispatch.run`` +
``process_results``) with only the import line changed, plus a variant on dask-ddp's own
API (the C++ ``Loader``, ``report()``, ``save_checkpoint()``).

Without arguments it builds a real image set offline (scikit-learn's handwritten digits
written as PNG/JPEG files), starts a LocalCluster for each world size, trains, and writes
the seed-style plots and a summary table. With ``--scheduler ADDR`` it uses your cluster;
with ``--data URL`` (a local folder or ``s3://bucket/prefix``) your images; with ``--s3``
it serves the digits from a local moto S3 server and trains through ``s3://``.

Examples
--------
$ python examples/transfer_learning.py                      # world sizes 1 and 2
$ python examples/transfer_learning.py --quick              # fewer epochs (CI)
$ python examples/transfer_learning.py --api loader --s3    # C++ Loader over s3://
$ python examples/transfer_learning.py --scheduler tcp://10.0.0.5:8786 --data s3://b/dogs
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import math
import os
import pickle
import shutil
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.optim import lr_scheduler
from torch.utils.data import DataLoader, Subset
from torch.utils.data.distributed import DistributedSampler
from torchvision import models, transforms

from dask_ddp import data, dispatch, rank_info, results  # the seed's: from dask_pytorch_ddp

sys.path.insert(0, str(Path(__file__).resolve().parent))
import digits_data  # noqa: E402

logger = logging.getLogger("transfer_learning")

MEAN, STD = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)
SPLIT_SEED = 1234  # every rank must draw the same train/eval split


class SmallCNN(nn.Module):
    """A small convolutional net: trains to >95% on the digits in a few CPU minutes."""

    def __init__(self, n_classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(32 * 8 * 8, 64), nn.ReLU(),
                                  nn.Linear(64, n_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def make_model(name: str, pretrained: bool, n_classes: int) -> nn.Module:
    """The seed fine-tunes a ResNet; ``cnn`` is the fast default on CPU."""
    if name == "cnn":
        return SmallCNN(n_classes)
    weights = "DEFAULT" if pretrained else None  # --pretrained needs the weights on disk
    net = getattr(models, name)(weights=weights)
    net.fc = nn.Linear(net.fc.in_features, n_classes)
    return net


# --- the seed's tutorial -------------------------------------------------------------------

def prepro_batches(data_url: str) -> Any:
    """Create the image Dataset (S3ImageFolder for s3://, as in the seed), with transforms."""
    transform = transforms.Compose([
        transforms.Resize(32),
        transforms.CenterCrop(32),
        transforms.ToTensor(),
        transforms.Normalize(MEAN, STD),
    ])
    if data_url.startswith("s3://"):
        bucket, _, prefix = data_url[len("s3://"):].partition("/")
        return data.S3ImageFolder(bucket, prefix, transform=transform)
    return data.ImageFolder(data_url, transform=transform)


def split_indices(n: int, train_pct: float) -> tuple[list[int], list[int]]:
    """The same train/eval split on every rank (the seed shuffled per rank: a bug in DDP)."""
    indices = np.random.default_rng(SPLIT_SEED).permutation(n).tolist()
    train_size = math.floor(n * train_pct)
    return indices[:train_size], indices[train_size:]


def get_splits_parallel(train_pct: float, dataset: Any, batch_size: int,
                        num_workers: int = 2) -> tuple[DataLoader, DataLoader]:
    """Train and eval DataLoaders, each sharded over the ranks with a DistributedSampler.

    Worker processes work inside a dask-ddp rank (it is a process of its own), so no
    ``fork`` context or ``DASK_DISTRIBUTED__WORKER__DAEMON`` setting is needed.
    """
    train_idx, test_idx = split_indices(len(dataset), train_pct)
    train_loader = DataLoader(Subset(dataset, train_idx), batch_size=batch_size,
                              sampler=DistributedSampler(Subset(dataset, train_idx), seed=0),
                              num_workers=num_workers, persistent_workers=num_workers > 0)
    test_loader = DataLoader(Subset(dataset, test_idx), batch_size=batch_size,
                             sampler=DistributedSampler(Subset(dataset, test_idx),
                                                        shuffle=False),
                             num_workers=num_workers, persistent_workers=num_workers > 0)
    return train_loader, test_loader


key = uuid.uuid4().hex
rh = results.DaskResultsHandler(key)


def run_transfer_learning(data_url: str, train_pct: float, batch_size: int, n_epochs: int,
                          base_lr: float, model_name: str = "cnn", pretrained: bool = False,
                          checkpoint_every: int = 100, num_workers: int = 2) -> dict[str, Any]:
    """The seed's training function: train + eval per epoch, stats through the handler."""
    worker_rank = int(dist.get_rank())
    torch.manual_seed(0)  # DDP broadcasts rank 0's weights anyway; this makes runs repeatable
    # The seed used torch.device(0); the rank's own device (its GPU, or the CPU) is this:
    device = rank_info().device
    net = make_model(model_name, pretrained, n_classes=10)
    model = DDP(net.to(device), device_ids=[device.index] if device.type == "cuda" else None)
    criterion = nn.CrossEntropyLoss()
    lr = base_lr * dist.get_world_size()
    optimizer = optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    scheduler = lr_scheduler.ReduceLROnPlateau(optimizer, mode="min", patience=2)

    whole_dataset = prepro_batches(data_url)
    train, val = get_splits_parallel(train_pct, whole_dataset, batch_size, num_workers)
    dataloaders = {"train": train, "val": val}

    count = 0
    t_count = 0
    eval_acc = 0.0
    started = time.perf_counter()
    for epoch in range(n_epochs):
        dataloaders["train"].sampler.set_epoch(epoch)
        model.train()
        for inputs, labels in dataloaders["train"]:
            dt = datetime.datetime.now().isoformat()
            inputs, labels = inputs.to(device), labels.to(device)
            outputs = model(inputs)
            _, preds = torch.max(outputs, 1)
            loss = criterion(outputs, labels)
            correct = (preds == labels).sum().item()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            count += 1
            current_lr = optimizer.param_groups[0]["lr"]
            rh.submit_result(
                f"worker/{worker_rank}/data-{dt}.json",
                json.dumps({"loss": loss.item(), "learning_rate": current_lr,
                            "correct": correct, "size": len(labels), "epoch": epoch,
                            "count": count, "worker": worker_rank, "sample": "train"}),
            )
            if (count % checkpoint_every) == 0 and worker_rank == 0:
                rh.submit_result(f"checkpoint-{dt}.pkl", pickle.dumps(model.state_dict()))

        with torch.no_grad():
            model.eval()
            totals = torch.zeros(2, device=device)  # all-reduced: on the backend's device
            for inputs_t, labels_t in dataloaders["val"]:
                dt = datetime.datetime.now().isoformat()
                inputs_t, labels_t = inputs_t.to(device), labels_t.to(device)
                outputs_t = model(inputs_t)
                _, pred_t = torch.max(outputs_t, dim=1)
                loss_t = criterion(outputs_t, labels_t)
                correct_t = (pred_t == labels_t).sum().item()
                totals += torch.tensor([correct_t, len(labels_t)], dtype=torch.float32,
                                       device=device)
                t_count += 1
                rh.submit_result(
                    f"worker/{worker_rank}/data-{dt}.json",
                    json.dumps({"loss": loss_t.item(), "learning_rate": current_lr,
                                "correct": correct_t, "size": len(labels_t), "epoch": epoch,
                                "count": t_count, "worker": worker_rank, "sample": "eval"}),
                )
            dist.all_reduce(totals)  # accuracy over the whole eval split, all ranks
            eval_acc = float(totals[0] / totals[1])
        scheduler.step(loss.item())
    return {"rank": worker_rank, "world_size": dist.get_world_size(), "iterations": count,
            "eval_accuracy": eval_acc, "train_seconds": time.perf_counter() - started}


# --- the same training on dask-ddp's own API -----------------------------------------------

def run_with_loader(data_url: str, train_pct: float, batch_size: int, n_epochs: int,
                    base_lr: float, model_name: str = "cnn", pretrained: bool = False,
                    checkpoint_every: int = 100, num_workers: int = 2) -> dict[str, Any]:
    """The C++ Loader feeds the batches; report() and save_checkpoint() bring results home."""
    import dask_ddp
    from dask_ddp.data import Loader
    from dask_ddp.data import transforms as T

    info = dask_ddp.rank_info()
    torch.manual_seed(0)
    model = DDP(make_model(model_name, pretrained, n_classes=10))
    criterion = nn.CrossEntropyLoss()
    optimizer = optim.SGD(model.parameters(), lr=base_lr * info.world_size, momentum=0.9)
    scheduler = lr_scheduler.ReduceLROnPlateau(optimizer, mode="min", patience=2)

    dataset = data.ImageFolder(data_url)
    train_idx, test_idx = split_indices(len(dataset), train_pct)
    tf = T.Compose([T.Resize(32), T.CenterCrop(32), T.ToTensor(), T.Normalize(MEAN, STD)])
    train = Loader(Subset(dataset, train_idx), batch_size, transform=tf, shuffle=True)
    val = Loader(Subset(dataset, test_idx), batch_size, transform=tf, shuffle=False)

    state = dask_ddp.load_checkpoint()
    start_epoch = 0
    if state is not None:
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start_epoch = state["epoch"] + 1

    def evaluate() -> float:
        with torch.no_grad():
            model.eval()
            totals = torch.zeros(2)
            for inputs_t, labels_t in val:
                totals += torch.tensor([(model(inputs_t).argmax(1) == labels_t).sum().item(),
                                        len(labels_t)], dtype=torch.float32)
            dist.all_reduce(totals)  # accuracy over the whole eval split, all ranks
            return float(totals[0] / totals[1])

    count, started = 0, time.perf_counter()
    for epoch in range(start_epoch, n_epochs):
        train.set_epoch(epoch)
        model.train()
        for inputs, labels in train:
            outputs = model(inputs)
            loss = criterion(outputs, labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            count += 1
            correct = (outputs.argmax(1) == labels).sum()  # tensors: report() never syncs
            dask_ddp.report({"loss": loss, "correct": correct, "size": len(labels),
                             "epoch": epoch, "sample": "train",
                             "learning_rate": optimizer.param_groups[0]["lr"]}, step=count)
        eval_acc = evaluate()
        dask_ddp.report({"accuracy": eval_acc, "epoch": epoch, "sample": "eval"}, step=count)
        scheduler.step(loss.item())
        dask_ddp.save_checkpoint({"model": model.module.state_dict(),
                                  "optimizer": optimizer.state_dict(), "epoch": epoch},
                                 step=epoch)
    if start_epoch >= n_epochs:  # resumed from a finished run: nothing to train
        eval_acc = evaluate()
    return {"rank": info.rank, "world_size": info.world_size, "iterations": count,
            "eval_accuracy": eval_acc, "train_seconds": time.perf_counter() - started}


# --- driver ---------------------------------------------------------------------------------

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scheduler", help="address of a running Dask scheduler (default: "
                   "start a LocalCluster per world size)")
    p.add_argument("--data", help="image folder URL: local path or s3://bucket/prefix "
                   "(default: the digits, built offline)")
    p.add_argument("--s3", action="store_true",
                   help="serve the digits from a local moto S3 server and train over s3://")
    p.add_argument("--api", choices=["seed", "loader", "both"], default="both",
                   help="seed: the tutorial as written; loader: dask-ddp's Loader/report")
    p.add_argument("--world-sizes", default="1,2", help="comma-separated, e.g. 1,2,4")
    p.add_argument("--epochs", type=int, help="epochs to train (default 6, 4 with --quick)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--base-lr", type=float, default=0.01)
    p.add_argument("--train-pct", type=float, default=0.8)
    p.add_argument("--model", default="cnn", help="cnn (fast) or a torchvision resnet name")
    p.add_argument("--pretrained", action="store_true",
                   help="load the ResNet's pretrained weights (must be on the machine)")
    p.add_argument("--quick", action="store_true",
                   help="4 epochs unless --epochs, no DataLoader workers (CI)")
    p.add_argument("--resume", action="store_true",
                   help="keep the previous run's outputs: the Loader variant continues from "
                        "its latest checkpoint (the default starts afresh)")
    p.add_argument("--out", default="out/demo", help="where results, plots, checkpoints go")
    return p.parse_args(argv)


def start_s3_server() -> tuple[Any, str]:
    """A moto S3 server on 127.0.0.1 and a free port, with the AWS variables pointing at it."""
    import socket
    import subprocess

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                             str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.1)
    os.environ.update(AWS_ACCESS_KEY_ID="demo", AWS_SECRET_ACCESS_KEY="demo",
                      AWS_REGION="us-east-1", AWS_ENDPOINT_URL_S3=endpoint)
    return proc, endpoint


def train_world_size(args: argparse.Namespace, api: str, world_size: int, data_url: str,
                     out: Path) -> dict[str, Any]:
    """Run one training at one world size; return rank 0's summary plus wall time."""
    from dask.distributed import Client, LocalCluster

    import dask_ddp

    kwargs = dict(data_url=data_url, train_pct=args.train_pct, batch_size=args.batch_size,
                  n_epochs=args.epochs if args.epochs is not None else 4 if args.quick else 6,
                  base_lr=args.base_lr,
                  model_name=args.model, pretrained=args.pretrained,
                  num_workers=0 if args.quick else 2)
    cluster = None
    if args.scheduler:
        client = Client(args.scheduler)
    else:
        cluster = LocalCluster(n_workers=world_size, threads_per_worker=1, processes=True,
                               dashboard_address=":0")
        client = Client(cluster)
    run_dir = out / f"{api}-ws{world_size}"
    if run_dir.exists() and not args.resume:
        # A fresh run: old metrics and checkpoints would be resumed from (the Loader
        # variant continues from its latest checkpoint) and mixed into the plots.
        logger.info("removing the previous run's %s (--resume keeps it)", run_dir)
        shutil.rmtree(run_dir)
    started = time.perf_counter()
    try:
        if api == "seed":
            futures = dispatch.run(client, run_transfer_learning, **kwargs)
            rh.process_results(str(run_dir), futures, raise_errors=True)
            ranks = client.gather(futures)
        else:
            job = dask_ddp.submit(client, run_with_loader, n_workers=world_size,
                                  output_dir=run_dir, storage=(run_dir / "checkpoints").
                                  resolve().as_uri(), name=f"digits-ws{world_size}", **kwargs)
            ranks = job.result()
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
    summary = dict(ranks[0])
    summary.update(api=api, wall_seconds=time.perf_counter() - started, run_dir=str(run_dir))
    return summary


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args = parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    s3_proc = None
    try:
        if args.data:
            data_url = args.data
        elif args.s3:
            s3_proc, endpoint = start_s3_server()
            data_url = digits_data.write_s3("dask-ddp-demo", "digits", endpoint_url=endpoint)
        else:
            data_url = str(digits_data.write_local(out / "digits"))
        logger.info("training on %s", data_url)
        apis = ["seed", "loader"] if args.api == "both" else [args.api]
        rows = [train_world_size(args, api, int(ws), data_url, out)
                for api in apis for ws in args.world_sizes.split(",")]
    finally:
        if s3_proc is not None:
            s3_proc.terminate()
            s3_proc.wait()

    table = ["| api | world size | iterations (rank 0) | eval accuracy | train s | wall s |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        table.append(f"| {r['api']} | {r['world_size']} | {r['iterations']} | "
                     f"{r['eval_accuracy']:.3f} | {r['train_seconds']:.1f} | "
                     f"{r['wall_seconds']:.1f} |")
    (out / "summary.md").write_text("\n".join(table) + "\n")
    (out / "summary.json").write_text(json.dumps(rows, indent=2))
    from dask_ddp import plot

    for api in {r["api"] for r in rows}:
        run_dirs = [r["run_dir"] for r in rows if r["api"] == api]
        plot.main([*run_dirs, "-o", str(out / f"{api}.png")])
    logger.info("summary\n%s", "\n".join(table))
    logger.info("plots: %s; results and checkpoints under %s",
                ", ".join(str(out / f"{a}.png") for a in {r["api"] for r in rows}), out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
