"""The results channel's wire format: frames on the rank's pipe, entries on the scheduler.

**Frame** (what a rank writes to its pipe, at most :data:`PIPE_BUF` bytes, one atomic
``os.write``)::

    !I data length | !Q seq | !I pid | !H topic length | !I fragment | !I fragments
    | topic (utf-8) | data

``seq`` counts the records of one process on one topic, from 0; a record larger than a
frame is cut into consecutive fragments (same seq and pid).

**Entry** (what the Forwarder puts into a topic on the scheduler and the Reader gets
back): an :class:`Entry` of one of three kinds, told apart by ``nparts``:

- ``nparts == 1``, a *run*: ``records`` whole frames from ``seq`` on, as the rank wrote them;
- ``nparts > 1``, a *part*: part ``part`` of the one large record ``seq``;
- ``nparts == 0``, the *end marker* of a stream: ``seq`` is the number of records in it.

``source`` names the stream (``<job>/<rank>/<nonce>.<pid>``). Entries cross the Dask
comm as plain sequences (msgpack); :meth:`Entry.of` turns one back into an ``Entry``.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

from dask_ddp import _config

ENV_FD = "DASK_DDP_CHANNEL_FD"
#: Writes up to this size are atomic on a pipe (POSIX PIPE_BUF on Linux).
PIPE_BUF = 4096
#: Consecutive frames of a stream travel together in entries of up to this size.
PACK_MAX = 32 * 1024
#: Entry overhead counted against a topic's budget besides the payload bytes.
ENTRY_OVERHEAD = 96
#: Longest topic name, in utf-8 bytes.
MAX_TOPIC = 1024


class FrameHeader(NamedTuple):
    """The fixed-size head of a frame."""

    length: int  # data bytes after the topic
    seq: int
    pid: int
    topic_len: int
    fragment: int  # index of this fragment of the record
    fragments: int  # fragments of the record (1: a whole record)

    def pack(self) -> bytes:
        return _HEADER.pack(*self)

    @classmethod
    def unpack_from(cls, buf: Any, pos: int = 0) -> FrameHeader:
        return cls(*_HEADER.unpack_from(buf, pos))


_HEADER = struct.Struct("!IQIHII")
#: Size of a :class:`FrameHeader` on the wire.
HEADER_SIZE = _HEADER.size


class Entry(NamedTuple):
    """One entry of a topic (see the module docstring for the three kinds)."""

    source: str
    seq: int
    records: int  # whole records in a run (1 for a part, 0 for an end marker)
    part: int
    nparts: int
    payload: bytes

    @classmethod
    def of(cls, raw: Sequence[Any]) -> Entry:
        """An entry from its wire form (a list or tuple), with checked types."""
        source, seq, records, part, nparts, payload = raw
        return cls(str(source), int(seq), int(records), int(part), int(nparts), bytes(payload))

    @classmethod
    def run(cls, source: str, seq: int, records: int, frames: bytes) -> Entry:
        return cls(source, seq, records, 0, 1, frames)

    @classmethod
    def end(cls, source: str, records: int) -> Entry:
        return cls(source, records, 0, 0, 0, b"")

    @property
    def is_end(self) -> bool:
        return self.nparts == 0

    @property
    def is_run(self) -> bool:
        return self.nparts == 1

    @property
    def size(self) -> int:
        """Bytes counted against the topic's budget."""
        return len(self.payload) + ENTRY_OVERHEAD


#: Longest stream name (``<job>/<rank>/<nonce>.<pid>``), in characters.
MAX_SOURCE = 1024


