"""Object store GET throughput: dask-ddp's batched get vs boto3, s3fs, s3torchconnector.

nginx (our own process, generated configuration) serves N objects as plain files at
path-style ``/bucket/key``; it ignores the SigV4 signature, so all clients can sign as
they normally would and the client, not the server, is what is measured. ``wrk`` on the
same nginx, over the same objects, gives the ceiling. moto's S3 server is measured too
(fewer objects: it is a Python server and its own cost dominates).

Run from the repository root::

    .venv/bin/python benchmarks/bench_store_get.py            # 10,000 x 100 KB
    .venv/bin/python benchmarks/bench_store_get.py --objects 2000 --skip-moto

Prints objects/s and MB/s for each client and the ratios dask-ddp/boto3, dask-ddp/s3fs,
dask-ddp/s3torchconnector (optional: skipped with a note when the package is missing;
S3MapDataset read by a DataLoader with one worker per core) and dask-ddp/wrk.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import benchenv  # first: the clean environment, before distributed is imported

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the server helpers shared with the tests
sys.path.insert(0, str(ROOT / "src"))

from dask_ddp import storage  # noqa: E402
from storage_servers import ServerProcess, free_port, start_nginx  # noqa: E402

logger = logging.getLogger("bench_store_get")
BUCKET = "bench"


def report(line: str) -> None:
    """One line of results (the logging handler set in main() writes it to stdout)."""
    logger.info(line)


def key_of(i: int) -> str:
    return f"train/{i % 100:02d}/{i:06d}.jpg"


def make_objects(root: Path, n: int, size: int) -> list[str]:
    """Write n objects of `size` random-ish bytes under root/BUCKET; return their keys."""
    payload = os.urandom(size + 4096)
    keys = []
    for i in range(n):
        k = key_of(i)
        p = root / BUCKET / k
        p.parent.mkdir(parents=True, exist_ok=True)
        off = i % 4096
        p.write_bytes(payload[off : off + size])
        keys.append(k)
    for d in [root, *root.rglob("*")]:  # nginx workers may run as another user
        if d.is_dir():
            d.chmod(0o755)
    return keys


def timed(label: str, n: int, size: int, fn: Callable[[], int]) -> float:
    """Run fn (returns bytes received) and report objects/s; checks nothing was lost."""
    t0 = time.perf_counter()
    got = fn()
    dt = time.perf_counter() - t0
    if got != n * size:
        raise RuntimeError(f"{label}: received {got} bytes, expected {n * size}")
    rate = n / dt
    report(f"  {label:<34} {rate:>9.0f} objects/s  {got / dt / 1e6:>8.0f} MB/s  ({dt:.2f} s)")
    return rate


def run_ddp(url: str, endpoint: str, keys: list[str], in_flight: int, anon: bool = False) -> int:
    store = storage.open(url, endpoint_url=endpoint, max_in_flight=in_flight, anon=anon)
    return sum(len(data) for _, data in store.get_many(keys))


def client_cpu(label: str, n: int, size: int, fn: Callable[[], int]) -> float:
    """Rate of ``fn`` and this process's CPU time (user + sys) per object while it ran."""
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    got = fn()
    r1, dt = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - t0
    if got != n * size:
        raise RuntimeError(f"{label}: fetched {got} bytes, expected {n * size}")
    user = (r1.ru_utime - r0.ru_utime) / n * 1e6
    sys_ = (r1.ru_stime - r0.ru_stime) / n * 1e6
    report(f"  {label:<34} {n / dt:>9.0f} objects/s  client CPU {user + sys_:.0f} us/object "
           f"(user {user:.0f}, sys {sys_:.0f})")
    return n / dt


def boto3_client(endpoint: str, threads: int) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        config=Config(max_pool_connections=threads, retries={"max_attempts": 3}),
    )


def run_boto3(client: Any, keys: list[str], threads: int) -> int:
    def get(k: str) -> int:
        return len(client.get_object(Bucket=BUCKET, Key=k)["Body"].read())

    with ThreadPoolExecutor(threads) as pool:
        return sum(pool.map(get, keys))


