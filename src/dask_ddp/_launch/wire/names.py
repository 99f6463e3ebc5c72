"""Names of a job's coordination objects on the scheduler (internal)."""

from __future__ import annotations

import re

#: The scheduler handler the job's cleanup calls (``topics=[...]``).
FORGET_HANDLER = "dask_ddp_forget_topics"
#: A rank's key: ``f"{job name}-{job id}-{rank}"`` (the id is a uuid4's 32 hex digits).
RANK_KEY = re.compile(r"^(?P<name>.+)-(?P<id>[0-9a-f]{32})-(?P<rank>\d+)$")


def rank_key(name: str, job_id: str, rank: int) -> str:
    """The key of rank ``rank``'s task of the job ``job_id`` named ``name``."""
    return f"{name}-{job_id}-{rank}"


def abort_event_name(job_id: str) -> str:
    """The job-wide abort ``distributed.Event``: set, every rank stops."""
    return f"dask-ddp-abort-{job_id}"


def master_variable_name(job_id: str) -> str:
    """The ``Variable`` (and ``Event``) carrying rank 0's rendezvous address."""
    return f"dask-ddp-master-{job_id}"


def output_topic(job_id: str) -> str:
    """The event topic of the ranks' stdout/stderr lines (``stream_output``)."""
    return f"dask-ddp-output-{job_id}"


def failure_topic(job_id: str) -> str:
    """The event topic where a failing rank (or the client) records the job's faults."""
    return f"dask-ddp-failure-{job_id}"


def progress_topic(job_id: str) -> str:
    """The event topic where each rank's supervisor records its rank's state changes
    (working, blocked in a collective, returned, frozen): what stall detection reads."""
    return f"dask-ddp-progress-{job_id}"
