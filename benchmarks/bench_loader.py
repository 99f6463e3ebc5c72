"""Image loader throughput: dask-ddp's C++ Loader against torchvision and the seed.

Workload: ImageNet-like JPEGs (sides 300-640 px, quality 90, photographic content
recropped from the photos scikit-image ships) in 10 class folders;
RandomResizedCrop(224) + RandomHorizontalFlip + ToTensor + Normalize; batch 64; all
cores. Every figure comes from the same run:

1. torchvision ImageFolder + torch DataLoader(num_workers=cores)     (baseline)
2. dask_ddp.data.Loader from local disk                               (target >= 5x 1)
   and its uint8 output (PILToTensor instead of ToTensor + Normalize: normalise on the
   GPU), row "ours_uint8"
3. libjpeg-turbo full-size decode only, all cores, bytes in memory    (2 should be >= 0.8x)
   (decode_throughput of the development module dask_ddp_bench: see bench_helpers)
4. NVIDIA DALI on the CPU (device_id=None, cores threads): readers.file ->
   decoders.image_random_crop -> resize -> crop_mirror_normalize       (target >= 3x 4)
   (optional: skipped with a note when nvidia-dali-cuda120 is not installed)
5. from a moto S3 server on loopback: the seed's S3ImageFolder (a boto3 client and a
   temp file per image, PIL) in a DataLoader vs Loader over s3://     (target >= 10x),
   and AWS's s3torchconnector (S3MapDataset + PIL + torchvision in a
   DataLoader(num_workers=cores); optional, skipped with a note when missing)
6. peak RSS of the Loader over 10 epochs, against prefetch x batch bytes + 64 MB.
7. from an S3 endpoint that is not the bottleneck (nginx on loopback serving the images
   as path-style /bucket/key files; it ignores the signature, every client signs): the
   Loader over an ImageList of s3:// keys against s3torchconnector (S3MapDataset of the
   same object URIs + PIL + torchvision, DataLoader(num_workers=cores))  (target >= 5x).
   nginx's own CPU is not counted; it shares the cores. moto (5.) serves ~170 objects/s
   to any client, so its rows measure moto.

Run (after ``make build``, which builds dask_ddp_bench into build/dev/bench):
      python benchmarks/bench_loader.py [--n 1000] [--s3-seed-n 256]
"""

from __future__ import annotations

import argparse
import gc
import importlib.machinery
import importlib.util
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

import benchenv  # noqa: F401 - first: the clean environment, before distributed
import numpy as np
import psutil
import torch
from PIL import Image

from dask_ddp.data import ImageFolder, ImageList, Loader
from dask_ddp.data import transforms as T

logger = logging.getLogger("bench_loader")
HERE = os.path.dirname(os.path.abspath(__file__))

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "immunohistochemistry", "hubble_deep_field")
BATCH = 64


