"""Metrics, results and checkpoints that lose nothing.

Rank side
---------
- :func:`report` sends a metric record (numbers and short strings, tagged with the rank,
  step and time) to the client.
- :meth:`DaskResultsHandler.submit_result` sends a ``(path, data)`` result, as the seed's
  handler did, without Dask Pub/Sub (removed from ``distributed`` in 2025.4).
- :func:`save_checkpoint` / :func:`load_checkpoint` (from :mod:`dask_ddp.checkpoint`) go to
  storage directly.

Every record goes through the results channel (:mod:`dask_ddp._channel`): written to a
pipe before the call returns, so it reaches the client exactly once and in order per rank,
also when the rank crashes right after, with bounded memory on the scheduler (a full budget
blocks the rank instead of dropping).

Client side
-----------
- :meth:`DaskResultsHandler.process_results` writes the results under a folder.
- The launcher calls :func:`start_job_monitor` (progress bar, ``metrics.jsonl``) and
  ``Job.metrics()`` returns :func:`iter_job_metrics`.

Configuration (Dask config, e.g. ``DASK_DASK_DDP__RESULTS__BUDGET="16 MiB"``)
---------------------------------------------------------------------------
``dask-ddp.results.budget`` (64 MiB)
    Scheduler memory per topic (a job's metrics, one handler's results); when full, the
    ranks' ``report``/``submit_result`` wait until the client has read. (One part of a
    large record is let into an empty topic even when it is larger than the budget.)
``dask-ddp.results.part-size`` (1 MiB)
    Large records cross the scheduler in parts of this size.
``dask-ddp.results.inline-max`` (4 MiB)
    With a job storage, ``submit_result`` data above this goes through storage.

Limits: one reader per topic (one ``process_results`` per handler at a time).
"""

from __future__ import annotations

import json
import logging
import math
import os
import struct
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from dask_ddp import _channel
from dask_ddp.checkpoint import load_checkpoint, save_checkpoint

logger = logging.getLogger(__name__)

__all__ = [
    "DaskResultsHandler",
    "report",
    "save_checkpoint",
    "load_checkpoint",
    "start_job_monitor",
    "iter_job_metrics",
]

#: Keys every metric record carries; a user metric may not use them.
RESERVED_KEYS = frozenset({"rank", "step", "time"})
#: Longest string value :func:`report` accepts.
MAX_STRING = 1024
_KIND_METRIC = b"M"
_KIND_RESULT = b"R"
_KIND_STORED = b"S"
_PATH_LEN = struct.Struct("!H")


# ------------------------------------------------------------------------------ rank side


