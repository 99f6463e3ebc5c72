"""The results channel in the rank (:func:`write`) and in its worker (:class:`Forwarder`).

- **Rank side**: each record is written to the pipe whose write end is
  ``DASK_DDP_CHANNEL_FD`` before the call returns, as frames of at most ``PIPE_BUF`` bytes
  (see :mod:`dask_ddp._channel.wire`): each frame is one atomic ``os.write``, so frames stay whole
  even when the rank's threads and the processes it forked (DataLoader workers, which
  inherit the pipe) write at once. Nothing is buffered in the rank's memory, so a record
  whose ``write`` returned survives ``os._exit`` and ``SIGKILL``, and a full pipe blocks
  the rank: the back-pressure of the whole channel ends there.
- **Worker side**: a Forwarder thread reads the pipe, packs frames into entries of at most
  ``dask-ddp.results.part-size`` and puts them into the scheduler's topic. A put that does
  not fit in the topic's budget waits; the Forwarder stops reading the pipe meanwhile. At
  end of stream it puts an end marker carrying the count of records, so the client can
  tell a complete stream from one that lost its tail.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import fcntl
import logging
import os
import select
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dask_ddp._channel.wire import (
    ENV_FD,
    HEADER_SIZE,
    MAX_TOPIC,
    PACK_MAX,
    PIPE_BUF,
    Entry,
    FrameHeader,
    checked_reply,
    part_size,
    put_retry_seconds,
)

logger = logging.getLogger(__name__)

_F_SETPIPE_SZ = 1031  # Linux fcntl: grow a pipe's kernel buffer
#: Seconds between two looks at the stop flag while the Forwarder waits.
_POLL_S = 0.2
#: A put that takes longer than this (seconds) is logged.
_SLOW_PUT_S = 5.0


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
            if len(tb) > MAX_TOPIC:
                raise ValueError(f"results topic too long ({len(tb)} bytes): {topic[:80]!r}...")
            self.topics[topic] = tb
        room = PIPE_BUF - HEADER_SIZE - len(tb)
        n = len(payload)
        with self.lock:
            seq = self.seqs.get(topic, 0)
            if n <= room:
                self._write(FrameHeader(n, seq, self.pid, len(tb), 0, 1).pack() + tb + payload)
            else:
                count = -(-n // room)
                view = memoryview(payload)
                for i in range(count):
                    chunk = view[i * room : (i + 1) * room]
                    head = FrameHeader(len(chunk), seq, self.pid, len(tb), i, count)
                    self._write(head.pack() + tb + chunk)
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


def reset_writer() -> None:
    """Forget this process's writer (the next :func:`write` reads ``ENV_FD`` again)."""
    global _writer
    _writer = None


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


class ForwarderStopped(Exception):
    """The Forwarder was told to stop before it delivered everything."""


@dataclass
class _Run:
    """Consecutive whole frames of one stream in the read buffer, forwarded as they are."""

    topic: str
    pid: int
    seq0: int
    count: int
    start: int
    end: int