def parse_entry(raw: Any) -> Entry:
    """An :class:`Entry` from its wire form, checked whole before anything reads it.

    The scheduler checks every entry a forwarder puts, the reader every entry it gets: a
    malformed one (from a broken or hostile peer) raises :class:`ValueError` saying what
    is wrong, and is never half-read.
    """
    try:
        e = Entry.of(raw)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"not a results entry ({exc})") from None
    if not e.source or len(e.source) > MAX_SOURCE:
        raise ValueError(f"its stream name is empty or over {MAX_SOURCE} characters")
    if min(e.seq, e.records, e.part, e.nparts) < 0:
        raise ValueError(f"a negative number in seq={e.seq} records={e.records} "
                         f"part={e.part} nparts={e.nparts}")
    if e.is_end:
        if e.records or e.part or e.payload:
            raise ValueError("an end marker that carries records or data")
    elif e.is_run:
        _check_run(e)
    elif e.part >= e.nparts:
        raise ValueError(f"part {e.part} of a record cut into {e.nparts} parts")
    return e


def _check_run(e: Entry) -> None:
    size = len(e.payload)
    if not 1 <= e.records <= size // HEADER_SIZE:
        raise ValueError(f"a run that claims {e.records} records in {size} bytes")
    pos = 0
    for i in range(e.records):
        if pos + HEADER_SIZE > size:
            raise ValueError(f"record {e.seq + i} of a run starts past its {size} bytes")
        head = FrameHeader.unpack_from(e.payload, pos)
        pos += HEADER_SIZE + head.topic_len + head.length
        if pos > size:
            raise ValueError(f"record {e.seq + i} of a run ends past its {size} bytes")
    if pos != size:
        raise ValueError(f"a run with {size - pos} bytes after its {e.records} records")


def iter_run(entry: Entry) -> Iterator[tuple[FrameHeader, bytes]]:
    """The frames of a run entry (checked by :func:`parse_entry`): each header and its
    record's data."""
    view = memoryview(entry.payload)
    pos = 0
    for _ in range(entry.records):
        head = FrameHeader.unpack_from(view, pos)
        start = pos + HEADER_SIZE + head.topic_len
        yield head, bytes(view[start : start + head.length])
        pos = start + head.length


def rank_of(source: str) -> int:
    """The rank in a stream name ``<job>/<rank>/<nonce>.<pid>`` (-1 when it has none)."""
    try:
        return int(source.split("/")[-2])
    except (IndexError, ValueError):
        return -1


def metrics_topic(job_id: str) -> str:
    """The topic carrying the ``report()`` records of a job."""
    return f"metrics/{job_id}"


def budget_bytes() -> int:
    """The per-topic memory budget on the scheduler (``dask-ddp.results.budget``)."""
    return _config.positive_bytes("dask-ddp.results.budget")


def total_budget_bytes() -> int:
    """The memory budget of all topics together (``dask-ddp.results.total-budget``)."""
    return _config.positive_bytes("dask-ddp.results.total-budget")


def unread_warning_seconds() -> float:
    """How long writers wait on a full topic nobody reads before it is logged
    (``dask-ddp.results.unread-warning``)."""
    return _config.positive_seconds("dask-ddp.results.unread-warning")


def part_size() -> int:
    """The largest part a record is cut into on its way through the scheduler."""
    return _config.positive_bytes("dask-ddp.results.part-size")


def expiry_seconds() -> float:
    """How long a topic nobody reads, whose writers are done, stays on the scheduler
    (``dask-ddp.results.expiry``)."""
    return _config.positive_seconds("dask-ddp.results.expiry")


def put_retry_seconds() -> float:
    """How long a Forwarder retries a put the scheduler does not answer
    (``dask-ddp.results.put-retry``)."""
    return _config.positive_seconds("dask-ddp.results.put-retry")


def checked_reply(reply: Any, op: str, address: str) -> dict[str, Any]:
    """``reply`` of handler ``op``, or an error naming the scheduler when it has none.

    ``distributed`` answers a call to a handler the scheduler does not have with
    ``None`` (and a log line on the scheduler), not an exception.
    """
    if not isinstance(reply, dict):
        raise RuntimeError(
            f"the scheduler at {address} has no dask-ddp results handler {op!r} "
            "(its extension is missing: was the scheduler restarted?)"
        )
    return reply
