"""The GPU data path in one run: loaders into CUDA memory and the training they feed.

Workload: JPEGs of ~500x375 (quality 90, photographic content from tests/images.py) in 16
class folders; uint8 RandomResizedCrop + flip on the host; batches of 256 copied to the GPU
as uint8 and normalised there. Every row comes from the same run, the configurations
interleaved round by round, and each figure is the median over the rounds:

1. The engine alone (host tensors, ``pin_memory=False``) at 1/2/4/8/15/16 threads (at most
   the cores), and at ``--loader-threads`` pinned (``pin_memory=True``).
2. The Loader into CUDA memory at ``--loader-threads``: ``Loader(..., device="cuda")`` where
   the Loader has ``device``, else pinned batches moved by ``.to("cuda", non_blocking=True)``
   in the loop (the row says which); ratio to (1) at the same threads.
3. torchvision's fastest CPU recipe (``torchvision.io.decode_jpeg`` + v2 transforms in a
   ``DataLoader(--workers, pin_memory=True)``) and PIL ``ImageFolder`` + the same DataLoader.
4. ResNet-18 and ResNet-50 training (bf16 autocast, channels_last, SGD, batch 256) fed by
   each loader of 2-3, against the same model on a batch already on the GPU (ratios).
5. ``dask_ddp.report()`` of the loss every step (the CUDA tensor, and ``loss.item()``)
   against none, ResNet-18 on the resident batch, in a rank's environment
   (``tests/rank_channel.py``: the results pipe a rank's supervisor gives it, read back
   here), so that ``report()`` runs its whole rank path: the value's pinned copy and
   event, the pending queue, the frame on the pipe. Every record sent is counted back
   (``report_records`` in the JSON). The time spent inside ``report()`` per step is a row
   of its own, and its share of a step without ``report()`` another: the GPU check's goal
   is at most 1%.

Each loader row first drains the batches its loader prefetched while the others ran (until
a batch takes longer than 2 ms to arrive), then times ``--loader-batches`` batches; a
training row drains, runs ``--warmup`` steps, then times ``--steps``. Streams cross epoch
boundaries as training does (an epoch here is 32 batches).

The defaults (3 rounds, 50 steps after 10, a ``--budget`` of rounds) fit the GPU check's
5 minutes (tools/gpu/check.sh); the figures of record use ``--rounds 5 --steps 200
--warmup 40 --budget 0`` (about 10 minutes on a 16-core H100 machine).

Usage::

    python benchmarks/bench_gpu.py --make-photos --data /tmp/gpu-photos --images 8192
    python benchmarks/bench_gpu.py --data /tmp/gpu-photos --json out.json
    python benchmarks/bench_gpu.py --quick --device cpu     # a check of the script, any machine
"""

from __future__ import annotations

import argparse
import inspect
import json
import logging
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from multiprocessing import Pool
from pathlib import Path
from typing import Any

import benchenv  # first: the environment before anything imports distributed
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the photo maker shared with the tests

logger = logging.getLogger("bench_gpu")

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
Batch = tuple[torch.Tensor, torch.Tensor]


# ---- photos -------------------------------------------------------------------------------
def _write_photo(job: tuple[str, int, int]) -> None:
    from images import photo

    root, i, classes = job
    # Mostly landscape 500x375, every fourth portrait, as photo collections are.
    size = (375, 500) if i % 4 == 3 else (500, 375)
    path = os.path.join(root, f"class_{i % classes:02d}", f"img_{i:05d}.jpg")
    photo(*size, seed=i).save(path, "JPEG", quality=90)


