"""Tables: Loader(table) rows/s against the in-memory floor, a DataLoader over a map-style
dataset, Ray Train + Ray Data, and pyarrow's Parquet reader, all in the same run.

Workload (the issue's, sizes by flag): ROWS rows x COLS float32 columns + an int64 label in
PARTS persisted partitions on a LocalCluster of 2 workers, 2 ranks, batch BATCH,
``shuffle=True``, (x, y) batches. Every figure is rows/s over both ranks (the slower
rank's epoch time), best of --epochs epochs after the first:

1. dask-ddp ``Loader(table, features=..., label="y")`` in a ``dask_ddp.submit`` job, three
   ways: with its default cache (the partitions kept once per host after their first read:
   the partitions fetched, the cache files' size and the ranks' PSS are printed),
   that run's first epoch (every read included), and ``cache=False`` (every epoch read
   window by window, as for a table larger than the cache); the time to the first batch
   (Loader made -> first batch) on persisted data;
2. the in-memory floors, in the same rank process: the rank's rows already one tensor,
   batches by indexing with the epoch's permutation (``x[perm]``) and by
   ``torch.index_select`` of the same rows, the gather's floor (target: 1 >= 0.8x it);
3. ``DataLoader`` over a map-style dataset of the rows (``DistributedSampler``, default
   collate), under torchrun spawned from the clean environment (target: 1 >= 5x 3);
4. Ray Train ``TorchTrainer(datasets=...)`` + ``iter_torch_batches`` over
   ``ray.data.from_pandas`` of the same partitions, block order randomised each epoch
   (target: 1 >= 3x 4); skipped with a note when ``ray[train]`` is not installed;
5. a skewed placement (90% of the partitions on one worker), shuffle=True: exact row
   counts on both ranks, no hang;
6. Parquet (--parquet): the same rows in PARTS row groups of files, read by
   ``Table.from_parquet`` in the ranks (file://, and s3:// from nginx on loopback with
   SigV4-signed requests) the three ways of 1., against pyarrow's own reader
   (``ParquetFile.read_row_group`` of local files, every epoch) in torchrun ranks.

Run:  python benchmarks/bench_tables.py [--rows 2000000] [--cols 32] [--parts 16]
      [--batch 1024] [--epochs 3] [--no-ray] [--parquet]
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
HERE = os.path.dirname(os.path.abspath(__file__))

logger = logging.getLogger("bench_tables")


# ---- data -----------------------------------------------------------------------------------
def make_part(seed: int, part: int, rows: int, cols: int) -> Any:
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng([seed, part])
    frame = pd.DataFrame(rng.standard_normal((rows, cols), dtype=np.float32),
                         columns=[f"f{i}" for i in range(cols)])
    frame["y"] = rng.integers(0, 10, rows, dtype=np.int64)
    return frame


def _features(cols: int) -> list[str]:
    return [f"f{i}" for i in range(cols)]


# ---- rank-side functions ----------------------------------------------------------------------
def _epochs_best(times: list[float]) -> float:
    return min(times[1:]) if len(times) > 1 else times[0]


def ours_rank(table: Any, cols: int, batch: int, epochs: int, cache: bool | None = None
              ) -> dict[str, Any]:
    """dask-ddp's Loader over the table, then the in-memory floor in the same process."""
    import torch

    from dask_ddp.data import Loader

    t0 = time.perf_counter()
    loader = Loader(table, batch_size=batch, shuffle=True, seed=0, features=_features(cols),
                    label="y", cache=cache)
    first = None
    times, rows = [], 0
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        start = time.perf_counter()
        rows = 0
        for _x, y in loader:
            if first is None:
                first = time.perf_counter() - t0
            rows += len(y)
        times.append(time.perf_counter() - start)
        getattr(loader, "_cancel_early", lambda: None)()  # each epoch its own work (bench_loader)
    # The floor: this rank's rows already one tensor, batches by permuted indexing.
    n = rows
    xs = torch.randn(n, cols)
    ys = torch.randint(0, 10, (n,))

    def epochs_of(take: Any) -> list[float]:
        """Each epoch's seconds to cut the permuted rows into batches with ``take``."""
        spent = []
        for epoch in range(epochs):
            g = torch.Generator().manual_seed(epoch)
            start = time.perf_counter()
            perm = torch.randperm(n, generator=g)
            for i in range(0, n, batch):
                take(perm[i:i + batch])
            spent.append(time.perf_counter() - start)
        return spent

    floor = epochs_of(lambda idx: (xs[idx], ys[idx]))
    # The gather floor: the same permuted rows by torch.index_select (a row-copy kernel).
    select = epochs_of(lambda idx: (torch.index_select(xs, 0, idx),
                                    torch.index_select(ys, 0, idx)))
    import psutil

    # The cache's memory: partitions read from the source by this rank, the files of the
    # host's cache (one copy per host), and this rank's share of its pages (PSS).
    reads = loader._source.reads
    host = reads.host
    files = sum(os.path.getsize(os.path.join(host.directory, f))
                for f in os.listdir(host.directory) if f.endswith(".rec")) if host else 0
    return {"rows": rows, "first_batch_s": first, "epoch_s": times, "floor_epoch_s": floor,
            "select_epoch_s": select, "fetched": reads.fetched, "host_files": files,
            "pss": psutil.Process().memory_full_info().pss}


