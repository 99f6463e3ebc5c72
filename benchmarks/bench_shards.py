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

With ``--ranks N`` (N > 1) the JPEG workload runs on N ranks at once instead, each a process
of a gloo group (a barrier starts and ends each epoch), both sides spawned from the clean
environment, every rank with the same number of batches (exact balance):

6. webdataset, its multi-rank recipe: ``resampled=True`` shards, shuffle(1000), PIL decode,
   torchvision transforms, WebLoader(num_workers=--workers) per rank, ``with_epoch`` for
   equal batch counts                                              (baseline)
7. dask_ddp TarShards + Loader(rank, world_size), the host's cores split between the ranks
                                                                   (target >= 5x 6)

An epoch's rate is the images of every rank over the slowest rank's time.

Run:  python benchmarks/bench_shards.py [--n 1000] [--rounds 3] [--data DIR] [--npy-shape 128x128]
      python benchmarks/bench_shards.py --ranks 2   (then --ranks 3)
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


def rank_main(side: str, pattern: str, counts: str, rounds: int, workers: int) -> None:
    """One rank of a multi-rank run (RANK, WORLD_SIZE, MASTER_ADDR/PORT in the
    environment): one JSON line per epoch (the warm-up first) of its images and seconds,
    each epoch started and ended by a barrier of the group."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    n = sum(int(c) for c in counts.split(","))
    batches = -(-n // (BATCH * world))  # each rank's share, in whole batches
    if side == "webdataset":
        import webdataset as wds
        from bench_loader import tv_transform

        ds = (
            wds.WebDataset(pattern, resampled=True, shardshuffle=True,
                           nodesplitter=wds.split_by_node, empty_check=False)
            .shuffle(1000)
            .decode("pil")
            .to_tuple("jpg", "cls")
            .map_tuple(tv_transform(), identity)
        )
        loader: Any = wds.WebLoader(ds, batch_size=BATCH, num_workers=workers,
                                    persistent_workers=True).with_epoch(batches)
        torch.manual_seed(rank)
    else:
        from bench_loader import our_transform

        from dask_ddp.data import Loader, TarShards

        cores = len(os.sched_getaffinity(0))
        loader = Loader(TarShards(pattern, counts=[int(c) for c in counts.split(",")]), BATCH,
                        transform=our_transform(), num_threads=max(1, cores // world),
                        rank=rank, world_size=world)
    for epoch in range(rounds + 1):
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(epoch)
        dist.barrier()
        t0 = time.perf_counter()
        images = sum(int(x.shape[0]) for x, _ in loader)
        spent = time.perf_counter() - t0
        getattr(loader, "_cancel_early", lambda: None)()  # each epoch its own work (bench_loader)
        dist.barrier()
        sys.stdout.write(json.dumps({"epoch": epoch, "images": images, "s": spent}) + "\n")
        sys.stdout.flush()
    dist.destroy_process_group()


def spawn_ranks(side: str, pattern: str, counts: list[int], ranks: int, rounds: int,
                workers: int) -> list[float]:
    """Images/s of each timed epoch of ``ranks`` ranks of ``side`` run at once (spawned from
    the clean environment): every rank's images over the slowest rank's seconds."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    procs = []
    for r in range(ranks):
        env = benchenv.clean_env(
            PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT / "benchmarks")]),
            RANK=str(r), WORLD_SIZE=str(ranks), LOCAL_RANK=str(r),
            LOCAL_WORLD_SIZE=str(ranks), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen(
            [sys.executable, __file__, "--rank-of", side, pattern, "--counts",
             ",".join(map(str, counts)), "--rounds", str(rounds), "--workers", str(workers)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    epochs: list[list[dict[str, Any]]] = []
    for r, proc in enumerate(procs):
        try:
            out, err = proc.communicate(timeout=1800)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise RuntimeError(f"{side} rank {r} of {ranks} did not finish in 30 min") from None
        if proc.returncode != 0:
            for p in procs:
                p.kill()
            raise RuntimeError(f"{side} rank {r} of {ranks} failed:\n{err[-3000:]}")
        epochs.append([json.loads(line) for line in out.splitlines() if line.startswith("{")])
    logger.info("%s on %d ranks: images per rank and epoch %s", side, ranks,
                [[e["images"] for e in per] for per in epochs])
    return [sum(per[k]["images"] for per in epochs) / max(per[k]["s"] for per in epochs)
            for k in range(1, rounds + 1)]


def data_root(data: str | None) -> tuple[tempfile.TemporaryDirectory[str] | None, Path]:
    """The folder of the generated data: ``data``, or a temporary one (returned to clean)."""
    if data is not None:
        return None, Path(data)
    tmp = tempfile.TemporaryDirectory(prefix="bench_shards_")
    return tmp, Path(tmp.name)


def multi_rank(args: argparse.Namespace) -> None:
    """The JPEG workload on ``args.ranks`` ranks: webdataset's recipe against ours."""
    from storage_servers import start_nginx

    tmp, root = data_root(args.data)
    counts, n = prepare(root, args.n)
    logger.info("%d images in %d shards, %d ranks, %d cores, batch %d; %s", n, len(counts),
                args.ranks, os.cpu_count() or 1, BATCH, benchenv.load_average())
    with start_nginx(root) as nginx:
        pattern = (f"http://127.0.0.1:{nginx.port}/shards/"
                   f"n{n}-shard-{{000000..{len(counts) - 1:06d}}}.tar")
        web = spawn_ranks("webdataset", pattern, counts, args.ranks, args.rounds, args.workers)
        ours = spawn_ranks("ours", pattern, counts, args.ranks, args.rounds, args.workers)
    logger.info("best of %d epochs on %d ranks: webdataset %.1f images/s, TarShards %.1f "
                "images/s: %.2fx (target >= 5); %s", args.rounds, args.ranks, max(web),
                max(ours), max(ours) / max(web), benchenv.load_average())
    print(json.dumps({"ranks": args.ranks, "webdataset": web, "ours": ours,  # noqa: T201
                      "ratio": max(ours) / max(web), "load": benchenv.load_average()}))
    if tmp is not None:
        tmp.cleanup()


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
        getattr(loader, "_cancel_early", lambda: None)()  # each epoch its own work (bench_loader)
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
    ap.add_argument("--ranks", type=int, default=1,
                    help="ranks at once (> 1: the multi-rank JPEG comparison only)")
    ap.add_argument("--webdataset-baseline", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--webdataset-npy-baseline", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--rank-of", nargs=2, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--counts", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank_of:
        rank_main(args.rank_of[0], args.rank_of[1], args.counts, args.rounds, args.workers)
        return
    if args.webdataset_baseline:
        webdataset_baseline(args.webdataset_baseline, args.rounds, args.workers)
        return
    if args.webdataset_npy_baseline:
        webdataset_npy_baseline(args.webdataset_npy_baseline, args.rounds, args.workers)
        return
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logger.setLevel(logging.INFO)
    if args.ranks > 1:
        multi_rank(args)
        return

    from bench_loader import our_transform

    from dask_ddp.data import ImageFolder, Loader, TarShards
    from storage_servers import start_nginx

    cores = os.cpu_count() or 1
    tmp, root = data_root(args.data)
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
