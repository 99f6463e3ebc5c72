"""Reading the live Python stacks of a job's ranks, across the cluster (internal).

Each rank answers a stack request through its probe
(:func:`dask_ddp._launch.rank.probe.read_stacks`);
:func:`collect_stacks` runs on a worker (``client.run``) and asks the ranks that worker
supervises; :func:`read_job_stacks` asks every worker of a job. Used by ``dask-ddp stacks``,
the client's :class:`~dask_ddp.Job`, the stall rule and a rank that gave up waiting for its
peers (:func:`peer_stacks_text`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from dask_ddp._launch.client import stall
from dask_ddp._launch.client.placement import RankSpec
from dask_ddp._launch.worker import rank_process


async def collect_stacks(job: str, timeout: float,
                         dask_worker: Any = None) -> dict[str, dict[str, Any]]:
    """The live Python stacks of the ranks of ``job`` (an id, an id's prefix of at least 8
    characters, or a name; ``""``: every job) that this worker supervises.

    Run on a worker with ``client.run``: ``{job_id: {"name": str, "stacks": {rank: text}}}``.
    """
    chosen = [r for r in rank_process.running_ranks()
              if not job or r.job_name == job or r.job_id == job
              or (len(job) >= 8 and r.job_id.startswith(job))]
    texts = await asyncio.gather(*(asyncio.to_thread(r.read_stacks, timeout) for r in chosen))
    found: dict[str, dict[str, Any]] = {}
    for r, text in zip(chosen, texts, strict=True):
        found.setdefault(r.job_id, {"name": r.job_name, "stacks": {}})["stacks"][r.rank] = text
    return found


async def read_job_stacks(client: Any, job_id: str, workers: list[str],
                          timeout: float) -> dict[int, str]:
    """The live stacks of job ``job_id``'s running ranks on ``workers``, by rank."""
    replies = await client.run(collect_stacks, job_id, timeout, workers=sorted(set(workers)),
                               on_error="return", asynchronous=True)
    stacks: dict[int, str] = {}
    for reply in replies.values():
        if isinstance(reply, dict) and job_id in reply:
            stacks.update(reply[job_id]["stacks"])
    return dict(sorted(stacks.items()))


def peer_stacks_text(client: Any, spec: RankSpec, wait: float) -> str:
    """The other ranks' live stacks, and the ranks with no process, as the text a rank's
    error ends with (read from a worker's thread, up to ``wait`` seconds)."""
    try:
        stacks = client.sync(read_job_stacks, client, spec.job_id, list(spec.workers), wait,
                             callback_timeout=wait + 10)
    except Exception as exc:  # the error it goes into matters more
        return f"\n\n(the other ranks' stacks could not be read: {exc})"
    stacks.pop(spec.rank, None)
    text = ""
    if stacks:
        text += ("\n\nPython stacks of the other ranks still running:\n"
                 + stall.stacks_text(stacks, list(spec.workers)))
    missing = [r for r in range(len(spec.workers)) if r != spec.rank and r not in stacks]
    if missing:
        text += ("\n\nranks with no process running: "
                 + ", ".join(f"{r} (worker {spec.workers[r]})" for r in missing)
                 + ": not started yet (its worker busy with other tasks, or waiting "
                 "for rank 0's rendezvous address), or already ended")
    return text
