"""The training loop's GPU path at full size, where a race or a hidden sync can show.

- In a real rank (``dask_ddp.submit`` on a LocalCluster of one worker, the bundle's Dask on
  the GPU machine), a ``Loader(device="cuda")`` + bf16 step + ``report(loss)`` loop over
  224-pixel batches of 128: the middle batches of each epoch run under
  ``torch.cuda.set_sync_debug_mode("error")`` (any sync torch knows of raises), and once
  with a second of GPU sleep queued ahead, after which the loop must have gone on without
  the GPU (so neither the stage's event waits nor ``report()`` hold the host); every
  reported loss reaches the client.
- A slow consumer (the step's stream sleeps after each batch) over 224-pixel batches of 128
  for several epochs: every batch equals the CPU decode of the same Loader seed (a
  per-image digest computed on the GPU, read once per epoch, not per step) and
  ``torch.cuda.memory_allocated()`` is the same after each epoch.

Each runs on the CPU too (``device="cpu"``, small sizes, no GPU sleep), so ``make test``
proves the plumbing; the GPU forms are marked ``gpu`` (``tests/conftest.py`` skips them
without CUDA).
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch

from cluster_util import client_fixture
from images import file_putter, write_folder

client = client_fixture(1)

CUDA = torch.cuda.is_available()
#: Batches of a GPU epoch and their size, at 224 pixels; small on the CPU.
GPU_SIZES = {"batch": 128, "batches": 6, "size": 224}
CPU_SIZES = {"batch": 8, "batches": 4, "size": 32}
#: GPU cycles of the queued sleep (about 1.5 s at 2 GHz) and of a slow consumer's step.
LONG_SLEEP = 3_000_000_000
SLOW_STEP = 30_000_000
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Enough 320x240 JPEGs in 8 classes for an epoch of ``batches`` batches (a class a
    thread: PIL's encoder runs without the GIL)."""
    root = tmp_path_factory.mktemp("loop-photos")
    sizes = GPU_SIZES if CUDA else CPU_SIZES
    per_class = -(-sizes["batch"] * sizes["batches"] // 8)
    put = file_putter(str(root))

    def write(c: int) -> None:
        write_folder(put, (f"c{c}",), per_class, sizes=((320, 240), (240, 320)),
                     seed=c * per_class)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(write, range(8)))
    return root


# ---- a real rank: no sync in the middle of an epoch -------------------------------------


def training_loop(folder: str, device: str, batch: int, size: int, epochs: int) -> dict[str, Any]:
    """A rank's loop: ``Loader(device=)``, a bf16 conv step, ``report(loss)``. On CUDA the
    middle batches of every epoch run with syncs as errors, and in epoch 0 a long GPU sleep
    is queued ahead of three steps that must finish on the host before the GPU does."""
    import time

    import torch
    import torch.nn.functional as F
    from torch import nn

    import dask_ddp
    from dask_ddp.data import ImageFolder, Loader
    from dask_ddp.data import transforms as T

    on_gpu = torch.device(device).type == "cuda"
    loader = Loader(ImageFolder(folder), batch, drop_last=True, device=device,
                    channels_last=True, seed=1,
                    transform=T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(),
                                         T.ToTensor(), T.Normalize(MEAN, STD)]))
    dev = loader.device
    assert dev is not None and dev.type == torch.device(device).type, dev
    model = nn.Sequential(nn.Conv2d(3, 32, 3, stride=2), nn.ReLU(), nn.Conv2d(32, 64, 3, stride=2),
                          nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 8))
    model = model.to(dev).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, foreach=True)
    n = len(loader)
    assert n >= 4, f"{n} batches an epoch: the loop needs a middle"
    ran_ahead: float | None = None
    t0 = 0.0
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for i, (x, y) in enumerate(loader):
            assert x.device == dev and x.is_contiguous(memory_format=torch.channels_last)
            if on_gpu and i == 1:
                # From the step of batch 1 to the step of batch n - 2, the next() calls
                # between them included: the first batch (cuDNN's choice, the allocator's
                # first blocks) and the end of the epoch (its flush of pending records
                # waits by design) stay outside.
                torch.cuda.set_sync_debug_mode("error")
            if on_gpu and epoch == 0 and i == 1:
                torch.cuda._sleep(LONG_SLEEP)
                t0 = time.perf_counter()
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=on_gpu):
                loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            dask_ddp.report({"loss": loss.detach(), "epoch": epoch})
            if on_gpu and epoch == 0 and i == 3:
                # Three steps and two batches later the sleep still runs: nothing waited.
                if torch.cuda.current_stream().query():
                    raise AssertionError("the GPU finished its sleep before the host ran three "
                                         "steps past it: something in the loop waited for it")
                ran_ahead = time.perf_counter() - t0
            if on_gpu and i == n - 2:
                torch.cuda.set_sync_debug_mode("default")
    loader.close()
    return {"batches": n, "epochs": epochs, "ran_ahead_s": ran_ahead}


