"""Results, metrics and checkpoints (PLACEHOLDER: filled by the results issue).

Functions the launcher calls (contract):

- ``start_job_monitor(job, progress: bool) -> monitor`` where ``monitor.stop(timeout)``
  returns once every record of the finished job has been consumed (written to the job's
  ``metrics.jsonl``, progress bar closed).
- ``iter_job_metrics(job) -> Iterator[dict]``: the job's metric records, live.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


class _NullMonitor:
    def stop(self, timeout: float = 30.0) -> None:
        return None


def start_job_monitor(job: Any, progress: bool = True) -> _NullMonitor:
    return _NullMonitor()


def iter_job_metrics(job: Any) -> Iterator[dict[str, Any]]:
    return iter(())
