"""Test helper: run a real rank subprocess behind a real Forwarder, inside a Dask task.

This is what the launcher's supervisor task does (pipe, ``pass_fds``, Forwarder), kept to
the channel contract so the results tests run before and without the launcher.
"""

from __future__ import annotations

import os
import subprocess
import sys


def run_rank(
    job_id: str,
    rank: int,
    world_size: int,
    code: str,
    env: dict[str, str] | None = None,
    timeout: float = 240.0,
) -> dict[str, int]:
    """Run ``python -c code`` as rank ``rank`` with a results channel; returns its exit
    code and the number of records the Forwarder saw."""
    from dask_ddp import _channel

    r, w = os.pipe()
    child_env = dict(os.environ)
    child_env.update(
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK="0",
        DASK_DDP_JOB_ID=job_id,
        DASK_DDP_JOB_NAME=f"test-{job_id}",
        DASK_DDP_CHANNEL_FD=str(w),
    )
    child_env.update(env or {})
    try:
        proc = subprocess.Popen([sys.executable, "-c", code], pass_fds=(w,), env=child_env)
    finally:
        os.close(w)
    fwd = _channel.Forwarder(job_id, rank, r)
    fwd.start()
    try:
        rc = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    fwd.close(timeout=120)
    return {"returncode": rc, "records": fwd.records}