def make_photos(root: str, n: int, classes: int = 16) -> float:
    """Write ``n`` JPEGs into ``classes`` folders under ``root``; returns the seconds it took.

    A folder this function made with the same ``n`` and ``classes`` is kept as it is; any
    other content of ``root`` is replaced.
    """
    t0 = time.perf_counter()
    stamp = os.path.join(root, ".bench_gpu_photos")
    wanted = f"{n} {classes}\n"
    if os.path.exists(stamp) and Path(stamp).read_text() == wanted:
        logger.info("%s already holds the %d photos in %d classes", root, n, classes)
        return 0.0
    if os.path.isdir(root):
        shutil.rmtree(root)
    for c in range(classes):
        os.makedirs(os.path.join(root, f"class_{c:02d}"), exist_ok=True)
    with Pool(os.cpu_count()) as pool:
        pool.map(_write_photo, [(root, i, classes) for i in range(n)], chunksize=64)
    Path(stamp).write_text(wanted)
    dt = time.perf_counter() - t0
    logger.info("wrote %d photos to %s in %.1f s", n, root, dt)
    return dt


# ---- results ------------------------------------------------------------------------------
@dataclass
class Row:
    """One configuration: what it is, its figure in each round, and its baseline's name."""

    name: str
    what: str
    unit: str = "img/s"
    baseline: str | None = None
    runs: list[float] = field(default_factory=list)
    digits: int = 0

    @property
    def median(self) -> float:
        return statistics.median(self.runs) if self.runs else float("nan")


class Results:
    """The rows in the order they were added, and the table and JSON made of them."""

    def __init__(self) -> None:
        self.rows: dict[str, Row] = {}

    def add(self, name: str, what: str, baseline: str | None = None, unit: str = "img/s",
            digits: int = 0) -> None:
        self.rows.setdefault(name, Row(name, what, unit, baseline, digits=digits))

    def record(self, name: str, value: float) -> None:
        self.rows[name].runs.append(value)

    def ratio(self, row: Row) -> float | None:
        base = self.rows.get(row.baseline or "")
        if base is None or not base.runs or not row.runs:
            return None
        return row.median / base.median

    def markdown(self, title: str) -> str:
        lines = [f"### {title}", "", "| row | what | median | runs | ratio (to) |",
                 "| --- | --- | ---: | --- | --- |"]
        for row in self.rows.values():
            r = self.ratio(row)
            ratio = f"{r:.2f} ({row.baseline})" if r is not None else ""
            runs = ", ".join(f"{v:,.{row.digits}f}" for v in row.runs)
            lines.append(f"| {row.name} | {row.what} | {row.median:,.{row.digits}f} {row.unit} "
                         f"| {runs} "
                         f"| {ratio} |")
        return "\n".join(lines) + "\n"

    def as_json(self) -> list[dict[str, Any]]:
        return [{**asdict(r), "median": r.median, "ratio": self.ratio(r)}
                for r in self.rows.values()]


# ---- feeds: endless streams of batches ----------------------------------------------------
def epochs(loader: Any, set_epoch: bool) -> Iterator[Any]:
    """The loader's batches, epoch after epoch."""
    epoch = 0
    while True:
        if set_epoch:
            loader.set_epoch(epoch)
        yield from loader
        epoch += 1


def to_device(stream: Iterator[Any], device: torch.device) -> Iterator[Batch]:
    """Batches moved to ``device`` in the loop (a no-op for batches already there)."""
    for images, labels in stream:
        yield (images.to(device, non_blocking=True), labels.to(device, non_blocking=True))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def drain(stream: Iterator[Batch], device: torch.device, most: int) -> int:
    """Take the batches that were ready (prefetched while other rows ran): until one takes
    longer than 2 ms to arrive, at most ``most``; returns how many were taken."""
    for taken in range(1, most + 1):
        t0 = time.perf_counter()
        next(stream)
        if taken > 1 and time.perf_counter() - t0 > 0.002:
            break
    sync(device)
    return taken


def loader_rate(stream: Iterator[Batch], device: torch.device, batches: int,
                buffered: int) -> float:
    """Images per second over ``batches`` batches, after draining the prefetched ones."""
    drain(stream, device, buffered)
    n = 0
    t0 = time.perf_counter()
    for _ in range(batches):
        images, _ = next(stream)
        n += int(images.shape[0])
    sync(device)
    return n / (time.perf_counter() - t0)


