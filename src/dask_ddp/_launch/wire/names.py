"""Names of a job's coordination objects on the scheduler (internal)."""

from __future__ import annotations


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
