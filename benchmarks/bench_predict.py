"""Batch inference: ``dask_ddp.predict`` against a hand-written ``map_partitions`` (careful and
naive) and Ray Data, on tables and images, all in the same run on the same cluster.

Workloads (the issue's, sizes by flag), on a LocalCluster of WORKERS workers x 1 thread:

1. table: an MLP (COLS -> 256 -> 256 -> 10) over ROWS x COLS float32 of a persisted Dask
   DataFrame (PARTS partitions), the outputs persisted:
   a. ``dask_ddp.predict(make_mlp, ddf, batch_size=BATCH)``;
   b. careful hand-written ``map_partitions``: the model in a worker-global cache,
      ``torch.from_numpy``, inference mode (target: a >= 1.0x b);
   c. naive ``map_partitions``: the model object passed to every task (target: a >= 3x c);
   d. Ray Data: ``from_pandas`` of the same partitions (saved by the client, loaded and
      materialized in Ray's object store before the clock starts) + ``map_batches`` with an
      actor pool of WORKERS actors, each building the model once (target: a >= 2x d);
   and the time from ``compute()`` to the first partition's result.
   The MLP has 77,000 parameters (300 KB): shipping it in every task costs nothing next
   to its forward over a partition, and neither does shipping any dense MLP, whose forward
   grows with its size as its bytes do (4.3 M parameters, 2048 wide: the naive map as fast
   as the careful one). So a, b and c also run, last, a model whose size is in a lookup
   table (``--lookup-rows`` rows, 16.8 M parameters, 64 MiB: an embedding of 2**20 x 16
   indexed by a hash of the first feature, then the MLP), which the naive map ships to
   every task (target: a >= 3x c and a >= 1.0x b).
2. images: IMAGES JPEGs (160x120) in class folders, a small CNN at 64 px, in partitions of
   ``--image-partition`` images (default: a quarter of a worker's share):
   a. ``dask_ddp.predict(ImageFolder(dir), transform=Resize+ToTensor)`` (the engine decodes);
   b. hand-written ``map_partitions`` over the paths with PIL and torchvision transforms
      (target: a >= 1.5x b);
   c. Ray Data: ``read_images(dir, size=, mode="RGB")`` + ``map_batches`` with an actor
      pool of WORKERS actors loading the model once (target: a >= 2x c; reading timed);
   with ``--resnet``, the same with ResNet-18 at 224 px (random weights: a >= 1.0x b, and
   ahead of c).
3. the workers' peak RSS (``ru_maxrss``) after the image runs, against the images' bytes.
4. GPU rows (``--gpu``: only these; by default they follow the CPU rows when CUDA is
   present): GPU_IMAGES JPEGs (``--photos DIR`` keeps them for the next run), Resize 256 +
   CenterCrop 224, ResNet-50 in bf16 with channels_last, batch 256, one thread per worker:
   a. ``dask_ddp.predict(..., precision="bf16", channels_last=True)`` on a LocalCluster of
      one worker x 1 thread, partitions of 2,048 images, after a warm call over one
      partition (model built, cuDNN tuned) that is not timed;
   b. the model alone on a batch already on the GPU (no cluster);
   c. the engine's Loader into CUDA memory alone (``Loader(device=...)`` where the Loader
      has it, else pinned batches and ``.to(device, non_blocking=True)``; no cluster);
   d. a hand-written torchvision ``DataLoader`` (PIL + the same transforms,
      ``--dataloader-workers`` processes, pinned) feeding the same bf16 model, outputs
      copied back per batch as such loops do (no cluster);
   with the ratios a/b, a/min(b, c) and a/d (the goals: a >= 0.9 x min(b, c), a >= 1.5 x d).
   ``--gpu-rows`` picks rows (``model,dataloader`` need no LocalCluster).

Ray runs in a process of its own, spawned from the environment this benchmark started
with (:mod:`benchenv`, captured before dask or distributed was imported: a LocalCluster
writes its workers' settings into the client's environment), on a local Ray of WORKERS
CPUs for the actors (plus WORKERS for ``read_images``' read tasks: a read task and an actor
each take one of Ray's logical CPUs, both stages run at once on the same cores); it is
skipped with a note when ``ray.data`` cannot be imported (``make bench-deps``) or with
``--no-ray``.

Each figure is the best of --repeat runs (samples/s). Run:

    python benchmarks/bench_predict.py [--rows 2000000] [--cols 32] [--parts 16]
        [--batch 4096] [--lookup-rows 500000] [--images 4000] [--image-partition N]
        [--workers 2] [--repeat 3]
        [--resnet] [--no-ray] [--json PATH]
    python benchmarks/bench_predict.py --gpu [--gpu-images 32768] [--photos DIR]
        [--gpu-rows predict,model,loader,dataloader] [--json PATH]
    python benchmarks/bench_predict.py --quick [--gpu]   # a check of the script, any machine

``--quick`` shrinks every workload (a few thousand rows, 64 images, a small CNN at 32 px for
the GPU rows, on the CPU where CUDA is missing) to prove the script runs; its figures mean
nothing. ``--json PATH`` writes every figure as ``{"rows": [{"row", "rate", "unit", ...}],
"machine", "load"}``.

The ways being compared run in turn within each repeat (ours, careful, naive, ours, ...),
so a change in the machine's load during the run does not favour whichever runs first.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import benchenv  # noqa: F401 - first: the clean environment, before distributed

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the image writer shared with the tests

logger = logging.getLogger("bench_predict")

#: Every figure of this run, for ``--json``.
RESULTS: list[dict[str, Any]] = []


def record(row: str, rate: float, unit: str, **extra: Any) -> None:
    """Keep one figure for ``--json``."""
    RESULTS.append({"row": row, "rate": round(rate, 3), "unit": unit, **extra})


def worker_cache() -> dict[str, Any]:
    """A dict living in the worker process (this script's globals travel by value)."""
    from distributed import get_worker

    try:
        worker: Any = get_worker()
    except ValueError:
        return {}
    if not hasattr(worker, "bench_models"):
        worker.bench_models = {}
    cache: dict[str, Any] = worker.bench_models
    return cache

def make_mlp(cols: int = 32) -> Any:
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(cols, 256), torch.nn.ReLU(),
                               torch.nn.Linear(256, 256), torch.nn.ReLU(),
                               torch.nn.Linear(256, 10))