def _check_job(client: Any, folder: Path, device: str, sizes: dict[str, int]) -> None:
    import dask_ddp

    epochs = 2
    job = dask_ddp.submit(client, training_loop, str(folder), device, sizes["batch"],
                          sizes["size"], epochs, progress=False, name=f"loop-{device}")
    records = list(job.metrics())
    [out] = job.result()
    assert out["batches"] == sizes["batches"], out
    losses = [r["loss"] for r in records]
    assert len(losses) == epochs * out["batches"], records[:3]
    assert [r["step"] for r in records] == list(range(len(losses)))
    assert all(math.isfinite(v) for v in losses), losses
    if device == "cuda":
        assert out["ran_ahead_s"] is not None


@pytest.mark.gpu
@pytest.mark.timeout(300)
def test_a_loader_and_report_loop_never_syncs_in_a_rank(client: Any, photos: Path) -> None:
    _check_job(client, photos, "cuda", GPU_SIZES)


@pytest.mark.timeout(300)
def test_the_loop_runs_in_a_rank_on_the_cpu(client: Any, photos: Path) -> None:
    _check_job(client, photos, "cpu", CPU_SIZES)


# ---- a slow consumer: intact values, flat memory ----------------------------------------


def _digests(x: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """One position-sensitive integer per image (exact on any device)."""
    return (x.reshape(x.shape[0], -1).to(torch.int64) * weights).sum(dim=1)


def _slow_consumer(folder: Path, device: str, sizes: dict[str, int]) -> list[int]:
    from dask_ddp.data import ImageFolder, Loader
    from dask_ddp.data import transforms as T

    ds = ImageFolder(str(folder))
    opts: dict[str, Any] = {
        "transform": T.Compose([T.RandomResizedCrop(sizes["size"]), T.RandomHorizontalFlip(),
                                T.PILToTensor()]),
        "seed": 3, "drop_last": True, "prefetch": 2}
    host = Loader(ds, sizes["batch"], **opts)
    staged = Loader(ds, sizes["batch"], device=device, **opts)
    on_gpu = device == "cuda"
    pixels = 3 * sizes["size"] ** 2
    weights = (torch.arange(pixels, dtype=torch.int64) % 251 + 1).to(device)
    memory = []
    try:
        for epoch in range(4):
            host.set_epoch(epoch)
            staged.set_epoch(epoch)
            got, labels = [], []
            for x, y in staged:
                assert x.device.type == device and x.dtype == torch.uint8
                if on_gpu:  # a slow step on the consumer's stream, then the batch is read
                    torch.cuda._sleep(SLOW_STEP)
                got.append(_digests(x, weights))
                labels.append(y)
            del x, y
            if on_gpu:
                torch.cuda.synchronize()  # once an epoch
            want = [(_digests(hx, weights.cpu()), hy) for hx, hy in host]
            assert len(got) == len(want) == sizes["batches"]
            for b, (g, gy, (w, wy)) in enumerate(zip(got, labels, want, strict=True)):
                assert torch.equal(g.cpu(), w), f"epoch {epoch} batch {b}: images differ"
                assert torch.equal(gy.cpu(), wy), f"epoch {epoch} batch {b}: labels differ"
            del got, labels
            if on_gpu:
                memory.append(torch.cuda.memory_allocated())
    finally:
        host.close()
        staged.close()
    return memory


@pytest.mark.gpu
@pytest.mark.timeout(300)
def test_a_slow_consumer_at_224_pixels_sees_every_batch_intact_and_memory_flat(
    photos: Path,
) -> None:
    memory = _slow_consumer(photos, "cuda", GPU_SIZES)
    assert len(set(memory)) == 1, f"memory_allocated after each epoch: {memory}"


def test_the_slow_consumer_check_runs_on_the_cpu(photos: Path) -> None:
    assert _slow_consumer(photos, "cpu", CPU_SIZES) == []
