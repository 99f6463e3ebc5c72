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
import threading
import time
from typing import Any

from dask_ddp._pending import flush_pending as flush_metrics
from dask_ddp.checkpoint.layout import (
    FULL_MANIFEST,
    PREFIX,
    delete_steps,
    full_data_key,
    full_manifest_key,
    get_or_none,
    key_of,
    open_store,
    redacted,
    storage_url,
)

logger = logging.getLogger(__name__)

__all__ = ["save_checkpoint", "load_checkpoint", "wait_checkpoints", "list_checkpoints"]

#: Uploads allowed in flight besides the one being serialised (bounds memory).
MAX_PENDING = 1

_executor: concurrent.futures.ThreadPoolExecutor | None = None
_pending: collections.deque[concurrent.futures.Future[str]] = collections.deque()
_lock = threading.Lock()


def _steps(store: Any) -> list[int]:
    return sorted(
        int(m.group(1)) for item in store.list(PREFIX) if (m := FULL_MANIFEST.search(key_of(item)))
    )


def list_checkpoints(storage: str | None = None) -> list[int]:
    """Steps that have a manifest (newest last); not yet verified."""
    return _steps(open_store(storage_url(storage)))


def _upload(url: str, step: int, data: memoryview, keep: int) -> str:
    t0 = time.perf_counter()
    store = open_store(url)
    digest = hashlib.sha256(data).hexdigest()
    store.put(full_data_key(step), data)
    manifest = {
        "step": step,
        "size": len(data),
        "sha256": digest,
        "time": time.time(),
        "format": "torch.save",
    }
    store.put(full_manifest_key(step), json.dumps(manifest).encode())
    logger.info(
        "checkpoint step %d: %d bytes to %s in %.2fs",
        step,
        len(data),
        redacted(url),
        time.perf_counter() - t0,
    )
    if keep > 0:
        delete_steps(store, _steps(store)[:-keep],
                     lambda s: [full_manifest_key(s), full_data_key(s)])
    return f"{url.rstrip('/')}/{full_data_key(step)}"


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
    # A checkpoint is a flush point of the metrics: every rank's records reported so far
    # (a CUDA value still being copied) are written before it.
    flush_metrics()
    if rank is not None and int(os.environ.get("RANK", "0")) != rank:
        return None
    if not isinstance(step, int) or step < 0:
        raise ValueError(f"save_checkpoint(): step must be a non-negative int, got {step!r}")
    url = storage_url(storage)
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

    url = storage_url(storage)
    store = open_store(url)
    # A concurrent writer may prune what was just listed: list again before giving up.
    for _attempt in range(3):
        steps = list_checkpoints(url)
        if step is not None:
            steps = [s for s in steps if s == step]
        if not steps:
            return None
        for s in reversed(steps):
            data = read_verified(store, url, s)
            if data is not None:
                # Visible on purpose: a new job pointed at an old job's storage resumes.
                logger.info("loading checkpoint step %d from %s", s, redacted(url))
                return torch.load(
                    io.BytesIO(data), weights_only=weights_only, map_location=map_location
                )
    return None


def read_verified(store: Any, url: str, step: int) -> bytes | None:
    """Step ``step``'s data if its manifest and data are there and agree; ``None`` if one
    is missing (pruned meanwhile) or fails verification. Storage errors raise."""
    raw = get_or_none(store, url, full_manifest_key(step), f"checkpoint step {step}")
    data = get_or_none(store, url, full_data_key(step), f"checkpoint step {step}")
    if raw is None or data is None:
        logger.warning("checkpoint step %d in %s is incomplete (pruned meanwhile?)", step,
                       redacted(url))
        return None
    try:
        manifest = json.loads(raw)
        ok = len(data) == manifest["size"] and hashlib.sha256(data).hexdigest() == manifest[
            "sha256"]
    except (ValueError, KeyError, TypeError) as e:
        logger.warning("checkpoint step %d in %s has a bad manifest (%s)", step,
                       redacted(url), e)
        return None
    if not ok:
        logger.warning("checkpoint step %d in %s does not match its manifest", step,
                       redacted(url))
        return None
    return data