class Lookup:
    """Builds the lookup model: an embedding of ``2**20 x 16`` indexed by a hash of the first
    feature, concatenated to the features, then the MLP (its size is in the table)."""

    def __init__(self, cols: int = 32, rows: int = 1 << 20, dim: int = 16) -> None:
        self.cols, self.rows, self.dim = cols, rows, dim

    def __call__(self) -> Any:
        import torch

        cols, rows, dim = self.cols, self.rows, self.dim

        class LookupModel(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                torch.manual_seed(0)
                self.table = torch.nn.Embedding(rows, dim)
                self.mlp = make_mlp(cols + dim)

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                ids = (x[:, 0].abs() * 1e4).long() % rows
                return self.mlp(torch.cat([x, self.table(ids)], 1))

        return LookupModel()


def make_cnn() -> Any:
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, stride=2), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, stride=2), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, 10))


def make_resnet() -> Any:
    import torchvision

    return torchvision.models.resnet18(weights=None)


def careful_partition(part: Any, build: Callable[[], Any], batch: int, key: str) -> Any:
    """The hand-written best: the model cached in the worker (as ``key``), views of the
    partition."""
    import numpy as np
    import pandas as pd
    import torch

    cache = worker_cache()
    model = cache.get(key)
    if model is None:
        model = cache[key] = build().eval()
    x = torch.from_numpy(np.array(part.to_numpy(dtype=np.float32)))
    with torch.inference_mode():
        out = torch.cat([model(x[i:i + batch]) for i in range(0, len(x), batch)]).numpy()
    return pd.DataFrame(out, index=part.index, columns=[f"out_{i}" for i in range(10)])


def naive_partition(part: Any, model: Any, batch: int) -> Any:
    """The common first try: the model object an argument of every task."""
    import numpy as np
    import pandas as pd
    import torch

    x = torch.tensor(part.to_numpy(dtype=np.float32))
    with torch.inference_mode():
        out = torch.cat([model.eval()(x[i:i + batch]) for i in range(0, len(x), batch)])
    return pd.DataFrame(out.numpy(), index=part.index, columns=[f"out_{i}" for i in range(10)])