def our_loader(root: str, args: argparse.Namespace, threads: int, *, pin: bool,
               device: torch.device | None) -> Any:
    """The Loader of the workload; with ``device``, its device stage (which pins its own
    buffers: ``pin`` is then not passed)."""
    from dask_ddp.data import ImageFolder, Loader
    from dask_ddp.data import transforms as T

    kw: dict[str, Any] = {"pin_memory": pin} if device is None else {"device": device}
    transform = T.Compose([T.RandomResizedCrop(args.size), T.RandomHorizontalFlip(),
                           T.PILToTensor()])
    return Loader(ImageFolder(root), args.batch, transform=transform, num_threads=threads,
                  drop_last=True, seed=threads, **kw)


def loader_has_device() -> bool:
    from dask_ddp.data import Loader

    return "device" in inspect.signature(Loader).parameters


class DecodeJpegFolder(torch.utils.data.Dataset[tuple[torch.Tensor, int]]):
    """torchvision's fastest CPU recipe: ``io.decode_jpeg`` and v2 transforms on uint8."""

    def __init__(self, root: str, size: int) -> None:
        import torchvision
        from torchvision.transforms import v2

        self.samples = torchvision.datasets.ImageFolder(root).samples
        self.transform = v2.Compose([v2.RandomResizedCrop(size, antialias=True),
                                     v2.RandomHorizontalFlip()])

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        from torchvision.io import ImageReadMode, decode_jpeg, read_file

        path, label = self.samples[i]
        return self.transform(decode_jpeg(read_file(path), mode=ImageReadMode.RGB)), label


def data_loader(dataset: Any, args: argparse.Namespace, device: torch.device) -> Any:
    return torch.utils.data.DataLoader(
        dataset, batch_size=args.batch, shuffle=True, num_workers=args.workers,
        pin_memory=device.type == "cuda", drop_last=True, persistent_workers=True,
        prefetch_factor=2)


def pil_folder(root: str, size: int) -> Any:
    import torchvision
    from torchvision.transforms import v2

    return torchvision.datasets.ImageFolder(root, transform=v2.Compose([
        v2.RandomResizedCrop(size, antialias=True), v2.RandomHorizontalFlip(),
        v2.PILToTensor()]))


def resident(args: argparse.Namespace, device: torch.device, classes: int) -> Iterator[Batch]:
    """The same uint8 batch on the device, forever: the model's ceiling."""
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (args.batch, 3, args.size, args.size), dtype=torch.uint8,
                           generator=g).to(device)
    labels = torch.randint(0, classes, (args.batch,), generator=g).to(device)
    while True:
        yield images, labels


# ---- training -----------------------------------------------------------------------------
class Trainer:
    """A torchvision ResNet training on ``device``: bf16 autocast, channels_last, SGD; the
    uint8 batch is normalised on the device first."""

    def __init__(self, arch: str, device: torch.device, amp: bool) -> None:
        import torchvision

        self.device = device
        self.amp = amp
        self.model = getattr(torchvision.models, arch)(num_classes=1000).to(
            device, memory_format=torch.channels_last)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        self.mean = torch.tensor(MEAN, device=device).view(1, 3, 1, 1) * 255
        self.std = torch.tensor(STD, device=device).view(1, 3, 1, 1) * 255

    def step(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = ((images.float() - self.mean) / self.std).contiguous(
            memory_format=torch.channels_last)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.amp):
            loss = torch.nn.functional.cross_entropy(self.model(x), labels)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return loss.detach()

    def rate(self, stream: Iterator[Batch], args: argparse.Namespace, buffered: int,
             after_step: Timed | None = None) -> float:
        """Images per second over ``args.steps`` steps after draining and ``args.warmup``
        (``after_step`` is called after each, timed from the first step timed here)."""
        drain(stream, self.device, buffered)
        for _ in range(args.warmup):
            loss = self.step(*next(stream))
            if after_step is not None:
                after_step(loss)
        sync(self.device)
        if after_step is not None:
            after_step.start()
        n = 0
        t0 = time.perf_counter()
        for _ in range(args.steps):
            images, labels = next(stream)
            loss = self.step(images, labels)
            if after_step is not None:
                after_step(loss)
            n += int(images.shape[0])
        sync(self.device)
        return n / (time.perf_counter() - t0)


