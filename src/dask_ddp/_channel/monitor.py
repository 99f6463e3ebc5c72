"""The client's job monitor: a job's metric records to a file, a progress bar and
``Job.metrics()`` (internal; see :mod:`dask_ddp.results`).

Client memory stays bounded however long the job: with an output folder every record
goes to ``output_dir/metrics.jsonl`` and ``Job.metrics()`` replays that file; without one
the records wait in a buffer of ``dask-ddp.results.metrics-buffer`` records (100,000 by
default). When it is full the oldest records are dropped, and an iterator of
``Job.metrics()`` that had not reached them yet logs a warning with the count it missed:
pass ``output_dir`` to keep every record.
"""

from __future__ import annotations

import collections
import json
import logging
import math
import os
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from dask_ddp._channel.reader import GapError, Reader, Record, follow
from dask_ddp._channel.records import KIND_METRIC
from dask_ddp._channel.wire import metrics_topic
from dask_ddp._config import positive_int

logger = logging.getLogger(__name__)


def buffer_limit() -> int:
    """Records a monitor keeps without an output folder (``dask-ddp.results.metrics-buffer``)."""
    return positive_int("dask-ddp.results.metrics-buffer")


class RecordBuffer:
    """The last ``limit`` records, numbered from 0 in arrival order."""

    def __init__(self, limit: int) -> None:
        self.items: collections.deque[dict[str, Any]] = collections.deque(maxlen=limit)
        self.total = 0  # records ever added

    @property
    def first(self) -> int:
        """Number of the oldest record kept (how many were dropped)."""
        return self.total - len(self.items)

    def extend(self, batch: list[dict[str, Any]]) -> None:
        self.items.extend(batch)
        self.total += len(batch)

    def since(self, i: int) -> tuple[int, list[dict[str, Any]]]:
        """How many records from ``i`` on were dropped, and the kept ones after them."""
        first = self.first
        skipped = max(0, first - i)
        return skipped, list(self.items)[max(i, first) - first :]


