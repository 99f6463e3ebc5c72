"""The results channel between rank processes and the client (internal).

Records go ``rank process -> pipe -> Forwarder (in the worker) -> scheduler -> client``:

- **Rank side** (:func:`write`): each record is written to the pipe whose write end is
  ``DASK_DDP_CHANNEL_FD`` before the call returns, as frames of at most ``PIPE_BUF``
  (4096) bytes: each frame is one atomic ``os.write``, so frames stay whole even when the
  rank's threads and the processes it forked (DataLoader workers, which inherit the pipe)
  write at once. Nothing is buffered in the rank's memory, so a record whose ``write``
  returned survives ``os._exit`` and ``SIGKILL`` (it is in the kernel's pipe buffer), and
  a full pipe blocks the rank: the back-pressure of the whole channel ends there. Frame::

      !I data length | !Q seq | !I pid | !H topic length | !I fragment | !I fragments
      | topic (utf-8) | data

  ``seq`` counts the records of one process on one topic, from 0; a record larger than a
  frame is cut into consecutive fragments (same seq, pid).
- **Worker side** (:class:`Forwarder`): a thread reads the pipe, cuts frames into parts of
  at most ``dask-ddp.results.part-size`` and puts them into the scheduler's store for the
  topic. A put that does not fit in the topic's budget waits there; the Forwarder stops
  reading the pipe meanwhile. At end of stream it puts an end marker carrying the count of
  records, so the client can tell a complete stream from one that lost its tail.
- **Scheduler side** (:class:`ResultsExtension`): per topic, an append-only log of entries
  with a global offset, a memory budget (``dask-ddp.results.budget``, 64 MiB by default) and
  the last ``(seq, part)`` accepted per source, which makes the Forwarder's retries
  idempotent. Nothing is freed before the reader acknowledges it, so a client that starts
  reading late still gets everything.
- **Client side** (:class:`Reader`): long-polls ``(topic, cursor)``; asking from cursor
  ``c`` acknowledges every entry before ``c``. It drops duplicates by ``(source, seq)``,
  reassembles parts and reports gaps (a sequence number skipped, or a stream whose end
  marker counts more records than arrived) instead of skipping them.

Contract with the launcher (dispatch.py, _rank.py): :func:`prepare` once per job before the
rank tasks are submitted; the supervisor task makes a pipe per rank, passes its write end to
the rank process (``pass_fds``, number in ``DASK_DDP_CHANNEL_FD``), closes it in the worker,
runs ``Forwarder(job_id, rank, read_fd).start()`` and calls :meth:`Forwarder.close` after the
process has exited.
"""

from __future__ import annotations

import asyncio
import collections
import fcntl
import logging
import os
import struct
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import dask.config
from dask.utils import parse_bytes
from distributed.diagnostics.plugin import SchedulerPlugin

logger = logging.getLogger(__name__)

ENV_FD = "DASK_DDP_CHANNEL_FD"
_HEADER = struct.Struct("!IQIHII")
#: Consecutive frames of a stream travel together in entries of up to this size.
_PACK_MAX = 32 * 1024
#: Writes up to this size are atomic on a pipe (POSIX PIPE_BUF on Linux).
PIPE_BUF = 4096
_PLUGIN_NAME = "dask-ddp-results"
_EXTENSION = "dask_ddp_results"
#: Entry overhead counted against the budget besides the payload bytes.
_ENTRY_OVERHEAD = 96
_F_SETPIPE_SZ = 1031  # Linux fcntl: grow a pipe's kernel buffer


def budget_bytes() -> int:
    """The per-topic memory budget on the scheduler (``dask-ddp.results.budget``)."""
    value = dask.config.get("dask-ddp.results.budget", default="64 MiB")
    n = parse_bytes(value) if isinstance(value, str) else int(value)
    if n <= 0:
        raise ValueError(f"dask-ddp.results.budget must be positive, got {value!r}")
    return n