def pil_partition(paths: Any, build: Callable[[], Any], size: int, batch: int) -> Any:
    """Hand-written images: PIL decode and torchvision transforms, the model cached."""
    import pandas as pd
    import torch
    from PIL import Image
    from torchvision import transforms as tv

    key = f"img-{size}"
    cache = worker_cache()
    model = cache.get(key)
    if model is None:
        model = cache[key] = build().eval()
    tf = tv.Compose([tv.Resize((size, size)), tv.ToTensor()])
    outs = []
    files = list(paths["path"])
    with torch.inference_mode():
        for i in range(0, len(files), batch):
            x = torch.stack([tf(Image.open(p).convert("RGB")) for p in files[i:i + batch]])
            outs.append(model(x).numpy())
    import numpy as np

    out = np.concatenate(outs)
    return pd.DataFrame(out, index=paths.index, columns=[f"out_{i}" for i in range(out.shape[1])])


def timed(client: Any, collections: dict[str, Any], repeat: int,
          n: int) -> dict[str, tuple[float, float]]:
    """Per name: the best samples/s over ``repeat`` persists, and the fewest seconds to the
    first partition. The collections take turns within each repeat."""
    from distributed import as_completed, futures_of, wait

    best = {name: (0.0, float("inf")) for name in collections}
    for _ in range(repeat):
        for name, collection in collections.items():
            t0 = time.perf_counter()
            done = collection.persist()
            futures = futures_of(done)
            next(iter(as_completed(futures)))
            first = time.perf_counter() - t0
            wait(futures)
            rate = n / (time.perf_counter() - t0)
            best[name] = (max(best[name][0], rate), min(best[name][1], first))
            keys = [f.key for f in futures]
            del done, futures
            _forgotten(client, keys)
    return best


def _held(dask_scheduler: Any, keys: list[Any]) -> int:
    return sum(k in dask_scheduler.tasks for k in keys)


def _forgotten(client: Any, keys: list[Any], timeout: float = 60.0) -> None:
    """Wait until the scheduler forgot ``keys``: a repeat submitted before that finds the
    previous repeat's results still held and times nothing (the same keys)."""
    deadline = time.monotonic() + timeout
    while client.run_on_scheduler(_held, keys=keys):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the scheduler still holds {len(keys)} results after "
                               f"{timeout} s: the next repeat would reuse them")
        time.sleep(0.05)


# ---- Ray Data (a process of its own, the clean environment) -----------------------------------
def ray_rate(spec: dict[str, Any]) -> float | None:
    """Ray Data's best samples/s for ``spec`` (:func:`ray_main` in a fresh process), or None
    with a note when Ray Data cannot be imported."""
    import peers

    env = peers._env()
    probe = subprocess.run([sys.executable, "-c", "import ray.data"], env=env,
                           capture_output=True)
    if probe.returncode != 0:
        logger.warning("Ray Data: skipped, ray[data] is not installed (make bench-deps)")
        return None
    with tempfile.TemporaryDirectory() as out:
        spec = {**spec, "out": os.path.join(out, "result.json")}
        done = subprocess.run([sys.executable, os.path.abspath(__file__), "ray",
                               json.dumps(spec)], env=env, capture_output=True, text=True,
                              timeout=3600)
        if done.returncode != 0:
            raise RuntimeError(f"Ray Data ({spec['kind']}) exited {done.returncode}:\n"
                               f"{done.stderr[-3000:]}")
        with open(spec["out"]) as f:
            return float(json.load(f)["rate"])


