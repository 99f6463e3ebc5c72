"""Sharded checkpoint save/load: dask-ddp's DCP writer vs FileSystemWriter vs s3torchconnector.

Two gloo ranks (processes) each hold half of a ``--size-mb`` state: DTensors sharded on
dim 0 over a CPU device mesh, as FSDP2 holds its parameters. Each case saves the state
with ``dcp.save`` and loads it back with ``dcp.load``, timed between barriers (the time
of the slowest rank), then reports the blocking time of ``dcp.async_save`` (until it
returns and training could go on) against the whole async save:

- files: ``dask_ddp.checkpoint.StorageWriter/Reader`` on ``file://`` vs
  ``torch.distributed.checkpoint.FileSystemWriter/Reader`` (same folder type, same disk);
- S3 (moto's server on 127.0.0.1, or ``--s3-endpoint`` for another S3 server on
  loopback): dask-ddp's writer/reader vs ``s3torchconnector.dcp.S3StorageWriter/Reader``
  (optional: skipped with a note when not installed; ``make bench-deps``).

Run from the repository root::

    .venv/bin/python benchmarks/bench_dcp.py                   # 500 MB, files and moto S3
    .venv/bin/python benchmarks/bench_dcp.py --size-mb 20 --repeats 1   # a quick check

Prints seconds and MB/s per case and the ratios dask-ddp / baseline (> 1: faster).
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import benchenv  # first: the clean environment, before distributed is imported

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the server helpers shared with the tests
sys.path.insert(0, str(ROOT / "src"))

logger = logging.getLogger("bench_dcp")
BUCKET = "bench-dcp"
TENSORS = 16  # the state is this many equal DTensors


def report(line: str) -> None:
    """One line of results (the logging handler set in main() writes it to stdout)."""
    logger.info(line)


# -- rank side ---------------------------------------------------------------------------


def make_state(size_mb: float, fill: float) -> dict[str, Any]:
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    world = int(os.environ["WORLD_SIZE"])
    mesh = init_device_mesh("cpu", (world,))
    rows = max(world, int(size_mb * 2**20 / 4 / TENSORS / 1024) // world * world)
    local = rows // world
    return {
        f"layer{i}.weight": DTensor.from_local(
            torch.full((local, 1024), fill + i, dtype=torch.float32), mesh, [Shard(0)]
        )
        for i in range(TENSORS)
    }


def storage_for(side: str, kind: str, url: str, endpoint: str | None) -> Any:
    """The ``side`` ("Writer" or "Reader") of a case's storage ``kind``."""
    import torch.distributed.checkpoint as dcp

    from dask_ddp import checkpoint

    if kind == "ddp":
        options = {"endpoint_url": endpoint} if endpoint else {}
        return getattr(checkpoint, f"Storage{side}")(url, **options)
    if kind == "fs":
        return getattr(dcp, f"FileSystem{side}")(url.removeprefix("file://"))
    return _s3tc(f"S3Storage{side}", url, endpoint)


def writer_for(kind: str, url: str, endpoint: str | None) -> Any:
    return storage_for("Writer", kind, url, endpoint)


def reader_for(kind: str, url: str, endpoint: str | None) -> Any:
    return storage_for("Reader", kind, url, endpoint)


def _s3tc(cls_name: str, url: str, endpoint: str | None) -> Any:
    from s3torchconnector import S3ClientConfig
    from s3torchconnector import dcp as s3dcp
    from s3torchconnector._s3client import S3Client

    region = os.environ.get("AWS_REGION", "us-east-1")
    obj = getattr(s3dcp, cls_name)(region=region, path=url)
    # Its file system builds a client without an endpoint: give it one for the local
    # server (path-style addressing, as the server needs).
    obj.fs._client = S3Client(region=region, endpoint=endpoint,
                              s3client_config=S3ClientConfig(force_path_style=True))
    return obj


