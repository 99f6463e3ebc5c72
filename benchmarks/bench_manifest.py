"""Manifest datasets: the cost of reading an ImageNet-size manifest, and Loader parity.

Every figure comes from the same run:

1. reading a 1,281,167-row ImageNet-like train list (``synset/synset_N.JPEG,synset``,
   1,000 classes) with ``ImageList.from_csv`` against the floor: ``csv.reader`` into two
   lists plus a sorted class index, nothing checked (baseline);
2. the pickled size of that dataset (what a spawned DataLoader worker receives) against
   the same object pickled with its ``samples`` list;
3. Loader images/s over the same JPEGs as an ``ImageFolder`` (baseline) and as an
   ``ImageList`` from a manifest: the same engine path, so the ratio should be ~1.0.

Run:  python benchmarks/bench_manifest.py [--rows 1281167] [--n 512]
"""

from __future__ import annotations

import argparse
import csv
import io
import logging
import os
import pickle
import statistics
import sys
import tempfile
import time

import benchenv  # first: the clean environment, before distributed is imported

from dask_ddp.data import ImageFolder, ImageList, Loader

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_loader import epoch_rate, make_dataset, our_transform  # noqa: E402

logger = logging.getLogger("bench_manifest")


def write_manifest(path: str, rows: int, classes: int = 1000) -> None:
    per = -(-rows // classes)
    with open(path, "w") as f:
        f.write("path,label\n")
        for i in range(rows):
            syn = f"n{1440764 + (i // per) * 997:08d}"
            f.write(f"{syn}/{syn}_{i}.JPEG,{syn}\n")


def floor_read(path: str) -> tuple[list[str], list[int]]:
    """The least a reader can do: split the CSV, map names to sorted indices."""
    with open(path, newline="") as f:
        reader = csv.reader(f)
        next(reader)
        keys, names = [], []
        for key, name in reader:
            keys.append(key)
            names.append(name)
    index = {c: i for i, c in enumerate(sorted(set(names)))}
    return keys, [index[n] for n in names]


def best_of(n: int, fn: object) -> float:
    assert callable(fn)
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=1_281_167, help="manifest rows (ImageNet train)")
    p.add_argument("--n", type=int, default=512, help="JPEGs for the Loader comparison")
    p.add_argument("--epochs", type=int, default=3)
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    benchenv.log_load_around_run(logger)
    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as tmp:
        manifest = os.path.join(tmp, "train.csv")
        write_manifest(manifest, args.rows)
        floor = best_of(3, lambda: floor_read(manifest))
        ours = best_of(3, lambda: ImageList.from_csv(manifest))
        logger.info(
            "manifest, %d rows (%.1f MB): csv.reader floor %.2f s, ImageList.from_csv %.2f s "
            "(%.2fx the floor; %.2f us/row)",
            args.rows, os.path.getsize(manifest) / 1e6, floor, ours, ours / floor,
            ours / args.rows * 1e6,
        )  # fmt: skip
        ds = ImageList.from_csv(manifest)
        slim = len(pickle.dumps(ds))
        buf = io.BytesIO()
        pickle.dump(ds.__dict__ | {"_store": None}, buf)
        logger.info(
            "pickled: %.1f MB (samples rebuilt on load) vs %.1f MB with samples (%.2fx)",
            slim / 1e6, buf.tell() / 1e6, slim / buf.tell(),
        )  # fmt: skip
        del ds

        images = os.path.join(tmp, "images")
        keys = make_dataset(images, args.n)
        with open(os.path.join(images, "train.csv"), "w") as f:
            f.write("path,label\n" + "".join(f"{k},{k.split('/')[0]}\n" for k in keys))
        folder = Loader(ImageFolder(images), 64, transform=our_transform(), num_threads=cores)
        listed = Loader(
            ImageList.from_csv(os.path.join(images, "train.csv")),
            64,
            transform=our_transform(),
            num_threads=cores,
        )
        epoch_rate(folder)  # warm the page cache and the pools
        epoch_rate(listed)
        a, b = [], []
        for epoch in range(args.epochs):  # interleaved, so drift hits both
            folder.set_epoch(epoch)
            listed.set_epoch(epoch)
            a.append(epoch_rate(folder))
            b.append(epoch_rate(listed))
        fa, fb = statistics.median(a), statistics.median(b)
        logger.info(
            "Loader, %d JPEGs, %d threads: ImageFolder %.0f img/s, ImageList from a manifest "
            "%.0f img/s (%.2fx)",
            args.n, cores, fa, fb, fb / fa,
        )  # fmt: skip
        folder.close()
        listed.close()


if __name__ == "__main__":
    main()
