"""The package's configuration: Dask config keys under ``dask-ddp``, defaults in YAML.

The defaults live in ``dask-ddp.yaml`` beside this file and are merged into Dask's
configuration (``dask.config.update_defaults``) when this module is first imported, so a
value the user set (a YAML file, ``dask.config.set``, ``DASK_DASK_DDP__...`` variables)
wins. Every module that reads a ``dask-ddp.*`` key reads it through here.
"""

from __future__ import annotations

import os
from typing import Any

import dask.config
import yaml
from dask.utils import parse_bytes, parse_timedelta

_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dask-ddp.yaml")

with open(_FILE, encoding="utf-8") as _f:
    DEFAULTS: dict[str, Any] = yaml.safe_load(_f)
dask.config.update_defaults(DEFAULTS)


def get(key: str) -> Any:
    """The value of ``key`` (``"dask-ddp.results.budget"``)."""
    return dask.config.get(key)


def positive_bytes(key: str, *, allow_zero: bool = False) -> int:
    """``key`` as a positive number of bytes (``"64 MiB"`` or an int)."""
    value = get(key)
    n = parse_bytes(value) if isinstance(value, str) else int(value)
    if n < 0 or (n == 0 and not allow_zero):
        raise ValueError(f"{key} must be positive, got {value!r}")
    return n


def positive_seconds(key: str) -> float:
    """``key`` as a positive duration in seconds (``"30 s"`` or a number)."""
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
