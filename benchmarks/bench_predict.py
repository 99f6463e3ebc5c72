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
2. images: IMAGES JPEGs (160x120) in class folders, a small CNN at 64 px:
   a. ``dask_ddp.predict(ImageFolder(dir), transform=Resize+ToTensor)`` (the engine decodes);
   b. hand-written ``map_partitions`` over the paths with PIL and torchvision transforms
      (target: a >= 1.5x b);
   c. Ray Data: ``read_images(dir, size=, mode="RGB")`` + ``map_batches`` with an actor
      pool of WORKERS actors loading the model once (target: a >= 2x c; reading timed);
   with ``--resnet``, the same with ResNet-18 at 224 px (random weights: a >= 1.0x b, and
   ahead of c).
3. the workers' peak RSS (``ru_maxrss``) after the image runs, against the images' bytes.

Ray runs in a process of its own, spawned from the environment this benchmark started
with (:mod:`benchenv`, captured before dask or distributed was imported: a LocalCluster
writes its workers' settings into the client's environment), on a local Ray of WORKERS
CPUs for the actors (plus WORKERS for ``read_images``' read tasks: a read task and an actor
each take one of Ray's logical CPUs, both stages run at once on the same cores); it is
skipped with a note when ``ray.data`` cannot be imported (``make bench-deps``) or with
``--no-ray``.

Each figure is the best of --repeat runs (samples/s). Run:

    python benchmarks/bench_predict.py [--rows 2000000] [--cols 32] [--parts 16]
        [--batch 4096] [--lookup-rows 500000] [--images 4000] [--workers 2] [--repeat 3]
        [--resnet] [--no-ray]

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
    n, part = len(ds), max(1, len(ds) // (4 * args.workers))
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--cols", type=int, default=32)
    p.add_argument("--parts", type=int, default=16)
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--lookup-rows", type=int, default=500_000,
                   help="rows for the lookup model (0: skip it)")
    p.add_argument("--images", type=int, default=4000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--resnet", action="store_true")
    p.add_argument("--no-ray", dest="ray", action="store_false")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    from distributed import Client, LocalCluster

    from images import file_putter, write_folder

    benchenv.log_load_around_run(logger)
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


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "ray":
        ray_main(json.loads(sys.argv[2]))
    else:
        main()
