"""What the job pages show, kept on the scheduler: jobs, attempts, ranks, and their flags.

Plain data, no Dask: the scheduler extension (:mod:`dask_ddp._dashboard.extension`)
feeds it the launcher's job events, the supervisors' rank samples and the jobs' failure
records, and serves :meth:`Board.jobs_json` / :meth:`Board.job_json` (the schema is in
the package docstring, :mod:`dask_ddp._dashboard`). Memory is bounded: the last
:data:`MAX_JOBS` jobs, :data:`MAX_POINTS` points per curve (halved when full), at most
:data:`MAX_CURVES` metrics per rank with a curve.
"""

from __future__ import annotations

import collections
import re
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from dask_ddp._states import AttemptState, JobState
from dask_ddp.errors import FailureKind, kind_order

#: Jobs remembered (the oldest ended one goes first).
MAX_JOBS = 200
#: Points kept per curve; when full, every other point is dropped.
MAX_POINTS = 400
#: Metrics per rank that get a curve (the first ones reported).
MAX_CURVES = 12
#: Data wait over this share of the step time: the rank is input-bound.
INPUT_BOUND = 1.0 / 3.0
#: A rank under this share of the median rank's step rate is a straggler.
STRAGGLER = 0.8
#: Characters of a traceback or a stack kept.
MAX_TEXT = 20_000
#: Generations (membership changes of a live job) remembered per attempt.
MAX_GENERATIONS = 1000
#: Unread results topics remembered per attempt.
MAX_UNREAD = 16
#: A job id (``uuid4().hex``) inside a topic name or a rank task key.
_JOB_ID = re.compile(r"(?<![0-9a-f])[0-9a-f]{32}(?![0-9a-f])")


def _clip(text: Any) -> str:
    s = str(text or "")
    return s if len(s) <= MAX_TEXT else s[:MAX_TEXT] + f"\n... ({len(s) - MAX_TEXT} more)"


@dataclass
class RankView:
    """One rank of the current attempt, as its supervisor last sampled it."""

    rank: int
    worker: str = ""
    host: str = ""
    pid: int | None = None
    state: str = "starting"  # the rank's process (the sampler's): starting, running, exited
    exit: str = ""  # how the process ended ("exit code 0", "killed by SIGKILL")
    steps: int = 0
    steps_per_s: float | None = None
    step_source: str = ""  # "loader" (batches) or "report" (report() steps)
    wait_fraction: float | None = None  # data wait / wall time (Loader ranks only)
    wait_ms_per_step: float | None = None
    step_ms: float | None = None
    cpu_percent: float | None = None
    rss_bytes: int | None = None
    step: int | None = None  # the last reported step
    metrics: dict[str, Any] = field(default_factory=dict)
    reports: int = 0
    curves: dict[str, list[list[float]]] = field(default_factory=dict)
    updated: float = 0.0
    #: The first non-finite loss-like metric (a diverged loss): its name, value ("NaN",
    #: "Infinity", "-Infinity") and the step it was first seen at.
    diverged: dict[str, Any] | None = None

    def merge(self, sample: dict[str, Any]) -> None:
        """Take a supervisor's sample (see :mod:`dask_ddp._dashboard.sampler`)."""
        for key in ("worker", "host", "pid", "state", "exit", "steps", "step_source",
                    "cpu_percent", "rss_bytes", "reports"):
            if sample.get(key) is not None:
                setattr(self, key, sample[key])
        # The rates stay those measured while the rank ran: a rank that exited keeps its
        # last rate on the page.
        for key in ("steps_per_s", "wait_fraction", "wait_ms_per_step", "step_ms"):
            if key in sample and (sample[key] is not None or self.state != "exited"):
                setattr(self, key, sample[key])
        if sample.get("metrics"):
            self.metrics = dict(sample["metrics"])
            self.step = sample.get("step")
        if self.diverged is None and sample.get("diverged"):
            self.diverged = dict(sample["diverged"])
        for name, points in (sample.get("points") or {}).items():
            curve = self.curves.get(name)
            if curve is None:
                if len(self.curves) >= MAX_CURVES:
                    continue
                curve = self.curves[name] = []
            curve.extend([float(x), float(y)] for x, y in points)
            while len(curve) > MAX_POINTS:
                del curve[1::2]
        self.updated = float(sample.get("time") or time.time())

    def json(self, median_rate: float | None, stalled: set[int],
             failed_rank: int | None) -> dict[str, Any]:
        flags = []
        if self.wait_fraction is not None and self.wait_fraction > INPUT_BOUND:
            flags.append("input-bound")
        if (median_rate and self.steps_per_s is not None and self.state == "running"
                and self.steps_per_s < STRAGGLER * median_rate):
            flags.append("straggler")
        if self.rank in stalled:
            flags.append("stalled")
        if self.rank == failed_rank:
            flags.append("failed")
        return {
            "rank": self.rank, "worker": self.worker, "host": self.host, "pid": self.pid,
            "state": self.state, "exit": self.exit, "steps": self.steps,
            "steps_per_s": self.steps_per_s, "step_source": self.step_source,
            "step_ms": self.step_ms, "wait_ms_per_step": self.wait_ms_per_step,
            "wait_fraction": self.wait_fraction, "cpu_percent": self.cpu_percent,
            "rss_bytes": self.rss_bytes, "step": self.step, "metrics": self.metrics,
            "diverged": self.diverged,
            "reports": self.reports, "flags": flags, "updated": self.updated,
        }


