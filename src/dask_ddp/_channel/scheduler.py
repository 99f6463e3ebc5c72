"""The results channel on the scheduler: one append-only log per topic (internal).

Per topic: the entries with a global offset, a memory budget (``dask-ddp.results.budget``)
and the last ``(seq, part)`` accepted per stream, which makes the Forwarder's retries
idempotent. Nothing is freed before the reader acknowledges it (asking from cursor ``c``
acknowledges every entry before ``c``), so a client that starts reading late still gets
everything.

A topic is removed when its reader closes it, or when it is abandoned (checked every
second, see :meth:`Topic.abandoned`): its client went away, or every rank task that wrote
to it was released, or nobody read it for ``dask-ddp.results.expiry`` while no writer was
running. A put to a removed topic from one of its writers (or from a writer that does not
say who it is) is accepted and dropped: the rank must not block on a topic nobody will
read. A put from a new writer (the next job of a reused results handler) opens the topic
afresh, and so does :meth:`ResultsExtension.open`; a get on a removed topic raises
:class:`LookupError`.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from distributed.diagnostics.plugin import SchedulerPlugin
from tornado.ioloop import PeriodicCallback

from dask_ddp._channel.wire import (
    Entry,
    budget_bytes,
    expiry_seconds,
    parse_entry,
    total_budget_bytes,
    unread_warning_seconds,
)

logger = logging.getLogger(__name__)

PLUGIN_NAME = "dask-ddp-results"
EXTENSION = "dask_ddp_results"
#: Seconds after its last get a reader still counts as attached (it polls much faster).
READER_LEASE_S = 10.0
#: Seconds between two checks for abandoned topics.
SWEEP_S = 1.0
#: Removed topics remembered, so late puts to them are dropped instead of re-creating them.
TOMBSTONES = 4096
#: The scheduler event topic telling the job pages that a full topic is not read
#: (``{"state": "unread", "topic", "writers", "since", "used", "budget"}``) or is read
#: again (``{"state": "read", "topic"}``); the writers are rank task keys.
UNREAD_EVENT = "dask-ddp-results-unread"
#: Writers named in one such event.
UNREAD_WRITERS = 64
#: Task states in which a writing rank task may still put records.
_ACTIVE = frozenset({"released", "waiting", "no-worker", "queued", "processing"})


class Tombstone(NamedTuple):
    """A topic removed as abandoned."""

    reason: str
    writers: frozenset[str]


@dataclass
class Topic:
    """One topic's log and what decides when it is abandoned."""

    budget: int
    expiry: float
    entries: collections.deque[Entry] = field(default_factory=collections.deque)
    base: int = 0  # offset of entries[0]
    used: int = 0
    last: dict[str, tuple[int, int]] = field(default_factory=dict)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    owner: str | None = None  # the client that opened or last read it
    writers: set[str] = field(default_factory=set)  # task keys of the Forwarders
    reading: int = 0  # gets in flight
    last_read: float = field(default_factory=time.monotonic)
    full_since: float | None = None  # writers waiting on a full budget since
    warned: bool = False

    def notify(self) -> None:
        # Swap the event so that waiters that armed the old one wake up exactly once.
        self.changed.set()
        self.changed = asyncio.Event()

    def free_before(self, cursor: int) -> bool:
        """Drop the entries before ``cursor``; whether any were dropped."""
        freed = False
        while self.entries and self.base < cursor:
            self.used -= self.entries.popleft().size
            self.base += 1
            freed = True
        if freed:
            self.full_since = None
            self.notify()
        return freed

    def accept(self, entries: list[Entry], room: int | None = None, held: int = 0) -> int:
        """Store ``entries`` from the front while they fit; how many were taken.

        An entry fits when the topic's budget has room for it (or the topic is empty) and
        ``room``, what the budget of all topics leaves, has room for it too (or no topic
        holds anything: ``held`` is what all topics hold), so one entry larger than a
        budget still travels.
        """
        n = 0
        for e in entries:
            key = (e.seq, e.part)
            if key <= self.last.get(e.source, (-1, -1)):  # a retried put: already stored
                n += 1
                continue
            over_topic = self.used and self.used + e.size > self.budget
            over_all = room is not None and held and e.size > room
            if over_topic or over_all:
                if self.full_since is None:
                    self.full_since = time.monotonic()
                break
            if room is not None:
                room -= e.size
            held += e.size
            self.entries.append(e)
            self.used += e.size
            self.last[e.source] = key
            n += 1
        return n

    def abandoned(self, now: float, clients: Any, tasks: Any) -> str | None:
        """Why nobody will read this topic any more, or None while someone may."""
        if self.reading:
            return None
        if self.owner is not None and self.owner not in clients:
            return f"its client {self.owner} went away"
        idle = now - self.last_read
        if idle < READER_LEASE_S:
            return None
        if self.writers and not any(k in tasks for k in self.writers):
            return "the rank tasks writing to it were released"
        if idle >= self.expiry and not any(
            (ts := tasks.get(k)) is not None and ts.state in _ACTIVE for k in self.writers
        ):
            return f"nobody read it for {self.expiry:g} s and no rank writes to it"
        return None


