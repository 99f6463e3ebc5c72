"""The results channel on the client: topics, the :class:`Reader` and the fetch loop.

The Reader long-polls ``(topic, cursor)``; asking from cursor ``c`` acknowledges every
entry before ``c``. It drops duplicates by ``(source, seq)``, reassembles parts and
reports gaps (a sequence number skipped, or a stream whose end marker counts more records
than arrived) instead of skipping them. :func:`follow` is the one loop that drains a topic
while a job runs (``process_results`` and the job monitor both use it) and always closes
the topic at the end, also on error.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dask_ddp._channel.scheduler import ResultsPlugin
from dask_ddp._channel.wire import (
    Entry,
    budget_bytes,
    checked_reply,
    expiry_seconds,
    iter_run,
    metrics_topic,
    parse_entry,
    rank_of,
)

logger = logging.getLogger(__name__)


def ensure_extension(client: Any) -> None:
    """Install the scheduler extension (idempotent: one cheap round trip).

    Not cached by scheduler address on purpose: a new scheduler may come up on the
    address of one that is gone (port reuse, a restarted cluster), and a cache keyed
    that way would skip the install and leave the handlers missing.
    """
    client.register_plugin(ResultsPlugin())


def open_topic(client: Any, topic: str, budget: int | None = None, *, keep: bool = False) -> None:
    """Create ``topic`` on the scheduler, to be read by ``client`` (idempotent).

    ``keep`` leaves the budget and expiry of an existing topic as they are (a reader
    joining); otherwise they are set from this process's Dask config.
    """
    ensure_extension(client)
    reply = client.sync(
        client.scheduler.dask_ddp_results_open,
        topic=topic,
        budget=None if keep else budget or budget_bytes(),
        expiry=None if keep else expiry_seconds(),
        client=client.id,
    )
    reply = checked_reply(reply, "dask_ddp_results_open", client.scheduler.address)
    if reply.get("removed"):
        logger.error(
            "results topic %r had been removed from the scheduler before it was read (%s); "
            "the records it held are lost",
            topic,
            reply["removed"],
        )


def prepare(client: Any, job_id: str, storage: str | None = None) -> None:
    """Make the scheduler ready to carry the records of ``job_id`` (idempotent), and
    declare the job's ``storage``: the one place its stored results may come from."""
    open_topic(client, metrics_topic(job_id))
    if storage:
        client.sync(client.scheduler.dask_ddp_results_declare, job_id=job_id,
                    storage=storage)


def job_storage(client: Any, job_id: str) -> str | None:
    """The storage URL declared for ``job_id`` when it was launched, if any."""
    found = client.sync(client.scheduler.dask_ddp_results_storage, job_id=job_id)
    return found if isinstance(found, str) else None


@dataclass
class Record:
    """One record off a topic: its stream (``source``), rank, sequence and payload."""

    source: str
    rank: int
    seq: int
    payload: bytes


class GapError(RuntimeError):
    """Records of a stream are missing (never silently skipped)."""


@dataclass
class _Stream:
    """What the Reader knows of one stream."""

    expected: int = 0  # the next sequence number
    ended: bool = False
    parts: list[bytes] | None = None  # parts of a large record so far


