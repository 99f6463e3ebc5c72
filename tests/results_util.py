"""Helpers shared by the results tests: rank processes started without the launcher."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from _rankproc import run_rank
from dask_ddp import _channel, _pending, results
from dask_ddp._channel import rank_writer
from dask_ddp._cluster import cluster_info
from rank_channel import decode_metrics


@dataclass
class JobLike:
    """The attributes of the launcher's Job that the results monitor uses (the contract)."""

    client: Any
    id: str
    name: str
    futures: list[Any] = field(default_factory=list)
    output_dir: Path | None = None
    world_size: int = 2
    storage: str | None = None


def launch(
    client: Any,
    code: str,
    world_size: int = 2,
    env: dict[str, str] | None = None,
    job_id: str | None = None,
) -> tuple[str, list[Any]]:
    """Start ``world_size`` rank processes, one per worker, each running ``code``."""
    job_id = job_id or uuid.uuid4().hex[:12]
    _channel.prepare(client, job_id)
    workers = sorted(cluster_info(client)["workers"])
    futures = [
        client.submit(
            run_rank,
            job_id,
            rank,
            world_size,
            code,
            env,
            workers=[workers[rank % len(workers)]],
            pure=False,
            key=f"rank-{job_id}-{rank}",
        )
        for rank in range(world_size)
    ]
    return job_id, futures


REPORT_N = """
import os
import dask_ddp.results as r
n = int(os.environ["N"])
for i in range(n):
    r.report({"loss": 1.0 / (i + 1), "tag": "x"}, step=i)
"""


def fake_rank_fixture() -> Any:
    """A module's ``fake_rank`` fixture: this test process as a rank (rank 0 of job
    ``unit``) whose results channel is a pipe; the fixture's value is the pipe's read end
    (see :func:`read_metrics`). Use as ``fake_rank = fake_rank_fixture()``."""

    @pytest.fixture
    def fake_rank(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
        r, w = os.pipe()
        monkeypatch.setenv("DASK_DDP_CHANNEL_FD", str(w))
        monkeypatch.setenv("RANK", "0")
        monkeypatch.setenv("DASK_DDP_JOB_ID", "unit")
        monkeypatch.setattr(rank_writer, "_writer", None)
        monkeypatch.setattr(results, "_state", None)
        try:
            yield r
        finally:
            _pending.flush_pending(timeout=30)  # nothing of this test is left to write
            os.close(r)
            os.close(w)

    return fake_rank


def read_metrics(fd: int) -> list[dict[str, Any]]:
    """The metric records a :func:`fake_rank_fixture` pipe holds now (whole frames), in
    the order they were written."""
    os.set_blocking(fd, False)
    buf = b""
    try:
        while True:
            buf += os.read(fd, 1 << 16)
    except BlockingIOError:
        pass
    finally:
        os.set_blocking(fd, True)
    out, used = decode_metrics(buf)
    assert used == len(buf), f"a frame cut after {used} of {len(buf)} bytes"
    return out