def ray_main(spec: dict[str, Any]) -> None:
    """Ray Data over the same data in this (clean) process: a table's partitions from
    ``from_pandas``, or ``read_images``; ``map_batches`` with an actor pool whose actors
    build the model once. Writes the best samples/s of ``spec["repeat"]`` runs."""
    import numpy as np
    import ray
    import ray.data
    import torch

    workers, kind = spec["workers"], spec["kind"]

    class Model:
        """One actor: the model built once, batches through it in inference mode."""

        def __init__(self) -> None:
            build = {"table": lambda: make_mlp(spec["cols"]), "cnn": make_cnn,
                     "resnet": make_resnet}[spec["model"]]
            self.model = build().eval()

        def __call__(self, batch: Any) -> Any:
            with torch.inference_mode():
                if kind == "table":
                    x = torch.from_numpy(batch.to_numpy(dtype=np.float32))
                else:  # uint8 [n, h, w, 3] from read_images
                    x = torch.from_numpy(batch["image"]).permute(0, 3, 1, 2).float().div(255)
                return {"out": self.model(x).numpy()}

    reads = workers if kind == "images" else 0
    ray.init(num_cpus=workers + reads, include_dashboard=False, log_to_driver=False)
    try:
        if kind == "table":
            import pandas as pd

            cols = [f"f{i}" for i in range(spec["cols"])]
            parts = [pd.DataFrame(np.load(p), columns=cols) for p in spec["parts"]]
            source = ray.data.from_pandas(parts).materialize()  # as the persisted frame
        best = 0.0
        for _ in range(spec["repeat"]):
            t0 = time.perf_counter()
            ds = source if kind == "table" else ray.data.read_images(
                spec["folder"], size=(spec["size"], spec["size"]), mode="RGB")
            n = ds.map_batches(Model, batch_size=spec["batch"],
                               batch_format="pandas" if kind == "table" else "numpy",
                               compute=ray.data.ActorPoolStrategy(size=workers),
                               num_cpus=1).materialize().count()
            best = max(best, n / (time.perf_counter() - t0))
        with open(spec["out"], "w") as f:
            json.dump({"rate": best, "samples": n}, f)
    finally:
        ray.shutdown()


