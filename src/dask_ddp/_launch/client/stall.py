"""Stall detection: when a job's ranks can no longer make progress (internal).

Each rank's supervisor records its rank's state changes on the job's progress topic
(:func:`dask_ddp._launch.wire.names.progress_topic`): ``blocked`` in a collective (inside one
for ``dask-ddp.launch.blocked-after``), ``working`` again, ``returned`` from its function,
``frozen`` (stopped). The client's watcher reads the topic and calls :func:`find_stall`.

A job is stalled when no rank is working and at least one rank is blocked in a collective
or frozen: a collective that a peer which returned, froze or waits in another collective
will never join cannot complete. It is reported once that has lasted ``stall_timeout``
seconds. A rank that works (rank 0's long evaluation while the others wait at a barrier
or at the end) keeps the job out of a stall however long it takes.

A rank whose Python state is working may still wait in a collective the Python wrappers
do not see: DDP's gradient all-reduce, issued by its reducer from C++ inside
``backward()`` (the commonest DDP hang: uneven data, rank 1 trains one step more than
rank 0, which returned). Each supervisor also records its rank's latest c10d collective
from torch's flight recorder once it stood still (:mod:`~dask_ddp._launch.rank.probe`): its
sequence number in its process group, whether it completed, and the group's count of
every group the rank used. Such a rank is stuck (:func:`in_c10d`) when that collective
has not completed, no peer's count of its group is beyond it (a peer ahead means it
completed there and is being finished here), and some peer's count is below it (a peer
that never issued it) or some peer is frozen (whatever it counts: stopped inside the
same collective, it will never send its part). Then the rule above applies with it
counted as blocked: every other rank returned, blocked, frozen or stuck so too, and no
count moved for ``stall_timeout`` (the stall's start is when the collective was issued).
A rank that computes has a count equal to its peers' (or moving, and then no count is
recorded), none of them frozen, or its latest collective completed: never a stall.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from dask_ddp._launch.wire.stack_request import stacks_text
from dask_ddp._states import RankActivity
from dask_ddp.errors import FailureKind, StallError


@dataclasses.dataclass(frozen=True)
class Stall:
    """A stall found: the stuck ranks, since when (``time.time()``), per-rank states."""

    stuck: list[int]
    collective: str
    since: float
    states: dict[int, Mapping[str, Any]]
    #: The stuck ranks whose Python state is working: they wait in a c10d collective
    #: issued from C++ (their state's ``c10d`` says which).
    in_c10d: list[int] = dataclasses.field(default_factory=list)


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


def in_c10d(rank: int, view: Mapping[int, Mapping[str, Any]]) -> bool:
    """Whether ``rank`` waits in a c10d collective some peer never issued or cannot
    finish: its latest one (its state's ``c10d``) has not completed, no peer counts beyond
    it in its process group, and some peer counts below it (a peer with no count counts
    0), waits at the same count in another collective (a mismatch: gloo's barrier against
    the reducer's all-reduce waits for good), or is frozen (stopped inside this very
    collective after its probe read it, it counts the same: it will never send its part)."""
    mine = view[rank].get("c10d")
    if not isinstance(mine, Mapping) or mine.get("done"):
        return False
    group, seq = str(mine.get("group", "")), int(mine.get("seq", 0))
    missing = False
    for peer, state in view.items():
        if peer == rank:
            continue
        theirs = state.get("c10d")
        theirs = theirs if isinstance(theirs, Mapping) else {}
        counts = theirs.get("counts")
        count = int(counts.get(group, 0)) if isinstance(counts, Mapping) else 0
        if count > seq:
            return False
        missing = missing or count < seq or activity(state) is RankActivity.FROZEN or (
            str(theirs.get("group")) == group and int(theirs.get("seq", -1)) == seq
            and not theirs.get("done") and theirs.get("name") != mine.get("name"))
    return missing


def _since(state: Mapping[str, Any], c10d: bool, now: float) -> float:
    """When a rank reached its present state (for a rank stuck in a c10d collective:
    when it issued it)."""
    if c10d:
        return float(state["c10d"].get("since", now))
    return float(state.get("since", now))


def find_stall(states: Mapping[int, Mapping[str, Any]], finished: Mapping[int, float],
               world: int, now: float, stall_timeout: float) -> Stall | None:
    """The job's stall, when it has lasted ``stall_timeout`` seconds, else ``None``.

    ``states`` are the ranks' last states (:func:`latest_states`); ``finished`` the ranks
    whose task already ended, with when it was seen ended (they count as returned then,
    with their last c10d count: a task that ended is progress, and a peer's state may not
    show yet that the collective it waited in completed with it); a rank with no state
    works.
    """
    done = set(finished)
    view: dict[int, Mapping[str, Any]] = {}
    for rank in range(world):
        state = states.get(rank)
        if rank in done:
            view[rank] = {"state": RankActivity.RETURNED, "since": float(finished[rank]),
                          "c10d": state.get("c10d") if state is not None else None}
        elif state is None:
            return None
        else:
            view[rank] = state
    c10d = [r for r, s in view.items()
            if r not in done and activity(s) is RankActivity.WORKING and in_c10d(r, view)]
    if any(not activity(s).is_idle and r not in c10d for r, s in view.items()):
        return None
    # A rank in a collective its peers never issued first: the error is about it.
    stuck = c10d + [r for r, s in view.items()
                    if activity(s) in (RankActivity.BLOCKED, RankActivity.FROZEN)]
    if not stuck:
        return None
    # The stall began when the last rank reached its present state.
    since = max(_since(s, r in c10d, now) for r, s in view.items())
    if now - since < stall_timeout:
        return None
    blocked = [r for r in stuck if activity(view[r]) is RankActivity.BLOCKED]
    if c10d:
        collective = str(view[c10d[0]]["c10d"].get("name", ""))
    else:
        collective = str(view[blocked[0]].get("collective", "")) if blocked else ""
    return Stall(stuck, collective, since, view, c10d)


#: How to train on uneven data: the end of a stall error whose stuck rank issued a
#: collective its peers never did.
UNEVEN_HINT = (
    "A rank waits in a collective its peers never issued: the usual cause is uneven data "
    "(one rank trains more steps than another). Give every rank the same number of "
    "batches (torch's DistributedSampler with drop_last=True under a DataLoader, or "
    "dask_ddp.data's Loader, whose ranks yield equal batch counts), or train inside "
    "torch.distributed.algorithms.Join([model]) (DDP's model.join()), which lets a rank "
    "that ran out of data shadow its peers' collectives until every rank is done.")


def where_c10d(state: Mapping[str, Any], stack: str) -> str:
    """What a rank stuck in a c10d collective waits in, in words: DDP's gradient
    all-reduce when its Python stack is inside ``backward()``, DDP's forward-time
    broadcast inside its ``forward``, else the collective's name."""
    c10d = state["c10d"]
    name = str(c10d.get("name", "")) or "a c10d collective"
    what = f"{name} #{c10d.get('seq')} of process group {c10d.get('group')!r}"
    op = name.split(":")[-1]
    if op.startswith("all_reduce") and "backward" in stack:
        return f"DDP's gradient all-reduce ({what}, issued from backward())"
    if op.startswith("broadcast") and "nn/parallel/distributed.py" in stack:
        return f"DDP's forward-time broadcast ({what})"
    return what


def describe(stall: Stall, job_name: str, stall_timeout: float, now: float,
             stacks: Mapping[int, str] | None = None) -> str:
    """The first paragraph of a stall error: who is stuck where, and what the others do."""
    stacks = stacks or {}
    parts = []
    order = stall.stuck + [r for r in sorted(stall.states) if r not in stall.stuck]
    for rank in order:
        s = stall.states[rank]
        state = activity(s)
        if rank in stall.in_c10d:
            age = now - _since(s, True, now)
            parts.append(f"rank {rank} blocked in {where_c10d(s, stacks.get(rank, ''))} "
                         f"for {age:.0f} s")
            continue
        age = now - float(s.get("since", now))
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


def c10d_text(stall: Stall, now: float) -> str:
    """Each rank's latest c10d collective, from torch's flight recorder ("" when no rank
    recorded one)."""
    lines = []
    for rank in sorted(stall.states):
        c10d = stall.states[rank].get("c10d")
        if not isinstance(c10d, Mapping):
            continue
        done = "completed" if c10d.get("done") else "not completed"
        lines.append(f"rank {rank}: {c10d.get('name')} #{c10d.get('seq')} of process group "
                     f"{c10d.get('group')!r}, issued {now - float(c10d.get('since', now)):.0f} "
                     f"s ago, {done}")
    return "\n".join(lines)


def stacks_note(read: Callable[[], Mapping[int, str]], workers: list[str]) -> str:
    """The running ranks' stacks (``read()``) for an error message ("" when none)."""
    try:
        stacks = read()
    except Exception as exc:  # the error it goes into matters more
        return f"\n(the ranks' stacks could not be read: {exc})"
    if not stacks:
        return ""
    return "\n\nPython stacks of the ranks:\n" + stacks_text(stacks, workers)


def stall_error(stall: Stall, job_name: str, workers: list[str], stall_timeout: float,
                stacks: Mapping[int, str], now: float) -> StallError:
    """The error ending a stalled job: who is stuck where, each rank's latest c10d
    collective, how to train on uneven data (a rank stuck in a collective its peers never
    issued), and every live rank's Python stack."""
    message = describe(stall, job_name, stall_timeout, now, stacks)
    c10d = c10d_text(stall, now)
    if c10d:
        message += ("\n\nLatest c10d collective of each rank (torch's flight recorder):\n"
                    + c10d)
    if stall.in_c10d and not any(activity(stall.states[r]) is RankActivity.FROZEN
                                 for r in stall.stuck):
        # A frozen rank explains the wait by itself; else the peers never issued it.
        message += "\n\n" + UNEVEN_HINT
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


def rank_table(recorded: Mapping[int, Mapping[str, Any]], statuses: Sequence[str],
               workers: Sequence[str], start_time: float) -> dict[int, dict[str, Any]]:
    """Every rank's state as :meth:`Job.rank_states <dask_ddp.Job.rank_states>` shows it,
    from the ranks' ``recorded`` states (:func:`latest_states`) and their tasks'
    ``statuses``: a running rank's record (or "working" since ``start_time`` before its
    first), else its task's end; with the rank's worker and its latest c10d collective."""
    states: dict[int, dict[str, Any]] = {}
    for rank, status in enumerate(statuses):
        record = recorded.get(rank)
        if record is not None and (status == "pending" or record.get("state")
                                   == RankActivity.RETURNED):
            entry = {k: record[k] for k in ("state", "collective", "since") if k in record}
        elif status == "pending":
            entry = {"state": RankActivity.WORKING.value, "collective": "", "since": start_time}
        else:
            entry = {"state": status, "collective": "", "since": None}
        if record is not None and record.get("c10d"):
            entry["c10d"] = record["c10d"]  # its latest c10d collective the watcher saw
        states[rank] = {**entry, "worker": workers[rank]}
    return states
