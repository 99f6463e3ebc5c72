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
blocks the rank instead of dropping). A metric given as a CUDA tensor is the exception:
:func:`report` does not wait for the GPU; the record waits in the rank (behind it, the
records reported after it) until the value's copy to the host is done, and is written then
or at the latest at :func:`flush_pending` (a checkpoint save, a Loader's end of epoch, the
rank's exit). A rank killed before such a value was ready loses that record and the ones
queued behind it, nothing else.

Client side
-----------
- :meth:`DaskResultsHandler.process_results` writes the results under a folder.
- A job's :class:`JobMonitor` (progress bar, ``metrics.jsonl``) reads its metrics on the
  client; ``Job.metrics()`` iterates over them (:mod:`dask_ddp._channel.monitor`).

Configuration (Dask config, e.g. ``DASK_DASK_DDP__RESULTS__BUDGET="16 MiB"``)
-----------------------------------------------------------------------------
``dask-ddp.results.budget`` (64 MiB)
    Scheduler memory per topic (a job's metrics, one handler's results); when full, the
    ranks' ``report``/``submit_result`` wait until the client has read. (One part of a
    large record is let into an empty topic even when it is larger than the budget.)
``dask-ddp.results.part-size`` (1 MiB)
    Large records cross the scheduler in parts of this size.
``dask-ddp.results.inline-max`` (4 MiB)
    With a job storage, ``submit_result`` data above this goes through storage.
``dask-ddp.results.metrics-buffer`` (100000)
    Metric records the client keeps for ``Job.metrics()`` when the job has no
    ``output_dir``; when full, the oldest are dropped (an iterator that missed them logs
    how many). With ``output_dir`` every record is in ``metrics.jsonl`` and memory stays
    flat.
``dask-ddp.results.expiry`` (10 minutes)
    A topic nobody reads whose ranks are done is removed from the scheduler after this
    long. Topics also go as soon as their reader has drained them, their client went
    away or the job's futures were released.
``dask-ddp.results.put-retry`` (60 s)
    How long a worker retries handing records to a scheduler that does not answer before
    the rank's task reports the failure.

Limits: one reader per topic (one ``process_results`` per handler at a time).
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dask_ddp import _pending
from dask_ddp._channel.rank_writer import in_rank, write
from dask_ddp._channel.records import (
    ResultWriter,
    StoredRef,
    check_path,
    encode_metric,
    encode_result,
    encode_stored,
)
from dask_ddp._channel.wire import metrics_topic
from dask_ddp._lazy import attribute_loader
from dask_ddp._pending import flush_pending

if TYPE_CHECKING:
    import torch

    from dask_ddp._channel.reader import GapError, Record
    from dask_ddp.checkpoint import load_checkpoint, save_checkpoint

logger = logging.getLogger(__name__)

__all__ = [
    "DaskResultsHandler",
    "flush_pending",
    "report",
    "save_checkpoint",
    "load_checkpoint",
]

#: Keys every metric record carries (``job`` is added on the client, naming the job whose
#: rank sent it); a user metric may not use them.
RESERVED_KEYS = frozenset({"job", "rank", "step", "time"})
#: Longest string value :func:`report` accepts.
MAX_STRING = 1024


# ------------------------------------------------------------------------------ rank side


class _RankState:
    """What report() needs, resolved once per process."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.enabled = in_rank()
        self.rank = int(os.environ.get("RANK", "0"))
        self.job_id = os.environ.get("DASK_DDP_JOB_ID", "")
        self.topic = metrics_topic(self.job_id)
        #: Writes one record to the job's metrics topic.
        self.writer = functools.partial(write, self.topic)
        #: The step of a report() without ``step=``: one past the last record's.
        self.next_step = 0


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
    item = getattr(value, "item", None)  # numpy scalars
    if callable(item):
        try:
            v = item()
        except (ValueError, RuntimeError):
            v = None
        if isinstance(v, (bool, int, float)):
            return v
    raise TypeError(
        f"report(): metric {key!r} has type {type(value).__name__}; metrics take numbers "
        "(int, float, bool, numpy scalars, 0-d or one-element tensors) and short strings"
    )


def _torch_tensor(value: Any) -> bool:
    """Whether ``value`` is a torch tensor (torch is not imported for the question)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def _tensor_value(key: str, value: torch.Tensor) -> Any:
    """The number a one-element tensor holds, read now, or ``value`` itself when it is on
    a CUDA device (read later, see :class:`_DeviceValues`); TypeError naming ``key``."""
    if value.numel() != 1 or value.is_complex() or value.is_sparse:
        raise TypeError(
            f"report(): metric {key!r} is a tensor of shape {tuple(value.shape)} and dtype "
            f"{value.dtype}; metrics take 0-d or one-element real tensors (reduce it first, "
            "e.g. .mean())")
    if value.device.type == "cuda":
        return value
    try:  # a CPU tensor: no wait; another device (mps, xpu): its own item() waits for it
        v = value.item()
    except (RuntimeError, NotImplementedError) as e:  # the meta device, a fake tensor
        raise TypeError(f"report(): metric {key!r}: its tensor on {value.device} cannot "
                        f"be read ({e})") from None
    return v