def bench_helpers() -> ModuleType:
    """The benchmark helper module ``dask_ddp_bench`` (``decode_throughput``).

    ``make build`` builds it into the build tree (``build/dev/bench``; the environment
    variable ``DDP_BUILD_DIR`` names another build directory); no wheel ships it. Exits
    with a message saying to run ``make build`` when it is not there.
    """
    build = Path(os.environ.get("DDP_BUILD_DIR") or Path(HERE).parent / "build" / "dev")
    where = build / "bench"
    spec = importlib.machinery.PathFinder.find_spec("dask_ddp_bench", [str(where)])
    if spec is None or spec.loader is None:
        sys.exit(f"the benchmark helper module dask_ddp_bench is not in {where}: run `make build` "
                 "(or set DDP_BUILD_DIR to the build directory that has it)")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_dataset(root: str, n: int, classes: int = 10, seed: int = 0) -> list[str]:
    """Write n JPEGs (q90, sides 300-640) into `classes` folders; returns relative keys."""
    from skimage import data

    rng = np.random.default_rng(seed)
    photos = [np.asarray(getattr(data, p)())[..., :3] for p in PHOTOS]
    keys = []
    for i in range(n):
        src = photos[i % len(photos)]
        h, w = src.shape[:2]
        ch, cw = int(rng.integers(h // 3, h + 1)), int(rng.integers(w // 3, w + 1))
        top, left = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
        img = Image.fromarray(np.ascontiguousarray(src[top : top + ch, left : left + cw]))
        out_w, out_h = int(rng.integers(300, 641)), int(rng.integers(300, 641))
        img = img.resize((out_w, out_h), Image.Resampling.BILINEAR)
        if rng.random() < 0.5:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        key = f"class_{i % classes:02d}/img_{i:05d}.jpg"
        os.makedirs(os.path.join(root, os.path.dirname(key)), exist_ok=True)
        img.save(os.path.join(root, key), "JPEG", quality=90)
        keys.append(key)
    return keys


# Processes whose CPU time is not the loader's (the moto server).
EXCLUDE_PIDS: set[int] = set()


def cpu_seconds() -> float:
    """CPU time of this process (all threads) and its children (DataLoader workers)."""
    me = psutil.Process()
    total = sum(me.cpu_times()[:2])
    for child in me.children(recursive=True):
        if child.pid in EXCLUDE_PIDS:
            continue
        try:
            total += sum(child.cpu_times()[:2])
        except psutil.NoSuchProcess:
            pass
    return total


def epoch_rate(batches: Iterable[Any], cpu: list[float] | None = None) -> float:
    """Images/s (wall clock) of one pass over `batches`; appends CPU ms/image to `cpu`."""
    c0 = cpu_seconds()
    t0 = time.perf_counter()
    n = 0
    for images, _ in batches:
        n += int(images.shape[0])
    rate = n / (time.perf_counter() - t0)
    if cpu is not None:
        cpu.append((cpu_seconds() - c0) * 1e3 / n)
    return rate


def tv_transform() -> Any:
    from torchvision import transforms as tv

    return tv.Compose(
        [
            tv.RandomResizedCrop(224),
            tv.RandomHorizontalFlip(),
            tv.ToTensor(),
            tv.Normalize(MEAN, STD),
        ]
    )


def our_transform() -> T.Transform:
    return T.Compose(
        [T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)]
    )


def uint8_transform() -> T.Transform:
    return T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.PILToTensor()])


def dali_loader(root: str, cores: int) -> Any:
    """DALI's CPU pipeline for the same work, or None (with a note) if DALI is missing."""
    try:
        from nvidia.dali import fn, pipeline_def, types
        from nvidia.dali.plugin.base_iterator import LastBatchPolicy
        from nvidia.dali.plugin.pytorch import DALIGenericIterator
    except ImportError as e:
        logger.info("DALI row skipped: nvidia-dali-cuda120 is not installed (%s)", e)
        return None

    @pipeline_def(batch_size=BATCH, num_threads=cores, device_id=None, seed=0)  # type: ignore[misc]
    def pipe() -> Any:
        jpegs, labels = fn.readers.file(file_root=root, random_shuffle=True, name="reader")
        images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB)
        images = fn.resize(images, resize_x=224, resize_y=224)
        return fn.crop_mirror_normalize(
            images,
            dtype=types.FLOAT,
            output_layout="CHW",
            mean=[m * 255 for m in MEAN],
            std=[s * 255 for s in STD],
            mirror=fn.random.coin_flip(probability=0.5),
        ), labels

    p = pipe()
    p.build()
    # auto_reset: each `for` over the iterator is one epoch. DALI keeps prefetching across
    # the epoch boundary (prefetch_queue_depth batches, 2 by default), so an epoch of n
    # images starts with up to 2 x BATCH already done: with small --n this flatters DALI
    # (use the default 1000 images or more).
    return DALIGenericIterator(
        p, ["images", "labels"], reader_name="reader", auto_reset=True,
        last_batch_policy=LastBatchPolicy.PARTIAL,
    )


def dali_epoch(it: Any) -> Iterable[Any]:
    """One epoch of dali_loader's iterator as (images, labels) pairs."""
    return ((b[0]["images"], b[0]["labels"]) for b in it)


