"""Benchmark hygiene shared by every benchmark: a clean baseline environment, load average.

Import this module first, before anything imports ``dask`` or ``distributed``: it captures
the environment the benchmark was started with. A ``LocalCluster`` writes its nanny's
``pre-spawn-environ`` (``MALLOC_TRIM_THRESHOLD_``, ``OMP_NUM_THREADS``, ...) into the
client's own ``os.environ``; a baseline (torchrun, Ray, a plain DataLoader process) spawned
from that polluted environment once ran 2x slower and hid the same slowdown in dask-ddp.
So baselines are spawned with :func:`clean_env`, and :func:`log_env_differences` prints
what still differs between a baseline's rank and a dask-ddp rank.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping

if "distributed" in sys.modules or "dask" in sys.modules:
    raise RuntimeError("import benchenv before dask/distributed (it captures the clean "
                       "environment baselines are spawned with)")

# The environment before any LocalCluster of this process could write into it.
CLEAN_ENV: dict[str, str] = dict(os.environ)

def clean_env(**extra: str) -> dict[str, str]:
    """The environment to spawn a baseline with: the benchmark's start-up one, plus ``extra``."""
    return {**CLEAN_ENV, **extra}


def load_average() -> str:
    """``"load average 0.31, 0.52, 0.60"`` (1, 5, 15 minutes), to print with each figure."""
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return "load average unknown"
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f}"


def env_differences(baseline: Mapping[str, str], rank: Mapping[str, str]) -> list[str]:
    """Lines naming each variable that differs between two rank environments.

    The launchers' own variables (torchrun's and ``DASK_DDP_*``, Ray's ``RAY_*``) are left
    out: they differ by design.
    """
    from dask_ddp._launch.worker.rank_env import (
        TORCHRUN_VARIABLES,  # here: baselines need not import it
    )

    def ours(key: str) -> bool:
        return key in TORCHRUN_VARIABLES or key.startswith(("DASK_DDP_", "RAY_"))

    lines = []
    for key in sorted(set(baseline) | set(rank)):
        if ours(key) or baseline.get(key) == rank.get(key):
            continue
        lines.append(f"{key}: baseline={baseline.get(key)!r} rank={rank.get(key)!r}")
    return lines


def log_env_differences(logger: logging.Logger, baseline_name: str,
                        baseline: Mapping[str, str], rank_name: str,
                        rank: Mapping[str, str]) -> None:
    """Log :func:`env_differences` between a baseline's rank and ours (or that there are none)."""
    diff = env_differences(baseline, rank)
    if not diff:
        logger.info("environment: a %s rank and a %s rank differ in nothing but the "
                    "launchers' own variables", baseline_name, rank_name)
        return
    logger.info("environment: a %s rank and a %s rank differ in %d variables (launchers' own "
                "left out):", baseline_name, rank_name, len(diff))
    for line in diff:
        logger.info("  %s", line)


def log_load_around_run(logger: logging.Logger) -> None:
    """Log the load average now and again when the benchmark exits (beside its figures)."""
    import atexit

    logger.warning("start: %s", load_average())
    atexit.register(lambda: logger.warning("end: %s", load_average()))
