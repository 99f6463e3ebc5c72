"""Tar shards over HTTP: TarShards + Loader against webdataset and our per-object reads.

Workload: the JPEGs of bench_loader.py (sides 300-640 px, q90), N images written by
write_shards into 10 tar shards, served with the same images as single objects by nginx
on loopback. RandomResizedCrop(224) + RandomHorizontalFlip + ToTensor + Normalize,
batch 64. Every figure comes from the same run:

1. webdataset.WebDataset (shard shuffle, shuffle(1000), PIL decode) + torchvision
   transforms + WebLoader(num_workers=2), spawned from the clean environment (baseline)
2. dask_ddp TarShards + Loader over http://, all cores            (target >= 5x 1)
3. dask_ddp ImageFolder + Loader over http://, one GET per image  (2 >= 1x 3, with
   ~100x fewer requests)

Then arrays: N samples of a float32 .npy (--npy-shape, default 128x128: 64 KiB) and a
.cls, written by write_shards into 10 shards on the same server:

4. webdataset.WebDataset (shard shuffle, shuffle(1000), its own .npy decoding) +
   WebLoader(num_workers=2) batching to tensors, spawned from the clean environment
5. dask_ddp TarShards(fields=("npy", "cls")) + Loader: arrays parsed and stacked by the
   engine                                                          (reported: 5 / 4)

Each runs a warm-up epoch (not timed) then --rounds epochs; the best epoch is reported,
with the HTTP requests nginx logged per epoch and the load average.

Run:  python benchmarks/bench_shards.py [--n 1000] [--rounds 3] [--data DIR] [--npy-shape 128x128]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import benchenv  # noqa: F401 - first: the clean environment, before distributed

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the nginx helper shared with the tests

logger = logging.getLogger("bench_shards")

BATCH = 64
SHARDS = 10


def identity(x: Any) -> Any:
    return x


def webdataset_baseline(urls: str, rounds: int, workers: int) -> None:
    """The baseline, in its own process: prints one JSON line of images/s per epoch."""
    import torch
    import webdataset as wds
    from bench_loader import tv_transform

    ds = (
        wds.WebDataset(urls, shardshuffle=SHARDS, empty_check=False)
        .shuffle(1000)
        .decode("pil")
        .to_tuple("jpg", "cls")
        .map_tuple(tv_transform(), identity)
    )
    loader = wds.WebLoader(ds, batch_size=BATCH, num_workers=workers, persistent_workers=True)
    torch.manual_seed(0)
    _print_epoch_rates(loader, rounds)


def _print_epoch_rates(loader: Any, rounds: int) -> None:
    """One JSON line of samples/s per epoch of ``loader`` (the warm-up epoch first)."""
    for epoch in range(rounds + 1):
        t0 = time.perf_counter()
        n = sum(int(x.shape[0]) for x, _ in loader)
        rate = n / (time.perf_counter() - t0)
        sys.stdout.write(json.dumps({"epoch": epoch, "images": n, "rate": rate}) + "\n")
        sys.stdout.flush()


def webdataset_npy_baseline(urls: str, rounds: int, workers: int) -> None:
    """The .npy baseline, in its own process: prints one JSON line of samples/s per epoch."""
    import webdataset as wds

    ds = (
        wds.WebDataset(urls, shardshuffle=SHARDS, empty_check=False)
        .shuffle(1000)
        .decode()
        .to_tuple("npy", "cls")
    )
    loader = wds.WebLoader(ds, batch_size=BATCH, num_workers=workers, persistent_workers=True)
    _print_epoch_rates(loader, rounds)


def prepare_npy(root: Path, n: int, shape: tuple[int, ...]) -> list[int]:
    """N float32 arrays with a label each, written by write_shards into SHARDS shards."""
    import numpy as np

    from dask_ddp.data import write_shards

    rng = np.random.default_rng(0)
    samples = [
        {"npy": rng.standard_normal(shape, dtype=np.float32), "cls": i % 10} for i in range(n)
    ]
    shards = write_shards(
        samples, str(root / "npy" / f"n{n}-shard-{{:06d}}.tar"), samples_per_shard=-(-n // SHARDS)
    )
    return shards.counts


def spawn_baseline(mode: str, pattern: str, rounds: int, workers: int) -> list[float]:
    """Rates per timed epoch of a webdataset baseline run in the clean environment."""
    proc = subprocess.run(
        [
            sys.executable,
            __file__,
            mode,
            pattern,
            "--rounds",
            str(rounds),
            "--workers",
            str(workers),
        ],
        env=benchenv.clean_env(
            PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT / "benchmarks")])
        ),
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"webdataset baseline ({mode}) failed:\n{proc.stderr[-3000:]}")
    epochs = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return [e["rate"] for e in epochs[1:]]


def array_epochs(loader: Any, rounds: int) -> list[float]:
    """Samples/s of each timed epoch (after a warm-up one) of a fields Loader."""
    rates = []
    for epoch in range(rounds + 1):
        loader.set_epoch(epoch)
        t0 = time.perf_counter()
        n = sum(int(batch[0].shape[0]) for batch in loader)
        if epoch:
            rates.append(n / (time.perf_counter() - t0))
    return rates


def requests_logged(log: Path) -> int:
    try:
        with open(log, "rb") as f:
            return sum(1 for _ in f)
    except FileNotFoundError:
        return 0


def prepare(root: Path, n: int) -> tuple[list[int], int]:
    """Images under root/images (with an _index.txt listing for http) and their shards
    under root/shards; returns (samples per shard, images)."""
    from bench_loader import make_dataset

    from dask_ddp.data import ImageList, write_shards

    images = root / "images"
    keys = (
        sorted(str(p.relative_to(images)) for p in images.rglob("*.jpg")) if images.exists() else []
    )
    if len(keys) < n:
        logger.info("writing %d JPEGs to %s", n, images)
        keys = make_dataset(str(images), n)
    keys = keys[:n]
    (images / "_index.txt").write_text(
        "".join(f"{k}\t{(images / k).stat().st_size}\n" for k in keys)
    )
    labels = [int(k.split("/")[0].split("_")[1]) for k in keys]
    per_shard = -(-n // SHARDS)
    shards = write_shards(
        ImageList(str(images), keys, labels),
        str(root / "shards" / f"n{n}-shard-{{:06d}}.tar"),
        samples_per_shard=per_shard,
    )
    return shards.counts, n


def our_epochs(loader: Any, rounds: int) -> list[float]:
    from bench_loader import loader_epoch

    loader_epoch(loader, 0)  # warm-up: connections, counts, buffers
    return [loader_epoch(loader, r + 1) for r in range(rounds)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--n", type=int, default=1000, help="images (default 1000)")
    ap.add_argument("--rounds", type=int, default=3, help="timed epochs; the best is reported")
    ap.add_argument("--workers", type=int, default=2, help="webdataset's WebLoader workers")
    ap.add_argument("--data", default=None, help="reuse/keep the generated images here")
    ap.add_argument("--npy-shape", default="128x128", help="each array's shape (float32)")
    ap.add_argument("--webdataset-baseline", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--webdataset-npy-baseline", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.webdataset_baseline:
        webdataset_baseline(args.webdataset_baseline, args.rounds, args.workers)
        return
    if args.webdataset_npy_baseline:
        webdataset_npy_baseline(args.webdataset_npy_baseline, args.rounds, args.workers)
        return
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logger.setLevel(logging.INFO)

    from bench_loader import our_transform

    from dask_ddp.data import ImageFolder, Loader, TarShards
    from storage_servers import start_nginx

    cores = os.cpu_count() or 1
    tmp = None
    if args.data is None:
        tmp = tempfile.TemporaryDirectory(prefix="bench_shards_")
        root = Path(tmp.name)
    else:
        root = Path(args.data)
    counts, n = prepare(root, args.n)
    npy_shape = tuple(int(d) for d in args.npy_shape.split("x"))
    npy_counts = prepare_npy(root, n, npy_shape)
    log = root / "access.log"
    log.unlink(missing_ok=True)
    logger.info(
        "%d images in %d shards, %d cores, batch %d; %s",
        n,
        len(counts),
        cores,
        BATCH,
        benchenv.load_average(),
    )
    with start_nginx(root, access_log=log) as nginx:
        url = f"http://127.0.0.1:{nginx.port}"
        pattern = f"{url}/shards/n{n}-shard-{{000000..{len(counts) - 1:06d}}}.tar"
        rates: dict[str, list[float]] = {}
        requests: dict[str, float] = {}

        before = requests_logged(log)
        rates["webdataset"] = spawn_baseline(
            "--webdataset-baseline", pattern, args.rounds, args.workers
        )
        requests["webdataset"] = (requests_logged(log) - before) / (args.rounds + 1)

        before = requests_logged(log)
        shards = Loader(
            TarShards(pattern, counts=counts), BATCH, transform=our_transform(), num_threads=cores
        )
        rates["TarShards"] = our_epochs(shards, args.rounds)
        requests["TarShards"] = (requests_logged(log) - before) / (args.rounds + 1)
        shards.close()

        before = requests_logged(log)
        folder = Loader(
            ImageFolder(f"{url}/images"), BATCH, transform=our_transform(), num_threads=cores
        )
        rates["ImageFolder"] = our_epochs(folder, args.rounds)
        requests["ImageFolder"] = (requests_logged(log) - before - 1) / (args.rounds + 1)
        folder.close()

        npy_pattern = f"{url}/npy/n{n}-shard-{{000000..{len(npy_counts) - 1:06d}}}.tar"
        rates["webdataset .npy"] = spawn_baseline(
            "--webdataset-npy-baseline", npy_pattern, args.rounds, args.workers
        )
        arrays = Loader(
            TarShards(npy_pattern, counts=npy_counts, fields=("npy", "cls")),
            BATCH,
            num_threads=cores,
        )
        rates["TarShards .npy"] = array_epochs(arrays, args.rounds)
        arrays.close()

    best = {k: max(v) for k, v in rates.items()}
    logger.info("best of %d epochs (images/s), HTTP requests per epoch:", args.rounds)
    for k, v in best.items():
        logger.info("  %-16s %8.1f samples/s  %8.1f requests/epoch", k, v, requests.get(k, 0.0))
    logger.info(
        "TarShards / webdataset(num_workers=%d) = %.2fx (target >= 5); TarShards / ImageFolder "
        "= %.2fx (target >= 1) with %.0fx fewer requests; %s",
        args.workers,
        best["TarShards"] / best["webdataset"],
        best["TarShards"] / best["ImageFolder"],
        requests["ImageFolder"] / max(requests["TarShards"], 1e-9),
        benchenv.load_average(),
    )
    logger.info(
        "TarShards .npy %s float32 / webdataset .npy decoding (num_workers=%d) = %.2fx",
        "x".join(map(str, npy_shape)),
        args.workers,
        best["TarShards .npy"] / best["webdataset .npy"],
    )
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