def run_s3fs(endpoint: str, keys: list[str]) -> int:
    import s3fs

    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": endpoint}, skip_instance_cache=True)
    out = fs.cat([f"{BUCKET}/{k}" for k in keys])
    total = sum(len(v) for v in out.values())
    # s3fs keeps an aiobotocore session on its event loop; close it there.
    close = getattr(fs, "close_session", None)
    if close is not None and fs._loop is not None and fs.s3 is not None:
        try:
            close(fs._loop, fs.s3)
        except (RuntimeError, asyncio.CancelledError):  # best effort at teardown
            pass
    return total


def s3tc_dataset(endpoint: str, keys: list[str]) -> Any:
    """AWS's s3torchconnector over the same objects (each item: the object's bytes), or
    None with a note when it is not installed."""
    try:
        from s3torchconnector import S3ClientConfig, S3MapDataset
    except ImportError as e:
        report(f"  s3torchconnector row skipped: it is not installed ({e})")
        return None
    return S3MapDataset.from_objects(
        [f"s3://{BUCKET}/{k}" for k in keys], region="us-east-1", endpoint=endpoint,
        transform=lambda reader: reader.read(),
        s3client_config=S3ClientConfig(force_path_style=True),
    )


def run_s3tc(ds: Any, workers: int) -> int:
    """Every object through a DataLoader(num_workers=workers), as a training job reads."""
    import torch

    dl = torch.utils.data.DataLoader(
        ds, batch_size=64, num_workers=workers, collate_fn=lambda items: sum(map(len, items))
    )
    return sum(dl)


