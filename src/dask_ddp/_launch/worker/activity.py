"""A rank's activity on its job's progress topic, as its supervisor sees it (internal).

The supervisor (:mod:`dask_ddp._launch.worker.supervisor`) looks at its rank every abort poll:
:class:`ActivityReporter` reads what the rank's probe says (:mod:`dask_ddp._launch.rank.probe`)
and records a change of the rank's activity on the job's progress topic
(:func:`~dask_ddp._launch.wire.names.progress_topic`), where the client's stall rule
(:mod:`dask_ddp._launch.client.stall`) and :meth:`Job.rank_states` read it.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from dask_ddp._launch.wire.names import progress_topic
from dask_ddp._launch.wire.rank_spec import RankSpec
from dask_ddp._launch.worker import probe
from dask_ddp._launch.worker.rank_process import RankProcess
from dask_ddp._states import RankActivity

logger = logging.getLogger(__name__)


class ActivityReporter:
    """Records rank ``spec.rank``'s activity changes from ``worker`` (see the module)."""

    def __init__(self, spec: RankSpec, worker: Any) -> None:
        self.spec = spec
        self.worker = worker
        self.blocked_after = spec.options.waits.blocked_after
        # The rank's state last recorded on the progress topic, and since when.
        self._reported: tuple[RankActivity, str] | None = (RankActivity.WORKING, "")
        self._reported_since = 0.0
        # The rank's latest c10d collective last recorded (None: none, or still moving).
        self._reported_c10d: dict[str, Any] | None = None

    def observe(self, rank: RankProcess, state: probe.RankState) -> None:
        """Record on the job's progress topic when the rank's activity changes: blocked in
        a collective (for ``blocked_after``), working again, returned, frozen; and its
        latest c10d collective (:func:`~dask_ddp._launch.rank.probe.latest_c10d`) once that has
        stood still for ``blocked_after`` (a moving count is work: nothing is recorded
        while a rank trains, one record when it stops issuing collectives)."""
        seen = state.read()
        now = time.time()
        if rank.is_stopped():
            current: tuple[RankActivity, str] = (RankActivity.FROZEN, "")
            age = 0.0 if self._reported is None or self._reported[0] is not RankActivity.FROZEN \
                else now - self._reported_since
        elif seen is None:
            return
        else:
            what, name, age = seen
            if what is RankActivity.BLOCKED and age < self.blocked_after:
                # A collective that completes soon is work.
                what, name, age = RankActivity.WORKING, "", 0.0
            current = (what, name)
        c10d = state.read_c10d()
        if c10d is not None and now - float(c10d.get("since", now)) < self.blocked_after:
            c10d = None
        if current == self._reported and c10d == self._reported_c10d:
            return
        if current != self._reported:
            self._reported, self._reported_since = current, now - age
        self._reported_c10d = c10d
        try:
            self.worker.log_event(progress_topic(self.spec.job_id), {
                "rank": self.spec.rank, "worker": self.spec.worker, "state": current[0].value,
                "collective": current[1], "since": self._reported_since, "c10d": c10d})
        except Exception as exc:  # the next change is recorded again
            logger.warning("rank %d of job %r: recording its state failed: %s",
                           self.spec.rank, self.spec.job_name, exc)
