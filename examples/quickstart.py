"""Quickstart: a small CNN trained with DDP on 2 ranks of a local Dask cluster.

What it shows
-------------
- :func:`dask_ddp.submit` starts one DDP rank per Dask worker; the process group is up
  when the training function starts.
- The C++ :class:`dask_ddp.data.Loader` decodes and augments an image folder, sharded per
  rank; :func:`dask_ddp.report` streams metrics to the client (``runs/first/metrics.jsonl``);
  :func:`dask_ddp.save_checkpoint` writes rank 0's weights off the training thread.
- The cluster is made under ``if __name__ == "__main__":`` (its worker processes are
  spawned and import this file) and closed by the ``with`` block.

How to run
----------
$ python examples/quickstart.py                      # a generated folder of 64 images
$ python examples/quickstart.py s3://my-bucket/images  # your images: <url>/<class>/<file>
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from dask.distributed import Client, LocalCluster
from PIL import Image

import dask_ddp
from dask_ddp.data import ImageFolder, Loader
from dask_ddp.data import transforms as T


def make_model() -> torch.nn.Module:
    """A small CNN for 2 classes."""
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, stride=2), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 2))


def train(data_url: str, epochs: int) -> float:
    """One rank's training: runs in each rank process, the process group already up."""
    info = dask_ddp.rank_info()                      # rank, world_size, local_rank, ...
    model = torch.nn.parallel.DistributedDataParallel(make_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.01 * info.world_size)
    loader = Loader(ImageFolder(data_url), batch_size=8,             # C++ decode + augment,
                    transform=T.Compose([T.RandomResizedCrop(32),    # sharded per rank
                                         T.RandomHorizontalFlip(), T.ToTensor()]))
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for images, labels in loader:
            loss = torch.nn.functional.cross_entropy(model(images), labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
            dask_ddp.report({"loss": loss})   # a tensor: no GPU sync; exactly once to the client
        dask_ddp.save_checkpoint(model.module.state_dict(), step=epoch)  # rank 0, async
    return loss.item()


def make_images(root: Path, per_class: int = 32) -> str:
    """A class folder of reddish and bluish 48x48 PNGs under ``root``; its URL."""
    rng = np.random.default_rng(0)
    for label, channel in (("red", 0), ("blue", 2)):
        (root / label).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            pixels = rng.integers(0, 96, size=(48, 48, 3), dtype=np.uint8)
            pixels[..., channel] += 128
            Image.fromarray(pixels).save(root / label / f"{i:03d}.png")
    return str(root)


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        data_url = sys.argv[1] if len(sys.argv) > 1 else make_images(Path(tmp))
        with LocalCluster(n_workers=2, threads_per_worker=1) as cluster, \
                Client(cluster) as client:
            job = dask_ddp.submit(client, train, data_url, 3,
                                  output_dir="runs/first", storage="runs/first/ckpt")
            print(job.result())  # noqa: T201  one value per rank; metrics in runs/first/
