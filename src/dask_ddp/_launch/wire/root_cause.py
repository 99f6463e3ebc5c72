"""A job's faults: which one is the root cause, and how every rank learns it (internal).

A rank that fails records its fault on the job's failure topic on the scheduler
(:func:`dask_ddp._launch.wire.names.failure_topic`); the client's watcher records a rank
whose worker left. The client's :meth:`Job.result` and each rank's supervisor pick the
root cause from the same order (:class:`FailureKind`), so the seed's
``client.gather(futures)`` raises the same root error as ``submit(...).result()``: a rank
whose collective broke because a peer died raises the peer's fault, with its own error
chained as ``__cause__`` (whether a rank's error came from a lost peer the rank decides,
by :mod:`dask_ddp._launch.wire.peer_loss`'s test, and says in its report; the supervisor's
side, a rank's end turned into its task's outcome, is
:mod:`dask_ddp._launch.worker.outcome`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dask_ddp.errors import (
    FailureKind,
    JobError,
    RankFailedError,
    StallError,
    WorkerLostError,
    kind_order,
)

logger = logging.getLogger(__name__)


def lost_error(job_name: str, rank: int, worker: str) -> WorkerLostError:
    """The error of rank ``rank`` whose worker left the cluster while it ran."""
    return WorkerLostError(
        f"rank {rank} of job {job_name!r}: its worker {worker} left the cluster while the "
        "rank ran (the worker process died or was killed)", rank, worker,
        kind=FailureKind.LOST)


def record_of(err: JobError) -> dict[str, Any]:
    """What goes on the failure topic about ``err`` (plain data: the scheduler keeps it)."""
    return {"rank": err.rank, "worker": err.worker, "kind": str(err.kind),
            "message": str(err).split("\n\n")[0], "traceback": err.remote_traceback}


def better_record(records: Iterable[Mapping[str, Any]], rank: int,
                  kind: FailureKind, broken: bool = False) -> Mapping[str, Any] | None:
    """The most fundamental fault of another rank, more fundamental than ``kind``.

    A stall recorded for the job outranks every fault that says a collective broke (the
    rank's own when ``broken``, a record's ``"broken"``): the job was ended for the stall,
    and ending it (a peer's process stopped) is what broke them.
    """
    records = list(records)
    stalled = any(m.get("kind") == FailureKind.STALLED.value for m in records)

    def outranks(m: Mapping[str, Any]) -> bool:
        if m.get("kind") == FailureKind.STALLED.value:
            if broken:
                return True
        elif stalled and m.get("broken"):
            return False
        # A stall is the job's fault, not one rank's: the stuck rank raises it too.
        return ((m.get("rank") != rank or m.get("kind") == FailureKind.STALLED.value)
                and kind_order(m.get("kind", "")) < kind.order)

    better = [m for m in records if outranks(m)]
    if not better:
        return None
    return min(better, key=lambda m: (kind_order(m["kind"]), m["rank"]))


def root_error(record: Mapping[str, Any], secondary: JobError) -> JobError:
    """The root fault ``record`` as an error, raised in place of ``secondary`` (chained).

    Names the failed rank, its worker and why; the secondary rank's own error (and its
    traceback) is ``__cause__``.
    """
    kind = FailureKind(record["kind"])
    message = str(record["message"])
    tb = str(record.get("traceback") or "")
    if tb and kind in (FailureKind.RAISED, FailureKind.RAISED_FIRST, FailureKind.REGROUP):
        message += f"\n\nTraceback from rank {record['rank']}:\n{tb.rstrip()}"
    own = str(secondary).split("\n\n")[0].split("\n(root cause")[0]
    message += f"\n\n(then {own})"
    if kind is FailureKind.STALLED:
        stacks = {int(r): str(t) for r, t in dict(record.get("stacks") or {}).items()}
        return StallError(message, int(record["rank"]), str(record["worker"]), "", secondary,
                          ranks=[int(r) for r in record.get("ranks") or [record["rank"]]],
                          collective=str(record.get("collective", "")), stacks=stacks)
    cls = WorkerLostError if kind is FailureKind.LOST else RankFailedError
    return cls(message, int(record["rank"]), str(record["worker"]), tb, secondary, kind)


def pick_root(errors: Sequence[tuple[int, BaseException]]) -> BaseException | None:
    """The root cause among ``(rank of the future, its error)``: the most fundamental kind,
    then the lowest rank, then the failed rank's own error (it carries the real cause)."""
    if not errors:
        return None

    def order(item: tuple[int, BaseException]) -> tuple[int, int, int]:
        rank, e = item
        if isinstance(e, JobError):
            return (e.kind.order, e.rank, 0 if e.rank == rank else 1)
        return (len(FailureKind), len(errors), 1)

    return min(errors, key=order)[1]


def read_error_file(path: str) -> tuple[str, str] | None:
    """(message, traceback) from a ``TORCHELASTIC_ERROR_FILE`` torch's ``@record`` wrote."""
    try:
        with open(path) as f:
            data = json.load(f)
        message = data["message"]
        if isinstance(message, str):  # torch's format for errors without a Python trace
            return message, ""
        return str(message["message"]), str(message.get("extraInfo", {}).get("py_callstack", ""))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        logger.warning("cannot read the rank's error file %s: %s", path, exc)
        return None
