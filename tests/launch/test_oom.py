"""A rank killed by the kernel's OOM killer says so, with the memory limit it hit.

A real LocalCluster worker is moved into a real memory cgroup with a 1 GiB limit (as a
SLURM job's or a container's); its rank allocates past it and the kernel kills it. Needs a
writable memory cgroup (root, cgroup v1 or v2): skipped with the reason otherwise.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dask
import pytest
from distributed import Client

import dask_ddp
from cluster_util import cluster_client, template_processes

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


def own_oom_score() -> int:
    with open("/proc/self/oom_score_adj") as f:
        return int(f.read())


@pytest.mark.skipif(not Path("/proc/self/oom_score_adj").exists(), reason="Linux's OOM score")
def test_ranks_and_templates_are_the_oom_killers_choice_before_their_worker(
        lease: Any, tmp_path: Path) -> None:
    """A worker's ranks, warm or cold, and its templates score ``launch.oom-score-adj``
    (500) above it: when their memory runs out the kernel takes them first, and a second
    kill while a victim's memory is still being freed takes another of them, not the
    worker (the OOM test above once lost its worker so, and with it the error)."""
    with lease(1) as client:
        (worker,) = client.run(own_oom_score).values()
        want = min(1000, worker + 500)
        assert dask_ddp.submit(client, own_oom_score, progress=False).result(timeout=120) \
            == [want]  # a function's rank: forked from the warm template
        templates = template_processes(client.scheduler.address)
        assert templates and {int(Path(f"/proc/{p.pid}/oom_score_adj").read_text())
                              for p in templates} == {want}
        out = tmp_path / "score"
        code = f"open({str(out)!r}, 'w').write(open('/proc/self/oom_score_adj').read())"
        assert dask_ddp.run_command(client, [sys.executable, "-c", code], n_workers=1,
                                    timeout=120) == [0]  # a command's rank: started cold
        assert int(out.read_text()) == want


@pytest.mark.parametrize(("value", "score"), [(0, None), (300, "own+300"), ("1000", 1000),
                                              (-1, ValueError), (1001, ValueError),
                                              ("high", ValueError), (2.5, ValueError)])
def test_the_oom_score_setting_is_read_and_checked(value: Any, score: Any) -> None:
    from dask_ddp._launch.worker import oom

    with dask.config.set({"dask-ddp.launch.oom-score-adj": value}):
        if score is ValueError:
            with pytest.raises(ValueError, match=r"dask-ddp\.launch\.oom-score-adj must be"):
                oom.victim_score()
            return
        got = oom.victim_score()
    if score == "own+300":
        assert got == min(1000, own_oom_score() + 300)
    else:
        assert got == score
