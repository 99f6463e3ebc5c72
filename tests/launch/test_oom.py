"""A rank killed by the kernel's OOM killer says so, with the memory limit it hit.

A real LocalCluster worker is moved into a real memory cgroup with a 1 GiB limit (as a
SLURM job's or a container's); its rank allocates past it and the kernel kills it. Needs a
writable memory cgroup (root, cgroup v1 or v2): skipped with the reason otherwise.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from distributed import Client

import dask_ddp
from cluster_util import cluster_client

pytestmark = [pytest.mark.dask, pytest.mark.timeout(300)]

LIMIT = 1 << 30


def _own_memory_cgroup() -> tuple[Path, str] | None:
    """This process's memory cgroup folder and its limit file, if one can be made below."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        num, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            folder = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
            return folder, "memory.limit_in_bytes"
        if num == "0" and controllers == "" and Path("/sys/fs/cgroup/cgroup.controllers").exists():
            return Path("/sys/fs/cgroup") / path.lstrip("/"), "memory.max"
    return None


@pytest.fixture
def limited_cgroup() -> Iterator[Path]:
    found = _own_memory_cgroup()
    if found is None:
        pytest.skip("no memory cgroup found for this process")
    parent, limit_file = found
    folder = parent / f"dask-ddp-oom-test-{os.getpid()}"
    try:
        folder.mkdir()
        (folder / limit_file).write_text(str(LIMIT))
    except OSError as exc:
        pytest.skip(f"cannot make a memory cgroup under {parent}: {exc}")
    try:
        yield folder
    finally:
        for pid in (folder / "cgroup.procs").read_text().split():
            try:  # back to the parent, so the folder can go
                (parent / "cgroup.procs").write_text(pid)
            except OSError:
                pass
        folder.rmdir()


def eat_memory(gib: float) -> int:
    import torch

    chunks = [torch.ones(1 << 27) for _ in range(int(gib * 2))]  # 512 MiB each, touched
    return len(chunks)


def test_a_rank_killed_by_the_oom_killer_says_so(limited_cgroup: Path) -> None:
    with cluster_client(1) as client:
        assert isinstance(client, Client)
        (worker_pid,) = client.run(os.getpid).values()
        (limited_cgroup / "cgroup.procs").write_text(str(worker_pid))  # its ranks follow
        job = dask_ddp.submit(client, eat_memory, 3.0, progress=False, stall_timeout=None)
        with pytest.raises(dask_ddp.JobError) as info:
            job.result(timeout=240)
    message = str(info.value)
    assert "killed by the kernel's OOM killer" in message, message
    assert str(limited_cgroup) in message and "1.0 GiB" in message, message
