"""End-to-end training benchmark: the job users run, under each launcher and data pipeline.

2 ranks (gloo, CPU) train a small CNN, cheap enough that data loading matters as it does on
a GPU, for 2 epochs over ~1,000 real JPEG photos (the bench_loader workload: sides
300-640 px, 10 classes), RandomResizedCrop(224) + flip + normalize, batch 32 per rank, in
one run on the same cores:

1. dask-ddp ``submit`` + dask-ddp ``Loader`` (decode threads: the rank's share of the host);
2. dask-ddp ``submit`` + torchvision ``ImageFolder`` + ``DataLoader(num_workers=1)`` +
   ``DistributedSampler``;
3. torchrun + the same torchvision pipeline (the baseline);
4. Ray Train ``TorchTrainer`` + the same torchvision pipeline (skipped with a note when
   ``ray[train]`` is not installed: ``make bench-deps``);
5. the model's ceiling: dask-ddp ``submit`` + the same number of in-memory batches, no
   loading at all (what any pipeline could reach on these cores).

torchrun and Ray run from the environment captured before ``distributed`` is imported
(:mod:`benchenv`). The figure is training throughput: images all ranks consumed / wall time
from the first step's barrier to the last one (data loader start-up included, launch not);
the whole call's wall time is printed beside it. Configurations are interleaved per round.

Targets: (2) within 3% of (3), the launcher adds nothing; (1) >= 3x (3).

Usage::

    PYTHONPATH=src .venv/bin/python benchmarks/bench_train.py --data /tmp/bench_images [--rounds 3]
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import time
from typing import Any

import benchenv  # first: captures the environment before distributed is imported
import peers

logger = logging.getLogger("bench_train")

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
CONFIGS = {
    "loader": "dask-ddp submit + dask-ddp Loader",
    "dask-tv": "dask-ddp submit + torchvision DataLoader(num_workers=1)",
    "torchrun": "torchrun + torchvision DataLoader(num_workers=1) (baseline)",
    "ray": "Ray Train TorchTrainer + torchvision DataLoader(num_workers=1)",
    "compute": "dask-ddp submit + in-memory batches, no loading (the model's ceiling)",
}


def make_model() -> Any:
    """A small CNN for 224 px input: ~11 M multiply-adds per image forward."""
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(3, 16, 5, stride=4, padding=2), nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))


def _batches(pipeline: str, root: str, batch: int, seed: int) -> tuple[Any, Any, Any]:
    """(iterable, set_epoch, close) of the rank's data pipeline."""
    if pipeline == "compute":  # the same number of batches, made once: no loading at all
        import torch

        n = len([f for _, _, fs in os.walk(root) for f in fs]) // 2  # this rank's half
        x, y = torch.randn(batch, 3, 224, 224), torch.randint(0, 10, (batch,))
        return [(x, y)] * (-(-n // batch)), lambda epoch: None, lambda: None
    if pipeline == "loader":
        from dask_ddp.data import ImageFolder, Loader
        from dask_ddp.data import transforms as T

        loader = Loader(ImageFolder(root), batch_size=batch, seed=seed, transform=T.Compose([
            T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
            T.Normalize(MEAN, STD)]))
        return loader, loader.set_epoch, loader.close
    from torch.utils.data import DataLoader, DistributedSampler
    from torchvision import datasets
    from torchvision import transforms as tv

    ds = datasets.ImageFolder(root, transform=tv.Compose([
        tv.RandomResizedCrop(224), tv.RandomHorizontalFlip(), tv.ToTensor(),
        tv.Normalize(MEAN, STD)]))
    sampler = DistributedSampler(ds, shuffle=True, seed=seed)
    return (DataLoader(ds, batch_size=batch, sampler=sampler, num_workers=1),
            sampler.set_epoch, lambda: None)


def train(pipeline: str, root: str, epochs: int, batch: int, seed: int = 0) -> dict[str, Any]:
    """Rank side: DDP training of :func:`make_model`; returns images, seconds and env."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(seed)
    model = DDP(make_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    batches, set_epoch, close = _batches(pipeline, root, batch, seed)
    images, loss = 0, float("nan")
    dist.barrier()
    t0 = time.perf_counter()
    try:
        for epoch in range(epochs):
            set_epoch(epoch)
            for x, y in batches:
                out = torch.nn.functional.cross_entropy(model(x), y)
                opt.zero_grad()
                out.backward()
                opt.step()
                images += int(x.shape[0])
                loss = float(out.item())
        dist.barrier()
        seconds = time.perf_counter() - t0
    finally:
        close()
    return {"images": images, "seconds": seconds, "loss": loss, "env": dict(os.environ),
            "torch_threads": torch.get_num_threads(),
            "loader_threads": getattr(batches, "num_threads", None)}


def _summary(values: list[dict[str, Any]], t0: float) -> dict[str, Any]:
    seconds = max(v["seconds"] for v in values)
    return {"rate": sum(v["images"] for v in values) / seconds, "wall": time.time() - t0,
            "env": values[0]["env"], "loss": [round(v["loss"], 3) for v in values],
            "torch_threads": values[0]["torch_threads"],
            "loader_threads": values[0]["loader_threads"]}


def run_config(name: str, client: Any, root: str, epochs: int, batch: int) -> dict[str, Any]:
    if name in ("loader", "dask-tv", "compute"):
        import dask_ddp

        t0 = time.time()
        pipeline = {"loader": "loader", "dask-tv": "torchvision"}.get(name, name)
        job = dask_ddp.submit(client, train, pipeline, root, epochs, batch, n_workers=2,
                              progress=False)
        return _summary(job.result(), t0)
    run = peers.run_torchrun if name == "torchrun" else peers.run_ray
    t0, values = run("bench_train:train", ["torchvision", root, epochs, batch])
    return _summary(values, t0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=os.path.join(os.environ.get("TMPDIR", "/tmp"),
                                                   "bench_images"))
    p.add_argument("--n", type=int, default=1000, help="images (made once into --data)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--no-ray", action="store_true")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from bench_loader import make_dataset

    if not os.path.isdir(args.data) or not os.listdir(args.data):
        logger.info("writing %d JPEGs into %s", args.n, args.data)
        make_dataset(args.data, args.n)
    names = peers.with_ray(["torchrun", "dask-tv", "loader", "compute"], args.no_ray)
    from distributed import Client, LocalCluster

    logging.getLogger("distributed").setLevel(logging.WARNING)
    results: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    logger.info("start: %s", benchenv.load_average())
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        for r in range(args.rounds):
            for name in names:
                res = run_config(name, client, args.data, args.epochs, args.batch)
                results[name].append(res)
                logger.info("round %d %-8s %7.1f images/s (call %.1f s; torch threads %s, "
                            "loader threads %s; final losses %s) %s", r, name, res["rate"],
                            res["wall"], res["torch_threads"], res["loader_threads"],
                            res["loss"], benchenv.load_average())
    benchenv.log_env_differences(logger, "torchrun", results["torchrun"][0]["env"],
                                 "dask-ddp", results["dask-tv"][0]["env"])
    if "ray" in results:
        benchenv.log_env_differences(logger, "torchrun", results["torchrun"][0]["env"],
                                     "Ray Train", results["ray"][0]["env"])
    base = statistics.median(x["rate"] for x in results["torchrun"])
    logger.info("training throughput, median of %d rounds (%s):", args.rounds,
                benchenv.load_average())
    for name in names:
        rate = statistics.median(x["rate"] for x in results[name])
        wall = statistics.median(x["wall"] for x in results[name])
        logger.info("  %-62s %7.1f images/s  %.3fx torchrun  (whole call %.1f s)",
                    CONFIGS[name], rate, rate / base, wall)
    ceiling = statistics.median(x["rate"] for x in results["compute"])
    loader = statistics.median(x["rate"] for x in results["loader"])
    logger.info("the Loader runs at %.2f of the no-loading ceiling (torchrun + torchvision "
                "at %.2f); the most any pipeline could be is %.2fx torchrun", loader / ceiling,
                base / ceiling, ceiling / base)
    logger.info("targets: dask-ddp + torchvision within 3% of torchrun (>= 0.97x); "
                "dask-ddp + Loader >= 3x torchrun")


if __name__ == "__main__":
    main()