def run_wrk(url: str, n_keys: int, connections: int, seconds: int) -> float:
    """wrk's request rate cycling over the same objects; the server's ceiling."""
    wrk = shutil.which("wrk")
    if wrk is None:
        raise FileNotFoundError("wrk is not installed (Debian package wrk)")
    script = tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False)
    script.write(
        f"""
local i = 0
request = function()
  local k = i % {n_keys}
  i = i + 1
  return wrk.format("GET", string.format("/{BUCKET}/train/%02d/%06d.jpg", k % 100, k))
end
"""
    )
    script.close()
    try:
        out = subprocess.run(
            [wrk, "-t1", f"-c{connections}", f"-d{seconds}s", "-s", script.name, url],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    finally:
        os.unlink(script.name)
    m = re.search(r"Requests/sec:\s*([\d.]+)", out)
    if not m:
        raise RuntimeError(f"could not read wrk's output:\n{out}")
    if "Non-2xx" in out:
        raise RuntimeError(f"wrk saw errors:\n{out}")
    return float(m.group(1))


def bench_nginx(args: argparse.Namespace, data_root: Path) -> dict[str, float]:
    report(f"== nginx: {args.objects} objects x {args.size} bytes, path-style /{BUCKET}/key ==")
    keys = make_objects(data_root, args.objects, args.size)
    rates: dict[str, float] = {}
    with start_nginx(data_root, workers=args.nginx_workers) as nginx:
        ep = nginx.url
        # Warm the page cache and nginx's open-file state once, untimed.
        run_ddp(f"s3://{BUCKET}", ep, keys, args.in_flight)
        # The ceiling is taken before and after the dask-ddp runs, keeping the higher:
        # on a shared machine the available CPU drifts, and this errs against dask-ddp.
        wrk_before = run_wrk(ep, len(keys), args.in_flight, args.wrk_seconds)
        for rep in range(args.repeat):
            tag = f" #{rep + 1}" if args.repeat > 1 else ""
            rates.setdefault("ddp", 0.0)
            r = timed(
                f"dask-ddp get_many ({args.in_flight} in flight){tag}",
                len(keys),
                args.size,
                lambda: run_ddp(f"s3://{BUCKET}", ep, keys, args.in_flight),
            )
            rates["ddp"] = max(rates["ddp"], r)
        wrk_after = run_wrk(ep, len(keys), args.in_flight, args.wrk_seconds)
        report(
            f"  {'wrk -t1 -c' + str(args.in_flight) + ' (ceiling, before/after)':<34} "
            f"{wrk_before:>9.0f} / {wrk_after:.0f} requests/s"
        )
        rates["wrk"] = max(wrk_before, wrk_after)
        # What limits the client: its CPU per object, signed (SigV4, store/s3/sigv4.h) and not.
        n = len(keys)
        client_cpu("dask-ddp signed, CPU probe", n, args.size,
                   lambda: run_ddp(f"s3://{BUCKET}", ep, keys, args.in_flight))
        rates["anon"] = client_cpu("dask-ddp anonymous, CPU probe", n, args.size,
                                   lambda: run_ddp(f"s3://{BUCKET}", ep, keys, args.in_flight,
                                                   anon=True))
        client = boto3_client(ep, args.threads)
        client.get_object(Bucket=BUCKET, Key=keys[0])["Body"].read()
        rates["boto3"] = timed(
            f"boto3 (1 client, {args.threads} threads)",
            len(keys),
            args.size,
            lambda: run_boto3(client, keys, args.threads),
        )
        if not args.skip_s3fs:
            rates["s3fs"] = timed(
                "s3fs cat (asyncio)", len(keys), args.size, lambda: run_s3fs(ep, keys)
            )
        ds = s3tc_dataset(ep, keys)
        if ds is not None:
            workers = os.cpu_count() or 1
            rates["s3tc"] = timed(
                f"s3torchconnector S3MapDataset ({workers} workers)", len(keys), args.size,
                lambda: run_s3tc(ds, workers),
            )
    return rates


def bench_moto(args: argparse.Namespace) -> dict[str, float]:
    report(f"== moto S3 server: {args.moto_objects} objects x {args.size} bytes ==")
    port = free_port()
    rates: dict[str, float] = {}
    with ServerProcess(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], port
    ) as moto:
        client = boto3_client(moto.url, args.threads)
        client.create_bucket(Bucket=BUCKET)
        payload = os.urandom(args.size)
        keys = [key_of(i) for i in range(args.moto_objects)]
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda k: client.put_object(Bucket=BUCKET, Key=k, Body=payload), keys))
        rates["ddp"] = timed(
            f"dask-ddp get_many ({args.in_flight} in flight)",
            len(keys),
            args.size,
            lambda: run_ddp(f"s3://{BUCKET}", moto.url, keys, args.in_flight),
        )
        rates["boto3"] = timed(
            f"boto3 (1 client, {args.threads} threads)",
            len(keys),
            args.size,
            lambda: run_boto3(client, keys, args.threads),
        )
    return rates


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--objects", type=int, default=10_000)
    p.add_argument("--size", type=int, default=100 * 1024)
    p.add_argument("--threads", type=int, default=16, help="boto3 threads")
    p.add_argument("--in-flight", type=int, default=64, help="dask-ddp requests in flight")
    p.add_argument("--repeat", type=int, default=2, help="dask-ddp runs (best is kept)")
    p.add_argument("--nginx-workers", type=int, default=1)
    p.add_argument("--wrk-seconds", type=int, default=5)
    p.add_argument("--moto-objects", type=int, default=1000)
    p.add_argument("--skip-s3fs", action="store_true")
    p.add_argument("--skip-moto", action="store_true")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    benchenv.log_load_around_run(logger)
    out = logging.StreamHandler(sys.stdout)
    out.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(out)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    # SIGTERM unwinds like an exception, so the servers started here are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    # Dummy credentials: nginx ignores signatures, moto accepts any.
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench")
    os.environ["AWS_REGION"] = "us-east-1"
    for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        os.environ.pop(var, None)

    data_root = Path(tempfile.mkdtemp(prefix="ddp-bench-store-"))
    try:
        r = bench_nginx(args, data_root)
    finally:
        shutil.rmtree(data_root, ignore_errors=True)
    line = f"  ratios: dask-ddp/boto3 = {r['ddp'] / r['boto3']:.2f}x"
    if "s3fs" in r:
        line += f", dask-ddp/s3fs = {r['ddp'] / r['s3fs']:.2f}x"
    if "s3tc" in r:
        line += f", dask-ddp/s3torchconnector = {r['ddp'] / r['s3tc']:.2f}x"
    report(line + f", dask-ddp/wrk = {r['ddp'] / r['wrk']:.2f}, "
           f"anonymous dask-ddp/wrk = {r['anon'] / r['wrk']:.2f}")
    if not args.skip_moto:
        m = bench_moto(args)
        report(f"  ratio: dask-ddp/boto3 = {m['ddp'] / m['boto3']:.2f}x")


if __name__ == "__main__":
    main()
