"""What the job pages take in, checked at the edge: the launcher's job events, the
supervisors' rank samples and the ranks' failure records (internal).

Everything here arrives over the network from workers and clients. Each message is checked
whole before the :class:`~dask_ddp._dashboard.model.Board` sees it: plain values only
(dicts, lists, text, numbers), bounded in size and depth, and the fields the pages compute
with of the type they need. A message that fails is refused with a reason (logged by the
extension) and changes nothing: one bad sample never blanks a page.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from dask_ddp._dashboard.model import Board

logger = logging.getLogger(__name__)

#: Bounds of a message: text length, items of a list or dict, nesting depth.
MAX_TEXT = 64 * 1024
MAX_ITEMS = 4096
MAX_DEPTH = 8
MAX_RANK = 1 << 20
#: The sample's fields that are numbers (or None), and those that are text.
_NUMBERS = ("pid", "steps", "cpu_percent", "rss_bytes", "reports", "steps_per_s",
            "wait_fraction", "wait_ms_per_step", "step_ms", "time", "step")
_TEXTS = ("worker", "host", "exit", "step_source")
_RANK_STATES = ("starting", "running", "exited")


def take_job_event(board: Board, job_id: Any, event: Any) -> None:
    """A launcher event (``{"kind": "started", ...}`` or a state change) into ``board``."""
    job_id, event = _message(job_id, event, "job event")
    if event.get("kind") == "started":
        workers = event.get("workers", [])
        if not isinstance(workers, list) or not all(isinstance(w, str) for w in workers):
            raise ValueError("a started job's workers are a list of addresses")
        for key in ("attempt", "world_size", "max_restarts"):
            _count(event, key)
        _number(event, "time")
        board.job_started({**event, "job_id": job_id})
    elif event.get("kind") == "generation":
        for key in ("generation", "world_size", "step"):
            _count(event, key)
        for key in ("time", "recovery_s"):
            _number(event, key)
        for key in ("lost", "joined"):
            ranks = event.get(key)
            if not isinstance(ranks, list) or not all(_is_int(r) for r in ranks):
                raise ValueError(f"a generation's {key} is a list of ranks")
        event["cause"] = str(event.get("cause", ""))[:500]
        board.job_generation(job_id, event)
    else:
        _number(event, "time")
        _stall_fields(event)
        board.job_state(job_id, event)


def take_rank_sample(board: Board, job_id: Any, sample: Any) -> None:
    """A supervisor's sample of its rank (:mod:`~dask_ddp._dashboard.sampler`)."""
    job_id, sample = _message(job_id, sample, "rank sample")
    rank = sample.get("rank")
    if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < MAX_RANK:
        raise ValueError(f"a rank sample's rank is {rank!r}")
    for key in _NUMBERS:
        _number(sample, key)
    for key in _TEXTS:
        if sample.get(key) is not None and not isinstance(sample[key], str):
            raise ValueError(f"a rank sample's {key} is not text")
    if sample.get("state") is not None and sample["state"] not in _RANK_STATES:
        raise ValueError(f"a rank sample's state is {str(sample['state'])[:40]!r}")
    diverged = sample.get("diverged")
    if diverged is not None and not (
            isinstance(diverged, dict) and isinstance(diverged.get("metric"), str)
            and diverged.get("value") in ("NaN", "Infinity", "-Infinity")
            and (diverged.get("step") is None or _is_int(diverged["step"]))):
        raise ValueError("a rank sample's diverged is not {metric, value, step}")
    metrics = sample.get("metrics")
    if metrics is not None and not isinstance(metrics, dict):
        raise ValueError("a rank sample's metrics are not a dict")
    points = sample.get("points")
    if points is not None:
        if not isinstance(points, dict):
            raise ValueError("a rank sample's points are not a dict")
        for curve in points.values():
            if not isinstance(curve, list) or not all(
                    isinstance(p, list) and len(p) == 2 and all(_is_finite(v) for v in p)
                    for p in curve):
                raise ValueError("a curve's points are not [x, y] pairs of finite numbers")
    board.rank_sample(job_id, sample)