def part_size() -> int:
    """The largest part a record is cut into on its way through the scheduler."""
    value = dask.config.get("dask-ddp.results.part-size", default="1 MiB")
    n = parse_bytes(value) if isinstance(value, str) else int(value)
    if n <= 0:
        raise ValueError(f"dask-ddp.results.part-size must be positive, got {value!r}")
    return n


# --------------------------------------------------------------------------- scheduler side


@dataclass
class _Topic:
    budget: int
    entries: collections.deque[list[Any]] = field(default_factory=collections.deque)
    base: int = 0  # offset of entries[0]
    used: int = 0
    last: dict[str, tuple[int, int]] = field(default_factory=dict)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def notify(self) -> None:
        # Swap the event so that waiters that armed the old one wake up exactly once.
        self.changed.set()
        self.changed = asyncio.Event()

    def free_before(self, cursor: int) -> None:
        freed = False
        while self.entries and self.base < cursor:
            entry = self.entries.popleft()
            self.used -= len(entry[5]) + _ENTRY_OVERHEAD
            self.base += 1
            freed = True
        if freed:
            self.notify()


class ResultsExtension:
    """Scheduler-side store of every results topic (see the module docstring)."""

    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        self.topics: dict[str, _Topic] = {}
        scheduler.handlers.update(
            {
                "dask_ddp_results_open": self.open,
                "dask_ddp_results_put": self.put,
                "dask_ddp_results_get": self.get,
                "dask_ddp_results_close": self.close,
                "dask_ddp_results_info": self.info,
            }
        )

    def _topic(self, topic: str, budget: int | None = None) -> _Topic:
        t = self.topics.get(topic)
        if t is None:
            t = self.topics[topic] = _Topic(budget if budget else budget_bytes())
        return t

    def open(self, topic: str, budget: int | None = None) -> dict[str, int]:
        t = self._topic(topic, budget)
        if budget:
            t.budget = int(budget)
        return {"budget": t.budget}

    def _accept(self, t: _Topic, entries: list[list[Any]]) -> int:
        n = 0
        for source, seq, count, part, nparts, payload in entries:
            key = (int(seq), int(part))
            if key <= t.last.get(source, (-1, -1)):  # a retried put: already stored
                n += 1
                continue
            size = len(payload) + _ENTRY_OVERHEAD
            if t.used and t.used + size > t.budget:
                break
            t.entries.append([source, key[0], int(count), key[1], int(nparts), payload])
            t.used += size
            t.last[source] = key
            n += 1
        return n

    async def put(self, topic: str, entries: list[list[Any]], wait: float = 1.0) -> dict[str, int]:
        """Append ``entries`` (``[source, seq, count, part, nparts, payload]``).

        Returns how many entries from the front were taken (stored or already stored).
        When none fit in the budget, waits up to ``wait`` seconds for the reader to free
        memory first: the caller retries the rest, which is how back-pressure travels.
        """
        t = self._topic(topic)
        n = self._accept(t, entries)
        deadline = time.monotonic() + wait
        while n == 0 and entries:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            event = t.changed
            try:
                await asyncio.wait_for(event.wait(), remaining)
            except asyncio.TimeoutError:
                break
            t = self._topic(topic)
            n = self._accept(t, entries)
        if n:
            t.notify()
        return {"accepted": n, "used": t.used, "budget": t.budget}

    async def get(
        self, topic: str, cursor: int, max_bytes: int = 8 << 20, timeout: float = 1.0
    ) -> dict[str, Any]:
        """Entries from offset ``cursor`` on; frees (acknowledges) every entry before it."""
        t = self._topic(topic)
        if cursor < t.base:
            raise ValueError(
                f"results topic {topic!r}: cursor {cursor} was already acknowledged "
                f"(first kept offset {t.base}); two readers on one topic?"
            )
        t.free_before(cursor)
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
            t = self._topic(topic)
        out: list[list[Any]] = []
        size = 0
        i = cursor - t.base
        while i < len(t.entries) and (not out or size < max_bytes):
            entry = t.entries[i]
            out.append(entry)
            size += len(entry[5])
            i += 1
        return {"entries": out, "cursor": cursor + len(out)}

    def close(self, topic: str) -> None:
        """Forget a topic and free its memory (its reader is done)."""
        t = self.topics.pop(topic, None)
        if t is not None:
            t.notify()

    def info(self, topic: str | None = None) -> dict[str, Any]:
        names = [topic] if topic is not None else list(self.topics)
        return {
            n: {"used": t.used, "budget": t.budget, "base": t.base, "length": len(t.entries)}
            for n in names
            if (t := self.topics.get(n)) is not None
        }