@dataclass
class Attempt:
    """One attempt of a job: a launch with its own ranks and rendezvous."""

    job_id: str
    attempt: int
    world_size: int
    workers: list[str]
    start: float
    end: float | None = None
    #: A job's state is its last attempt's.
    state: AttemptState = AttemptState.STARTING
    failures: list[dict[str, Any]] = field(default_factory=list)
    stall: dict[str, Any] | None = None
    ranks: dict[int, RankView] = field(default_factory=dict)
    #: A live job's membership changes (``recovery="live"``), oldest first.
    generations: list[dict[str, Any]] = field(default_factory=list)
    #: Results topics of this attempt that are full and nobody reads (its ranks wait in
    #: report()/submit_result()), by topic: ``{"topic", "since", "used", "budget"}``.
    unread: dict[str, dict[str, Any]] = field(default_factory=dict)

    def root_cause(self) -> dict[str, Any] | None:
        """The most fundamental failure recorded (the launcher's order: lost, died, raised
        first, raised, aborted; then the lowest rank)."""
        if not self.failures:
            return None
        stalls = [f for f in self.failures if f.get("kind") == FailureKind.STALLED]
        if stalls:
            return stalls[0]
        return min(self.failures, key=lambda f: (kind_order(str(f.get("kind", ""))),
                                                 _rank_or(f.get("rank"))))

    def summary(self) -> dict[str, Any]:
        cause = self.root_cause()
        return {
            "job_id": self.job_id, "attempt": self.attempt, "state": self.state.value,
            "world_size": self.world_size, "start": self.start, "end": self.end,
            "root_cause": None if cause is None else {
                k: cause.get(k) for k in ("rank", "worker", "kind", "message", "traceback")},
        }


@dataclass
class JobView:
    """A job as the pages show it: its attempts (one unless it restarted)."""

    run_id: str
    name: str
    max_restarts: int = 0
    attempts: list[Attempt] = field(default_factory=list)
    first_metric: str | None = None

    @property
    def current(self) -> Attempt:
        return self.attempts[-1]

    @property
    def state(self) -> JobState:
        return self.current.state

    def hosts(self) -> list[str]:
        seen = {r.host for r in self.current.ranks.values() if r.host}
        return sorted(seen or {_host(w) for w in self.current.workers})

    def row(self, now: float) -> dict[str, Any]:
        a, first = self.current, self.attempts[0]
        end = a.end
        return {
            "id": self.run_id, "name": self.name, "state": a.state.value, "job_id": a.job_id,
            "world_size": a.world_size, "attempt": a.attempt,
            "restarts": len(self.attempts) - 1, "max_restarts": self.max_restarts,
            "start": first.start, "end": end,
            "duration_s": (end if end is not None else now) - first.start,
            "hosts": self.hosts(), "url": f"job/{self.run_id}",
        }

    def detail(self, now: float, metric: str | None = None) -> dict[str, Any]:
        """The job page's JSON; ``curves`` holds ``metric``'s curves (default: the default
        metric's; ``"*"``: every metric's)."""
        a = self.current
        rates = [r.steps_per_s for r in a.ranks.values()
                 if r.steps_per_s is not None and r.state == "running"]
        median = statistics.median(rates) if len(rates) >= 2 else None
        cause = a.root_cause()
        failed_rank = None if cause is None or a.state is not JobState.FAILED \
            else cause.get("rank")
        stalled = set(a.stall.get("ranks", ())) if a.stall and a.state is JobState.STALLED \
            else set()
        ranks = [a.ranks[r].json(median, stalled, failed_rank) for r in sorted(a.ranks)]
        if a.state is JobState.CANCELLED:
            for r in ranks:  # the launcher's stop, not a fault of the rank
                if str(r["exit"]).startswith("killed by SIG"):
                    r["exit"] = "stopped: the job was cancelled"
        names = sorted({n for r in a.ranks.values() for n in r.curves})
        default = ("loss" if "loss" in names else self.first_metric
                   if self.first_metric in names else names[0] if names else None)
        return {
            **self.row(now),
            "median_steps_per_s": median,
            "stall": a.stall if a.state is JobState.STALLED else None,
            "unread": [] if a.state.is_terminal else [
                {**u, "seconds": None if u["since"] is None else now - u["since"]}
                for u in a.unread.values()],
            "root_cause": a.summary()["root_cause"] if a.state is JobState.FAILED else None,
            "attempts": [x.summary() for x in self.attempts],
            "generations": list(a.generations),
            "ranks": ranks,
            "metric_names": names, "default_metric": default,
            "curves": {str(r.rank): {k: v for k, v in r.curves.items()
                                     if metric == "*" or k == (metric or default)}
                       for r in a.ranks.values()},
        }


