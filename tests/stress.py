"""Repetition belongs to ``make stress``: ``make test`` runs each scenario once.

``make stress`` sets ``DASK_DDP_STRESS=1``: a test parametrized over variants of one
scenario (the victim rank 0 and 1 of the same fault, each on a fresh cluster) runs all of
them there, and one of them in ``make test``; the chaos tests run many random faults there
(``DASK_DDP_CHAOS_RUNS``) and one smoke run in ``make test``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")

#: Whether this is a ``make stress`` run (``DASK_DDP_STRESS=1``).
STRESS = os.environ.get("DASK_DDP_STRESS", "0").strip().lower() not in ("", "0", "false")


def variants(every: Sequence[T], once: T) -> list[T]:
    """``every`` variant under ``make stress``, else only ``once`` (one of them)."""
    if once not in every:
        raise ValueError(f"{once!r} is not one of the variants {list(every)!r}")
    return list(every) if STRESS else [once]