class ResultsPlugin(SchedulerPlugin):
    """Installs :class:`ResultsExtension` on the scheduler (registered idempotently)."""

    name = _PLUGIN_NAME
    idempotent = True

    async def start(self, scheduler: Any) -> None:
        if _EXTENSION not in scheduler.extensions:
            scheduler.extensions[_EXTENSION] = ResultsExtension(scheduler)


def ensure_extension(client: Any) -> None:
    """Install the scheduler extension (idempotent: one cheap round trip).

    Not cached by scheduler address on purpose: a new scheduler may come up on the
    address of one that is gone (port reuse, a restarted cluster), and a cache keyed
    that way would skip the install and leave the handlers missing.
    """
    client.register_plugin(ResultsPlugin())


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


def metrics_topic(job_id: str) -> str:
    """The topic carrying the ``report()`` records of a job."""
    return f"metrics/{job_id}"


def open_topic(client: Any, topic: str, budget: int | None = None) -> None:
    """Create ``topic`` on the scheduler with the client's budget (idempotent)."""
    ensure_extension(client)
    reply = client.sync(
        client.scheduler.dask_ddp_results_open, topic=topic, budget=budget or budget_bytes()
    )
    checked_reply(reply, "dask_ddp_results_open", client.scheduler.address)


def prepare(client: Any, job_id: str) -> None:
    """Make the scheduler ready to carry the records of ``job_id`` (idempotent)."""
    open_topic(client, metrics_topic(job_id))


# ------------------------------------------------------------------------------ rank side


