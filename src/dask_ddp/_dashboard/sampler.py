"""The supervisor's sampler of its rank: step rate, data wait, metrics, CPU and RSS.

Runs in the worker beside the rank's supervisor, in a thread that wakes every
``interval`` seconds (the job's ``dask-ddp.launch.dashboard-sample``). It reads the rank's
step counters (the mapped file of :mod:`dask_ddp._dashboard.counters`), the metric
records the rank's results Forwarder saw (:meth:`RankSampler.tap`, called in the
Forwarder's thread with each record of the job's metrics topic) and the rank process's
CPU and RSS (psutil), and sends one small sample to
the scheduler's dashboard extension. The rank's training loop does no extra work for it,
and the scheduler gets one message per rank per interval however often the rank reports.
A sample that cannot be sent is dropped (logged at debug level): the page never affects
the job.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import math
import os
import threading
import time
from typing import Any

from dask_ddp._dashboard import counters

logger = logging.getLogger(__name__)

#: The step rate is measured over about this many seconds.
RATE_WINDOW_S = 10.0
#: Metric records kept between two samples for the curve point (the latest ones), and
#: their bytes at most (records of any size arrive; what is kept stays bounded).
KEEP_RECORDS = 512
KEEP_BYTES = 4 << 20
#: Metrics of a rank shown on the page (a record of 150 gradient norms and the loss shows
#: the loss and the first others).
MAX_METRICS = 48
#: Seconds a sample may take to reach the scheduler.
SEND_TIMEOUT_S = 5.0
_METRIC = b"M"[0]
_RESERVED = ("rank", "step", "time")


class RankSampler:
    """Samples one rank process for the job page (see the module docstring).

    Parameters
    ----------
    worker
        The Dask worker running the supervisor (its connection to the scheduler is used).
    job_id, rank
        Which rank of which job attempt.
    workdir
        The rank's work directory: the counters file goes there.
    interval
        Seconds between two samples.
    """

    def __init__(self, worker: Any, job_id: str, rank: int, workdir: str,
                 interval: float = 2.0) -> None:
        self.worker = worker
        self.interval = interval
        self.job_id = job_id
        self.rank = rank
        self.path = os.path.join(workdir, "dashboard-counters")
        self.counters = counters.create(self.path)
        self.pid: int | None = None
        self._records: collections.deque[bytes] = collections.deque(maxlen=KEEP_RECORDS)
        self._lock = threading.Lock()
        self._kept = 0  # bytes in _records
        #: The first non-finite loss-like metric the rank reported, and at which step.
        self.diverged: dict[str, Any] | None = None
        self._reports = 0
        self._last_step: int | None = None
        self._last_metrics: dict[str, Any] = {}
        self._first_done = False
        self._history: collections.deque[tuple[float, int, int]] = collections.deque()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._procs: dict[int, Any] = {}

    def environment(self) -> dict[str, str]:
        """What the rank process needs in its environment to count its steps."""
        return {counters.ENV_STATS: self.path}

    # -- the Forwarder's side --------------------------------------------------------
    def tap(self, payload: bytes) -> None:
        """One record of the job's metrics topic, as the rank wrote it (kept, not parsed)."""
        if payload and payload[0] == _METRIC:
            with self._lock:
                if len(self._records) == self._records.maxlen:
                    self._kept -= len(self._records[0])
                self._records.append(payload)
                self._kept += len(payload)
                while self._kept > KEEP_BYTES and len(self._records) > 1:
                    self._kept -= len(self._records.popleft())
                self._reports += 1

    # -- the thread ------------------------------------------------------------------
    def start(self, pid: int) -> None:
        """Sample the process ``pid`` until :meth:`stop`."""
        self.pid = pid
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"dask-ddp-dashboard-{self.job_id[:8]}-{self.rank}")
        self._thread.start()

    def stop(self, returncode: int | None) -> None:
        """Send the last sample (the rank exited with ``returncode``) and stop."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(SEND_TIMEOUT_S + self.interval)
        try:
            sample = self._sample(final=True)
            sample["state"] = "exited"
            sample["exit"] = _exit_text(returncode)
            self._send(sample)
        except Exception:  # never let the page hide the rank's outcome
            logger.debug("last dashboard sample of rank %d failed", self.rank, exc_info=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._send(self._sample())
            except Exception:  # never let the page disturb the rank
                logger.debug("dashboard sample of rank %d failed", self.rank, exc_info=True)

    def _sample(self, final: bool = False) -> dict[str, Any]:
        now = time.monotonic()
        with self._lock:
            records, self._records = list(self._records), collections.deque(
                maxlen=KEEP_RECORDS)
            self._kept = 0
            reports = self._reports
        points = self._curve_points(records)
        count = self.counters.read()
        loader = count["batches"] > 0
        steps = count["batches"] if loader else (
            self._last_step + 1 if self._last_step is not None else reports)
        self._history.append((now, steps, count["wait_ns"]))
        while len(self._history) > 2 and now - self._history[1][0] >= RATE_WINDOW_S:
            self._history.popleft()
        sample: dict[str, Any] = {
            "rank": self.rank, "worker": self.worker.address, "host": _host(self.worker),
            "pid": self.pid, "time": time.time(), "state": "running",
            "steps": steps, "step_source": "loader" if loader else "report",
            "reports": reports, "points": points,
        }
        if self._last_metrics:
            sample["metrics"] = self._last_metrics
            sample["step"] = self._last_step
        if self.diverged is not None:
            sample["diverged"] = self.diverged
        t0, s0, w0 = self._history[0]
        span, done = now - t0, steps - s0
        if span > 0 and len(self._history) > 1:
            sample["steps_per_s"] = done / span
            if done > 0:
                sample["step_ms"] = 1000.0 * span / done
            if loader:
                wait_s = (count["wait_ns"] - w0) / 1e9
                sample["wait_fraction"] = min(1.0, wait_s / span)
                if done > 0:
                    sample["wait_ms_per_step"] = 1000.0 * wait_s / done
        if not final:
            sample.update(self._process())
        return sample

    def _curve_points(self, records: list[bytes]) -> dict[str, list[list[float]]]:
        """The curves' points of this interval: per numeric metric, its last value reported
        in the interval at the step of the record that carried it (the count of reports
        when the records carry no step), and the rank's very first record's. A metric sent
        by records of its own (an ``eval/`` score beside the training loss) keeps its
        points; the step shown is the highest seen, so an older step's record (a score of
        an earlier checkpoint) does not set it back."""
        latest: dict[str, list[float]] = {}
        first: dict[str, list[list[float]]] = {}
        for i, raw in enumerate(records):
            try:
                rec = json.loads(raw[1:])
            except ValueError:
                continue
            if not isinstance(rec, dict):
                continue
            step = rec.get("step")
            if isinstance(step, int) and not isinstance(step, bool):
                x = float(step)
                if self._last_step is None or step > self._last_step:
                    self._last_step = step
            else:
                x = float(self._reports - len(records) + i + 1)
            shown = _shown_metrics(rec)
            # The newest value of every metric, the loss first, at most MAX_METRICS.
            self._last_metrics = _shown_metrics({**self._last_metrics, **shown})
            if self.diverged is None:  # every record is looked at: the first step counts
                self.diverged = _diverged(rec, step if isinstance(step, int) else None)
            for key, value in shown.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) \
                        and math.isfinite(value):
                    latest[key] = [x, float(value)]
                    if not self._first_done:
                        first.setdefault(key, []).append([x, float(value)])
            self._first_done = self._first_done or bool(shown)
        points = first
        for key, point in latest.items():
            if point not in points.get(key, ()):
                points.setdefault(key, []).append(point)
        return points

    def _process(self) -> dict[str, Any]:
        """CPU (the rank and its children, percent of one core) and the rank's RSS."""
        import psutil

        try:
            main = self._procs.get(self.pid or -1) or psutil.Process(self.pid)
            procs = [main, *main.children(recursive=True)]
            cpu = 0.0
            alive: dict[int, Any] = {}
            for p in procs:
                cached = self._procs.get(p.pid, p)
                with contextlib.suppress(psutil.Error):
                    cpu += cached.cpu_percent(None)
                    alive[p.pid] = cached
            self._procs = alive
            rss = int(main.memory_info().rss)
            if not rss or main.status() == psutil.STATUS_ZOMBIE:
                return {}  # exited, not yet reaped: keep the last figures
            return {"cpu_percent": cpu, "rss_bytes": rss}
        except psutil.Error:
            return {}

    def _send(self, sample: dict[str, Any]) -> None:
        worker = self.worker
        coro = worker.scheduler.dask_ddp_dashboard_rank(job_id=self.job_id, sample=sample)
        fut = None
        try:
            fut = asyncio.run_coroutine_threadsafe(coro, worker.loop.asyncio_loop)
            fut.result(timeout=SEND_TIMEOUT_S)
        except Exception as exc:
            if fut is not None:
                fut.cancel()
            else:
                coro.close()  # the page is best effort; the job goes on
            logger.debug("dashboard sample of rank %d not sent: %r", self.rank, exc)


