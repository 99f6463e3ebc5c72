"""Where checkpoints live under a storage URL, and how they are read (internal).

Both kinds share one folder under the job's storage URL::

    checkpoints/step-000000000100.pt        full: torch.save of the object
    checkpoints/step-000000000100.json      full: manifest (step, size, sha256, time)
    checkpoints/step-000000000100/          sharded: a DCP folder, complete with .metadata

This module is the leaf the others share: the key names, the storage URL a checkpoint goes
to, one way to open its store, reads that tell "missing" from "storage unavailable", and
pruning old steps. It imports neither torch nor the other checkpoint modules.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

logger = logging.getLogger(__name__)

PREFIX = "checkpoints/"
#: A full checkpoint's manifest (it exists only once the data object is complete).
FULL_MANIFEST = re.compile(r"step-(\d{12})\.json$")
#: A complete sharded checkpoint's DCP metadata object.
SHARDED_METADATA = re.compile(r"^checkpoints/step-(\d{12})/\.metadata$")
#: Any object of a sharded checkpoint's folder.
SHARDED_KEY = re.compile(r"^checkpoints/step-(\d{12})/")

#: Storage errors worth another whole try after the store's own retries (a 503 storm, a
#: timeout). Anything else (a refused request, a bad key) is raised at once.
TRANSIENT = (ConnectionError, TimeoutError)
#: Whole tries of one checkpoint object when reading it to restore.
READ_ATTEMPTS = 3

T = TypeVar("T")


def full_data_key(step: int) -> str:
    return f"{PREFIX}step-{step:012d}.pt"


def full_manifest_key(step: int) -> str:
    return f"{PREFIX}step-{step:012d}.json"


def sharded_prefix(step: int) -> str:
    return f"{PREFIX}step-{step:012d}/"


def storage_url(storage: str | None) -> str:
    """``storage``, else the job's storage URL (``DASK_DDP_STORAGE``); raises if neither."""
    url = storage or os.environ.get("DASK_DDP_STORAGE")
    if not url:
        raise ValueError(
            "no checkpoint storage: pass storage='file:///...' or 's3://bucket/prefix', or "
            "launch the job with storage=URL (DASK_DDP_STORAGE)"
        )
    return url


def redacted(url: str | os.PathLike[str]) -> str:
    """``url`` with a ``user:password@`` taken out: what every log line and error of the
    checkpoints shows (worker logs reach Dask's dashboard)."""
    from dask_ddp import storage

    return storage.redact_url(url)


def open_store(url: str, **options: Any) -> Any:
    """The :class:`dask_ddp.storage.Store` at ``url`` (imported here, on first use)."""
    from dask_ddp import storage

    return storage.open(url, **options)


def key_of(item: Any) -> str:
    """The key of a listing entry (a ``str``, or an object or tuple carrying one)."""
    if isinstance(item, str):
        return item
    for attr in ("key", "name", "path"):
        v = getattr(item, attr, None)
        if isinstance(v, str):
            return v
    if isinstance(item, (tuple, list)) and item and isinstance(item[0], str):
        return item[0]
    raise TypeError(f"unexpected listing entry {item!r}")


def retry(
    fn: Callable[[], T], *, attempts: int, on_error: Callable[[Exception], BaseException]
) -> T:
    """``fn()``, tried ``attempts`` times on transient errors; other errors at once.

    The error raised is ``on_error(e)``, chained to the last one.
    """
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except TRANSIENT as e:
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
        msg = f"reading {what} {redacted(url).rstrip('/')}/{key}: {e}"
        try:
            return type(e)(msg)  # the same type, so callers catch what they know
        except Exception:  # noqa: BLE001 - a type with another signature
            return RuntimeError(msg)

    try:
        return bytes(retry(lambda: store.get(key), attempts=READ_ATTEMPTS, on_error=failed))
    except FileNotFoundError:
        return None


def delete_steps(store: Any, steps: Iterable[int], keys_of: Callable[[int], list[str]]) -> None:
    """Delete each step's objects in the order ``keys_of`` gives, oldest step first.

    ``keys_of`` puts a step's completion marker (manifest, ``.metadata``) first, so the step
    stops counting before any of its objects go. Best effort: a failed delete is logged.
    """
    for step in sorted(steps):
        for key in keys_of(step):
            try:
                store.delete(key)
            except Exception:  # noqa: BLE001 - pruning is best effort
                logger.warning("could not delete old checkpoint object %s", key, exc_info=True)