class Timed:
    """``fn`` called after each step, with the seconds spent in its calls since
    :meth:`start` and their count, and the count of every call."""

    def __init__(self, fn: Callable[[torch.Tensor], None]) -> None:
        self.fn = fn
        self.seconds = 0.0
        self.calls = 0
        self.all_calls = 0

    def start(self) -> None:
        """Time from here (after the warm-up steps)."""
        self.seconds, self.calls = 0.0, 0

    def __call__(self, loss: torch.Tensor) -> None:
        t0 = time.perf_counter()
        self.fn(loss)
        self.seconds += time.perf_counter() - t0
        self.calls += 1
        self.all_calls += 1


def report_tensor(loss: torch.Tensor) -> None:
    import dask_ddp

    dask_ddp.report({"loss": loss})


def report_item(loss: torch.Tensor) -> None:
    import dask_ddp

    dask_ddp.report({"loss": loss.item()})


# ---- the run ------------------------------------------------------------------------------
def machine(device: torch.device) -> dict[str, Any]:
    info: dict[str, Any] = {
        "cores": os.cpu_count(), "torch": torch.__version__, "cuda": torch.version.cuda,
        "python": sys.version.split()[0], "device": str(device),
    }
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        info["gpu"] = p.name
        info["gpu_memory_gib"] = round(p.total_memory / 2**30, 1)
    return info