def _host(worker: Any) -> str:
    address = str(worker.address).split("://", 1)[-1]
    return address.rsplit(":", 1)[0]


def _exit_text(returncode: int | None) -> str:
    if returncode is None:
        return ""
    if returncode < 0:
        import signal

        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


def _shown_metrics(record: dict[str, Any]) -> dict[str, Any]:
    """The metrics of a record the page shows: at most :data:`MAX_METRICS`, the loss
    (any name with "loss") first, long texts clipped."""
    names = [k for k in record if k not in _RESERVED]
    names.sort(key=lambda k: "loss" not in str(k).lower())  # stable: loss first
    shown: dict[str, Any] = {}
    for name in names[:MAX_METRICS]:
        value = record[name]
        if isinstance(value, str) and len(value) > 200:
            value = value[:200] + "..."
        elif isinstance(value, (dict, list)):
            value = str(value)[:200]
        shown[str(name)[:100]] = value
    return shown


def _diverged(record: dict[str, Any], step: int | None) -> dict[str, Any] | None:
    """The record's first loss-like metric that is NaN or infinite, with its step."""
    for name, value in record.items():
        if "loss" in str(name).lower() and isinstance(value, float) \
                and not math.isfinite(value):
            text = "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
            return {"metric": str(name)[:100], "value": text, "step": step}
    return None
