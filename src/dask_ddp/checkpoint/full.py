"""Checkpoints straight from a rank to storage, atomically, off the training thread.

Layout under the storage URL (``file://`` or ``s3://``, through :mod:`dask_ddp.storage`)::

    checkpoints/step-000000000100.pt     torch.save of the object
    checkpoints/step-000000000100.json   manifest: step, size, sha256, time

A checkpoint exists only once its manifest does, and the manifest is written after the data
object is complete; no object is ever overwritten. So a writer killed at any point leaves
the previous checkpoints loadable, and :func:`load_checkpoint` takes the newest checkpoint
whose manifest parses and whose data matches its size and hash (falling back to older ones
otherwise). Checkpoints never travel through the Dask scheduler.
"""

from __future__ import annotations

import atexit
import collections
import concurrent.futures
import hashlib
import io
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

logger = logging.getLogger(__name__)

__all__ = ["save_checkpoint", "load_checkpoint", "wait_checkpoints", "list_checkpoints"]

PREFIX = "checkpoints/"
_MANIFEST = re.compile(r"step-(\d{12})\.json$")
#: Uploads allowed in flight besides the one being serialised (bounds memory).
MAX_PENDING = 1

_executor: concurrent.futures.ThreadPoolExecutor | None = None
_pending: collections.deque[concurrent.futures.Future[str]] = collections.deque()
_lock = threading.Lock()
#: Storage errors worth another whole try after the store's own retries (a 503 storm, a
#: timeout). Anything else (a refused request, a bad key) is raised at once.
_TRANSIENT = (ConnectionError, TimeoutError)
#: Whole tries of one checkpoint object when reading it to restore.
READ_ATTEMPTS = 3

T = TypeVar("T")


def _storage_url(storage: str | None) -> str:
    url = storage or os.environ.get("DASK_DDP_STORAGE")
    if not url:
        raise ValueError(
            "no checkpoint storage: pass storage='file:///...' or 's3://bucket/prefix', or "
            "launch the job with storage=URL (DASK_DDP_STORAGE)"
        )
    return url


def _open(url: str) -> Any:
    from dask_ddp import storage

    return storage.open(url)


def _key_of(item: Any) -> str:
    if isinstance(item, str):
        return item
    for attr in ("key", "name", "path"):
        v = getattr(item, attr, None)
        if isinstance(v, str):
            return v
    if isinstance(item, (tuple, list)) and item and isinstance(item[0], str):
        return item[0]
    raise TypeError(f"unexpected listing entry {item!r}")


def _data_key(step: int) -> str:
    return f"{PREFIX}step-{step:012d}.pt"


def _manifest_key(step: int) -> str:
    return f"{PREFIX}step-{step:012d}.json"


def list_checkpoints(storage: str | None = None) -> list[int]:
    """Steps that have a manifest (newest last); not yet verified."""
    store = _open(_storage_url(storage))
    steps = []
    for item in store.list(PREFIX):
        m = _MANIFEST.search(_key_of(item))
        if m:
            steps.append(int(m.group(1)))
    return sorted(steps)


def _upload(url: str, step: int, data: memoryview, keep: int) -> str:
    t0 = time.perf_counter()
    store = _open(url)
    digest = hashlib.sha256(data).hexdigest()
    store.put(_data_key(step), data)
    manifest = {
        "step": step,
        "size": len(data),
        "sha256": digest,
        "time": time.time(),
        "format": "torch.save",
    }
    store.put(_manifest_key(step), json.dumps(manifest).encode())
    logger.info(
        "checkpoint step %d: %d bytes to %s in %.2fs",
        step,
        len(data),
        url,
        time.perf_counter() - t0,
    )
    if keep > 0:
        steps = sorted(
            int(m.group(1)) for item in store.list(PREFIX) if (m := _MANIFEST.search(_key_of(item)))
        )
        for old in steps[:-keep]:
            # The manifest goes first: a checkpoint is never visible without its data.
            for key in (_manifest_key(old), _data_key(old)):
                try:
                    store.delete(key)
                except Exception:  # noqa: BLE001 - pruning is best effort
                    logger.warning("could not delete old checkpoint %s", key, exc_info=True)
    return f"{url.rstrip('/')}/{_data_key(step)}"


def save_checkpoint(
    obj: Any,
    step: int,
    *,
    storage: str | None = None,
    rank: int | None = 0,
    keep: int = 3,
) -> concurrent.futures.Future[str] | None:
    """Save ``obj`` (e.g. a ``state_dict``) as the checkpoint of ``step``.

    ``torch.save`` runs on the calling thread (a consistent snapshot, the only time the
    training loop is blocked); the upload runs on a background thread while training goes
    on. At most one earlier upload may still be in flight; a third call waits for it.
    Uploads still running when the rank process ends normally finish before it exits.

    Parameters
    ----------
    obj
        What to save (anything ``torch.save`` takes).
    step
        The step number; the newest complete step is what :func:`load_checkpoint` loads.
    storage
        A store URL; default: the job's storage (``DASK_DDP_STORAGE``).
    rank
        Only this rank saves (others return ``None`` at once); ``None``: every rank.
    keep
        How many checkpoints to keep (older ones are deleted); 0 keeps all.

    Returns
    -------
    concurrent.futures.Future or None
        Resolves to the checkpoint's URL once it is complete and visible.
    """
    if rank is not None and int(os.environ.get("RANK", "0")) != rank:
        return None
    if not isinstance(step, int) or step < 0:
        raise ValueError(f"save_checkpoint(): step must be a non-negative int, got {step!r}")
    url = _storage_url(storage)
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    data = buf.getbuffer()
    global _executor
    with _lock:
        while _pending and _pending[0].done():
            _log_failure(_pending.popleft())
        to_wait = list(_pending)[: max(0, len(_pending) - MAX_PENDING)]
    for old in to_wait:  # bounded memory: at most MAX_PENDING uploads behind this one
        concurrent.futures.wait([old])
    with _lock:
        while _pending and _pending[0].done():
            _log_failure(_pending.popleft())
        if _executor is None:
            _executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="dask-ddp-checkpoint"
            )
            # The rank process ends with atexit handlers then os._exit (no thread joins):
            # finish the uploads there, so a checkpoint saved last is not lost.
            atexit.register(_finish_at_exit)
        fut = _executor.submit(_upload, url, step, data, keep)
        _pending.append(fut)
    return fut