def count_rank(table: Any, batch: int) -> dict[str, Any]:
    """Rows and batches each rank reads in one epoch (the skewed placement)."""
    from dask_ddp.data import Loader

    loader = Loader(table, batch_size=batch, shuffle=True, seed=0)
    start = time.perf_counter()
    rows = batches = 0
    for b in loader:
        rows += len(next(iter(b.values())))
        batches += 1
    return {"rows": rows, "batches": batches, "epoch_s": time.perf_counter() - start}


def dataloader_rank(rows: int, cols: int, batch: int, epochs: int) -> dict[str, Any]:
    """A DataLoader over a map-style dataset of the rows (numpy rows, default collate)."""
    import numpy as np
    import torch
    from torch.utils.data import DataLoader, Dataset, DistributedSampler

    class Rows(Dataset[tuple[Any, Any]]):
        def __init__(self) -> None:
            rng = np.random.default_rng(0)
            self.x = rng.standard_normal((rows, cols), dtype=np.float32)
            self.y = rng.integers(0, 10, rows, dtype=np.int64)

        def __len__(self) -> int:
            return rows

        def __getitem__(self, i: int) -> tuple[Any, Any]:
            return torch.from_numpy(self.x[i]), int(self.y[i])

    ds = Rows()
    sampler = DistributedSampler(ds, shuffle=True, seed=0)
    loader = DataLoader(ds, batch_size=batch, sampler=sampler)
    times, n = [], 0
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        start = time.perf_counter()
        n = 0
        for _, y in loader:
            n += len(y)
        times.append(time.perf_counter() - start)
    return {"rows": n, "epoch_s": times}


def pyarrow_rank(files: list[str], cols: int, batch: int, epochs: int) -> dict[str, Any]:
    """pyarrow's own reader: this rank's share of the row groups, read and batched."""
    import numpy as np
    import pyarrow.parquet as pq
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    groups = [(f, g) for f in files for g in range(pq.ParquetFile(f).metadata.num_row_groups)]
    mine = groups[rank::world]
    names = [*_features(cols), "y"]
    times, n = [], 0
    for epoch in range(epochs):
        start = time.perf_counter()
        n = 0
        rng = np.random.default_rng([0, epoch])
        for f, g in [mine[i] for i in rng.permutation(len(mine))]:
            t = pq.ParquetFile(f).read_row_group(g, columns=names)
            x = torch.from_numpy(np.stack([t.column(c).to_numpy() for c in names[:-1]], 1))
            y = torch.from_numpy(t.column("y").to_numpy())
            perm = torch.from_numpy(rng.permutation(len(y)))
            for i in range(0, len(y), batch):
                idx = perm[i:i + batch]
                xb, yb = x[idx], y[idx]
                n += len(yb)
                del xb
        times.append(time.perf_counter() - start)
    return {"rows": n, "epoch_s": times}


# ---- Ray Train + Ray Data (its own process, clean environment) -------------------------------
def ray_main(rows: int, cols: int, parts: int, batch: int, epochs: int, out: str) -> None:
    import ray
    import ray.data
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    def loop(config: dict[str, Any]) -> None:
        import ray.train

        shard = ray.train.get_dataset_shard("train")
        times, n = [], 0
        for _ in range(config["epochs"]):
            start = time.perf_counter()
            n = 0
            for b in shard.iter_torch_batches(batch_size=config["batch"]):
                n += len(b["y"])
            times.append(time.perf_counter() - start)
        rank = ray.train.get_context().get_world_rank()
        with open(os.path.join(config["out"], f"rank{rank}.json"), "w") as f:
            json.dump({"rows": n, "epoch_s": times}, f)

    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False)
    try:
        per = rows // parts
        ds = ray.data.from_pandas([make_part(0, p, per, cols) for p in range(parts)])
        ds = ds.randomize_block_order()
        trainer = TorchTrainer(
            loop, train_loop_config={"epochs": epochs, "batch": batch, "out": out},
            datasets={"train": ds}, torch_config=TorchConfig(backend="gloo"),
            scaling_config=ScalingConfig(num_workers=2, use_gpu=False,
                                         resources_per_worker={"CPU": 1}),
            run_config=RunConfig(storage_path=os.path.join(out, "ray"), name="bench"))
        trainer.fit()
    finally:
        ray.shutdown()


