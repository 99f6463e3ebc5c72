"""Stall detection: when a job's ranks can no longer make progress (internal).

Each rank's supervisor records its rank's state changes on the job's progress topic
(:func:`dask_ddp._launch.names.progress_topic`): ``blocked`` in a collective (inside one
for ``dask-ddp.launch.blocked-after``), ``working`` again, ``returned`` from its function,
``frozen`` (stopped). The client's watcher reads the topic and calls :func:`find_stall`.

A job is stalled when no rank is working and at least one rank is blocked in a collective
or frozen: a collective that a peer which returned, froze or waits in another collective
will never join cannot complete. It is reported once that has lasted ``stall_timeout``
seconds. A rank that works (rank 0's long evaluation while the others wait at a barrier
or at the end) keeps the job out of a stall however long it takes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from dask_ddp._states import RankActivity
from dask_ddp.errors import FailureKind, StallError


@dataclasses.dataclass(frozen=True)
class Stall:
    """A stall found: the stuck ranks, since when (``time.time()``), per-rank states."""

    stuck: list[int]
    collective: str
    since: float
    states: dict[int, Mapping[str, Any]]


def latest_states(
        events: Iterable[tuple[float, Mapping[str, Any]]]) -> dict[int, Mapping[str, Any]]:
    """Each rank's last recorded state, from the progress topic's ``(time, msg)`` events."""
    states: dict[int, Mapping[str, Any]] = {}
    for _, msg in events:
        if isinstance(msg, Mapping) and "rank" in msg:
            states[int(msg["rank"])] = msg
    return states


def activity(state: Mapping[str, Any] | None) -> RankActivity:
    """The activity a rank's recorded state names; none (or one this launcher does not
    know) reads as working: it never makes a stall."""
    try:
        return RankActivity(state.get("state")) if state is not None else RankActivity.WORKING
    except ValueError:
        return RankActivity.WORKING


def find_stall(states: Mapping[int, Mapping[str, Any]], finished: Iterable[int], world: int,
               now: float, stall_timeout: float) -> Stall | None:
    """The job's stall, when it has lasted ``stall_timeout`` seconds, else ``None``.

    ``states`` are the ranks' last states (:func:`latest_states`); ``finished`` the ranks
    whose task already ended (they count as returned); a rank with no state works.
    """
    done = set(finished)
    view: dict[int, Mapping[str, Any]] = {}
    for rank in range(world):
        if rank in done:
            view[rank] = {"state": RankActivity.RETURNED, "since": now}
            continue
        state = states.get(rank)
        if state is None or not activity(state).is_idle:
            return None
        view[rank] = state
    stuck = [r for r, s in view.items()
             if activity(s) in (RankActivity.BLOCKED, RankActivity.FROZEN)]
    if not stuck:
        return None
    # The stall began when the last rank reached its present state.
    since = max(float(s.get("since", now)) for r, s in view.items() if r not in done)
    if now - since < stall_timeout:
        return None
    blocked = [r for r in stuck if activity(view[r]) is RankActivity.BLOCKED]
    collective = str(view[blocked[0]].get("collective", "")) if blocked else ""
    return Stall(stuck, collective, since, view)


def describe(stall: Stall, job_name: str, stall_timeout: float, now: float) -> str:
    """The first paragraph of a stall error: who is stuck where, and what the others do."""
    parts = []
    order = stall.stuck + [r for r in sorted(stall.states) if r not in stall.stuck]
    for rank in order:
        s = stall.states[rank]
        age = now - float(s.get("since", now))
        state = activity(s)
        if state is RankActivity.BLOCKED:
            parts.append(f"rank {rank} blocked in {s.get('collective') or 'a collective'} "
                         f"for {age:.0f} s")
        elif state is RankActivity.FROZEN:
            parts.append(f"rank {rank} frozen (its process is stopped) for {age:.0f} s")
        else:
            parts.append(f"rank {rank} returned from its function")
    return (f"job {job_name!r} stalled: " + "; ".join(parts)
            + f". No rank made progress for {now - stall.since:.0f} s "
            f"(stall_timeout={stall_timeout:g} s): a collective that can no longer complete")


def stacks_text(stacks: Mapping[int, str], workers: list[str]) -> str:
    """The ranks' stacks as one block of text, rank by rank."""
    blocks = []
    for rank in sorted(stacks):
        where = f" on worker {workers[rank]}" if rank < len(workers) else ""
        blocks.append(f"--- rank {rank}{where} ---\n{stacks[rank].rstrip()}")
    return "\n".join(blocks)


def stall_error(stall: Stall, job_name: str, workers: list[str], stall_timeout: float,
                stacks: Mapping[int, str], now: float) -> StallError:
    """The error ending a stalled job, with every live rank's Python stack."""
    message = describe(stall, job_name, stall_timeout, now)
    if stacks:
        message += "\n\nPython stacks of the ranks:\n" + stacks_text(stacks, workers)
    first = stall.stuck[0]
    return StallError(message, first, workers[first] if first < len(workers) else "",
                      kind=FailureKind.STALLED, ranks=stall.stuck,
                      collective=stall.collective, stacks=dict(stacks))


def stall_record(err: StallError) -> dict[str, Any]:
    """The failure-topic record of a stall (the supervisors raise it in place of their
    abort; a dashboard shows it): plain data."""
    return {"rank": err.rank, "worker": err.worker, "kind": str(FailureKind.STALLED),
            "message": str(err), "traceback": "", "ranks": list(err.ranks),
            "collective": err.collective,
            "stacks": {str(r): t for r, t in err.stacks.items()}}
