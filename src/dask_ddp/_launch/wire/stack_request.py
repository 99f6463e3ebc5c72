"""A job's stack request: its ranks' live Python stacks, asked of its workers (internal).

The client (``Job.stacks``, the stall rule) and a rank's supervisor (a rank that gave up
waiting for its peers) ask every worker of the job (:func:`read_job_stacks`); each worker
answers for the ranks it supervises (:func:`dask_ddp._launch.worker.stacks.collect_stacks`,
``{job_id: {"name": str, "stacks": {rank: text}}}``). :func:`stacks_text` is the text the
stacks make in an error.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dask_ddp._launch.wire.entry_points import COLLECT_STACKS


async def read_job_stacks(client: Any, job_id: str, workers: list[str],
                          timeout: float) -> dict[int, str]:
    """The live stacks of job ``job_id``'s running ranks on ``workers``, by rank."""
    replies = await client.run(COLLECT_STACKS, job_id, timeout, workers=sorted(set(workers)),
                               on_error="return", asynchronous=True)
    stacks: dict[int, str] = {}
    for reply in replies.values():
        if isinstance(reply, dict) and job_id in reply:
            stacks.update(reply[job_id]["stacks"])
    return dict(sorted(stacks.items()))


def stacks_text(stacks: Mapping[int, str], workers: list[str]) -> str:
    """The ranks' stacks as one block of text, rank by rank."""
    blocks = []
    for rank in sorted(stacks):
        where = f" on worker {workers[rank]}" if rank < len(workers) else ""
        blocks.append(f"--- rank {rank}{where} ---\n{stacks[rank].rstrip()}")
    return "\n".join(blocks)