def torchvision_loader(root: str, cores: int) -> Any:
    import torchvision

    ds = torchvision.datasets.ImageFolder(root, transform=tv_transform())
    return torch.utils.data.DataLoader(
        ds, batch_size=BATCH, shuffle=True, num_workers=cores, persistent_workers=True
    )


def our_loader(url: str, cores: int, **kw: Any) -> Loader:
    return Loader(ImageFolder(url), BATCH, transform=our_transform(), num_threads=cores, **kw)


def loader_epoch(loader: Loader, epoch: int, cpu: list[float] | None = None) -> float:
    loader.set_epoch(epoch)
    rate = epoch_rate(loader, cpu)
    # The Loader starts decoding its next epoch when one ends (up to prefetch batches):
    # here that work would run while the other configurations are timed and be counted
    # in this one's next figure. Each figure is one epoch's own work: drop it.
    cancel = getattr(loader, "_cancel_early", None)
    if cancel is not None:
        cancel()
    return rate


def read_blobs(root: str, keys: list[str]) -> list[bytes]:
    blobs = []
    for k in keys:
        with open(os.path.join(root, k), "rb") as f:
            blobs.append(f.read())
    return blobs


def bench_local(
    root: str, keys: list[str], cores: int, rounds: int, helpers: ModuleType
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Every configuration once per round, interleaved, so that load from other processes
    on a shared machine hits them alike; callers report the best round of each. The
    decode ceiling comes from `helpers` (:func:`bench_helpers`)."""
    blobs = read_blobs(root, keys)
    loaders = {
        "ours": our_loader(root, cores),
        "ours_uint8": Loader(
            ImageFolder(root), BATCH, transform=uint8_transform(), num_threads=cores
        ),
        "ours_no_region": our_loader(root, cores, region_decode=False),
        "ours_no_scaled": our_loader(root, cores, scaled_decode=False),
        "ours_full_decode": our_loader(root, cores, region_decode=False, scaled_decode=False),
    }
    tv_dl = torchvision_loader(root, cores)
    epoch_rate(tv_dl)  # start the persistent workers (not timed)
    dali = dali_loader(root, cores)
    if dali is not None:
        epoch_rate(dali_epoch(dali))  # warm up (not timed)
    helpers.decode_throughput(blobs[:64], cores)
    names = ["ceiling", *loaders, "torchvision", *(["dali_cpu"] if dali is not None else [])]
    rates: dict[str, list[float]] = {k: [] for k in names}
    cpu: dict[str, list[float]] = {k: [] for k in names}
    for r in range(rounds):
        c0 = cpu_seconds()
        rates["ceiling"].append(float(helpers.decode_throughput(blobs, cores)))
        cpu["ceiling"].append((cpu_seconds() - c0) * 1e3 / len(blobs))
        for name, loader in loaders.items():
            rates[name].append(loader_epoch(loader, r, cpu[name]))
        rates["torchvision"].append(epoch_rate(tv_dl, cpu["torchvision"]))
        if dali is not None:
            rates["dali_cpu"].append(epoch_rate(dali_epoch(dali), cpu["dali_cpu"]))
        logger.info("round %d: %s", r, {k: round(v[-1], 1) for k, v in rates.items()})
    for loader in loaders.values():
        loader.close()
    del tv_dl, dali
    return rates, cpu


def bench_rss(root: str, cores: int, epochs: int = 10, prefetch: int = 4) -> dict[str, float]:
    """Peak RSS above the pre-loader level while iterating `epochs` epochs."""
    gc.collect()
    proc = psutil.Process()
    base = proc.memory_info().rss
    peak = [base]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], proc.memory_info().rss)
            time.sleep(0.01)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    loader = Loader(
        ImageFolder(root), BATCH, transform=our_transform(), num_threads=cores, prefetch=prefetch
    )
    after_epoch = []
    for e in range(epochs):
        loader.set_epoch(e)
        for _images, _labels in loader:
            pass
        after_epoch.append(proc.memory_info().rss)
    stop.set()
    t.join()
    loader.close()
    batch_bytes = BATCH * 3 * 224 * 224 * 4
    mib = 1 << 20
    return {
        "peak_over_base_mib": (peak[0] - base) / mib,
        "bound_mib": (prefetch * batch_bytes + 64 * mib) / mib,
        "epoch1_mib": (after_epoch[0] - base) / mib,
        "epoch10_mib": (after_epoch[-1] - base) / mib,
    }


# ---- S3 ---------------------------------------------------------------------------------


class SeedS3ImageFolder(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """The seed's S3ImageFolder (dask-pytorch-ddp data.py): a new boto3 client per item,
    download_fileobj into a temporary file, PIL decode, torchvision transform."""

    def __init__(self, bucket: str, prefix: str, keys: list[str], transform: Any) -> None:
        self.s3_bucket, self.s3_prefix = bucket, prefix
        self.all_files = [f"{prefix}/{k}" for k in keys]
        self.classes = sorted({k.split("/")[-2] for k in self.all_files})
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        self.transform = transform

    def __len__(self) -> int:
        return len(self.all_files)

    def __getitem__(self, idx: int) -> tuple[Any, int]:
        import boto3

        s3 = boto3.client("s3")
        path = self.all_files[idx]
        label = self.class_to_idx[path.split("/")[-2]]
        with tempfile.TemporaryFile() as f:
            s3.download_fileobj(self.s3_bucket, path, f)
            f.seek(0)
            img = Image.open(f).convert("RGB")
        return self.transform(img), label


def s3tc_loader(endpoint: str, source: str | list[str], cores: int) -> Any:
    """AWS's s3torchconnector: S3MapDataset + PIL + torchvision in a DataLoader, or None
    (with a note) when it is not installed. `source`: a prefix URI (listed) or the object
    URIs."""
    try:
        from s3torchconnector import S3ClientConfig, S3MapDataset
    except ImportError as e:
        logger.info("s3torchconnector row skipped: it is not installed (%s)", e)
        return None
    tv = tv_transform()

    def load(reader: Any) -> tuple[Any, int]:
        label = int(reader.key.split("/")[-2].split("_")[-1])  # class_NN/...
        with Image.open(reader) as img:
            return tv(img.convert("RGB")), label

    opts: dict[str, Any] = {
        "region": "us-east-1", "endpoint": endpoint, "transform": load,
        "s3client_config": S3ClientConfig(force_path_style=True),
    }
    if isinstance(source, str):
        ds = S3MapDataset.from_prefix(source, **opts)
    else:
        ds = S3MapDataset.from_objects(source, **opts)
    return torch.utils.data.DataLoader(
        ds, batch_size=BATCH, shuffle=True, num_workers=cores, persistent_workers=True
    )


def start_moto() -> tuple[subprocess.Popen[bytes], str]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                break
        except OSError:
            time.sleep(0.1)
    endpoint = f"http://127.0.0.1:{port}"
    os.environ.update(
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_REGION="us-east-1",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_ENDPOINT_URL_S3=endpoint,
    )
    return proc, endpoint


def bench_s3(root: str, keys: list[str], cores: int, seed_n: int) -> dict[str, float]:
    import boto3

    proc, endpoint = start_moto()
    EXCLUDE_PIDS.add(proc.pid)
    try:
        s3 = boto3.client("s3")
        s3.create_bucket(Bucket="bench")
        for k in keys:
            s3.upload_file(os.path.join(root, k), "bench", f"imagenet/{k}")
        sub = keys[:seed_n]
        seed_ds = SeedS3ImageFolder("bench", "imagenet", sub, tv_transform())
        dl = torch.utils.data.DataLoader(
            seed_ds, batch_size=BATCH, shuffle=True, num_workers=cores, persistent_workers=True
        )
        epoch_rate(dl)  # start the persistent workers
        s3tc = s3tc_loader(endpoint, "s3://bench/imagenet/", cores)
        if s3tc is not None:
            epoch_rate(s3tc)  # start its workers (not timed)
        loader = our_loader("s3://bench/imagenet", cores)
        seed_rates: list[float] = []
        our_rates: list[float] = []
        s3tc_rates: list[float] = []
        seed_cpu: list[float] = []
        our_cpu: list[float] = []
        s3tc_cpu: list[float] = []
        for r in range(2):
            seed_rates.append(epoch_rate(dl, seed_cpu))
            our_rates.append(loader_epoch(loader, r, our_cpu))
            if s3tc is not None:
                s3tc_rates.append(epoch_rate(s3tc, s3tc_cpu))
        del dl, s3tc
        loader.close()
        seed, ours = max(seed_rates), max(our_rates)
        out = {
            "seed": seed,
            "ours": ours,
            "ratio": ours / seed,
            "seed_cpu": min(seed_cpu),
            "ours_cpu": min(our_cpu),
        }
        if s3tc_rates:
            out.update(s3tc=max(s3tc_rates), s3tc_cpu=min(s3tc_cpu))
        return out
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def exclude_server(pid: int) -> None:
    """Leave a server process and its workers out of the clients' CPU time."""
    EXCLUDE_PIDS.add(pid)
    EXCLUDE_PIDS.update(c.pid for c in psutil.Process(pid).children(recursive=True))


def bench_s3_nginx(root: str, keys: list[str], cores: int, rounds: int) -> dict[str, float]:
    """Loader vs s3torchconnector from nginx serving `root` as bucket "bench"."""
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))  # shared server helpers
    from storage_servers import start_nginx

    serve_dir = tempfile.TemporaryDirectory(prefix="bench_loader_nginx_")
    serve = serve_dir.name
    os.makedirs(os.path.join(serve, "bench"))
    os.symlink(os.path.abspath(root), os.path.join(serve, "bench", "imagenet"))
    os.chmod(serve, 0o755)
    targets = [int(k.split("/")[0].split("_")[-1]) for k in keys]  # class_NN/...
    # Dummy credentials: nginx ignores the signature, but both clients sign.
    for var, value in (("AWS_ACCESS_KEY_ID", "bench"), ("AWS_SECRET_ACCESS_KEY", "bench"),
                       ("AWS_REGION", "us-east-1")):
        os.environ.setdefault(var, value)
    with start_nginx(Path(serve)) as nginx:
        exclude_server(nginx.proc.pid)
        ds = ImageList("s3://bench/imagenet", keys, targets,
                       storage_options={"endpoint_url": nginx.url, "region": "us-east-1"})
        loader = Loader(ds, BATCH, transform=our_transform(), num_threads=cores)
        s3tc = s3tc_loader(nginx.url, [f"s3://bench/imagenet/{k}" for k in keys], cores)
        if s3tc is not None:
            epoch_rate(s3tc)  # start its workers (not timed)
        loader_epoch(loader, 0)  # warm nginx's open files and the page cache
        rates: dict[str, list[float]] = {"ours": [], "s3tc": []}
        cpu: dict[str, list[float]] = {"ours": [], "s3tc": []}
        for r in range(rounds):
            rates["ours"].append(loader_epoch(loader, r + 1, cpu["ours"]))
            if s3tc is not None:
                rates["s3tc"].append(epoch_rate(s3tc, cpu["s3tc"]))
        loader.close()
        del s3tc
    serve_dir.cleanup()
    out = {"ours": max(rates["ours"]), "ours_cpu": min(cpu["ours"])}
    if rates["s3tc"]:
        out.update(s3tc=max(rates["s3tc"]), s3tc_cpu=min(cpu["s3tc"]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--n", type=int, default=1000, help="images (default 1000)")
    ap.add_argument("--s3-seed-n", type=int, default=256, help="images for the seed's slow S3 path")
    ap.add_argument("--data", default=None, help="reuse/keep the generated images here")
    ap.add_argument("--skip-s3", action="store_true")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds; best is reported")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logger.setLevel(logging.INFO)
    helpers = bench_helpers()  # before any work: a missing build fails at once
    cores = os.cpu_count() or 1
    tmp = None
    root = args.data
    if root is None:
        tmp = tempfile.TemporaryDirectory(prefix="bench_loader_")
        root = tmp.name
    keys = sorted(
        os.path.relpath(os.path.join(d, f), root)
        for d, _, fs in os.walk(root)
        for f in fs
        if f.endswith(".jpg")
    )
    if len(keys) < args.n:
        logger.info("writing %d JPEGs to %s", args.n, root)
        keys = make_dataset(root, args.n)
    keys = keys[: args.n]
    logger.info("%d images, %d cores, batch %d; %s", len(keys), cores, BATCH,
                benchenv.load_average())

    rates, cpu = bench_local(root, keys, cores, args.rounds, helpers)
    best = {k: max(v) for k, v in rates.items()}
    cost = {k: min(v) for k, v in cpu.items()}
    logger.info("best of %d rounds: images/s (wall), CPU ms per image (all processes)", args.rounds)
    for k, v in best.items():
        logger.info("  %-18s %8.1f img/s  %6.2f CPU-ms/img", k, v, cost[k])
    logger.info(
        "wall: Loader / torchvision = %.2fx (target >= 5); Loader / decode ceiling = %.2f "
        "(target >= 0.8); %s",
        best["ours"] / best["torchvision"],
        best["ours"] / best["ceiling"],
        benchenv.load_average(),
    )
    logger.info(
        "CPU cost: Loader / torchvision = %.2fx; Loader / decode ceiling = %.2f",
        cost["torchvision"] / cost["ours"],
        cost["ceiling"] / cost["ours"],
    )
    logger.info("uint8 output (PILToTensor): %.1f img/s = %.2fx the float32 Loader",
                best["ours_uint8"], best["ours_uint8"] / best["ours"])
    if "dali_cpu" in best:
        logger.info("wall: Loader / DALI-CPU = %.2fx (target >= 3); CPU cost: %.2fx",
                    best["ours"] / best["dali_cpu"], cost["dali_cpu"] / cost["ours"])
    rss = bench_rss(root, cores)
    logger.info(
        "RSS over 10 epochs: peak +%.0f MiB (bound %.0f MiB); after epoch 1 +%.0f, after 10 +%.0f",
        rss["peak_over_base_mib"],
        rss["bound_mib"],
        rss["epoch1_mib"],
        rss["epoch10_mib"],
    )
    if not args.skip_s3:
        s3 = bench_s3(root, keys, cores, args.s3_seed_n)
        logger.info(
            "S3 (moto): seed S3ImageFolder %.1f img/s (%d images, %.2f CPU-ms/img), Loader over "
            "s3:// %.1f img/s (%.2f CPU-ms/img) -> %.1fx (target >= 10); %s",
            s3["seed"],
            min(args.s3_seed_n, len(keys)),
            s3["seed_cpu"],
            s3["ours"],
            s3["ours_cpu"],
            s3["ratio"],
            benchenv.load_average(),
        )
        if "s3tc" in s3:
            logger.info(
                "S3 (moto): s3torchconnector S3MapDataset + PIL + torchvision %.1f img/s "
                "(%.2f CPU-ms/img) -> Loader is %.1fx (target >= 5)",
                s3["s3tc"], s3["s3tc_cpu"], s3["ours"] / s3["s3tc"],
            )
        nginx = bench_s3_nginx(root, keys, cores, args.rounds)
        line = (f"S3 (nginx, signed): Loader {nginx['ours']:.1f} img/s "
                f"({nginx['ours_cpu']:.2f} CPU-ms/img)")
        if "s3tc" in nginx:
            line += (f"; s3torchconnector S3MapDataset + PIL + torchvision {nginx['s3tc']:.1f} "
                     f"img/s ({nginx['s3tc_cpu']:.2f} CPU-ms/img) -> Loader is "
                     f"{nginx['ours'] / nginx['s3tc']:.2f}x (target >= 5)")
        logger.info("%s; %s", line, benchenv.load_average())
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
