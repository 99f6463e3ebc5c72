"""Helpers of the job-page tests: rank functions (importable by the rank processes), the
pages' HTTP reads and the bounded waits on them."""

from __future__ import annotations

import json
import math
import os
import time
import urllib.error
import urllib.request
from typing import Any

from waits import wait_until


def dashboard_root(client: Any) -> str:
    """``http://host:port/<prefix>/dask-ddp/`` of ``client``'s scheduler."""
    link = client.dashboard_link  # http://127.0.0.1:PORT/status (with any prefix)
    return link.rsplit("/", 1)[0] + "/dask-ddp/"


def get(url: str, timeout: float = 10.0) -> tuple[int, str, str]:
    """(status, content type, body) of a GET; an HTTP error status is returned, not raised."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read().decode()
    except urllib.error.HTTPError as e:
        with e:
            return e.code, e.headers.get("Content-Type", ""), e.read().decode()


def get_json(url: str) -> Any:
    status, ctype, body = get(url)
    assert status == 200, f"GET {url}: {status} {body[:300]}"
    assert ctype.startswith("application/json"), ctype
    return json.loads(body)


def wait_job(root: str, job_id: str, what: str, ready: Any, timeout: float = 120.0) -> dict:
    """Poll ``/api/job/<id>`` until ``ready(job)`` is true; the last job JSON."""
    last: dict[str, Any] = {}

    def missing() -> str | None:
        status, _, body = get(f"{root}api/job/{job_id}")
        if status != 200:
            return f"HTTP {status}: {body[:200]}"
        last.clear()
        last.update(json.loads(body)["job"])
        return None if ready(last) else json.dumps(_brief(last))[:1500]

    wait_until(missing, timeout, f"job page of {job_id}: {what}", interval=0.5)
    return last


def _brief(job: dict[str, Any]) -> dict[str, Any]:
    return {"state": job.get("state"), "ranks": [
        {k: r.get(k) for k in ("rank", "state", "steps", "steps_per_s", "wait_fraction",
                               "flags", "step")} for r in job.get("ranks", [])]}


# -- functions run inside rank processes ----------------------------------------------------

def report_loop(steps: int, pause: float, stop: str | None = None) -> int:
    """A DDP-like loop: an all_reduce and a ``report()`` of a falling loss each step.

    With ``stop`` (a path), the ranks end together at the first step after it exists (the
    all_reduce carries each rank's view of it), or after ``steps`` steps: a test that has
    seen what it needs of a running job ends it instead of waiting the steps out.
    """
    import torch
    import torch.distributed as dist

    import dask_ddp

    rank = dist.get_rank()
    for step in range(steps):
        t = torch.tensor([float(stop is not None and os.path.exists(stop))])
        dist.all_reduce(t)
        if t.item() > 0:
            break
        loss = 2.0 * math.exp(-step / 40.0) + 0.05 * rank + 0.02 * math.sin(step)
        dask_ddp.report({"loss": loss, "lr": 0.1}, step=step)
        time.sleep(pause)
    return rank


def uneven_loop(seconds: float, pauses: list[float]) -> int:
    """Ranks stepping at their own pace (no collective per step): rank r sleeps
    ``pauses[r]`` per step, so a slow one is a straggler by step rate."""
    import torch.distributed as dist

    import dask_ddp

    rank = dist.get_rank()
    deadline = time.monotonic() + seconds
    step = 0
    while time.monotonic() < deadline:
        dask_ddp.report({"loss": 1.0 / (1 + step)}, step=step)
        time.sleep(pauses[rank])
        step += 1
    dist.barrier()
    return step


def fail_after(steps: int, bad_rank: int, message: str) -> int:
    """Report for ``steps`` steps, then rank ``bad_rank`` raises ``message`` (the others
    sit in a collective it never joins)."""
    import torch
    import torch.distributed as dist

    import dask_ddp

    rank = dist.get_rank()
    t = torch.ones(1)
    for step in range(steps):
        dist.all_reduce(t)
        dask_ddp.report({"loss": 1.0 / (1 + step)}, step=step)
        time.sleep(0.1)
    if rank == bad_rank:
        raise ValueError(message)
    while True:
        dist.all_reduce(t)


def fail_first_attempt(steps: int) -> int:
    """Attempt 0 fails on rank 1 after a few steps; later attempts finish."""
    import os

    import torch
    import torch.distributed as dist

    import dask_ddp

    rank = dist.get_rank()
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    t = torch.ones(1)
    for step in range(steps):
        dist.all_reduce(t)
        dask_ddp.report({"loss": 1.0 / (1 + step), "attempt": attempt}, step=step)
        time.sleep(0.05)
        if attempt == 0 and rank == 1 and step == steps // 2:
            raise RuntimeError("attempt 0 of rank 1 fails on purpose")
    return attempt


def loader_loop(root: str, seconds: float, threads: int, compute_s: float,
                stop: str | None = None) -> int:
    """Iterate a dask-ddp Loader over the image folder ``root`` for ``seconds``: with one
    decode thread, large images and little compute per step, the rank waits for data.
    With ``stop`` (a path), each rank also ends at its first step after it exists."""
    import torch.distributed as dist

    import dask_ddp
    from dask_ddp.data import ImageFolder, Loader
    from dask_ddp.data import transforms as T

    rank = dist.get_rank()
    tf = T.Compose([T.RandomResizedCrop(224), T.ToTensor()])
    loader = Loader(ImageFolder(root), batch_size=8, transform=tf, num_threads=threads,
                    prefetch=1, region_decode=False, scaled_decode=False)
    deadline = time.monotonic() + seconds
    step, epoch = 0, 0
    try:
        while time.monotonic() < deadline:
            loader.set_epoch(epoch)
            for images, _ in loader:
                time.sleep(compute_s)
                loss = 1.5 * math.exp(-step / 25.0) + 0.2 * float(images.mean())
                dask_ddp.report({"loss": loss, "epoch": epoch}, step=step)
                step += 1
                if time.monotonic() >= deadline or stop is not None and os.path.exists(stop):
                    deadline = 0.0
                    break
            epoch += 1
    finally:
        loader.close()
    dist.barrier()
    return rank


def diverging(steps: int, hold: float, stop: str | None = None) -> int:
    """Each step reports 150 gradient norms and the loss in one record (about 5 KB, more
    than one pipe frame), the loss NaN on rank 0 and infinite on rank 1 from step 3 on.
    Then the ranks stay for ``hold`` seconds, or until ``stop`` (a path) exists."""
    import torch.distributed as dist

    import dask_ddp

    rank = dist.get_rank()
    for step in range(steps):
        loss = 1.0 / (step + 1) if step < 3 else (math.nan if rank == 0 else math.inf)
        record: dict[str, Any] = {f"grad_norm/layer{i:03d}": 0.001 * i for i in range(150)}
        record["loss"] = loss
        dask_ddp.report(record, step=step)
        time.sleep(0.05)
    # The page samples every 2 s: stay visible while the test looks.
    deadline = time.monotonic() + hold
    while time.monotonic() < deadline and not (stop is not None and os.path.exists(stop)):
        time.sleep(0.05)
    return rank


def report_unnumbered(steps: int, pause: float) -> int:
    """A loop that calls ``report()`` without ``step=`` (report numbers the steps)."""
    import torch.distributed as dist

    import dask_ddp

    for i in range(steps):
        dask_ddp.report({"loss": 1.0 / (i + 1)})
        time.sleep(pause)
    return dist.get_rank()