def _log_failure(fut: concurrent.futures.Future[str]) -> None:
    exc = fut.exception()
    if exc is not None:
        logger.error("checkpoint upload failed: %r", exc)


def _finish_at_exit() -> None:
    try:
        wait_checkpoints()
    except Exception:  # noqa: BLE001 - at exit: log, do not mask the exit code
        logger.exception("a checkpoint upload failed at exit")


def wait_checkpoints(timeout: float | None = None) -> None:
    """Wait until every checkpoint saved by this process is in storage (raises its error)."""
    with _lock:
        pending = list(_pending)
        _pending.clear()
    for fut in pending:
        fut.result(timeout)


def load_checkpoint(
    storage: str | None = None,
    *,
    weights_only: bool = True,
    map_location: Any = "cpu",
    step: int | None = None,
) -> Any | None:
    """Load the newest complete checkpoint (or the one of ``step``); ``None`` if none.

    Parameters
    ----------
    storage
        A store URL; default: the job's storage (``DASK_DDP_STORAGE``).
    weights_only
        Passed to ``torch.load``: only tensors and plain containers unless set False.
    map_location
        Passed to ``torch.load``.
    step
        Load this step (``None``: the newest complete one).
    """
    import torch

    url = _storage_url(storage)
    store = _open(url)
    # A concurrent writer may prune what was just listed: list again before giving up.
    for _attempt in range(3):
        steps = list_checkpoints(url)
        if step is not None:
            steps = [s for s in steps if s == step]
        if not steps:
            return None
        for s in reversed(steps):
            data = _read_verified(store, url, s)
            if data is not None:
                # Visible on purpose: a new job pointed at an old job's storage resumes.
                logger.info("loading checkpoint step %d from %s", s, url)
                return torch.load(
                    io.BytesIO(data), weights_only=weights_only, map_location=map_location
                )
    return None


def _retry(
    fn: Callable[[], T], *, attempts: int, on_error: Callable[[Exception], BaseException]
) -> T:
    """``fn()``, tried ``attempts`` times on transient errors; other errors at once.

    The error raised is ``on_error(e)``, chained to the last one.
    """
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except _TRANSIENT as e:
            if attempt == attempts:
                raise on_error(e) from e
            logger.warning("transient storage error (attempt %d of %d): %s", attempt, attempts, e)
            time.sleep(min(0.5 * 2 ** (attempt - 1), 5.0))
        except Exception as e:
            raise on_error(e) from e
    raise AssertionError("unreachable")


def get_or_none(store: Any, url: str, key: str, what: str) -> bytes | None:
    """The object ``key`` of a checkpoint store, or ``None`` if it does not exist.

    Only a missing object is ``None``: a transient error (503, timeout) is retried
    (:data:`READ_ATTEMPTS` whole tries), then raised, like any other error, naming the
    object. A restore must never mistake "storage unavailable" for "no checkpoint" and
    silently resume from an older step or from scratch.
    """

    def failed(e: Exception) -> BaseException:
        msg = f"reading {what} {url.rstrip('/')}/{key}: {e}"
        try:
            return type(e)(msg)  # the same type, so callers catch what they know
        except Exception:  # noqa: BLE001 - a type with another signature
            return RuntimeError(msg)

    try:
        return bytes(_retry(lambda: store.get(key), attempts=READ_ATTEMPTS, on_error=failed))
    except FileNotFoundError:
        return None


def _read_verified(store: Any, url: str, step: int) -> bytes | None:
    """Step ``step``'s data if its manifest and data are there and agree; ``None`` if one
    is missing (pruned meanwhile) or fails verification. Storage errors raise."""
    raw = get_or_none(store, url, _manifest_key(step), f"checkpoint step {step}")
    data = get_or_none(store, url, _data_key(step), f"checkpoint step {step}")
    if raw is None or data is None:
        logger.warning("checkpoint step %d in %s is incomplete (pruned meanwhile?)", step, url)
        return None
    try:
        manifest = json.loads(raw)
        ok = len(data) == manifest["size"] and hashlib.sha256(data).hexdigest() == manifest[
            "sha256"]
    except (ValueError, KeyError, TypeError) as e:
        logger.warning("checkpoint step %d in %s has a bad manifest (%s)", step, url, e)
        return None
    if not ok:
        logger.warning("checkpoint step %d in %s does not match its manifest", step, url)
        return None
    return data


# Sharded checkpoints (torch.distributed.checkpoint) live in checkpoint_dcp and
# checkpoint_sharded, which import torch at once: their public names are reached from here
# lazily, so importing this module stays cheap.
_LAZY = {"StorageWriter": "checkpoint_dcp", "StorageReader": "checkpoint_dcp",
         "save_sharded": "checkpoint_sharded", "load_sharded": "checkpoint_sharded",
         "list_sharded_checkpoints": "checkpoint_sharded",
         "latest_sharded_step": "checkpoint_sharded"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__package__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