def bench_table(client: Any, args: argparse.Namespace) -> None:
    import dask.array as da
    import dask.dataframe as dd
    import numpy as np
    from distributed import wait

    arr = da.random.default_rng(0).standard_normal((args.rows, args.cols), dtype=np.float32,
                                                   chunks=(-(-args.rows // args.parts), -1))
    ddf = dd.from_dask_array(arr, columns=[f"f{i}" for i in range(args.cols)]).persist()
    wait(ddf)  # the input ready before any clock starts
    n, batch = args.rows, args.batch

    def build() -> Any:
        return make_mlp(args.cols)

    ours, careful, naive, first = three_ways(client, ddf, build, "mlp", batch, args.repeat, n)
    record("table/predict", ours, "rows/s", first_partition_s=round(first, 3))
    record("table/careful_map_partitions", careful, "rows/s", ratio=round(ours / careful, 3))
    record("table/naive_map_partitions", naive, "rows/s", ratio=round(ours / naive, 3))
    logger.info("table %d x %d in %d parts: dask-ddp %.0f rows/s (first partition %.2fs), "
                "careful map_partitions %.0f (%.2fx), naive %.0f (%.2fx)", n, args.cols,
                args.parts, ours, first, careful, ours / careful, naive, ours / naive)
    if args.ray:
        with tempfile.TemporaryDirectory() as tmp:  # the same partitions, for from_pandas
            files = []
            for i, part in enumerate(ddf.to_delayed()):
                files.append(os.path.join(tmp, f"part-{i:04d}.npy"))
                np.save(files[-1], part.compute().to_numpy())
            ray = ray_rate({"kind": "table", "model": "table", "parts": files,
                            "cols": args.cols, "batch": batch, "workers": args.workers,
                            "repeat": args.repeat})
        if ray:
            logger.info("table: Ray Data from_pandas + map_batches (actor pool) %.0f rows/s "
                        "(dask-ddp %.2fx)", ray, ours / ray)


def three_ways(client: Any, ddf: Any, build: Callable[[], Any], key: str, batch: int,
               repeat: int, n: int) -> tuple[float, float, float, float]:
    """rows/s of ``dask_ddp.predict``, the careful map and the naive one (the model built
    here, an argument of every task), and our seconds to the first partition."""
    import numpy as np
    import pandas as pd

    import dask_ddp

    meta = pd.DataFrame(np.empty((0, 10), np.float32), columns=[f"out_{i}" for i in range(10)])
    got = timed(client, {
        "ours": dask_ddp.predict(build, ddf, batch_size=batch),
        "careful": ddf.map_partitions(careful_partition, build, batch, key, meta=meta),
        "naive": ddf.map_partitions(naive_partition, build(), batch, meta=meta)}, repeat, n)
    return got["ours"][0], got["careful"][0], got["naive"][0], got["ours"][1]


def bench_lookup(client: Any, args: argparse.Namespace) -> None:
    """The lookup model (its 64 MiB in a table) over ``--lookup-rows`` rows."""
    import warnings

    import dask.array as da
    import dask.dataframe as dd
    import numpy as np
    from distributed import wait

    n = args.lookup_rows
    arr = da.random.default_rng(1).standard_normal((n, args.cols), dtype=np.float32,
                                                   chunks=(-(-n // args.parts), -1))
    ddf = dd.from_dask_array(arr, columns=[f"f{i}" for i in range(args.cols)]).persist()
    wait(ddf)  # the input ready before any clock starts
    build = Lookup(args.cols)
    with warnings.catch_warnings():  # Dask warns of the model in the naive map's tasks
        warnings.filterwarnings("ignore", "(Large object|Sending large graph)")
        ours, careful, naive, first = three_ways(client, ddf, build, "lookup", args.batch,
                                                 args.repeat, n)
    record("lookup/predict", ours, "rows/s")
    record("lookup/careful_map_partitions", careful, "rows/s", ratio=round(ours / careful, 3))
    record("lookup/naive_map_partitions", naive, "rows/s", ratio=round(ours / naive, 3))
    logger.info("lookup model (16.8 M parameters, 64 MiB), %d x %d in %d parts: dask-ddp "
                "%.0f rows/s (first partition %.2fs), careful map_partitions %.0f (%.2fx), "
                "naive %.0f (%.2fx)", n, args.cols, args.parts, ours, first, careful,
                ours / careful, naive, ours / naive)


def bench_images(client: Any, args: argparse.Namespace, folder: str, resnet: bool) -> None:
    import dask.dataframe as dd
    import numpy as np
    import pandas as pd

    import dask_ddp
    from dask_ddp.data import ImageFolder
    from dask_ddp.data import transforms as T

    size, build = (224, make_resnet) if resnet else (64, make_cnn)
    what = "ResNet-18 at 224 px" if resnet else "small CNN at 64 px"
    ds = ImageFolder(folder)
    n, part = len(ds), args.image_partition or max(1, len(ds) // (4 * args.workers))
    tf = T.Compose([T.Resize((size, size)), T.ToTensor()])
    paths = dd.from_pandas(pd.DataFrame({"path": [p for p, _ in ds.samples]}),
                           chunksize=part)
    meta = pd.DataFrame(np.empty((0, 1000 if resnet else 10), np.float32),
                        columns=[f"out_{i}" for i in range(1000 if resnet else 10)])
    got = timed(client, {
        "ours": dask_ddp.predict(build, ds, transform=tf, batch_size=64, partition_size=part),
        "hand": paths.map_partitions(pil_partition, build, size, 64, meta=meta)},
        args.repeat, n)
    (ours, first), hand = got["ours"], got["hand"][0]
    name = "resnet18" if resnet else "cnn"
    record(f"images_{name}/predict", ours, "images/s")
    record(f"images_{name}/pil_map_partitions", hand, "images/s", ratio=round(ours / hand, 3))
    logger.info("images (%d, %s): dask-ddp %.0f images/s (first partition %.2fs), "
                "PIL + torchvision map_partitions %.0f (%.2fx)", n, what, ours, first, hand,
                ours / hand)
    if args.ray:
        ray = ray_rate({"kind": "images", "model": "resnet" if resnet else "cnn",
                        "folder": folder, "size": size, "batch": 64, "workers": args.workers,
                        "repeat": args.repeat})
        if ray:
            logger.info("images (%s): Ray Data read_images + map_batches (actor pool) %.0f "
                        "images/s (dask-ddp %.2fx)", what, ray, ours / ray)
    rss = client.run(lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    size_on_disk = sum(os.path.getsize(p) for p, _ in ds.samples)
    logger.info("workers' peak RSS %s MiB (images on disk %.1f MiB)",
                [round(v / 2**20) for v in rss.values()], size_on_disk / 2**20)


# ---- GPU rows ---------------------------------------------------------------------------------
#: The GPU rows, in the order they run.
GPU_ROWS = ("model", "loader", "dataloader", "predict")


class GpuModel:
    """Builds the GPU rows' model: ResNet-50 (random weights), ResNet-18 or the small CNN."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self) -> Any:
        import torchvision

        if self.name == "cnn":
            return make_cnn()
        return getattr(torchvision.models, self.name)(weights=None)


def gpu_sizes(args: argparse.Namespace) -> tuple[int, int]:
    """The GPU rows' Resize and CenterCrop sides (the issue's 256 and 224; 36 and 32 quick)."""
    return (36, 32) if args.quick else (256, 224)


def gpu_photos(args: argparse.Namespace, tmp: str) -> str:
    """A folder of ``--gpu-images`` JPEGs (320 x 240) in 16 classes: ``--photos`` when it
    holds enough already, else written there (or in ``tmp``), one process per core."""
    from multiprocessing import Pool

    folder = args.photos or os.path.join(tmp, "photos")
    have = sum(len(files) for _, _, files in os.walk(folder)) if os.path.isdir(folder) else 0
    if have >= args.gpu_images:
        return folder
    per_class = -(-args.gpu_images // 16)
    t0 = time.perf_counter()
    with Pool(os.cpu_count() or 1) as pool:
        pool.starmap(_write_class, [(folder, c, per_class) for c in range(16)])
    logger.info("wrote %d JPEGs into %s in %.0f s", 16 * per_class, folder,
                time.perf_counter() - t0)
    return folder


def _write_class(folder: str, c: int, per_class: int) -> None:
    from images import file_putter, write_folder

    write_folder(file_putter(folder), [f"c{c:02d}"], per_class, sizes=((320, 240),),
                 seed=c * per_class)


def _synced(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _fast_model(args: argparse.Namespace, device: Any) -> Any:
    import torch

    model = GpuModel(args.gpu_model)().eval().to(device)
    return model.to(memory_format=torch.channels_last)


def gpu_model_alone(args: argparse.Namespace, device: Any) -> float:
    """Images/s of the bf16 channels_last model on one batch already on the device."""
    import torch

    side = gpu_sizes(args)[1]
    model = _fast_model(args, device)
    x = torch.rand(args.gpu_batch, 3, side, side, device=device)
    x = x.contiguous(memory_format=torch.channels_last)
    steps = max(2, args.gpu_images // args.gpu_batch)
    with torch.inference_mode(), torch.autocast(device.type, dtype=torch.bfloat16):
        for _ in range(3):
            model(x)
        _synced(device)
        t0 = time.perf_counter()
        for _ in range(steps):
            model(x)
        _synced(device)
    return steps * args.gpu_batch / (time.perf_counter() - t0)


def gpu_loader_alone(args: argparse.Namespace, folder: str, device: Any) -> tuple[float, str]:
    """Images/s of the engine's Loader into the device's memory, and how it got there."""
    import inspect

    from dask_ddp.data import ImageFolder, Loader
    from dask_ddp.data import transforms as T

    resize, crop = gpu_sizes(args)
    tf = T.Compose([T.Resize(resize), T.CenterCrop(crop), T.ToTensor()])
    staged = "device" in inspect.signature(Loader).parameters
    options: dict[str, Any] = ({"device": str(device), "channels_last": True} if staged
                               else {"pin_memory": device.type == "cuda"})
    loader = Loader(ImageFolder(folder), args.gpu_batch, transform=tf, shuffle=False, rank=0,
                    world_size=1, **options)
    n = 0
    try:
        t0 = time.perf_counter()
        for x, _ in loader:
            if x.device != device:
                x = x.to(device, non_blocking=True)
            n += len(x)
        _synced(device)
        rate = n / (time.perf_counter() - t0)
    finally:
        loader.close()
    return rate, "Loader(device=)" if staged else "pinned + .to(non_blocking)"


def gpu_dataloader(args: argparse.Namespace, folder: str, device: Any) -> float:
    """Images/s of the hand-written loop: torchvision ``ImageFolder`` (PIL) in a
    ``DataLoader``, the bf16 channels_last model, each batch's outputs copied back."""
    import torch
    import torchvision
    from torch.utils.data import DataLoader, Subset
    from torchvision import transforms as tv

    resize, crop = gpu_sizes(args)
    tf = tv.Compose([tv.Resize(resize), tv.CenterCrop(crop), tv.ToTensor()])
    ds = torchvision.datasets.ImageFolder(folder, transform=tf)
    model = _fast_model(args, device)

    def loop(data: Any) -> int:
        loader = DataLoader(data, batch_size=args.gpu_batch, shuffle=False,
                            num_workers=args.dataloader_workers,
                            pin_memory=device.type == "cuda")
        n = 0
        with torch.inference_mode(), torch.autocast(device.type, dtype=torch.bfloat16):
            for x, _ in loader:
                x = x.to(device, non_blocking=True).contiguous(memory_format=torch.channels_last)
                n += len(model(x).float().cpu())
        return n

    loop(Subset(ds, range(min(len(ds), 2 * args.gpu_batch))))  # warm: cuDNN's choice
    t0 = time.perf_counter()
    n = loop(ds)
    return n / (time.perf_counter() - t0)


def gpu_predict(args: argparse.Namespace, folder: str, device: Any) -> float:
    """Images/s of ``dask_ddp.predict`` in bf16 + channels_last on a LocalCluster of one
    worker x 1 thread, after an untimed warm call over one partition."""
    from distributed import Client, LocalCluster, wait
    from torch.utils.data import Subset

    import dask_ddp
    from dask_ddp.data import ImageFolder
    from dask_ddp.data import transforms as T

    resize, crop = gpu_sizes(args)
    tf = T.Compose([T.Resize(resize), T.CenterCrop(crop), T.ToTensor()])
    ds = ImageFolder(folder)
    options = {"transform": tf, "batch_size": args.gpu_batch, "precision": "bf16",
               "channels_last": True, "partition_size": args.gpu_partition,
               "device": str(device)}
    build = GpuModel(args.gpu_model)
    with LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        warm = Subset(ds, range(min(len(ds), args.gpu_partition)))
        wait(client.persist(dask_ddp.predict(build, warm, **options)))
        t0 = time.perf_counter()
        # Persisted on the worker, as the CPU rows are: the client's gather is not predict's.
        done = client.persist(dask_ddp.predict(build, ds, **options))
        wait(done)
        rate = len(ds) / (time.perf_counter() - t0)
        del done
        return rate


def bench_gpu(args: argparse.Namespace) -> None:
    """The GPU rows (a-d of the module's notes) and their ratios."""
    import torch

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    rows = [r for r in GPU_ROWS if r in args.gpu_rows]
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    common = {"device": where, "model": args.gpu_model, "batch": args.gpu_batch,
              "images": args.gpu_images}
    got: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = gpu_photos(args, tmp) if set(rows) - {"model"} else ""
        for row in rows:
            if row == "model":
                got[row] = gpu_model_alone(args, device)
                extra = {}
            elif row == "loader":
                got[row], how = gpu_loader_alone(args, folder, device)
                extra = {"how": how}
            elif row == "dataloader":
                got[row] = gpu_dataloader(args, folder, device)
                extra = {"workers": args.dataloader_workers}
            else:
                got[row] = gpu_predict(args, folder, device)
                extra = {"partition": args.gpu_partition}
            logger.info("gpu %s (%s, %s, bf16 + channels_last, batch %d): %.0f images/s", row,
                        where, args.gpu_model, args.gpu_batch, got[row])
            record(f"gpu/{row}", got[row], "images/s", **common, **extra)
    if "predict" in got:
        ours = got["predict"]
        parts = [got[r] for r in ("model", "loader") if r in got]
        for name, base in (("model", got.get("model")), ("slower_part", min(parts or [0])),
                           ("dataloader", got.get("dataloader"))):
            if base:
                logger.info("gpu: predict / %s = %.2fx", name, ours / base)
                record(f"gpu/predict_over_{name}", ours / base, "ratio", **common)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--cols", type=int, default=32)
    p.add_argument("--parts", type=int, default=16)
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--lookup-rows", type=int, default=500_000,
                   help="rows for the lookup model (0: skip it)")
    p.add_argument("--images", type=int, default=4000)
    p.add_argument("--image-partition", type=int, default=0,
                   help="images per partition (0: a quarter of a worker's share)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--resnet", action="store_true")
    p.add_argument("--no-ray", dest="ray", action="store_false")
    p.add_argument("--quick", action="store_true",
                   help="tiny workloads: proves the script runs (figures mean nothing)")
    p.add_argument("--json", metavar="PATH", help="write every figure here as JSON")
    gpu = p.add_argument_group("GPU rows")
    gpu.add_argument("--gpu", dest="gpu", action="store_true", default=None,
                     help="run only the GPU rows (default: after the CPU rows if CUDA is here, "
                     "or with --quick)")
    gpu.add_argument("--no-gpu", dest="gpu", action="store_false", help="skip the GPU rows")
    gpu.add_argument("--gpu-rows", default=",".join(GPU_ROWS),
                     help=f"comma-separated, of {','.join(GPU_ROWS)}")
    gpu.add_argument("--gpu-images", type=int, default=32_768)
    gpu.add_argument("--gpu-batch", type=int, default=256)
    gpu.add_argument("--gpu-partition", type=int, default=2048)
    gpu.add_argument("--gpu-model", default="resnet50", choices=("resnet50", "resnet18", "cnn"))
    gpu.add_argument("--dataloader-workers", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    gpu.add_argument("--photos", metavar="DIR", help="keep the GPU rows' JPEGs here")
    gpu.add_argument("--device", help="the GPU rows' device (default: cuda if present, else cpu)")
    args = p.parse_args()
    unknown = set(args.gpu_rows.split(",")) - set(GPU_ROWS)
    if unknown:
        p.error(f"--gpu-rows: unknown {sorted(unknown)}; choose from {list(GPU_ROWS)}")
    args.gpu_rows = args.gpu_rows.split(",")
    if args.quick:
        args.rows, args.parts, args.batch, args.images = 20_000, 4, 1024, 40
        args.lookup_rows, args.repeat, args.ray, args.resnet = 0, 1, False, False
        args.gpu_images, args.gpu_batch, args.gpu_partition = 64, 16, 32
        args.gpu_model, args.dataloader_workers = "cnn", 1
    return args


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    import torch
    from distributed import Client, LocalCluster

    from images import file_putter, write_folder

    benchenv.log_load_around_run(logger)
    load_at_start = benchenv.load_average()
    # --quick proves every row runs: the GPU rows too, on the CPU where CUDA is missing.
    gpu = (args.quick or torch.cuda.is_available()) if args.gpu is None else args.gpu
    if args.gpu is not True:
        with tempfile.TemporaryDirectory() as tmp, \
                LocalCluster(n_workers=args.workers, threads_per_worker=1,
                             dashboard_address=":0") as cluster, Client(cluster) as client:
            bench_table(client, args)
            write_folder(file_putter(tmp), [f"c{i}" for i in range(10)], args.images // 10,
                         sizes=((160, 120),))
            bench_images(client, args, tmp, resnet=False)
            if args.resnet:
                bench_images(client, args, tmp, resnet=True)
            if args.lookup_rows:  # last: the naive map's copies of it would count in the RSS
                bench_lookup(client, args)
    if gpu:
        bench_gpu(args)
    if args.json:
        import platform

        with open(args.json, "w") as f:
            json.dump({"rows": RESULTS, "machine": f"{platform.node()} {platform.machine()}, "
                       f"{os.cpu_count()} CPUs", "load_at_start": load_at_start,
                       "load_at_end": benchenv.load_average(), "args": vars(args)}, f, indent=1)
        logger.info("figures written to %s", args.json)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "ray":
        ray_main(json.loads(sys.argv[2]))
    else:
        main()
