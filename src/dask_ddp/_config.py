"""The package's configuration: Dask config keys under ``dask-ddp``, defaults in YAML.

The defaults live in ``dask-ddp.yaml`` beside this file and are merged into Dask's
configuration (``dask.config.update_defaults``) when the first key is read, so a value the
user set (a YAML file, ``dask.config.set``, ``DASK_DASK_DDP__...`` variables) wins. Every
module that reads a ``dask-ddp.*`` key reads it through here. Importing this module costs
nothing: ``dask`` is imported with the first read (a rank that only writes records never
reads a key, and never imports dask).
"""

from __future__ import annotations

import functools
import os
from typing import Any

_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dask-ddp.yaml")


@functools.cache
def defaults() -> dict[str, Any]:
    """The package's defaults (``dask-ddp.yaml``), merged into Dask's config once."""
    import dask.config
    import yaml

    with open(_FILE, encoding="utf-8") as f:
        values: dict[str, Any] = yaml.safe_load(f)
    dask.config.update_defaults(values)
    return values


def get(key: str) -> Any:
    """The value of ``key`` (``"dask-ddp.results.budget"``)."""
    import dask.config

    values = defaults()
    try:
        return dask.config.get(key)
    except KeyError:
        # The defaults were merged inside a ``dask.config.set`` block whose exit removed
        # the whole ``dask-ddp`` section again: merge them once more (set values win).
        dask.config.update_defaults(values)
        return dask.config.get(key)


def positive_bytes(key: str, *, allow_zero: bool = False) -> int:
    """``key`` as a positive number of bytes (``"64 MiB"`` or an int)."""
    from dask.utils import parse_bytes

    value = get(key)
    n = parse_bytes(value) if isinstance(value, str) else int(value)
    if n < 0 or (n == 0 and not allow_zero):
        raise ValueError(f"{key} must be positive, got {value!r}")
    return n


def positive_seconds(key: str) -> float:
    """``key`` as a positive duration in seconds (``"30 s"`` or a number)."""
    from dask.utils import parse_timedelta

    value = get(key)
    s = parse_timedelta(value) if isinstance(value, str) else float(value)
    if s is None or s <= 0:
        raise ValueError(f"{key} must be a positive duration, got {value!r}")
    return float(s)


def positive_int(key: str) -> int:
    """``key`` as a positive integer."""
    value = int(get(key))
    if value <= 0:
        raise ValueError(f"{key} must be positive, got {value}")
    return value


def flag(key: str) -> bool:
    """``key`` as a boolean (``True``/``False``, or ``"true"``/``"false"``/``"1"``/``"0"``
    from a ``DASK_DASK_DDP__...`` variable)."""
    value = get(key)
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off"):
        return False
    raise ValueError(f"{key} must be true or false, got {value!r}")


def duration(value: Any, what: str, *, allow_none: bool = False) -> float | None:
    """``value`` (seconds, ``"30 s"``, a ``timedelta``, or ``None`` when allowed) as a
    positive number of seconds; ``what`` names it in the error."""
    import datetime

    from dask.utils import parse_timedelta

    if value is None:
        if allow_none:
            return None
        raise ValueError(f"{what} must be a positive duration, got None")
    try:
        if isinstance(value, datetime.timedelta):
            s = value.total_seconds()
        elif isinstance(value, str):
            s = parse_timedelta(value)
        elif isinstance(value, bool):
            raise TypeError
        else:
            s = float(value)
    except (TypeError, ValueError, KeyError):
        raise ValueError(f"{what} must be a duration (seconds, '30 s' or a timedelta), "
                         f"got {value!r}") from None
    if s is None or s <= 0:
        raise ValueError(f"{what} must be a positive duration, got {value!r}")
    return float(s)


def seconds(key: str, *, allow_none: bool = False) -> float | None:
    """``key`` as a positive duration in seconds, or ``None`` (off) when allowed."""
    return duration(get(key), key, allow_none=allow_none)
