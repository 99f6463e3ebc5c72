"""This process as a rank's results side, without a cluster: what ``report()`` needs to take
its rank path, and a reader of what it sends.

A rank started by dask-ddp gets from its supervisor ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``DASK_DDP_JOB_ID`` and the write end of a pipe named by
``DASK_DDP_CHANNEL_FD`` (:mod:`dask_ddp._channel`); the worker's Forwarder reads that pipe.
:class:`RankChannel` gives this process the same environment and reads the pipe in a
thread of its own, as the Forwarder does, decoding the metric records, so that
``report()`` runs the whole of its rank path (a CUDA value's pinned copy and event, the
pending queue, the frames on the pipe) where no Dask worker is: in the GPU benchmark and
in tests. Outside such an environment ``report()`` checks its values and returns before
any of that.
"""

from __future__ import annotations

import json
import os
import select
import threading
from types import TracebackType
from typing import Any

from dask_ddp import _pending, results
from dask_ddp._channel import rank_writer, wire

#: The variables a rank's supervisor sets that report() reads.
RANK_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "DASK_DDP_JOB_ID", wire.ENV_FD)


def decode_metrics(buf: bytes | bytearray) -> tuple[list[dict[str, Any]], int]:
    """The metric records of the whole frames at the start of ``buf``, and how many bytes
    they took (a frame cut at the end is left for the next read)."""
    out, pos = [], 0
    while len(buf) - pos >= wire.HEADER_SIZE:
        head = wire.FrameHeader.unpack_from(buf, pos)
        start = pos + wire.HEADER_SIZE + head.topic_len
        if start + head.length > len(buf):
            break
        if head.fragments != 1:
            raise ValueError(f"a metric record in {head.fragments} fragments (seq {head.seq}):"
                             " metric records fit one frame")
        payload = bytes(buf[start : start + head.length])
        if payload[:1] != b"M":
            raise ValueError(f"not a metric record: {payload[:20]!r}")
        out.append(json.loads(payload[1:]))
        pos = start + head.length
    return out, pos


class RankChannel:
    """This process as rank 0 of a one-rank job ``job_id``, its metrics read back here.

    Use as a context manager; inside it ``dask_ddp.report()`` sends, and
    :meth:`records` returns what reached the pipe's reader. On exit the records still
    waiting for a CUDA value are written (:func:`dask_ddp.results.flush_pending`), the
    pipe is drained and closed and the environment is restored.
    """

    def __init__(self, job_id: str = "rank-channel") -> None:
        self.job_id = job_id
        self._records: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._saved: dict[str, str | None] = {}
        self._fds: tuple[int, int] | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def __enter__(self) -> RankChannel:
        r, w = os.pipe()
        self._fds = (r, w)
        self._saved = {k: os.environ.get(k) for k in RANK_ENV}
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
                          DASK_DDP_JOB_ID=self.job_id, **{wire.ENV_FD: str(w)})
        _forget_rank_state()
        self._thread = threading.Thread(target=self._read, args=(r,), daemon=True,
                                        name=f"rank-channel-{self.job_id}")
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        assert self._fds is not None and self._thread is not None
        try:
            flushed = _pending.flush_pending(timeout=60)
        finally:
            self._stop.set()
            self._thread.join(30)
            for fd in self._fds:
                os.close(fd)
            for k, v in self._saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            _forget_rank_state()
        if kind is None:
            if not flushed:
                raise TimeoutError("metric records still wait for their values after 60 s")
            if self._thread.is_alive():
                raise TimeoutError("the rank channel's reader did not stop within 30 s")
            if self._error is not None:
                raise RuntimeError(f"the rank channel's reader failed: {self._error}")

    def records(self) -> list[dict[str, Any]]:
        """The metric records read so far, in the order they were written."""
        with self._lock:
            return list(self._records)

    def _read(self, fd: int) -> None:
        buf = bytearray()
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        try:
            # Forked children (DataLoader workers) may hold the write end: no EOF to wait
            # for, so read until told to stop, then what is left.
            while True:
                stopping = self._stop.is_set()
                if poller.poll(0 if stopping else 50):
                    buf += os.read(fd, 1 << 20)
                    got, used = decode_metrics(buf)
                    del buf[:used]
                    with self._lock:
                        self._records.extend(got)
                elif stopping:
                    break
        except BaseException as e:  # noqa: BLE001 - reported by __exit__
            self._error = e


def _forget_rank_state() -> None:
    """report()'s per-process state read again from the environment on its next call."""
    rank_writer.reset_writer()
    results._state = None