class _DeviceValues:
    """A record some of whose values are CUDA tensors: each is copied into pinned host
    memory without blocking, then an event is recorded after the copies on each device's
    current stream (the stream the copies ran on); the record is ready once the events
    have completed, and reads the host copies then."""

    __slots__ = ("record", "hosts", "events")

    def __init__(self, record: dict[str, Any], tensors: list[tuple[str, torch.Tensor]]) -> None:
        import torch

        self.record = record
        self.hosts: list[tuple[str, torch.Tensor]] = []
        devices: dict[torch.device, None] = {}
        for key, t in tensors:
            host = torch.empty((), dtype=t.dtype, pin_memory=True)
            host.copy_(t.detach().reshape(()), non_blocking=True)
            self.hosts.append((key, host))
            devices[t.device] = None
        self.events: list[torch.cuda.Event] = []
        for device in devices:
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(device))
            self.events.append(event)

    def ready(self) -> bool:
        return all(e.query() for e in self.events)

    def payload(self) -> bytes:
        for key, host in self.hosts:
            self.record[key] = host.item()  # host memory the copy has filled: no wait
        return encode_metric(self.record)


def report(metrics: dict[str, Any], step: int | None = None) -> None:
    """Send a metric record from this rank to the client.

    The record carries ``rank``, ``step`` and ``time`` (Unix seconds) besides the metrics.
    On the client it appears in ``Job.metrics()``, the progress bar and ``metrics.jsonl``,
    with ``job`` (the job's id) added, so that jobs sharing an output folder stay apart.
    The call returns once the record is in the rank's channel (a few microseconds); it
    blocks only when the scheduler's budget for the job is full (back-pressure).

    A metric may be a 0-d or one-element tensor on any device: pass ``loss``, not
    ``loss.item()``, which would wait for the GPU every step. A CUDA tensor's value is
    copied to the host without waiting and read once the GPU has produced it; its record
    (with ``step`` and ``time`` of this call) is written then, after every record
    reported before it and before every record reported after it, and at the latest at
    :func:`flush_pending`: a checkpoint save, a Loader's end of epoch, the rank's exit.
    A rank killed (SIGKILL) before such a value was ready loses that record and the ones
    queued behind it; nothing else. A tensor holding NaN or inf gives the same record as
    that float.

    Parameters
    ----------
    metrics
        Names to numbers (int, float, bool, numpy scalars, 0-d or one-element tensors on
        any device) or short strings.
    step
        The training step (iteration) the metrics belong to (an int). Default: one past
        the step of this rank's previous record (0 for the first), so calling ``report()``
        once per step numbers the steps 0, 1, 2, ...

    Raises
    ------
    TypeError
        A metric that is not a number or a short string, or a tensor of more than one
        element (the message names its key and shape).
    ValueError
        A metric named ``job``, ``rank``, ``step`` or ``time``.

    Examples
    --------
    >>> dask_ddp.report({"loss": loss, "epoch": epoch}, step=i)  # doctest: +SKIP
    """
    global _warned_outside
    if type(metrics) is not dict:
        if not isinstance(metrics, dict):
            raise TypeError(f"report(): metrics must be a dict, got {type(metrics).__name__}")
    if step is not None and type(step) is not int:
        given: Any = step
        step = _clean_value("step", given.item() if _torch_tensor(given) else given)
        if not isinstance(step, int):
            raise TypeError(f"report(): step must be an int, got {type(step).__name__}")
    s = _rank_state()
    if step is None:
        step = s.next_step
    s.next_step = step + 1
    rec: dict[str, Any] = {"rank": s.rank, "step": step, "time": time.time()}
    on_device: list[tuple[str, Any]] = []
    for key, value in metrics.items():
        t = type(value)
        if t is not float and t is not int:
            if _torch_tensor(value):
                value = _tensor_value(key, value)
                if _torch_tensor(value):
                    on_device.append((key, value))
                    value = None  # a place in the record's key order, filled when read
            else:
                value = _clean_value(key, value)
        if key in RESERVED_KEYS or type(key) is not str:
            if type(key) is not str:
                raise TypeError(f"report(): metric names must be str, got {key!r}")
            raise ValueError(f"report(): metric {key!r} is reserved (job, rank, step, time)")
        rec[key] = value
    if not s.enabled:
        if not _warned_outside:
            _warned_outside = True
            logger.warning("report() outside a dask-ddp rank: metrics are not sent")
        return
    item: bytes | _DeviceValues = (
        _DeviceValues(rec, on_device) if on_device else encode_metric(rec))
    _pending.put(item, s.writer)


