"""A worker's answer to a stack request, and a rank's view of its peers' stacks (internal).

:func:`collect_stacks` runs on a worker (``client.run``, see
:mod:`dask_ddp._launch.wire.stack_request`) and asks the ranks that worker supervises,
each through its probe (:func:`dask_ddp._launch.worker.probe.read_stacks`).
:func:`peer_stacks_text` is what a rank that gave up waiting for its peers adds to its
error.
"""

from __future__ import annotations

import asyncio
from typing import Any

from dask_ddp._launch.wire.rank_spec import RankSpec
from dask_ddp._launch.wire.stack_request import read_job_stacks, stacks_text
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
                 + stacks_text(stacks, list(spec.workers)))
    missing = [r for r in range(len(spec.workers)) if r != spec.rank and r not in stacks]
    if missing:
        text += ("\n\nranks with no process running: "
                 + ", ".join(f"{r} (worker {spec.workers[r]})" for r in missing)
                 + ": not started yet (its worker busy with other tasks, or waiting "
                 "for rank 0's rendezvous address), or already ended")
    return text
