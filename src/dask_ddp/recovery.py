"""Recovery policies: what a rank's end leads to (``submit(..., recovery=...)``).

A job meets each event (a rank raised, died, lost its worker, stalled, was aborted) once,
as a :class:`RecoveryStatus`, and asks its policy's pure ``decide(status)`` for an
:class:`Action`: ``CONTINUE``, ``REGROUP`` (the others go on in a smaller group),
``RESTART`` (the attempt ends; an :class:`~dask_ddp.ElasticJob` starts another) or
``RAISE``. ``recovery="restart"`` and ``recovery="live"`` are the built-ins
(:data:`RESTART`, :data:`LIVE`); a policy of one's own is one function:

>>> from dask_ddp.errors import FailureKind
>>> def regroup_lost_workers(status):
...     if status.kind is FailureKind.LOST and status.live_workers != 0:
...         return Action.REGROUP  # the others go on without a lost worker's rank
...     return Action.RESTART if status.restarts_left else Action.RAISE
>>> mine = Policy("regroup-lost-workers", regroup_lost_workers, regroups=True)
>>> # dask_ddp.submit(client, train, recovery=mine, max_restarts=2)

``regroups=True`` says the policy may answer ``REGROUP``: its jobs run on the live
machinery (as ``recovery="live"``: gloo, a model registered with
:class:`~dask_ddp.Checkpointer`). The function must be pure and defined at a module's top
level: it is pickled with the job's options and asked in the client and in the workers.
"""

from __future__ import annotations

from dask_ddp._launch.wire.policy import (
    LIVE,
    NAMES,
    RESTART,
    Action,
    Policy,
    RecoveryPolicy,
    RecoveryStatus,
    live_rule,
    restart_rule,
)

__all__ = ["LIVE", "NAMES", "RESTART", "Action", "Policy", "RecoveryPolicy", "RecoveryStatus",
           "live_rule", "restart_rule"]