def take_failure(board: Board, job_id: Any, record: Any) -> None:
    """A rank's failure record (the launcher's failure topic)."""
    job_id, record = _message(job_id, record, "failure record")
    if record.get("rank") is not None and not _is_int(record["rank"]):
        raise ValueError(f"a failure record's rank is {str(record['rank'])[:40]!r}")
    _number(record, "time")
    _stall_fields(record)
    board.failure(job_id, record)


def take_results_unread(board: Board, event: Any) -> None:
    """The results extension's word that a topic is full and unread, or read again."""
    event = _plain(event, "results event")
    if not isinstance(event, dict):
        raise ValueError("a results event is a dict")
    if event.get("state") not in ("unread", "read"):
        raise ValueError(f"a results event's state is {str(event.get('state'))[:40]!r}")
    topic = event.get("topic")
    if not isinstance(topic, str) or not 0 < len(topic) <= 200:
        raise ValueError("a results event's topic is text of 1 to 200 characters")
    writers = event.get("writers", [])
    if not isinstance(writers, list) or len(writers) > 64 or not all(
            isinstance(w, str) and len(w) <= 400 for w in writers):
        raise ValueError("a results event's writers are a list of at most 64 task keys")
    for key in ("since", "used", "budget"):
        _number(event, key)
    board.results_unread(event)


def _stall_fields(event: dict[str, Any]) -> None:
    ranks = event.get("ranks")
    if ranks is not None and (not isinstance(ranks, list) or not all(map(_is_int, ranks))):
        raise ValueError("a stall's ranks are not a list of ranks")
    stacks = event.get("stacks")
    if stacks is not None and not isinstance(stacks, dict):
        raise ValueError("a stall's stacks are not a dict")


def _message(job_id: Any, raw: Any, what: str) -> tuple[str, dict[str, Any]]:
    """The job id and the message, checked as plain data and a dict."""
    if not isinstance(job_id, str) or not 0 < len(job_id) <= 200:
        raise ValueError("a job id is text of 1 to 200 characters")
    message = _plain(raw, what)
    if not isinstance(message, dict):
        raise ValueError(f"a {what} is a dict")
    return job_id, message


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_finite(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def _number(message: dict[str, Any], key: str) -> None:
    value = message.get(key)
    if value is not None and not _is_finite(value):
        raise ValueError(f"{key} is {str(value)[:40]!r}, not a finite number")


def _count(message: dict[str, Any], key: str) -> None:
    value = message.get(key)
    if value is not None and not (_is_int(value) and 0 <= value < MAX_RANK):
        raise ValueError(f"{key} is {str(value)[:40]!r}, not a count")


def _plain(value: Any, what: str, depth: int = 0) -> Any:
    """``value`` if it is plain data within the bounds, with tuples as lists; else
    ``ValueError`` naming what is wrong. Non-finite floats stay (a diverged loss is shown)."""
    if depth > MAX_DEPTH:
        raise ValueError(f"a {what} nested deeper than {MAX_DEPTH}")
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        if len(value) > MAX_TEXT:
            raise ValueError(f"a {what} holds a text of {len(value)} characters")
        return value
    if isinstance(value, (list, tuple)):
        if len(value) > MAX_ITEMS:
            raise ValueError(f"a {what} holds a list of {len(value)} items")
        return [_plain(v, what, depth + 1) for v in value]
    if isinstance(value, dict):
        if len(value) > MAX_ITEMS:
            raise ValueError(f"a {what} holds a dict of {len(value)} items")
        out = {}
        for k, v in value.items():
            if not isinstance(k, str) or len(k) > 1000:
                raise ValueError(f"a {what} has a key that is not short text")
            out[k] = _plain(v, what, depth + 1)
        return out
    raise ValueError(f"a {what} holds a {type(value).__name__}")