@dataclass
class Reader:
    """Reads one topic from the scheduler: exactly once, in order per source.

    Parameters
    ----------
    client
        A ``distributed.Client`` connected to the scheduler.
    topic
        The topic; one reader per topic.
    on_gap
        Called with a :class:`GapError` when records are missing; default raises it.
    """

    client: Any
    topic: str
    on_gap: Callable[[GapError], None] | None = None
    cursor: int = 0
    streams: dict[str, _Stream] = field(default_factory=dict)
    gaps: list[GapError] = field(default_factory=list)
    closed: bool = False

    def __post_init__(self) -> None:
        open_topic(self.client, self.topic, keep=True)

    def _gap(self, message: str) -> None:
        err = GapError(f"results topic {self.topic!r}: {message}")
        self.gaps.append(err)
        if self.on_gap is None:
            raise err
        self.on_gap(err)

    def fetch(self, timeout: float = 1.0) -> list[Record]:
        """Records that arrived (waits up to ``timeout`` seconds for the first)."""
        reply = self.client.sync(
            self.client.scheduler.dask_ddp_results_get,
            topic=self.topic,
            cursor=self.cursor,
            timeout=timeout,
            client=self.client.id,
        )
        reply = checked_reply(reply, "dask_ddp_results_get", self.client.scheduler.address)
        self.cursor = int(reply["cursor"])
        out: list[Record] = []
        for raw in reply["entries"]:
            try:
                entry = parse_entry(raw)
            except ValueError as exc:  # the scheduler refuses these: an older or odd peer
                self._gap(f"a malformed entry was skipped: {exc}")
                continue
            self._take(out, entry)
        return out

    def _take(self, out: list[Record], e: Entry) -> None:
        s = self.streams.setdefault(e.source, _Stream())
        if e.is_end:
            s.ended = True
            if e.seq != s.expected or s.parts is not None:
                self._gap(f"stream {e.source} ended after {e.seq} records, {s.expected} arrived")
            return
        if e.seq < s.expected:
            return  # duplicate
        if e.seq > s.expected:
            self._gap(f"stream {e.source}: records {s.expected}..{e.seq - 1} are missing")
            s.parts = None
        rank = rank_of(e.source)
        if e.is_run:  # a run of whole frames, as the rank wrote them
            for i, (head, data) in enumerate(iter_run(e)):
                if head.seq != e.seq + i:
                    self._gap(f"stream {e.source}: corrupt run at record {e.seq + i}")
                    break
                out.append(Record(e.source, rank, head.seq, data))
            s.expected = e.seq + e.records
            return
        parts = s.parts if s.parts is not None else []
        if e.part != len(parts):
            if e.part > len(parts):
                lost = f"{len(parts)}..{e.part - 1}"
                self._gap(f"stream {e.source}: record {e.seq} lost parts {lost}")
                s.parts = None
            return  # else a duplicate part
        parts.append(e.payload)
        s.parts = parts
        if len(parts) < e.nparts:
            return
        s.parts = None
        s.expected = e.seq + 1
        out.append(Record(e.source, rank, e.seq, b"".join(parts)))

    def unfinished(self) -> list[str]:
        """Streams seen without their end marker (their forwarder or worker died)."""
        return sorted(name for name, s in self.streams.items() if not s.ended)

    def close(self) -> None:
        """Free the topic on the scheduler (idempotent).

        Streams that never sent their end marker are logged: records written after the
        last one that arrived may be lost (the worker holding the pipe died).
        """
        if self.closed:
            return
        self.closed = True
        for source in self.unfinished():
            logger.warning(
                "results topic %r: stream %s (rank %d) has no end marker after %d records; "
                "its worker may have died with records still in the rank's pipe",
                self.topic,
                source,
                rank_of(source),
                self.streams[source].expected,
            )
        try:
            self.client.sync(self.client.scheduler.dask_ddp_results_close, topic=self.topic)
        except Exception:  # noqa: BLE001 - the scheduler may be gone at shutdown
            logger.debug("closing results topic %s failed", self.topic, exc_info=True)


def follow(
    reader: Reader,
    futures: Sequence[Any],
    handle: Callable[[list[Record]], bool | None],
    *,
    poll: float = 0.5,
) -> None:
    """Hand the records of ``reader``'s topic to ``handle`` until ``futures`` are done.

    Ends once every future is done and the topic is drained, or when ``handle`` returns
    True; ``handle`` is called after every fetch, with the records (maybe none), so it
    can also look at the futures. The reader is closed in every case (the topic is
    removed from the scheduler), also when ``handle``, a gap or an interrupt raises.
    """
    try:
        while True:
            done = all(f.done() for f in futures)
            records = reader.fetch(timeout=0 if done else poll)
            if handle(records):
                return
            if done and not records:
                return
    finally:
        reader.close()