def timed_collective(fn: Any) -> float:
    """Seconds of ``fn()`` on the slowest rank (barriers around it)."""
    import torch
    import torch.distributed as dist

    dist.barrier()
    t0 = time.perf_counter()
    fn()
    elapsed = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return float(elapsed.item())


def rank_main(spec: dict[str, Any]) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    state = make_state(spec["size_mb"], 1.0)
    results: list[dict[str, Any]] = []
    for case in spec["cases"]:
        results += run_case(case, state, spec)
    if dist.get_rank() == 0:
        sys.stdout.write("RESULTS " + json.dumps(results) + "\n")
    dist.barrier()
    dist.destroy_process_group()


def run_case(case: dict[str, Any], state: dict[str, Any],
             spec: dict[str, Any]) -> list[dict[str, Any]]:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    kind, url, endpoint = case["kind"], case["url"], case.get("endpoint")
    # Untimed warm-up (imports, connections, DCP's first-call costs) on a small state.
    small = make_state(1.0, 1.0)
    dcp.save(small, storage_writer=writer_for(kind, f"{url}/warmup", endpoint))
    dcp.load(small, storage_reader=reader_for(kind, f"{url}/warmup", endpoint))
    results = []
    for rep in range(spec["repeats"]):
        target = f"{url}/rep{rep}"
        writer = writer_for(kind, target, endpoint)
        save_s = timed_collective(functools.partial(dcp.save, state, storage_writer=writer))
        loaded = make_state(spec["size_mb"], 0.0)
        reader = reader_for(kind, target, endpoint)
        load_s = timed_collective(functools.partial(dcp.load, loaded, storage_reader=reader))
        for k, v in state.items():  # the load must be right to count
            assert torch.equal(v.to_local(), loaded[k].to_local()), k
        results.append({"case": case["name"], "op": "save", "s": save_s})
        results.append({"case": case["name"], "op": "load", "s": load_s})
    if case.get("async"):
        group = dist.new_group(backend="gloo")
        blocked = torch.tensor([0.0], dtype=torch.float64)
        writer = writer_for(kind, f"{url}/async", endpoint)
        total = timed_collective(lambda: _async_once(state, writer, group, blocked))
        dist.all_reduce(blocked, op=dist.ReduceOp.MAX)
        results.append({"case": case["name"], "op": "async-blocked", "s": float(blocked.item())})
        results.append({"case": case["name"], "op": "async-total", "s": total})
    return results


def _async_once(state: Any, writer: Any, group: Any, blocked: Any) -> None:
    """One ``dcp.async_save``; ``blocked[0]``: the seconds until it returned."""
    import torch.distributed.checkpoint as dcp

    t0 = time.perf_counter()
    fut = dcp.async_save(state, storage_writer=writer, process_group=group)
    blocked[0] = time.perf_counter() - t0
    fut.result()


# -- driver ------------------------------------------------------------------------------