def run(args: argparse.Namespace) -> tuple[Results, dict[str, Any]]:
    import torchvision  # noqa: F401 - fail here, not inside a worker

    from rank_channel import RankChannel

    device = torch.device(args.device)
    if device.type == "cuda":
        torch.cuda.set_device(device if device.index is not None else 0)
        torch.backends.cudnn.benchmark = True
    root = args.data
    classes = len([d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d))])
    cores = os.cpu_count() or 1
    threads = sorted({t for t in args.threads if t <= cores})
    lt = min(args.loader_threads, cores)
    res = Results()
    feeds: dict[str, tuple[Iterator[Batch], int]] = {}  # stream and how many it buffers
    closers: list[Any] = []

    # 1. the engine alone, host tensors; its prefetched batches are drained per row.
    for t in threads:
        loader = our_loader(root, args, t, pin=False, device=None)
        closers.append(loader)
        res.add(f"engine_t{t}", f"dask-ddp engine, {t} threads, host, pin_memory=False")
        feeds[f"engine_t{t}"] = (epochs(loader, True), loader.prefetch + 2)
    if device.type == "cuda":
        loader = our_loader(root, args, lt, pin=True, device=None)
        closers.append(loader)
        res.add(f"engine_t{lt}_pinned", f"dask-ddp engine, {lt} threads, host, pin_memory=True",
                baseline=f"engine_t{lt}")
        feeds[f"engine_t{lt}_pinned"] = (epochs(loader, True), loader.prefetch + 2)
    # 2. the Loader into the device's memory.
    if loader_has_device():
        loader = our_loader(root, args, lt, pin=False, device=device)
        ours = epochs(loader, True)
        what = f"dask-ddp Loader(device={args.device!r}), {lt} threads"
    else:
        loader = our_loader(root, args, lt, pin=device.type == "cuda", device=None)
        ours = to_device(epochs(loader, True), device)
        what = (f"dask-ddp Loader(pin_memory=True) + .to({args.device!r}, non_blocking=True) "
                f"in the loop (no device= yet), {lt} threads")
    closers.append(loader)
    ours_name = f"ours_{device.type}_t{lt}"
    res.add(ours_name, what, baseline=f"engine_t{lt}" if lt in threads else None)
    # The engine's queue and the device stage's both hold batches ready.
    feeds[ours_name] = (ours, 2 * loader.prefetch + 4)
    # 3. the peers, in DataLoaders with their own workers and pinning thread.
    peers = {"tv_io": (DecodeJpegFolder(root, args.size),
                       f"torchvision io.decode_jpeg + v2, DataLoader({args.workers})"),
             "pil": (pil_folder(root, args.size),
                     f"PIL ImageFolder + v2, DataLoader({args.workers})")}
    for name, (dataset, what) in peers.items():
        dl = data_loader(dataset, args, device)
        res.add(name, what, baseline=ours_name)
        feeds[name] = (to_device(epochs(dl, False), device), 2 * args.workers + 2)
    loader_rows = list(feeds)
    feeds["resident"] = (resident(args, device, classes), 1)

    trainers = {arch: Trainer(arch, device, args.amp == "bf16") for arch in args.models}
    train_feeds = ["resident", ours_name, "tv_io", "pil"]
    for arch in trainers:
        for feed in train_feeds:
            what = ("the same batch resident on the device (the ceiling)" if feed == "resident"
                    else f"fed by {res.rows[feed].what}")
            res.add(f"{arch}_{feed}", f"{arch} training, {what}",
                    baseline=None if feed == "resident" else f"{arch}_resident")
    report_arch = args.models[0]
    reports: dict[str, Callable[[torch.Tensor], None] | None] = {
        "none": None, "tensor": report_tensor, "item": report_item}
    res.add(f"{report_arch}_report_none", f"{report_arch}, resident batch, no report()")
    res.add(f"{report_arch}_report_tensor",
            f"{report_arch}, resident batch, report({{'loss': loss}}) every step",
            baseline=f"{report_arch}_report_none")
    res.add(f"{report_arch}_report_item",
            f"{report_arch}, resident batch, report({{'loss': loss.item()}}) every step",
            baseline=f"{report_arch}_report_none")
    res.add(f"{report_arch}_report_call", "time inside report({'loss': loss}) per step",
            unit="us", digits=1)
    res.add(f"{report_arch}_report_share",
            "time inside report({'loss': loss}) per step / a step without report()",
            unit="%", digits=3)
    sent = 0

    t_start = time.perf_counter()
    rounds_run = 0
    # report() sends from here on, as in a rank (the loaders above were made outside it);
    # leaving it writes every record and restores the environment.
    channel = RankChannel("bench-gpu")
    try:
        with channel:
            for r in range(args.rounds):
                t_round = time.perf_counter()
                for name in loader_rows:
                    stream, buffered = feeds[name]
                    res.record(name, loader_rate(stream, device, args.loader_batches, buffered))
                for arch, trainer in trainers.items():
                    for feed in train_feeds:
                        stream, buffered = feeds[feed]
                        res.record(f"{arch}_{feed}", trainer.rate(stream, args, buffered))
                for kind, fn in reports.items():
                    hook = None if fn is None else Timed(fn)
                    res.record(f"{report_arch}_report_{kind}",
                               trainers[report_arch].rate(feeds["resident"][0], args, 1, hook))
                    if hook is None:
                        continue
                    sent += hook.all_calls
                    if kind == "tensor":
                        per_call = hook.seconds / max(hook.calls, 1)
                        step_s = args.batch / res.rows[f"{report_arch}_report_none"].runs[-1]
                        res.record(f"{report_arch}_report_call", per_call * 1e6)
                        res.record(f"{report_arch}_report_share", 100 * per_call / step_s)
                rounds_run += 1
                took = time.perf_counter() - t_round
                logger.info("round %d in %.1f s: %s", r, took,
                            {k: round(v.runs[-1]) for k, v in res.rows.items() if v.runs})
                spent = time.perf_counter() - t_start
                if args.budget and r + 1 < args.rounds and spent + took > args.budget:
                    logger.warning("stopping after %d of %d rounds: another (%.0f s) would "
                                   "pass the budget of %.0f s", rounds_run, args.rounds, took,
                                   args.budget)
                    break
    finally:
        for c in closers:
            c.close()
    received = channel.records()
    bad = [r for r in received if not math.isfinite(r["loss"])]
    if bad:
        logger.error("%d of %d reported losses are not finite: %s", len(bad), len(received),
                     bad[:3])
    meta = {"machine": machine(device), "rounds_run": rounds_run, "classes": classes,
            "images": sum(len(f) for _, _, f in os.walk(root)),
            "loader_device_parameter": loader_has_device(),
            "report_records": {"sent": sent, "received": len(received)},
            "seconds": time.perf_counter() - t_start}
    return res, meta


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", help="photo folder (made with --make-photos; --quick makes one)")
    p.add_argument("--make-photos", action="store_true", help="write --images photos, then exit")
    p.add_argument("--images", type=int, default=8192)
    p.add_argument("--classes", type=int, default=16)
    p.add_argument("--device", default="cuda")
    p.add_argument("--threads", type=lambda s: [int(x) for x in s.split(",")],
                   default=[1, 2, 4, 8, 15, 16], help="engine rows (at most the cores)")
    p.add_argument("--loader-threads", type=int, default=15, help="threads of the feeding Loader")
    p.add_argument("--workers", type=int, default=15, help="the peers' DataLoader workers")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--models", type=lambda s: s.split(","), default=["resnet18", "resnet50"])
    p.add_argument("--amp", choices=["bf16", "none"], default="bf16",
                   help="autocast (--quick: none, as a CPU without bf16 units crawls in it)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--loader-batches", type=int, default=10)
    p.add_argument("--budget", type=float, default=0,
                   help="seconds of rounds: stop before a round that would pass it (0: none)")
    p.add_argument("--json", help="write the rows and the machine here")
    p.add_argument("--markdown", help="write the table here")
    p.add_argument("--quick", action="store_true",
                   help="tiny data and steps: proves the script works (with --device cpu)")
    args = p.parse_args(argv)
    if args.quick:
        args.images, args.classes = min(args.images, 128), 4
        args.threads, args.loader_threads, args.workers = [1, 2], 2, 2
        args.batch, args.size, args.models, args.amp = 8, 32, ["resnet18"], "none"
        args.rounds, args.steps, args.warmup, args.loader_batches = 2, 2, 1, 4
    if not args.make_photos and args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error("--device cuda, but torch.cuda.is_available() is False (use --device cpu)")
    return args


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    args = parse(argv)
    tmp = None
    if args.data is None:
        if not args.quick:
            raise SystemExit("--data names the photo folder (or use --quick)")
        tmp = tempfile.TemporaryDirectory(prefix="bench_gpu_")
        args.data = tmp.name
    if args.make_photos or tmp is not None:
        make_photos(args.data, args.images, args.classes)
        if args.make_photos:
            return
    benchenv.log_load_around_run(logger)
    try:
        res, meta = run(args)
    finally:
        if tmp is not None:
            tmp.cleanup()
    title = (f"bench_gpu on {meta['machine'].get('gpu', args.device)}, {meta['machine']['cores']} "
             f"cores, torch {torch.__version__}: medians of {meta['rounds_run']} rounds, "
             f"batch {args.batch}, {args.steps} steps after {args.warmup}; "
             f"{benchenv.load_average()}")
    table = res.markdown(title)
    print(table)  # noqa: T201 - the benchmark's result table
    if args.markdown:
        Path(args.markdown).write_text(table)
    if args.json:
        Path(args.json).write_text(json.dumps(
            {**meta, "args": vars(args), "load_average": benchenv.load_average(),
             "rows": res.as_json()}, indent=1, default=str))


if __name__ == "__main__":
    main()