@dataclass
class _Pieces:
    """The fragments of one large record read so far."""

    seq: int
    next_index: int = 0
    data: bytearray = field(default_factory=bytearray)


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
        running the calling task; that task's key tells the scheduler who writes).
    tap
        ``(topic, tap)``: ``tap(data)`` is called in the Forwarder's thread with each
        whole record of ``topic`` as it passes (the job page's sampler); it must be quick.
    """

    def __init__(self, job_id: str, rank: int, read_fd: int, *, worker: Any = None,
                 tap: tuple[str, Callable[[bytes], None]] | None = None) -> None:
        self.task_key: str | None = None
        if worker is None:
            from distributed import get_worker

            worker = get_worker()
            try:
                self.task_key = str(worker.get_current_task())
            except (AttributeError, KeyError, ValueError):
                self.task_key = None
        self.job_id = job_id
        self.rank = rank
        self.read_fd = read_fd
        # Streams are "<job>/<rank>/<nonce>.<pid>": one per process writing to the pipe.
        self.source = f"{job_id}/{rank}/{uuid.uuid4().hex[:8]}"
        self._worker = worker
        self._tap = tap
        self._part = part_size()
        self._retry_for = put_retry_seconds()
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self._dropped_warned = False
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

        Returns or raises within about ``timeout`` seconds (plus one put's round trip):
        when the records are not all delivered by then, the Forwarder is stopped (the pipe
        is closed, what it still held is lost) and TimeoutError is raised.

        Raises
        ------
        TimeoutError
            When the records could not all be handed to the scheduler within ``timeout``
            (its budget stayed full: nobody reads the topic).
        RuntimeError
            When forwarding failed (the scheduler refused or did not answer).
        """
        self._thread.join(timeout)
        if self._thread.is_alive():
            self._stop.set()
            self._thread.join(max(5.0, 4 * _POLL_S))
            raise TimeoutError(
                f"results of job {self.job_id} rank {self.rank}: not all delivered to the "
                f"scheduler within {timeout}s (is anyone reading them?); forwarding stopped "
                f"after {self.records} records, the rest is dropped"
            )
        if self._error is not None:
            raise RuntimeError(
                f"results of job {self.job_id} rank {self.rank}: forwarding failed: "
                f"{self._error}"
            ) from self._error

    # -- thread

    def _run(self) -> None:
        try:
            self._forward()
        except ForwarderStopped:
            logger.warning("results forwarder of job %s rank %s stopped", self.job_id, self.rank)
        except BaseException as e:  # noqa: BLE001 - reported by close()
            logger.exception("results forwarder of job %s rank %s failed", self.job_id, self.rank)
            self._error = e
        finally:
            os.close(self.read_fd)

    def _read(self) -> bytes:
        poller = select.poll()
        poller.register(self.read_fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        while not poller.poll(_POLL_S * 1000):
            if self._stop.is_set():
                raise ForwarderStopped
        return os.read(self.read_fd, 1 << 20)

    def _forward(self) -> None:
        buf = bytearray()
        seqs: dict[tuple[str, int], int] = {}  # (topic, pid) -> next sequence
        pieces: dict[tuple[str, int], _Pieces] = {}
        last_tb, last_topic = b"", ""
        while True:
            chunk = self._read()
            if not chunk:
                break
            buf += chunk
            batches: dict[str, list[Entry]] = {}
            run: _Run | None = None
            pos = 0
            while len(buf) - pos >= HEADER_SIZE:
                head = FrameHeader.unpack_from(buf, pos)
                start = pos + HEADER_SIZE
                end = start + head.topic_len + head.length
                if end > len(buf):
                    break
                if head.topic_len != len(last_tb) or not buf.startswith(last_tb, start):
                    last_tb = bytes(buf[start : start + head.topic_len])
                    last_topic = last_tb.decode()
                topic = last_topic
                if self._tap is not None and head.fragments == 1 and topic == self._tap[0]:
                    self._tap[1](bytes(buf[start + head.topic_len : end]))
                if head.fragments == 1:
                    if (
                        run is not None
                        and run.pid == head.pid
                        and run.seq0 + run.count == head.seq
                        and run.topic == topic
                        and end - run.start <= PACK_MAX
                    ):
                        run.count += 1
                        run.end = end
                    else:
                        if run is not None:
                            self._flush_run(batches, buf, run)
                        run = _Run(topic, head.pid, head.seq, 1, pos, end)
                else:  # a fragment of a large record
                    if run is not None:
                        self._flush_run(batches, buf, run)
                        run = None
                    key = (topic, head.pid)
                    if head.fragment == 0:
                        pieces[key] = _Pieces(head.seq)
                    piece = pieces.get(key)
                    if piece is None or piece.seq != head.seq or piece.next_index != head.fragment:
                        raise RuntimeError(
                            f"results pipe of job {self.job_id} rank {self.rank}: fragment "
                            f"{head.fragment}/{head.fragments} of record {head.seq} "
                            f"(pid {head.pid}) out of order"
                        )
                    piece.next_index += 1
                    piece.data += buf[start + head.topic_len : end]
                    if head.fragment + 1 == head.fragments:
                        del pieces[key]
                        if self._tap is not None and topic == self._tap[0]:
                            self._tap[1](bytes(piece.data))  # a large record, whole
                        source = f"{self.source}.{head.pid}"
                        entries = batches.setdefault(topic, [])
                        entries.extend(self._parts(source, head.seq, bytes(piece.data)))
                        self.records += 1
                seqs[(topic, head.pid)] = head.seq + 1
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
                len(buf) + sum(len(p.data) for p in pieces.values()),
            )
        for (topic, pid), nxt in seqs.items():  # end markers: the count of records
            self._put(topic, [Entry.end(f"{self.source}.{pid}", nxt)])

    def _flush_run(self, batches: dict[str, list[Entry]], buf: bytearray, run: _Run) -> None:
        source = f"{self.source}.{run.pid}"
        entry = Entry.run(source, run.seq0, run.count, bytes(buf[run.start : run.end]))
        batches.setdefault(run.topic, []).append(entry)
        self.records += run.count

    def _parts(self, source: str, seq: int, payload: bytes) -> list[Entry]:
        """A reassembled large record: one frame, or raw parts of ``part-size``."""
        p = self._part
        if len(payload) <= p:  # a run of one frame (no topic: the entry has it)
            head = FrameHeader(len(payload), seq, 0, 0, 0, 1)
            return [Entry.run(source, seq, 1, head.pack() + payload)]
        n = -(-len(payload) // p)
        return [Entry(source, seq, 1, i, n, payload[i * p : (i + 1) * p]) for i in range(n)]

    def _call(self, coro: Any, timeout: float) -> Any:
        """Run ``coro`` on the worker's loop; wait for it up to ``timeout`` seconds unless
        told to stop (the wait is ended here, not by a cancellation the call may ignore)."""
        fut = asyncio.run_coroutine_threadsafe(coro, self._worker.loop.asyncio_loop)
        deadline = time.monotonic() + timeout
        while True:
            try:
                return fut.result(timeout=_POLL_S)
            except concurrent.futures.TimeoutError:
                if fut.done():
                    # The call itself raised TimeoutError (on Python 3.11 the same class
                    # as this poll's): its error, not ours.
                    return fut.result()
                if self._stop.is_set():
                    fut.cancel()
                    raise ForwarderStopped from None
                if time.monotonic() >= deadline:
                    fut.cancel()
                    raise TimeoutError(f"no answer within {timeout:g} s") from None

    def _put(self, topic: str, entries: list[Entry]) -> None:
        """Put ``entries`` into ``topic``: waits while the budget is full (back-pressure),
        retries a failed call for ``dask-ddp.results.put-retry`` seconds, then raises."""
        delay = 0.05
        failing_since: float | None = None
        address = self._worker.scheduler.address
        while entries:
            batch: list[Entry] = []
            size = 0
            for e in entries:
                if batch and size + len(e.payload) > 4 * self._part:
                    break
                batch.append(e)
                size += len(e.payload)
            coro = self._worker.scheduler.dask_ddp_results_put(
                topic=topic, entries=batch, writer=self.task_key
            )
            began = time.monotonic()
            try:
                reply = self._call(coro, min(120.0, self._retry_for))
            except (OSError, asyncio.TimeoutError, TimeoutError) as e:
                # The put is idempotent (dedup by (source, seq, part)): try again, a while.
                now = time.monotonic()
                failing_since = now if failing_since is None else failing_since
                if now - failing_since >= self._retry_for:
                    raise RuntimeError(
                        f"the scheduler at {address} did not take the records of topic "
                        f"{topic!r} for {now - failing_since:.0f} s "
                        f"(dask-ddp.results.put-retry): {type(e).__name__}: {e}"
                    ) from e
                logger.warning("results put for %s failed (%s); retrying", topic, e)
                if self._stop.wait(delay):
                    raise ForwarderStopped from None
                delay = min(delay * 2, 2.0)
                continue
            failing_since = None
            took = time.monotonic() - began
            if took > _SLOW_PUT_S:  # a diagnosis for records that arrive late
                logger.warning("job %s rank %s: a results put to %s took %.1f s (%d entries)",
                               self.job_id, self.rank, topic, took, len(batch))
            reply = checked_reply(reply, "dask_ddp_results_put", address)
            if reply.get("dropped") and not self._dropped_warned:
                self._dropped_warned = True
                logger.warning(
                    "job %s rank %s: records dropped, results topic %r is gone: %s",
                    self.job_id, self.rank, topic, reply["dropped"],
                )
            entries = entries[int(reply["accepted"]) :]
            if entries and self._stop.is_set():
                raise ForwarderStopped