class _Writer:
    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.seqs: dict[str, int] = {}
        self.topics: dict[str, bytes] = {}

    def write(self, topic: str, payload: bytes) -> None:
        tb = self.topics.get(topic)
        if tb is None:
            tb = topic.encode()
            if len(tb) > 1024:
                raise ValueError(f"results topic too long ({len(tb)} bytes): {topic[:80]!r}...")
            self.topics[topic] = tb
        room = PIPE_BUF - _HEADER.size - len(tb)
        n = len(payload)
        with self.lock:
            seq = self.seqs.get(topic, 0)
            if n <= room:
                self._write(_HEADER.pack(n, seq, self.pid, len(tb), 0, 1) + tb + payload)
            else:
                count = -(-n // room)
                view = memoryview(payload)
                for i in range(count):
                    chunk = view[i * room : (i + 1) * room]
                    self._write(
                        _HEADER.pack(len(chunk), seq, self.pid, len(tb), i, count) + tb + chunk
                    )
            self.seqs[topic] = seq + 1

    def _write(self, frame: bytes) -> None:
        # A blocking write of at most PIPE_BUF bytes to a pipe is all-or-nothing.
        written = os.write(self.fd, frame)
        if written != len(frame):
            raise OSError(f"short write to the results pipe: {written} of {len(frame)} bytes")


_writer: _Writer | None = None
_writer_lock = threading.Lock()


def _make_writer() -> _Writer:
    # Once per process (a forked child makes its own): two writers in one process would
    # hand out the same sequence numbers twice.
    global _writer, _writer_lock
    if _writer is not None and _writer.pid != os.getpid():
        _writer_lock = threading.Lock()  # a fork may have copied it held
    with _writer_lock:
        w = _writer
        if w is None or w.pid != os.getpid():
            fd_text = os.environ.get(ENV_FD)
            if fd_text is None:
                raise RuntimeError(
                    f"no results channel: {ENV_FD} is not set; submit_result/report work "
                    "in a rank started by dask_ddp (dispatch.run or dask_ddp.submit)"
                )
            w = _writer = _Writer(int(fd_text))
        return w


def in_rank() -> bool:
    """Whether this process is a rank with a results channel."""
    return ENV_FD in os.environ


def write(topic: str, payload: bytes) -> None:
    """Write one record to this rank's channel; returns once it is in the pipe.

    Raises
    ------
    RuntimeError
        When this process is not a dask-ddp rank (no ``DASK_DDP_CHANNEL_FD``), or the
        channel's reader is gone.
    """
    w = _writer
    if w is None or w.pid != os.getpid():
        w = _make_writer()
    try:
        w.write(topic, payload)
    except BrokenPipeError as e:
        raise RuntimeError(
            f"results channel closed (fd {w.fd}): the worker's forwarder is gone"
        ) from e


# ---------------------------------------------------------------------------- worker side


class Forwarder:
    """Reads a rank's framed records from ``read_fd`` and forwards them to the scheduler.

    Parameters
    ----------
    job_id, rank
        Name the stream (with a random nonce: one per rank process).
    read_fd
        Read end of the rank's pipe; the Forwarder owns and closes it.
    worker
        The Dask worker whose connection to the scheduler is used (default: the worker
        running the calling task).
    """

    def __init__(self, job_id: str, rank: int, read_fd: int, *, worker: Any = None) -> None:
        if worker is None:
            from distributed import get_worker

            worker = get_worker()
        self.job_id = job_id
        self.rank = rank
        self.read_fd = read_fd
        # Streams are "<job>/<rank>/<nonce>.<pid>": one per process writing to the pipe.
        self.source = f"{job_id}/{rank}/{uuid.uuid4().hex[:8]}"
        self._worker = worker
        self._part = part_size()
        self._error: BaseException | None = None
        self._closed = False
        self.records = 0
        try:  # bigger kernel buffer: fewer rank stalls while a put is in flight
            fcntl.fcntl(read_fd, _F_SETPIPE_SZ, 1 << 20)
        except OSError:
            pass
        self._thread = threading.Thread(
            target=self._run, name=f"dask-ddp-forward-{job_id}-{rank}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def close(self, timeout: float = 30.0) -> None:
        """Deliver what is left in the pipe (the rank has exited), then release it.

        Raises
        ------
        TimeoutError
            When the records could not all be handed to the scheduler within ``timeout``
            (its budget stayed full: nobody reads the topic). The thread keeps trying.
        RuntimeError
            When forwarding failed (the scheduler refused the records).
        """
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(
                f"results of job {self.job_id} rank {self.rank}: not all delivered to the "
                f"scheduler within {timeout}s (is anyone reading them?)"
            )
        if self._error is not None:
            raise RuntimeError(
                f"results of job {self.job_id} rank {self.rank}: forwarding failed"
            ) from self._error

    # -- thread

    def _run(self) -> None:
        try:
            self._forward()
        except BaseException as e:  # noqa: BLE001 - reported by close()
            logger.exception("results forwarder of job %s rank %s failed", self.job_id, self.rank)
            self._error = e
        finally:
            os.close(self.read_fd)

    def _forward(self) -> None:
        buf = bytearray()
        seqs: dict[tuple[str, int], int] = {}  # (topic, pid) -> next sequence
        pieces: dict[tuple[str, int], list[Any]] = {}  # (topic, pid) -> [seq, next, data]
        last_tb, last_topic = b"", ""
        while True:
            chunk = os.read(self.read_fd, 1 << 20)
            if not chunk:
                break
            buf += chunk
            batches: dict[str, list[list[Any]]] = {}
            # A run: consecutive whole frames of one stream, forwarded as they are.
            run: list[Any] | None = None  # [topic, pid, seq0, count, start, end]
            pos = 0
            while len(buf) - pos >= _HEADER.size:
                length, seq, pid, tlen, index, count = _HEADER.unpack_from(buf, pos)
                start = pos + _HEADER.size
                end = start + tlen + length
                if end > len(buf):
                    break
                if tlen != len(last_tb) or not buf.startswith(last_tb, start):
                    last_tb = bytes(buf[start : start + tlen])
                    last_topic = last_tb.decode()
                topic = last_topic
                if count == 1:
                    if (
                        run is not None
                        and run[1] == pid
                        and run[2] + run[3] == seq
                        and run[0] == topic
                        and end - run[4] <= _PACK_MAX
                    ):
                        run[3] += 1
                        run[5] = end
                    else:
                        if run is not None:
                            self._flush_run(batches, buf, run)
                        run = [topic, pid, seq, 1, pos, end]
                else:  # a fragment of a large record
                    if run is not None:
                        self._flush_run(batches, buf, run)
                        run = None
                    key = (topic, pid)
                    piece = pieces.get(key)
                    if index == 0:
                        piece = pieces[key] = [seq, 0, bytearray()]
                    if piece is None or piece[0] != seq or piece[1] != index:
                        raise RuntimeError(
                            f"results pipe of job {self.job_id} rank {self.rank}: fragment "
                            f"{index}/{count} of record {seq} (pid {pid}) out of order"
                        )
                    piece[1] += 1
                    piece[2] += buf[start + tlen : end]
                    if index + 1 == count:
                        del pieces[key]
                        source = f"{self.source}.{pid}"
                        entries = batches.setdefault(topic, [])
                        entries.extend(self._parts(source, seq, bytes(piece[2])))
                        self.records += 1
                seqs[(topic, pid)] = seq + 1
                pos = end
            if run is not None:
                self._flush_run(batches, buf, run)
            del buf[:pos]
            for topic, entries in batches.items():
                self._put(topic, entries)
        if buf or pieces:
            logger.warning(
                "job %s rank %s: the rank ended in the middle of writing a record "
                "(%d bytes); that record was never submitted",
                self.job_id,
                self.rank,
                len(buf) + sum(len(p[2]) for p in pieces.values()),
            )
        for (topic, pid), nxt in seqs.items():  # end markers: the count of records
            self._put(topic, [[f"{self.source}.{pid}", nxt, 0, 0, 0, b""]])

    def _flush_run(
        self, batches: dict[str, list[list[Any]]], buf: bytearray, run: list[Any]
    ) -> None:
        topic, pid, seq0, count, start, end = run
        source = f"{self.source}.{pid}"
        batches.setdefault(topic, []).append([source, seq0, count, 0, 1, bytes(buf[start:end])])
        self.records += count

    def _parts(self, source: str, seq: int, payload: bytes) -> list[list[Any]]:
        """A reassembled large record: one frame, or raw parts of ``part-size``."""
        p = self._part
        if len(payload) <= p:  # a run of one frame (no topic: the entry has it)
            return [[source, seq, 1, 0, 1, _HEADER.pack(len(payload), seq, 0, 0, 0, 1) + payload]]
        n = -(-len(payload) // p)
        return [[source, seq, 1, i, n, payload[i * p : (i + 1) * p]] for i in range(n)]

    def _put(self, topic: str, entries: list[list[Any]]) -> None:
        loop = self._worker.loop.asyncio_loop
        delay = 0.05
        while entries:
            batch: list[list[Any]] = []
            size = 0
            for e in entries:
                if batch and size + len(e[5]) > 4 * self._part:
                    break
                batch.append(e)
                size += len(e[5])
            coro = self._worker.scheduler.dask_ddp_results_put(topic=topic, entries=batch)
            try:
                reply = asyncio.run_coroutine_threadsafe(coro, loop).result(timeout=120)
            except (OSError, asyncio.TimeoutError, TimeoutError) as e:
                # The put is idempotent (dedup by (source, seq, part)): just try again.
                logger.warning("results put for %s failed (%s); retrying", topic, e)
                time.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            reply = checked_reply(reply, "dask_ddp_results_put", self._worker.scheduler.address)
            entries = entries[int(reply["accepted"]) :]


# ---------------------------------------------------------------------------- client side


@dataclass
class Record:
    """One record off a topic: its stream (``source``), rank, sequence and payload."""

    source: str
    rank: int
    seq: int
    payload: bytes


class GapError(RuntimeError):
    """Records of a stream are missing (never silently skipped)."""


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

    def __init__(
        self, client: Any, topic: str, on_gap: Callable[[GapError], None] | None = None
    ) -> None:
        self.client = client
        self.topic = topic
        self.cursor = 0
        self.expected: dict[str, int] = {}
        self.ended: set[str] = set()
        self.partial: dict[str, list[bytes]] = {}
        self.gaps: list[GapError] = []
        self.on_gap = on_gap
        ensure_extension(client)

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
        )
        reply = checked_reply(reply, "dask_ddp_results_get", self.client.scheduler.address)
        self.cursor = int(reply["cursor"])
        out: list[Record] = []
        for source, seq, count, part, nparts, payload in reply["entries"]:
            self._take(out, source, int(seq), int(count), int(part), int(nparts), payload)
        return out

    def _take(
        self,
        out: list[Record],
        source: str,
        seq: int,
        count: int,
        part: int,
        nparts: int,
        payload: bytes,
    ) -> None:
        """Entry kinds: ``nparts == 0`` the end marker (``seq``: records in the stream);
        ``nparts == 1`` a run of ``count`` whole frames from ``seq`` on;
        ``nparts > 1`` part ``part`` of the one record ``seq``."""
        expected = self.expected.get(source, 0)
        if nparts == 0:
            self.ended.add(source)
            if seq != expected or source in self.partial:
                self._gap(f"stream {source} ended after {seq} records, {expected} arrived")
            return
        if seq < expected:
            return  # duplicate
        if seq > expected:
            self._gap(f"stream {source}: records {expected}..{seq - 1} are missing")
            self.partial.pop(source, None)
        rank = _rank_of(source)
        if nparts == 1:  # a run of whole frames, as the rank wrote them
            view = memoryview(payload)
            pos = 0
            hsize = _HEADER.size
            for i in range(count):
                length, fseq, _pid, tlen, _index, _count = _HEADER.unpack_from(view, pos)
                if fseq != seq + i:
                    self._gap(f"stream {source}: corrupt run at record {seq + i}")
                    break
                start = pos + hsize + tlen
                out.append(Record(source, rank, fseq, bytes(view[start : start + length])))
                pos = start + length
            self.expected[source] = seq + count
            return
        parts = self.partial.setdefault(source, [])
        if part != len(parts):
            if part < len(parts):
                return  # duplicate part
            self._gap(f"stream {source}: record {seq} lost parts {len(parts)}..{part - 1}")
            self.partial.pop(source, None)
            return
        parts.append(bytes(payload))
        if len(parts) < nparts:
            return
        del self.partial[source]
        self.expected[source] = seq + 1
        out.append(Record(source, rank, seq, b"".join(parts)))

    def unfinished(self) -> list[str]:
        """Streams seen without their end marker (their forwarder or worker died)."""
        return sorted(set(self.expected) - self.ended)

    def close(self) -> None:
        """Free the topic on the scheduler (after everything was read).

        Streams that never sent their end marker are logged: records written after the
        last one that arrived may be lost (the worker holding the pipe died).
        """
        for source in self.unfinished():
            logger.warning(
                "results topic %r: stream %s (rank %d) has no end marker after %d records; "
                "its worker may have died with records still in the rank's pipe",
                self.topic,
                source,
                _rank_of(source),
                self.expected[source],
            )
        try:
            self.client.sync(self.client.scheduler.dask_ddp_results_close, topic=self.topic)
        except Exception:  # noqa: BLE001 - the scheduler may be gone at shutdown
            logger.debug("closing results topic %s failed", self.topic, exc_info=True)


def _rank_of(source: str) -> int:
    try:
        return int(source.split("/")[-2])
    except (IndexError, ValueError):
        return -1