class MonitoredJob(Protocol):
    """What :func:`start_job_monitor` reads of a job (the launcher's job handle has more)."""

    @property
    def client(self) -> Any: ...
    @property
    def id(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def futures(self) -> list[Any]: ...
    @property
    def output_dir(self) -> Path | None: ...


class JobMonitor:
    """Consumes a job's metric records on the client, in a thread.

    Appends the records to ``output_dir/metrics.jsonl`` (or a bounded buffer, see the
    module docstring) and drives a tqdm progress bar. :meth:`iter` replays them from the
    first. Ends by itself once the job's futures are done and every record was read; the
    topic is then removed from the scheduler, also when reading failed.

    Parameters
    ----------
    client
        The ``distributed.Client`` the job runs on.
    job_id
        The job's id (its metrics topic's name).
    futures
        The job's rank futures: the monitor ends once they are done and the topic is
        drained (only its thread holds them).
    name
        The progress bar's label (default: the job id).
    output_dir
        Where ``metrics.jsonl`` goes; ``None`` keeps the records in a bounded buffer.
    progress
        Show a tqdm progress bar from the first record on.
    """

    def __init__(self, client: Any, job_id: str, futures: Sequence[Any], *,
                 name: str | None = None, output_dir: str | os.PathLike[str] | None = None,
                 progress: bool = True) -> None:
        self.client = client
        self.job_id = job_id
        self.name = name if name is not None else job_id
        self.count = 0  # metric records read
        self.gaps: list[GapError] = []
        self.error: BaseException | None = None
        self.finished = False
        self._cond = threading.Condition()
        self._progress = progress
        self._bar: Any = None
        self._reader = Reader(client, metrics_topic(job_id), on_gap=self._on_gap)
        self.path = Path(output_dir) / "metrics.jsonl" if output_dir is not None else None
        self.buffer = RecordBuffer(buffer_limit()) if self.path is None else None
        self._offset = 0  # where this job's records start in metrics.jsonl
        self._size = 0  # bytes of them written and flushed
        self._file: BinaryIO | None = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "ab")  # noqa: SIM115 - closed by the thread
            self._offset = self._file.tell()
        self._thread = threading.Thread(
            target=self._run, args=(list(futures),), name=f"dask-ddp-metrics-{job_id}",
            daemon=True
        )
        self._thread.start()

    @property
    def dropped(self) -> int:
        """Records dropped from the full buffer (always 0 with an output folder)."""
        return self.buffer.first if self.buffer is not None else 0

    def _on_gap(self, err: GapError) -> None:
        logger.error("%s", err)
        self.gaps.append(err)

    def _run(self, futures: list[Any]) -> None:
        try:
            follow(self._reader, futures, self._handle, poll=0.5)
        except BaseException as e:  # noqa: BLE001 - re-raised by stop()
            self.error = e
            if getattr(self.client, "status", None) in ("closing", "closed"):
                # The user closed the client (e.g. after dispatch.run + process_results):
                # nobody is left to read the records; not a failure worth a traceback.
                logger.debug("metrics monitor of job %s ended: client closed", self.job_id)
            else:
                logger.exception("metrics monitor of job %s failed", self.job_id)
        finally:
            if self._file is not None:
                self._file.close()
            if self._bar is not None:
                self._bar.close()
            with self._cond:
                self.finished = True
                self._cond.notify_all()

    def _handle(self, recs: list[Record]) -> None:
        if not recs:
            return
        f = self._file
        batch = []
        n = 0
        for rec in recs:
            if rec.payload[:1] != KIND_METRIC:
                logger.error("unexpected record kind on the metrics topic of job %s", self.job_id)
                continue
            try:
                obj = json.loads(rec.payload[1:])
            except ValueError:
                obj = None
            if not isinstance(obj, dict) or not obj:
                # A rank's report() always sends a non-empty JSON object: anything else is
                # damaged on the way; skip it and keep the others.
                logger.error("metric record of job %s is not a JSON object: skipped (%d bytes)",
                             self.job_id, len(rec.payload))
                continue
            n += 1
            # The job's id goes first in each record: jobs sharing an output folder append
            # to one metrics.jsonl, and each line says whose it is.
            obj = {"job": self.job_id, **obj}
            if f is not None:
                f.write(json.dumps(obj).encode())
                f.write(b"\n")
            if f is None or self._progress:
                batch.append(obj)
        if f is not None:
            f.flush()
        if self._progress and batch:
            if self._bar is None:  # first record: no bar for jobs that never report()
                from tqdm.auto import tqdm

                self._bar = tqdm(desc=str(self.name), unit="step")
            _update_bar(self._bar, batch)
        with self._cond:
            if self.buffer is not None:
                self.buffer.extend(batch)
            if f is not None:
                self._size = f.tell() - self._offset
            self.count += n
            self._cond.notify_all()

    def stop(self, timeout: float = 30.0) -> None:
        """Wait until every record of the finished job was consumed.

        Raises
        ------
        TimeoutError
            The records were not all read within ``timeout`` seconds.
        dask_ddp._channel.GapError
            Records went missing (they were also logged as they were detected).
        """
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"metrics of job {self.job_id} not all read within {timeout}s")
        if self.error is not None:
            raise RuntimeError(f"reading the metrics of job {self.job_id} failed") from self.error
        if self.gaps:
            raise self.gaps[0]

    def iter(self) -> Iterator[dict[str, Any]]:
        """Every record from the first kept, live: blocks for new ones until the job ends."""
        if self.path is not None:
            yield from self._iter_file(self.path)
            return
        assert self.buffer is not None
        i = 0
        while True:
            with self._cond:
                while i >= self.buffer.total and not self.finished:
                    self._cond.wait(1.0)
                skipped, batch = self.buffer.since(i)
                finished, total = self.finished, self.buffer.total
            if skipped:
                logger.warning(
                    "job %s: %d metric records were dropped from the client's buffer before "
                    "this iterator reached them (dask-ddp.results.metrics-buffer keeps %d); "
                    "pass output_dir to keep every record",
                    self.job_id, skipped, self.buffer.items.maxlen,
                )
            yield from batch
            i = total
            if finished:
                return

    def _iter_file(self, path: Path) -> Iterator[dict[str, Any]]:
        """This job's records in ``path`` (not a later job's appended after them)."""
        pending = b""
        pos = 0
        with open(path, "rb") as f:
            f.seek(self._offset)
            while True:
                with self._cond:
                    finished, size = self.finished, self._size
                if size > pos:
                    chunk = f.read(size - pos)
                    pos += len(chunk)
                    lines = (pending + chunk).split(b"\n")
                    pending = lines.pop()
                    for line in lines:
                        if line:
                            yield json.loads(line)
                    continue
                if finished:
                    return
                with self._cond:
                    if self._size == size and not self.finished:
                        self._cond.wait(1.0)


def _update_bar(bar: Any, batch: list[dict[str, Any]]) -> None:
    steps = [r["step"] for r in batch if isinstance(r.get("step"), int)]
    if steps and max(steps) + 1 > bar.n:
        bar.update(max(steps) + 1 - bar.n)
    elif not steps:
        bar.update(len([r for r in batch if r.get("rank") == 0]))
    last = batch[-1]
    post = {}
    for key in ("epoch", "loss"):
        v = last.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            post[key] = f"{v:.4g}" if isinstance(v, float) and math.isfinite(v) else v
    if post:
        bar.set_postfix(post, refresh=False)


def start_job_monitor(job: MonitoredJob, progress: bool = True) -> JobMonitor:
    """Start consuming ``job``'s metric records in a new monitor, which the caller holds."""
    return JobMonitor(job.client, job.id, job.futures, name=job.name,
                      output_dir=job.output_dir, progress=progress)


def iter_job_metrics(job: MonitoredJob) -> Iterator[dict[str, Any]]:
    """``job``'s metric records from the first, live, until the job ends: its own
    (``job.metrics()``, the launcher's job) or, for a job without, a new monitor's."""
    metrics = getattr(job, "metrics", None)
    if callable(metrics):
        records: Iterator[dict[str, Any]] = metrics()
        return records
    return start_job_monitor(job, progress=False).iter()
