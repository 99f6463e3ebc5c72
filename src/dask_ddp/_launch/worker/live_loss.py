"""A live rank's loss, recorded by its supervisor the moment its process is gone (internal).

The survivors of a live job re-form once a lost member is recorded dead on the job's store
(:func:`~dask_ddp._launch.wire.live_store.mark_dead`). A rank whose process died (it left no
report: it neither returned nor raised, :mod:`dask_ddp._launch.wire.rank_report`) is an event
its job's recovery policy answers, once, here: ``REGROUP`` records it at once, from a
thread that waits for the process's exit (:meth:`LossRecorder.watch`), and again as the
supervisor winds the rank up, before its output and records (the survivors wait for this
record, not for them). A rank whose worker dies with its supervisor is recorded by the
scheduler (:mod:`dask_ddp._launch.scheduler.live_stores`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any

from dask_ddp._launch.wire import live_store
from dask_ddp._launch.wire.live_store import mark_dead
from dask_ddp._launch.wire.policy import Action, RecoveryPolicy, RecoveryStatus, ask
from dask_ddp._launch.wire.rank_report import has_report
from dask_ddp.errors import FailureKind

logger = logging.getLogger(__name__)


class LossRecorder:
    """Records rank ``rank`` of a live job as lost on the job's store at ``address``, when
    ``policy`` answers ``REGROUP`` to ``died`` (the rank's death as its supervisor sees
    it: :class:`~dask_ddp._launch.wire.policy.RecoveryStatus` of kind ``DIED``).

    Connects to the store at once (before the rank starts; again when a loss is recorded,
    if that failed), within ``wait`` seconds.
    """

    def __init__(self, address: str, rank: int, job_name: str, wait: float, *,
                 policy: RecoveryPolicy, died: RecoveryStatus) -> None:
        assert died.kind is FailureKind.DIED
        self.address = address
        self.rank = rank
        self.job_name = job_name
        self.wait = wait
        self.policy = policy
        self.died = died
        self._action: Action | None = None
        self._lock = threading.Lock()
        self._store: Any = None
        with contextlib.suppress(Exception):  # connected again when a loss is recorded
            self._store = live_store.connect(address, wait)

    def _answer(self) -> Action:
        """The policy's answer to the rank's death, asked once (the exit's thread and the
        supervisor both come here)."""
        with self._lock:
            if self._action is None:
                try:
                    self._action = ask(self.policy, self.died)
                except Exception as exc:  # a policy that fails: the death is an error
                    logger.error("rank %d of job %r: recovery policy %r failed: %s",
                                 self.rank, self.job_name, self.policy.name, exc)
                    self._action = Action.RAISE
            return self._action

    def record(self, returncode: int, workdir: str) -> bool:
        """If the rank's process (ended with ``returncode``, -1: being ended) died, not
        returned or raised, and its policy lets the job go on without it (``REGROUP``:
        recorded lost, its peers re-form; ``CONTINUE``: nothing recorded): whether so."""
        if returncode == 0 or has_report(workdir):
            return False
        action = self._answer()
        if action is Action.CONTINUE:
            return True
        if action is not Action.REGROUP:
            return False
        try:
            if self._store is None:
                self._store = live_store.connect(self.address, self.wait)
            mark_dead(self._store, self.rank)
        except Exception as exc:  # the survivors wait for the scheduler's notice instead
            logger.warning("rank %d of job %r: recording its loss failed: %s",
                           self.rank, self.job_name, exc)
        return True

    def watch(self, exited: threading.Event, workdir: str) -> None:
        """Record the loss the moment ``exited`` is set (the rank's process is gone)."""
        threading.Thread(target=lambda: exited.wait() and self.record(-1, workdir),
                         name=f"dask-ddp-live-loss-{self.rank}", daemon=True).start()
