"""Helpers shared by the results tests: rank processes started without the launcher."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _rankproc import run_rank
from dask_ddp import _channel
from dask_ddp._cluster import cluster_info


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