class ResultsExtension:
    """Scheduler-side store of every results topic (see the module docstring)."""

    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        self.topics: dict[str, Topic] = {}
        #: Removed topics: why, and the task keys that wrote to them.
        self.removed: collections.OrderedDict[str, Tombstone] = collections.OrderedDict()
        scheduler.handlers.update(
            {
                "dask_ddp_results_open": self.open,
                "dask_ddp_results_put": self.put,
                "dask_ddp_results_get": self.get,
                "dask_ddp_results_close": self.close,
                "dask_ddp_results_info": self.info,
                "dask_ddp_results_declare": self.declare,
                "dask_ddp_results_storage": self.storage,
            }
        )
        #: Each job's storage URL, as its launching client declared it: the only place a
        #: stored result of the job may be fetched from (the newest jobs, bounded).
        self.job_storage: collections.OrderedDict[str, str] = collections.OrderedDict()
        self.total_budget = total_budget_bytes()
        self.unread_warning = unread_warning_seconds()
        self._sweeper = PeriodicCallback(self.sweep, SWEEP_S * 1000)
        scheduler.periodic_callbacks["dask-ddp-results-sweep"] = self._sweeper
        self._sweeper.start()

    def _topic(self, topic: str) -> Topic:
        t = self.topics.get(topic)
        if t is None:
            t = self.topics[topic] = Topic(budget_bytes(), expiry_seconds())
        return t

    def open(
        self,
        topic: str,
        budget: int | None = None,
        client: str | None = None,
        expiry: float | None = None,
    ) -> dict[str, Any]:
        """Create ``topic`` (or update it) for ``client``, who will read it.

        ``removed`` in the reply says why, when the topic had been removed as abandoned
        (its unread records are lost).
        """
        gone = self.removed.pop(topic, None)
        t = self._topic(topic)
        if budget:
            t.budget = int(budget)
        if expiry:
            t.expiry = float(expiry)
        if client is not None:
            t.owner = client
        t.last_read = time.monotonic()
        reply: dict[str, Any] = {"budget": t.budget}
        if gone is not None:
            reply["removed"] = gone.reason
        return reply

    async def put(
        self, topic: str, entries: list[Any], wait: float = 1.0, writer: str | None = None
    ) -> dict[str, Any]:
        """Append ``entries`` (:class:`Entry` in wire form) from the task ``writer``.

        Returns how many entries from the front were taken (stored or already stored).
        When none fit in the budget, waits up to ``wait`` seconds for the reader to free
        memory first: the caller retries the rest, which is how back-pressure travels.
        A removed topic takes everything and drops it (``dropped`` says why).
        """
        gone = self.removed.get(topic)
        if gone is not None:
            if writer is None or writer in gone.writers:
                return {"accepted": len(entries), "dropped": gone.reason}
            del self.removed[topic]  # a new job writes to it: a new topic
        batch, at = self._checked(topic, writer, entries)
        t = self._topic(topic)
        if writer:
            t.writers.add(writer)
        n = t.accept(batch, *self._room())
        deadline = time.monotonic() + wait
        while n == 0 and batch:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            event = t.changed
            try:
                await asyncio.wait_for(event.wait(), remaining)
            except asyncio.TimeoutError:
                break
            if topic in self.removed:
                return {"accepted": len(entries), "dropped": self.removed[topic].reason}
            t = self._topic(topic)
            if writer:
                t.writers.add(writer)
            n = t.accept(batch, *self._room())
        if n:
            t.notify()
        # Counted in the caller's list: a malformed entry is taken (and dropped) with the
        # valid ones around it, so the forwarder never retries it.
        taken = len(entries) if n == len(batch) else at[n]
        return {"accepted": taken, "used": t.used, "budget": t.budget}

    def declare(self, job_id: str, storage: str) -> None:
        """The launching client says where job ``job_id`` keeps its storage."""
        self.job_storage[str(job_id)] = str(storage)
        self.job_storage.move_to_end(str(job_id))
        while len(self.job_storage) > TOMBSTONES:
            self.job_storage.popitem(last=False)

    def storage(self, job_id: str) -> str | None:
        """The storage URL job ``job_id``'s client declared, if any."""
        return self.job_storage.get(str(job_id))

    def _room(self) -> tuple[int, int]:
        """What the budget of all topics (``dask-ddp.results.total-budget``) has left, and
        what all topics hold: many topics never hold more than it together, whatever
        each one's own budget."""
        held = sum(x.used for x in self.topics.values())
        return max(0, self.total_budget - held), held

    def _checked(self, topic: str, writer: str | None,
                 entries: list[Any]) -> tuple[list[Entry], list[int]]:
        """The well-formed entries of a put, and where each stood in ``entries``; each
        malformed one is logged with its reason and dropped (its reader reports a gap)."""
        batch: list[Entry] = []
        at: list[int] = []
        for i, raw in enumerate(entries):
            try:
                batch.append(parse_entry(raw))
                at.append(i)
            except ValueError as exc:
                logger.warning("results topic %r: refused a malformed entry from %s: %s",
                               topic[:200], writer or "an unnamed writer", exc)
        return batch, at

    async def get(
        self,
        topic: str,
        cursor: int,
        max_bytes: int = 8 << 20,
        timeout: float = 1.0,
        client: str | None = None,
    ) -> dict[str, Any]:
        """Entries from offset ``cursor`` on; frees (acknowledges) every entry before it."""
        gone = self.removed.get(topic)
        if gone is not None and gone.reason == "its reader closed it":
            # A get its reader had in flight when it closed the topic: nothing more.
            return {"entries": [], "cursor": cursor, "closed": True}
        if gone is not None:
            raise LookupError(
                f"results topic {topic!r} was removed from the scheduler: "
                f"{gone.reason}"
            )
        t = self._topic(topic)
        if cursor < t.base:
            raise ValueError(
                f"results topic {topic!r}: cursor {cursor} was already acknowledged "
                f"(first kept offset {t.base}); two readers on one topic?"
            )
        if client is not None:
            t.owner = client
        t.reading += 1
        try:
            if t.free_before(cursor) and t.warned:
                t.warned = False
                self.scheduler.log_event(UNREAD_EVENT, {"state": "read", "topic": topic[:200]})
            deadline = time.monotonic() + timeout
            while t.base + len(t.entries) <= cursor:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return {"entries": [], "cursor": cursor}
                event = t.changed
                try:
                    await asyncio.wait_for(event.wait(), remaining)
                except asyncio.TimeoutError:
                    return {"entries": [], "cursor": cursor}
                if self.topics.get(topic) is not t:
                    return {"entries": [], "cursor": cursor}
        finally:
            t.reading -= 1
            t.last_read = time.monotonic()
        out: list[Entry] = []
        size = 0
        i = cursor - t.base
        while i < len(t.entries) and (not out or size < max_bytes):
            entry = t.entries[i]
            out.append(entry)
            size += len(entry.payload)
            i += 1
        return {"entries": out, "cursor": cursor + len(out)}

    def close(self, topic: str) -> None:
        """Forget a topic and free its memory (its reader is done).

        A tombstone stays: later puts of its writers are dropped instead of making the
        topic again with no reader (where, once full, they would wait for good). A reader
        that opens it again, or a writer it never had, makes it anew.
        """
        t = self.topics.pop(topic, None)
        if t is not None:
            self._bury(topic, "its reader closed it", t)
            t.notify()

    def _bury(self, topic: str, reason: str, t: Topic | None) -> None:
        self.removed[topic] = Tombstone(reason, frozenset(t.writers) if t else frozenset())
        while len(self.removed) > TOMBSTONES:
            self.removed.popitem(last=False)

    def remove(self, topic: str, reason: str) -> None:
        """Drop an abandoned topic; later puts to it are dropped too."""
        t = self.topics.pop(topic, None)
        self._bury(topic, reason, t)
        if t is not None and t.warned:
            self.scheduler.log_event(UNREAD_EVENT, {"state": "read", "topic": topic[:200]})
        if t is not None:
            if t.used:
                logger.warning(
                    "results topic %r removed with %d unread entries (%d bytes): %s",
                    topic, len(t.entries), t.used, reason,
                )
            else:
                logger.info("results topic %r removed: %s", topic, reason)
            t.notify()

    def sweep(self) -> None:
        """Remove the abandoned topics (runs every :data:`SWEEP_S` seconds)."""
        now = time.monotonic()
        clients, tasks = self.scheduler.clients, self.scheduler.tasks
        for name, t in list(self.topics.items()):
            reason = t.abandoned(now, clients, tasks)
            if reason is not None:
                self.remove(name, reason)
            elif (t.full_since is not None and not t.warned and not t.reading
                  and now - t.full_since >= self.unread_warning
                  and now - t.last_read >= self.unread_warning):
                t.warned = True
                self.scheduler.log_event(UNREAD_EVENT, {
                    "state": "unread", "topic": name[:200],
                    "writers": sorted(t.writers)[:UNREAD_WRITERS],
                    "since": time.time() - (now - t.full_since),
                    "used": t.used, "budget": t.budget})
                logger.warning(
                    "results topic %r is full and nobody read it for %.0f s: its writers "
                    "(%s) wait in report()/submit_result() until it is read (%d of %d bytes; "
                    "all topics %d of %d). Read the job's results (Job.result(), "
                    "process_results) or raise dask-ddp.results.budget",
                    name[:200], now - t.last_read, ", ".join(sorted(t.writers)[:4]) or "?",
                    t.used, t.budget, sum(x.used for x in self.topics.values()),
                    self.total_budget)

    def info(self, topic: str | None = None) -> dict[str, Any]:
        names = [topic] if topic is not None else list(self.topics)
        return {
            n: {
                "used": t.used,
                "budget": t.budget,
                "base": t.base,
                "length": len(t.entries),
                "owner": t.owner,
                "writers": sorted(t.writers),
            }
            for n in names
            if (t := self.topics.get(n)) is not None
        }


class ResultsPlugin(SchedulerPlugin):
    """Installs :class:`ResultsExtension` on the scheduler (registered idempotently)."""

    name = PLUGIN_NAME
    idempotent = True

    async def start(self, scheduler: Any) -> None:
        if EXTENSION not in scheduler.extensions:
            scheduler.extensions[EXTENSION] = ResultsExtension(scheduler)
