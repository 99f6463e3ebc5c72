"""The job pages on the scheduler's dashboard server (internal).

The launcher installs them when a job first runs on a cluster (nothing to configure); they
are served on the port of the Dask dashboard (``client.dashboard_link``'s), under its
HTTP prefix:

- ``/dask-ddp/``: every job (name, id, state, world size, attempt, start, duration,
  hosts), each linking to ``/dask-ddp/job/<id>``;
- ``/dask-ddp/job/<id>``: one job, refreshed every 2 s while it runs and readable after;
- ``/dask-ddp/api/jobs`` and ``/dask-ddp/api/job/<id>``: the JSON the pages read.

Modules: :mod:`~dask_ddp._dashboard.counters` (the rank's step and data-wait counters,
which the Loader bumps), :mod:`~dask_ddp._dashboard.sampler` (the supervisor's sampler of
its rank), :mod:`~dask_ddp._dashboard.events` (the launcher's job events, and
:func:`~dask_ddp._dashboard.events.job_stalled`), :mod:`~dask_ddp._dashboard.model` (the
state on the scheduler and the flags), :mod:`~dask_ddp._dashboard.extension` (the
scheduler extension and HTTP routes). It imports nothing of the launcher (an
import-linter contract holds it); the launcher calls it.

JSON schema (``version`` 1; times are Unix seconds, rates per second, ``null`` when not
known yet)
----------------------------------------------------------------------------------------
``GET /dask-ddp/api/jobs``::

    {"version": 1, "time": float,
     "jobs": [JobRow, ...]}                       # newest first

    JobRow = {"id": str,            # the job's run id (an elastic job's attempts share it)
              "job_id": str,        # the current attempt's id (DASK_DDP_JOB_ID)
              "name": str, "state": State, "world_size": int,
              "attempt": int,       # the current attempt, from 0
              "restarts": int, "max_restarts": int,
              "start": float, "end": float | null, "duration_s": float,
              "hosts": [str], "url": "job/<id>"}  # relative to /dask-ddp/
    State = "starting" | "running" | "stalled" | "done" | "failed" | "cancelled"

``GET /dask-ddp/api/job/<id>[?metric=<name>|*]`` (``id``: the run id, an attempt's id or
a unique prefix; 404 with ``{"version": 1, "error": str}`` when unknown; ``curves`` holds
the curves of ``metric``, by default ``default_metric``'s, ``*`` for all)::

    {"version": 1, "time": float,
     "job": JobRow + {
        "median_steps_per_s": float | null,
        "root_cause": Failure | null,          # when state is "failed"
        "stall": {"ranks": [int], "collective": str, "stacks": {rank: str},
                  "message": str, "time": float,
                  "final": bool} | null,       # when state is "stalled"; final: the
                                               # stall ended the job
        "unread": [{"topic": str, "since": float, "seconds": float,
                    "used": int, "budget": int}],  # results topics full and unread
                                               # (their ranks wait): while running
        "attempts": [{"job_id", "attempt", "state", "world_size", "start", "end",
                      "root_cause": Failure | null}],
        "ranks": [Rank],                       # the current attempt's, by rank
        "metric_names": [str], "default_metric": str | null,   # "loss" when reported
        "curves": {rank: {metric: [[step, value], ...]}}}}   # see ?metric=

    Failure = {"rank": int, "worker": str, "kind": str, "message": str, "traceback": str}
    Rank = {"rank": int, "worker": str, "host": str, "pid": int | null,
            "state": "starting" | "running" | "exited", "exit": str,
            "steps": int, "steps_per_s": float | null,
            "step_source": "loader" | "report" | "",  # Loader batches, or report() steps
            "step_ms": float | null, "wait_ms_per_step": float | null,
            "wait_fraction": float | null,           # data wait / wall time (Loader only)
            "cpu_percent": float | null,             # the rank and its children, 100 = 1 core
            "rss_bytes": int | null, "step": int | null,
            "metrics": {str: number | str},          # the last report()
            "reports": int, "updated": float,
            "flags": ["input-bound" | "straggler" | "stalled" | "failed"]}

Flags: *input-bound* when the rank waited for data more than a third of its step time
(ranks using the :class:`~dask_ddp.data.Loader`); *straggler* when a running rank's step
rate is under 0.8 times the median rank's; *stalled* from the launcher's stall detection;
*failed* on the root-cause rank of a failed job.

A results topic of the job that is full and that nobody read for
``dask-ddp.results.unread-warning`` seconds reaches the page from the results extension
(a scheduler event, ``dask-ddp-results-unread``) and stays listed in ``unread`` until a
client reads it again.

Stalls reach the pages two ways: a failure record of kind ``"stalled"`` (with ``ranks``,
``collective``, ``stacks``) on the job's failure topic, which is how the launcher's stall
detection ends a job; or :func:`~dask_ddp._dashboard.events.job_stalled`, for a stall
seen while the job goes on (cleared by ``job_state(..., "running")``).
"""

from __future__ import annotations

from dask_ddp._lazy import attribute_loader, public_dir

_WHERE = {
    **{n: f"dask_ddp._dashboard.events:{n}"
       for n in ("install", "job_started", "job_state", "job_stalled")},
    "RankSampler": "dask_ddp._dashboard.sampler:RankSampler",
    **{n: f"dask_ddp._dashboard.extension:{n}"
       for n in ("DashboardExtension", "DashboardPlugin")},
}

__all__ = sorted(_WHERE)
__getattr__ = attribute_loader(__name__, _WHERE)
__dir__ = public_dir(__name__)