def run_ranks(spec: dict[str, Any], ranks: int, env: dict[str, str]) -> list[dict[str, Any]]:
    from storage_servers import free_port

    base = dict(os.environ, **env, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                WORLD_SIZE=str(ranks), PYTHONPATH=str(ROOT / "src"))
    procs = [
        subprocess.Popen([sys.executable, __file__, "--rank-spec", json.dumps(spec)],
                         env={**base, "RANK": str(r), "LOCAL_RANK": str(r)},
                         stdout=subprocess.PIPE, text=True)
        for r in range(ranks)
    ]
    outs = [p.communicate()[0] for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError(f"a rank failed: exit codes {[p.returncode for p in procs]}")
    for line in outs[0].splitlines():
        if line.startswith("RESULTS "):
            return json.loads(line[len("RESULTS "):])  # type: ignore[no-any-return]
    raise RuntimeError("rank 0 printed no results")


def summarise(results: list[dict[str, Any]], size_mb: float, pairs: list[tuple[str, str]]) -> None:
    best: dict[tuple[str, str], float] = {}
    for r in results:
        key = (r["case"], r["op"])
        best[key] = min(best.get(key, float("inf")), r["s"])
    for (case, op), s in sorted(best.items()):
        rate = f"{size_mb / s:8.1f} MB/s" if op in ("save", "load", "async-total") else ""
        report(f"{case:28s} {op:14s} {s:8.3f} s {rate}")
    for ours, base in pairs:
        for op in ("save", "load"):
            if (ours, op) in best and (base, op) in best:
                report(f"ratio {op}: {ours} / {base} = {best[(base, op)] / best[(ours, op)]:.2f}x")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size-mb", type=float, default=500.0, help="the whole state, all ranks")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3, help="best of this many")
    p.add_argument("--dir", help="folder for the file cases (default: a temporary one)")
    p.add_argument("--skip-s3", action="store_true")
    p.add_argument("--s3-endpoint", help="an S3 server to use instead of starting moto "
                   f"(bucket {BUCKET} must exist; AWS_* credentials from the environment)")
    p.add_argument("--rank-spec", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank_spec:
        rank_main(json.loads(args.rank_spec))
        return
    logging.basicConfig(level=logging.WARNING)
    benchenv.log_load_around_run(logger)
    out = logging.StreamHandler(sys.stdout)
    logger.addHandler(out)
    logger.setLevel(logging.INFO)
    logger.propagate = False

    report(f"== {args.size_mb:.0f} MB sharded state, {args.ranks} ranks, best of "
           f"{args.repeats} ==")
    folder = Path(args.dir or tempfile.mkdtemp(prefix="bench-dcp-"))
    try:
        spec = {"size_mb": args.size_mb, "repeats": args.repeats, "cases": [
            {"name": "files dask-ddp", "kind": "ddp", "url": (folder / "ddp").as_uri(),
             "async": True},
            {"name": "files FileSystemWriter", "kind": "fs", "url": (folder / "fs").as_uri(),
             "async": True},
        ]}
        summarise(run_ranks(spec, args.ranks, {}), args.size_mb,
                  [("files dask-ddp", "files FileSystemWriter")])
    finally:
        if not args.dir:
            shutil.rmtree(folder, ignore_errors=True)
    if not args.skip_s3:
        bench_s3(args)


def bench_s3(args: argparse.Namespace) -> None:
    import boto3

    from storage_servers import ServerProcess, free_port

    try:
        import s3torchconnector  # noqa: F401

        have_s3tc = True
    except ImportError:
        have_s3tc = False
        report("note: s3torchconnector is not installed: its S3 case is skipped "
               "(make bench-deps)")
    env = {"AWS_ACCESS_KEY_ID": os.environ.get("AWS_ACCESS_KEY_ID", "testing"),
           "AWS_SECRET_ACCESS_KEY": os.environ.get("AWS_SECRET_ACCESS_KEY", "testing"),
           "AWS_REGION": os.environ.get("AWS_REGION", "us-east-1")}
    server = None
    endpoint = args.s3_endpoint
    if endpoint is None:
        port = free_port()
        server = ServerProcess(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], port)
        endpoint = server.url
        boto3.client("s3", endpoint_url=endpoint, region_name=env["AWS_REGION"],
                     aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                     aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"]).create_bucket(
                         Bucket=BUCKET)
    try:
        report(f"== S3 at {endpoint}{' (moto)' if server else ''} ==")
        cases = [{"name": "s3 dask-ddp", "kind": "ddp", "url": f"s3://{BUCKET}/ddp",
                  "endpoint": endpoint, "async": True}]
        if have_s3tc:
            cases.append({"name": "s3 s3torchconnector", "kind": "s3tc",
                          "url": f"s3://{BUCKET}/s3tc", "endpoint": endpoint})
        spec = {"size_mb": args.size_mb, "repeats": args.repeats, "cases": cases}
        summarise(run_ranks(spec, args.ranks, env), args.size_mb,
                  [("s3 dask-ddp", "s3 s3torchconnector")])
    finally:
        if server is not None:
            server.close()


if __name__ == "__main__":
    main()