def _inline_max() -> int:
    from dask_ddp._config import positive_bytes

    return positive_bytes("dask-ddp.results.inline-max", allow_zero=True)


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
        if not in_rank():
            client = _current_client()
            if client is not None:
                from dask_ddp._channel.reader import open_topic  # client side only

                open_topic(client, self.topic)

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
        check_path(path)
        if isinstance(data, str):
            kind, body = b"s", data.encode()
        elif isinstance(data, (bytes, bytearray, memoryview)):
            kind, body = b"b", bytes(data)
        else:
            raise TypeError(
                f"submit_result({path!r}): data must be str or bytes, got {type(data).__name__}"
            )
        storage = os.environ.get("DASK_DDP_STORAGE")
        if storage and len(body) > _inline_max():
            key = f"_results/{os.environ.get('DASK_DDP_JOB_ID', 'job')}/{uuid.uuid4().hex}"
            from dask_ddp import storage as _storage

            _storage.open(storage).put(key, body)
            ref = StoredRef(path=path, url=storage, key=key, kind=kind.decode())
            write(self.topic, encode_stored(ref))
            return
        write(self.topic, encode_result(path, kind, body))

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
            Raise the first rank error (after writing what arrived), or else the first
            result that could not be written (a refused path, a full disk: after every
            other record was written); otherwise log each and go on. A record that cannot
            be written never costs the others.
        """
        futures = list(futures)
        client = futures[0].client if futures else _current_client()
        if client is None:
            raise ValueError("process_results(): no futures and no Dask client")
        from dask_ddp._channel.reader import Reader, follow, job_storage  # client side only

        declared: dict[str, str | None] = {}

        def storage_of(job_id: str) -> str | None:
            if job_id not in declared:
                declared[job_id] = job_storage(client, job_id)
            return declared[job_id]

        writer = ResultWriter(Path(prefix), storage_of=storage_of)
        reported: set[str] = set()
        first_error: tuple[Any, float] | None = None

        def handle(records: list[Record]) -> bool:
            nonlocal first_error
            for rec in records:
                writer.write(rec)
            writer.flush()
            for f in futures:
                if f.status in ("error", "cancelled") and f.key not in reported:
                    reported.add(f.key)
                    if not raise_errors:
                        logger.error("rank task %s failed: %r", f.key, _exception(f))
                    elif first_error is None:
                        first_error = (f, time.monotonic())
            # Other ranks are being stopped by the launcher; do not wait forever.
            return first_error is not None and time.monotonic() - first_error[1] > 10

        try:
            reader = Reader(client, self.topic, on_gap=None if raise_errors else _log_gap)
            follow(reader, futures, handle, poll=0.2)  # closes the topic, always
        finally:
            writer.close()
        if first_error is not None:
            exc = _exception(first_error[0])
            if isinstance(exc, BaseException):
                raise exc
        if raise_errors and writer.first_error is not None:
            # Every record that could be written was: then the first that could not.
            logger.error("process_results: %d result(s) were not written under %s",
                         writer.failed, prefix)
            raise writer.first_error


def _exception(future: Any) -> BaseException | None:
    try:
        return future.exception(timeout=5)
    except BaseException as e:  # noqa: BLE001 - CancelledError and friends are the answer
        return e


def _log_gap(err: GapError) -> None:
    logger.error("%s", err)


def _current_client() -> Any:
    try:
        from distributed import default_client

        return default_client()
    except ValueError:
        return None


# Re-exported names, imported on first use: a rank that only reports never loads the
# client's reader or torch's checkpoint code. The monitor's names (its home is
# dask_ddp._channel.monitor) stay importable from here, outside __all__.
__getattr__ = attribute_loader(__name__, {
    **{n: f"dask_ddp._channel.monitor:{n}"
       for n in ("JobMonitor", "iter_job_metrics", "start_job_monitor")},
    **{n: f"dask_ddp.checkpoint:{n}" for n in ("load_checkpoint", "save_checkpoint")},
})