class _RankState:
    """What report() needs, resolved once per process."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.enabled = _channel.in_rank()
        self.rank = int(os.environ.get("RANK", "0"))
        self.job_id = os.environ.get("DASK_DDP_JOB_ID", "")
        self.topic = _channel.metrics_topic(self.job_id)


_state: _RankState | None = None
_warned_outside = False


def _rank_state() -> _RankState:
    global _state
    s = _state
    if s is None or s.pid != os.getpid():
        s = _state = _RankState()
    return s


def _clean_value(key: str, value: Any) -> Any:
    """A JSON-able number or short string for ``value``, or TypeError naming ``key``."""
    if value is None or isinstance(value, (bool, int, str)):
        if isinstance(value, str) and len(value) > MAX_STRING:
            raise TypeError(
                f"report(): metric {key!r} is a string of {len(value)} characters; "
                f"metrics take numbers and strings of at most {MAX_STRING}"
            )
        return value
    if isinstance(value, float):
        return value
    item = getattr(value, "item", None)  # numpy scalars, one-element tensors
    if callable(item):
        try:
            v = item()
        except (ValueError, RuntimeError):
            v = None
        if isinstance(v, (bool, int, float)):
            return v
    raise TypeError(
        f"report(): metric {key!r} has type {type(value).__name__}; metrics take numbers "
        "(int, float, bool, numpy/torch scalars) and short strings"
    )


def report(metrics: dict[str, Any], step: int | None = None) -> None:
    """Send a metric record from this rank to the client.

    The record carries ``rank``, ``step`` and ``time`` (Unix seconds) besides the metrics.
    On the client it appears in ``Job.metrics()``, the progress bar and ``metrics.jsonl``.
    The call returns once the record is in the rank's channel (a few microseconds); it
    blocks only when the scheduler's budget for the job is full (back-pressure).

    Parameters
    ----------
    metrics
        Names to numbers (int, float, bool, numpy or torch scalars) or short strings.
    step
        The training step (iteration) the metrics belong to.

    Raises
    ------
    TypeError
        A metric that is not a number or a short string (the message names its key).
    ValueError
        A metric named ``rank``, ``step`` or ``time``.

    Examples
    --------
    >>> dask_ddp.report({"loss": loss.item(), "epoch": epoch}, step=i)  # doctest: +SKIP
    """
    global _warned_outside
    if type(metrics) is not dict:
        if not isinstance(metrics, dict):
            raise TypeError(f"report(): metrics must be a dict, got {type(metrics).__name__}")
    if step is not None and type(step) is not int:
        step = _clean_value("step", step)
        if not isinstance(step, int):
            raise TypeError(f"report(): step must be an int, got {type(step).__name__}")
    s = _rank_state()
    rec: dict[str, Any] = {"rank": s.rank, "step": step, "time": time.time()}
    for key, value in metrics.items():
        t = type(value)
        if t is not float and t is not int:
            value = _clean_value(key, value)
        if key in RESERVED_KEYS or type(key) is not str:
            if type(key) is not str:
                raise TypeError(f"report(): metric names must be str, got {key!r}")
            raise ValueError(f"report(): metric {key!r} is reserved (rank, step, time)")
        rec[key] = value
    payload = _KIND_METRIC + json.dumps(rec).encode()
    if not s.enabled:
        if not _warned_outside:
            _warned_outside = True
            logger.warning("report() outside a dask-ddp rank: metrics are not sent")
        return
    _channel.write(s.topic, payload)


def _check_path(path: Any) -> str:
    if not isinstance(path, str) or not path:
        raise TypeError(f"submit_result(): path must be a non-empty str, got {path!r}")
    parts = path.replace("\\", "/").split("/")
    if path.startswith("/") or ".." in parts:
        raise ValueError(f"submit_result(): path {path!r} must stay inside the results folder")
    return path


def _inline_max() -> int:
    import dask.config
    from dask.utils import parse_bytes

    value = dask.config.get("dask-ddp.results.inline-max", default="4 MiB")
    return parse_bytes(value) if isinstance(value, str) else int(value)


class DaskResultsHandler:
    """Results from the ranks to files on the client (seed-compatible).

    Parameters
    ----------
    pub_sub_key
        Names the handler's channel; a random one by default. Create the handler on the
        client before launching, and use it in the rank function (it travels pickled).

    Examples
    --------
    >>> rh = DaskResultsHandler(uuid.uuid4().hex)  # doctest: +SKIP
    >>> def train():
    ...     rh.submit_result(f"worker/{rank}.json", json.dumps({"loss": 0.1}))
    >>> futures = dispatch.run(client, train)  # doctest: +SKIP
    >>> rh.process_results("/tmp/stats", futures, raise_errors=False)  # doctest: +SKIP
    """

    def __init__(self, pub_sub_key: str | None = None) -> None:
        self.pub_sub_key = pub_sub_key if pub_sub_key is not None else uuid.uuid4().hex
        if not isinstance(self.pub_sub_key, str) or not self.pub_sub_key:
            raise TypeError(f"pub_sub_key must be a non-empty str, got {pub_sub_key!r}")
        if not _channel.in_rank():
            client = _current_client()
            if client is not None:
                _channel.open_topic(client, self.topic)

    @property
    def topic(self) -> str:
        """The channel topic of this handler."""
        return f"results/{self.pub_sub_key}"

    def __getstate__(self) -> dict[str, Any]:
        return {"pub_sub_key": self.pub_sub_key}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.pub_sub_key = state["pub_sub_key"]

    # -- rank side

    def submit_result(self, path: str, data: str | bytes) -> None:
        """Send ``data`` to be written at ``path`` under the client's results folder.

        A ``str`` is appended to the file as a line (JSON lines, as the seed's tutorial
        writes ``worker/<rank>.json``); ``bytes`` replace the file's content. Results above
        ``dask-ddp.results.inline-max`` (4 MiB) go through the job's storage when it has
        one, only their reference through the scheduler.

        Raises
        ------
        TypeError
            ``data`` is not ``str`` or ``bytes`` (the message names ``path``).
        """
        _check_path(path)
        if isinstance(data, str):
            kind, body = b"s", data.encode()
        elif isinstance(data, (bytes, bytearray, memoryview)):
            kind, body = b"b", bytes(data)
        else:
            raise TypeError(
                f"submit_result({path!r}): data must be str or bytes, got {type(data).__name__}"
            )
        storage = os.environ.get("DASK_DDP_STORAGE")
        pathb = path.encode()
        if storage and len(body) > _inline_max():
            key = f"_results/{os.environ.get('DASK_DDP_JOB_ID', 'job')}/{uuid.uuid4().hex}"
            from dask_ddp import storage as _storage

            _storage.open(storage).put(key, body)
            ref = {"path": path, "url": storage, "key": key, "kind": kind.decode()}
            _channel.write(self.topic, _KIND_STORED + json.dumps(ref).encode())
            return
        _channel.write(self.topic, _KIND_RESULT + _PATH_LEN.pack(len(pathb)) + pathb + kind + body)

    # -- client side

    def process_results(
        self, prefix: str | os.PathLike[str], futures: Sequence[Any], raise_errors: bool = True
    ) -> None:
        """Write each result under ``prefix`` as it arrives, until ``futures`` are done.

        Parameters
        ----------
        prefix
            Folder the results' paths are relative to (created as needed).
        futures
            The rank futures (``dispatch.run``'s result).
        raise_errors
            Raise the first rank error (after writing what arrived); otherwise log it and
            go on.
        """
        futures = list(futures)
        client = futures[0].client if futures else _current_client()
        if client is None:
            raise ValueError("process_results(): no futures and no Dask client")
        writer = _ResultWriter(Path(prefix))
        reader = _channel.Reader(client, self.topic, on_gap=None if raise_errors else _log_gap)
        reported: set[str] = set()
        first_error: tuple[Any, float] | None = None
        try:
            while True:
                done = all(f.done() for f in futures)
                records = reader.fetch(timeout=0 if done else 0.2)
                for rec in records:
                    writer.write(rec)
                writer.flush()
                for f in futures:
                    if f.status in ("error", "cancelled") and f.key not in reported:
                        reported.add(f.key)
                        if raise_errors:
                            if first_error is None:
                                first_error = (f, time.monotonic())
                        else:
                            logger.error("rank task %s failed: %r", f.key, _exception(f))
                if done and not records:
                    break
                # Other ranks are being stopped by the launcher; do not wait forever.
                if first_error is not None and time.monotonic() - first_error[1] > 10:
                    break
        finally:
            writer.close()
        reader.close()
        if first_error is not None:
            exc = _exception(first_error[0])
            if isinstance(exc, BaseException):
                raise exc


def _exception(future: Any) -> BaseException | None:
    try:
        return future.exception(timeout=5)
    except BaseException as e:  # noqa: BLE001 - CancelledError and friends are the answer
        return e


def _log_gap(err: _channel.GapError) -> None:
    logger.error("%s", err)


def _current_client() -> Any:
    try:
        from distributed import default_client

        return default_client()
    except ValueError:
        return None


class _ResultWriter:
    """Writes results under a folder, keeping the appended-to files open."""

    def __init__(self, root: Path, max_open: int = 64) -> None:
        self.root = root
        self.files: dict[Path, Any] = {}
        self.max_open = max_open

    def _target(self, path: str) -> Path:
        target = (self.root / _check_path(path)).resolve()
        if not target.is_relative_to(self.root.resolve()):
            raise ValueError(f"result path {path!r} leaves {self.root}")
        target.parent.mkdir(parents=True, exist_ok=True)
        return target

    def write(self, rec: _channel.Record) -> None:
        kind, payload = rec.payload[:1], rec.payload
        if kind == _KIND_RESULT:
            (n,) = _PATH_LEN.unpack_from(payload, 1)
            path = payload[3 : 3 + n].decode()
            self._store(path, payload[3 + n : 4 + n], memoryview(payload)[4 + n :])
        elif kind == _KIND_STORED:
            ref = json.loads(payload[1:])
            from dask_ddp import storage as _storage

            store = _storage.open(ref["url"])
            data = store.get(ref["key"])
            self._store(ref["path"], ref["kind"].encode(), memoryview(data))
            store.delete(ref["key"])
        else:
            logger.error("unknown result record kind %r from rank %d", kind, rec.rank)

    def _store(self, path: str, kind: bytes, body: memoryview) -> None:
        target = self._target(path)
        if kind == b"s":
            f = self.files.get(target)
            if f is None:
                if len(self.files) >= self.max_open:
                    self.files.pop(next(iter(self.files))).close()
                f = self.files[target] = open(target, "ab")  # noqa: SIM115 - kept open
            f.write(body)
            f.write(b"\n")
        else:
            old = self.files.pop(target, None)
            if old is not None:
                old.close()
            tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.tmp")
            tmp.write_bytes(body)
            os.replace(tmp, target)

    def flush(self) -> None:
        for f in self.files.values():
            f.flush()

    def close(self) -> None:
        for f in self.files.values():
            f.close()
        self.files.clear()


# ---------------------------------------------------------------------------- job monitor


class JobMonitor:
    """Consumes a job's metric records on the client, in a thread.

    Appends the records to ``output_dir/metrics.jsonl`` and drives a tqdm progress bar.
    :meth:`iter` replays them from the first: from that file when the job has an output
    folder (the client's memory stays flat however long the job), else from memory. Ends
    by itself once the job's futures are done and every record was read.
    """

    def __init__(self, job: Any, progress: bool = True) -> None:
        self.job = job
        self.records: list[dict[str, Any]] = []  # only without an output folder
        self.count = 0
        self.gaps: list[_channel.GapError] = []
        self.error: BaseException | None = None
        self.finished = False
        self._cond = threading.Condition()
        self._progress = progress
        self._reader = _channel.Reader(
            job.client, _channel.metrics_topic(job.id), on_gap=self._on_gap
        )
        out = getattr(job, "output_dir", None)
        self.path = Path(out) / "metrics.jsonl" if out is not None else None
        self._offset = 0  # where this job's records start in metrics.jsonl
        self._file = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "ab")  # noqa: SIM115 - closed by the thread
            self._offset = self._file.tell()
        self._thread = threading.Thread(
            target=self._run, name=f"dask-ddp-metrics-{job.id}", daemon=True
        )
        self._thread.start()

    def _on_gap(self, err: _channel.GapError) -> None:
        logger.error("%s", err)
        self.gaps.append(err)

    def _run(self) -> None:
        bar = None
        f = self._file
        try:
            while True:
                done = all(fut.done() for fut in self.job.futures)
                recs = self._reader.fetch(timeout=0 if done else 0.5)
                batch = []
                for rec in recs:
                    if rec.payload[:1] != _KIND_METRIC:
                        logger.error("unexpected record kind on the metrics topic")
                        continue
                    body = rec.payload[1:]
                    if f is not None:
                        f.write(body)
                        f.write(b"\n")
                    if f is None or self._progress:
                        batch.append(json.loads(body))
                if f is not None and recs:
                    f.flush()
                if self._progress and batch:
                    if bar is None:  # first record: no bar for jobs that never report()
                        from tqdm.auto import tqdm

                        bar = tqdm(desc=str(getattr(self.job, "name", self.job.id)), unit="step")
                    _update_bar(bar, batch)
                if recs:
                    with self._cond:
                        if f is None:
                            self.records.extend(batch)
                        self.count += len(recs)
                        self._cond.notify_all()
                if done and not recs:
                    break
            self._reader.close()
        except BaseException as e:  # noqa: BLE001 - re-raised by stop()
            self.error = e
            if getattr(self.job.client, "status", None) in ("closing", "closed"):
                # The user closed the client (e.g. after dispatch.run + process_results):
                # nobody is left to read the records; not a failure worth a traceback.
                logger.debug("metrics monitor of job %s ended: client closed", self.job.id)
            else:
                logger.exception("metrics monitor of job %s failed", self.job.id)
        finally:
            if f is not None:
                f.close()
            if bar is not None:
                bar.close()
            with self._cond:
                self.finished = True
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
            raise TimeoutError(f"metrics of job {self.job.id} not all read within {timeout}s")
        if self.error is not None:
            raise RuntimeError(f"reading the metrics of job {self.job.id} failed") from self.error
        if self.gaps:
            raise self.gaps[0]

    def iter(self) -> Iterator[dict[str, Any]]:
        """Every record from the first, live: blocks for new ones until the job ends."""
        if self.path is not None:
            yield from self._iter_file(self.path)
            return
        i = 0
        while True:
            with self._cond:
                while i >= len(self.records) and not self.finished:
                    self._cond.wait(1.0)
                batch = self.records[i:]
                finished = self.finished
            yield from batch
            i += len(batch)
            if finished and i >= len(self.records):
                return

    def _iter_file(self, path: Path) -> Iterator[dict[str, Any]]:
        pending = b""
        with open(path, "rb") as f:
            f.seek(self._offset)
            seen = 0
            while True:
                with self._cond:
                    finished = self.finished  # before reading: then the read gets it all
                    count = self.count
                chunk = f.read()
                if chunk:
                    lines = (pending + chunk).split(b"\n")
                    pending = lines.pop()
                    for line in lines:
                        if line:
                            seen += 1
                            yield json.loads(line)
                    continue
                if finished:
                    return
                with self._cond:
                    if self.count == count and not self.finished:
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


def start_job_monitor(job: Any, progress: bool = True) -> JobMonitor:
    """Start consuming ``job``'s metric records (the launcher calls this after submit)."""
    return JobMonitor(job, progress=progress)


def iter_job_metrics(job: Any) -> Iterator[dict[str, Any]]:
    """``job``'s metric records from the first, live, until the job ends."""
    monitor = getattr(job, "_monitor", None)
    if monitor is None:
        monitor = job._monitor = start_job_monitor(job, progress=False)
    return monitor.iter()