def _set_stall(a: Attempt, event: dict[str, Any], final: bool) -> None:
    """Record a stall on ``a``: ``final`` when it ended the job (a failure record)."""
    stacks = {str(k): _clip(v) for k, v in (event.get("stacks") or {}).items()}
    a.stall = {"ranks": [int(r) for r in event.get("ranks", ())],
               "collective": str(event.get("collective") or ""), "stacks": stacks,
               "message": str(event.get("message") or "").split("\n\n")[0],
               "final": final, "time": float(event.get("time") or time.time())}


def _rank_or(rank: Any) -> int:
    """A failure record's rank for ordering; -1 for a job-wide one (no rank)."""
    return rank if isinstance(rank, int) and not isinstance(rank, bool) else -1


def _host(address: str) -> str:
    rest = address.split("://", 1)[-1]
    return rest.rsplit(":", 1)[0] if ":" in rest else rest


class Board:
    """Every job the pages know, by run id (an elastic job's attempts share one)."""

    def __init__(self) -> None:
        self.jobs: collections.OrderedDict[str, JobView] = collections.OrderedDict()
        self.by_attempt: dict[str, tuple[str, int]] = {}  # job id -> (run id, attempt index)
        self.early_failures: dict[str, list[dict[str, Any]]] = {}

    # -- events ------------------------------------------------------------------------
    def job_started(self, event: dict[str, Any]) -> None:
        run_id = str(event.get("run_id") or event["job_id"])
        job = self.jobs.get(run_id)
        if job is None:
            job = self.jobs[run_id] = JobView(run_id, str(event.get("name") or run_id),
                                              int(event.get("max_restarts") or 0))
        if job.attempts and job.current.end is None and not job.current.state.is_terminal:
            job.current.state, job.current.end = JobState.FAILED, time.time()
        workers = [str(w) for w in event.get("workers", ())]
        attempt = Attempt(str(event["job_id"]), int(event.get("attempt") or 0),
                          int(event.get("world_size") or len(workers)), workers,
                          float(event.get("time") or time.time()))
        for rank, worker in enumerate(workers):
            attempt.ranks[rank] = RankView(rank, worker=worker, host=_host(worker))
        job.attempts.append(attempt)
        self.by_attempt[attempt.job_id] = (run_id, len(job.attempts) - 1)
        for record in self.early_failures.pop(attempt.job_id, []):
            self.failure(attempt.job_id, record)
        self._trim()

    def _attempt(self, job_id: str) -> Attempt | None:
        where = self.by_attempt.get(job_id)
        if where is None or where[0] not in self.jobs:
            return None
        return self.jobs[where[0]].attempts[where[1]]

    def job_state(self, job_id: str, event: dict[str, Any]) -> None:
        """A state change from the launcher: ``done``, ``failed``, ``cancelled`` (the job
        ended), ``stalled`` (with ``ranks``, ``collective``, ``stacks``) or ``running``
        (a stall cleared). A recorded failure, or a stall that ended the job, stands
        against a later ``done``/``failed``/``running``/``stalled``; a cancel wins."""
        a = self._attempt(job_id)
        try:
            state = JobState(event.get("state"))
        except ValueError:
            return
        if a is None:
            return
        now = float(event.get("time") or time.time())
        ended_stalled = a.state is JobState.STALLED and bool(a.stall and a.stall["final"])
        if state is not JobState.CANCELLED and (a.state is JobState.FAILED or ended_stalled):
            if state.is_terminal:
                a.end = a.end or now
            return
        if state is JobState.STALLED:
            _set_stall(a, event, final=False)
        a.state = state
        if state.is_terminal:
            a.end = now

    def job_generation(self, job_id: str, event: dict[str, Any]) -> None:
        """A live job's group changed (see ``events.job_generation``): listed once per
        generation, the attempt's world size now the new group's."""
        a = self._attempt(job_id)
        if a is None or any(g["generation"] == event["generation"] for g in a.generations):
            return
        a.generations.append({k: event[k] for k in (
            "generation", "time", "cause", "lost", "joined", "world_size", "step",
            "recovery_s")})
        del a.generations[:-MAX_GENERATIONS]
        a.generations.sort(key=lambda g: g["generation"])
        a.world_size = int(event["world_size"])

    def failure(self, job_id: str, record: dict[str, Any]) -> None:
        """A rank's failure record (the launcher's failure topic); ``kind == "stalled"``
        (with ``ranks``, ``collective``, ``stacks``) is the stall that ended the job."""
        a = self._attempt(job_id)
        if a is None:  # the record came before the job's start event
            self.early_failures.setdefault(job_id, []).append(dict(record))
            while len(self.early_failures) > MAX_JOBS:
                self.early_failures.pop(next(iter(self.early_failures)))
            return
        rec = {k: record.get(k) for k in ("rank", "worker", "kind", "message")}
        rec["traceback"] = _clip(record.get("traceback"))
        a.failures.append(rec)
        kind = str(rec.get("kind"))
        if kind == FailureKind.STALLED:
            _set_stall(a, record, final=True)
            a.state = JobState.STALLED
        elif kind != FailureKind.ABORTED and not (a.stall and a.stall["final"]):
            a.state = JobState.FAILED
        else:
            return
        a.end = a.end or time.time()

    def rank_sample(self, job_id: str, sample: dict[str, Any]) -> None:
        a = self._attempt(job_id)
        if a is None:
            return
        rank = int(sample["rank"])
        view = a.ranks.get(rank)
        if view is None:
            view = a.ranks[rank] = RankView(rank)
        view.merge(sample)
        if a.state is JobState.STARTING and view.state == "running":
            a.state = JobState.RUNNING
        ranks = a.ranks.values()
        if a.end is None and not a.state.is_terminal and len(a.ranks) >= a.world_size \
                and all(r.state == "exited" for r in ranks):
            # Every rank ended: the job did, also when its client never says so (gone).
            ok = all(r.exit == "exit code 0" for r in ranks)
            a.state = JobState.DONE if ok and not a.failures else JobState.FAILED
            a.end = view.updated
        job = self.jobs[self.by_attempt[job_id][0]]
        if job.first_metric is None and view.curves:
            job.first_metric = next(iter(view.curves))

    def results_unread(self, event: dict[str, Any]) -> None:
        """A results topic is full and nobody reads it (``state == "unread"``), or it is
        read again or gone (``"read"``). The attempts concerned are those whose rank task
        keys (the topic's writers, ``<name>-<job id>-<rank>``) or topic name hold their
        job id."""
        topic = str(event["topic"])
        if event.get("state") == "read":
            for job in self.jobs.values():
                for a in job.attempts:
                    a.unread.pop(topic, None)
            return
        ids = {m for text in (topic, *event.get("writers", ()))
               for m in _JOB_ID.findall(str(text))}
        for job_id in ids:
            found = self._attempt(job_id)
            if found is not None and (topic in found.unread or len(found.unread) < MAX_UNREAD):
                found.unread[topic] = {"topic": topic, "since": event.get("since"),
                                       "used": event.get("used"), "budget": event.get("budget")}

    # -- views -------------------------------------------------------------------------
    def find(self, key: str) -> JobView | None:
        """A job by its run id, an attempt's job id, or a unique prefix of either."""
        if key in self.jobs:
            return self.jobs[key]
        if key in self.by_attempt:
            return self.jobs.get(self.by_attempt[key][0])
        found = {r for r in self.jobs if r.startswith(key)}
        found |= {run for j, (run, _) in self.by_attempt.items() if j.startswith(key)}
        return self.jobs[found.pop()] if len(found) == 1 and key else None

    def jobs_json(self) -> dict[str, Any]:
        now = time.time()
        rows = [j.row(now) for j in reversed(self.jobs.values())]
        return {"version": 1, "time": now, "jobs": rows}

    def job_json(self, key: str, metric: str | None = None) -> dict[str, Any] | None:
        job = self.find(key)
        if job is None:
            return None
        return {"version": 1, "time": time.time(), "job": job.detail(time.time(), metric)}

    def _trim(self) -> None:
        while len(self.jobs) > MAX_JOBS:
            victim = next((r for r, j in self.jobs.items() if j.state.is_terminal),
                          next(iter(self.jobs)))
            gone = self.jobs.pop(victim)
            for a in gone.attempts:
                self.by_attempt.pop(a.job_id, None)