def run_ray(a: argparse.Namespace) -> list[dict[str, Any]] | None:
    import peers

    if a.no_ray:
        logger.warning("Ray Train + Ray Data: skipped (--no-ray)")
        return None
    if not peers.ray_available():
        logger.warning("Ray Train + Ray Data: skipped, ray[train] is not installed")
        return None
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([sys.executable, __file__, "ray", json.dumps(
            [a.rows, a.cols, a.parts, a.batch, a.epochs, out])], check=True,
            env=peers._env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(2)]


# ---- the run ----------------------------------------------------------------------------------
def rate(results: list[dict[str, Any]], key: str = "epoch_s") -> float:
    """Rows/s over the ranks: all rows over the slower rank's best epoch."""
    slow = max(_epochs_best(r[key]) for r in results)
    return sum(r["rows"] for r in results) / slow


def first_epoch_rate(results: list[dict[str, Any]]) -> float:
    """Rows/s of the first epoch (every read included: the cache is empty)."""
    return sum(r["rows"] for r in results) / max(r["epoch_s"][0] for r in results)


def run_ours(client: Any, data: Any, a: argparse.Namespace, name: str,
             **submit: Any) -> dict[str, Any]:
    """dask-ddp's figures over ``data``: cached (the default for a table that fits), its
    first epoch, and without the cache (every epoch read window by window)."""
    import dask_ddp

    out: dict[str, Any] = {}
    for cache in (None, False):
        res = dask_ddp.submit(client, ours_rank, data, a.cols, a.batch, a.epochs, cache,
                              progress=False, **submit).result(timeout=1800)
        if cache is None:
            out[f"{name}_rows_s"] = rate(res)
            out[f"{name}_first_epoch_rows_s"] = first_epoch_rate(res)
            out[f"{name}_first_batch_s"] = max(r["first_batch_s"] for r in res)
            out[f"{name}_floor_rows_s"] = rate(res, "floor_epoch_s")
            out[f"{name}_select_rows_s"] = rate(res, "select_epoch_s")
            # Partitions read from the source by the host's ranks (once each with the
            # host cache), the cache files' MB on the host, and the ranks' PSS summed.
            out[f"{name}_partitions_fetched"] = sum(r["fetched"] for r in res)
            out[f"{name}_host_cache_mb"] = max(r["host_files"] for r in res) / 2**20
            out[f"{name}_ranks_pss_mb"] = sum(r["pss"] for r in res) / 2**20
        else:
            out[f"{name}_nocache_rows_s"] = rate(res)
    return out


def workload_arguments(doc: str, epochs: int) -> argparse.ArgumentParser:
    """The table workload's flags (rows, columns, partitions, epochs)."""
    p = argparse.ArgumentParser(description=doc.split("\n", 1)[0])
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--cols", type=int, default=32)
    p.add_argument("--parts", type=int, default=16)
    p.add_argument("--epochs", type=int, default=epochs)
    return p


def start_logs(log: logging.Logger) -> None:
    """INFO logs of the benchmark (the cluster's and launcher's quieter), and the load
    average at the start and the end."""
    logging.basicConfig(level=logging.INFO, format="%(name)s %(message)s")
    for name in ("distributed", "dask_ddp._launch", "dask_ddp.data.table.table"):
        logging.getLogger(name).setLevel(logging.WARNING)
    benchenv.log_load_around_run(log)


def main() -> None:
    p = workload_arguments(__doc__, 3)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--no-ray", action="store_true")
    p.add_argument("--parquet", action="store_true")
    a = p.parse_args()
    start_logs(logger)
    import dask
    import dask.dataframe as dd
    import peers
    from distributed import Client, LocalCluster, wait

    import dask_ddp

    figures: dict[str, Any] = {"rows": a.rows, "cols": a.cols, "parts": a.parts,
                               "batch": a.batch}
    per = a.rows // a.parts
    meta = make_part(0, 0, 0, a.cols)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        ddf = dd.from_delayed([dask.delayed(make_part)(0, i, per, a.cols)
                               for i in range(a.parts)], meta=meta, verify_meta=False)
        ddf = ddf.persist()
        wait(ddf)
        ours = run_ours(client, ddf, a, "ours")
        figures.update(ours)
        figures["floor_rows_s"] = figures.pop("ours_floor_rows_s")
        figures["index_select_rows_s"] = figures.pop("ours_select_rows_s")
        figures["first_batch_s"] = figures.pop("ours_first_batch_s")
        # A skewed placement: 90% of the partitions on one worker.
        workers = sorted(client.scheduler_info()["workers"])
        cut = max(1, round(a.parts * 0.9))
        skew = dd.concat([client.persist(ddf.partitions[:cut], workers=[workers[0]]),
                          client.persist(ddf.partitions[cut:], workers=[workers[1]])]).persist()
        wait(skew)
        counted = dask_ddp.submit(client, count_rank, skew, a.batch,
                                  progress=False).result(timeout=1800)
        rows_each = -(-per * a.parts // 2)
        assert [c["rows"] for c in counted] == [rows_each, rows_each], counted
        figures["skewed_rows_s"] = sum(c["rows"] for c in counted) / max(
            c["epoch_s"] for c in counted)
        if a.parquet:
            figures.update(bench_parquet(client, ddf, a))
    _, dl = peers.run_torchrun("bench_tables:dataloader_rank",
                               [per * a.parts, a.cols, a.batch, a.epochs])
    figures["dataloader_rows_s"] = rate(dl)
    ray_results = run_ray(a)
    if ray_results is not None:
        figures["ray_rows_s"] = rate(ray_results)
    for mode in ("", "_first_epoch", "_nocache"):
        ours_rate = figures[f"ours{mode}_rows_s"]
        figures[f"vs_floor{mode}"] = ours_rate / figures["floor_rows_s"]
        figures[f"vs_index_select{mode}"] = ours_rate / figures["index_select_rows_s"]
        figures[f"vs_dataloader{mode}"] = ours_rate / figures["dataloader_rows_s"]
        if "ray_rows_s" in figures:
            figures[f"vs_ray{mode}"] = ours_rate / figures["ray_rows_s"]
    figures["load"] = benchenv.load_average()
    for k, v in figures.items():
        logger.info("%-22s %s", k, f"{v:,.3f}" if isinstance(v, float) else v)
    print(json.dumps(figures))  # noqa: T201 - the benchmark's result line


def bench_parquet(client: Any, ddf: Any, a: argparse.Namespace) -> dict[str, Any]:
    import peers
    import pyarrow as pa
    import pyarrow.parquet as pq

    import dask_ddp
    from storage_servers import start_nginx

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as root:
        files = []
        for i in range(a.parts):
            frame = ddf.partitions[i].compute()
            path = os.path.join(root, f"part-{i:03d}.parquet")
            pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path)
            files.append(path)
        table = dask_ddp.data.Table.from_parquet([f"file://{f}" for f in files])
        out.update(run_ours(client, table, a, "parquet_file"))
        # nginx serving the files as bucket "bench" on loopback; the ranks sign every
        # request (SigV4, dummy credentials nginx does not check), as from S3.
        os.makedirs(os.path.join(root, "bench"))
        os.symlink(root, os.path.join(root, "bench", "tables"))
        creds = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
                 "AWS_REGION": "us-east-1"}
        for var, value in creds.items():  # the footers are read here, signed too
            os.environ.setdefault(var, value)
        with start_nginx(Path(root)) as nginx:
            table = dask_ddp.data.Table.from_parquet(
                [f"s3://bench/tables/{os.path.basename(f)}" for f in files],
                endpoint_url=nginx.url, region="us-east-1")
            out.update(run_ours(client, table, a, "parquet_s3", env=creds))
        _, pa_res = peers.run_torchrun("bench_tables:pyarrow_rank",
                                       [files, a.cols, a.batch, a.epochs])
        out["pyarrow_rows_s"] = rate(pa_res)
        for where in ("file", "s3"):
            for mode in ("", "_first_epoch", "_nocache"):
                out[f"parquet_{where}{mode}_vs_pyarrow"] = \
                    out[f"parquet_{where}{mode}_rows_s"] / out["pyarrow_rows_s"]
    return out


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "ray":
        ray_main(*json.loads(sys.argv[2]))
    else:
        main()
