"""A rank's end as its supervisor task's outcome: its value, or the error naming the job's
root fault (internal).

The supervisor (:mod:`dask_ddp._launch.worker.supervisor`) hands the end of its rank to
:class:`RankOutcome`, which judges it by what the rank left: its report
(:mod:`dask_ddp._launch.wire.rank_report`: it returned or raised), torch's error file of a script
whose main is decorated with ``@record``, or else its exit (the code, the signal, an OOM
kill, its last stderr lines). A failure is published on the job's failure topic, and the
rank's peers are told to stop (the job's abort). A rank that is likely the victim of a
peer's fault (its collective broke: the rank's own verdict in its report,
:attr:`~dask_ddp._launch.wire.rank_report.RankReport.peer_lost`; or it raised after another rank
claimed the job's first failure) waits a moment to learn that fault and raises it instead,
its own error chained (:mod:`dask_ddp._launch.wire.root_cause` picks it from the job's failure
records and its lost workers). No error text of a report is matched: only a rank that left
no report (a command's, or one that died first) is judged by its text
(:func:`~dask_ddp._launch.wire.peer_loss.text_says_peer_lost`).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import time
from collections.abc import Iterable, Mapping
from typing import Any

from dask_ddp._launch.wire.names import failure_topic
from dask_ddp._launch.wire.peer_loss import text_says_peer_lost
from dask_ddp._launch.wire.rank_report import RankStatus, read_report
from dask_ddp._launch.wire.rank_spec import RankSpec
from dask_ddp._launch.wire.root_cause import (
    better_record,
    lost_error,
    read_error_file,
    record_of,
    root_error,
)
from dask_ddp._launch.worker import collective_dump
from dask_ddp._launch.worker.rank_process import ERROR_FILE, RankProcess
from dask_ddp._launch.worker.rendezvous import Rendezvous
from dask_ddp._launch.worker.stacks import peer_stacks_text
from dask_ddp.errors import FailureKind, JobError, RankFailedError, RemoteException


def _waited_for_peers(phase: str, what: str, broken: bool) -> bool:
    """Whether a rank's failure is a wait for its peers that ran out (rendezvous, process
    group setup, a timed-out collective: ``broken``, a collective's error, that says it
    timed out; a user's own error that says so is not one)."""
    text = what.lower()
    return (phase in ("rendezvous", "init_process_group")
            or (broken and ("timed out" in text or "timeout" in text)))


class RankOutcome:
    """What the end of rank ``spec.rank`` means for its supervisor task (see the module).

    Parameters
    ----------
    spec
        The rank's spec.
    worker
        The rank's worker (its failure records go on the job's topic from there).
    client
        The worker's client (the job's failure records and workers are read through it).
    rendezvous
        The job's rendezvous (whether the job was aborted; its abort).
    """

    def __init__(self, spec: RankSpec, worker: Any, client: Any,
                 rendezvous: Rendezvous) -> None:
        self.spec = spec
        self.worker = worker
        self.client = client
        self.rendezvous = rendezvous
        self.waits = spec.options.waits

    def of_exit(self, returncode: int, workdir: str, rank: RankProcess,
                stderr_tail: Iterable[str]) -> Any:
        """The rank's value (its report's, or 0 for a command that exited with 0); raises
        its error, or the job's root fault, when it failed."""
        spec = self.spec
        report = read_report(workdir)
        if (report is not None and report.status is RankStatus.OK
                and report.value is not None and returncode == 0):
            return pickle.loads(report.value)
        if spec.options.command is not None and returncode == 0:
            return 0
        if report is not None and report.status is RankStatus.ERROR:
            # The rank's verdict, by its exception's type (its group's verdict that it
            # cannot go on is no victim's error, whatever broke before it).
            victim = report.peer_lost and not report.regroup_failed
            err = self.failed(report.phase, f"{report.type_name}: {report.message}",
                              report.own_exception(), report.traceback,
                              claimed=report.claimed, broken=victim,
                              regroup=report.regroup_failed)
            if report.regroup_failed:
                # Its live group's verdict that it cannot go on: the job's reason to end,
                # which the workers it lost are not (it names them).
                raise err
        elif (recorded := read_error_file(os.path.join(workdir, ERROR_FILE))) is not None:
            # A script whose main is decorated with torch's @record.
            message, tb = recorded
            victim = text_says_peer_lost(message)
            err = self.failed("run", message, None, tb, broken=victim)
        else:
            oom = rank.oom_reason() if returncode == -signal.SIGKILL else None
            if oom is not None:
                how = f"was {oom}"
            elif returncode < 0:
                how = f"was killed by signal {signal.Signals(-returncode).name}"
            else:
                how = f"exited with code {returncode}"
            tail = "\n".join(stderr_tail)
            detail = f"\nlast stderr lines:\n{tail}" if tail else ""
            # A collective's timeout (NCCL's watchdog) dumped the rank's last collectives.
            detail += collective_dump.dump_summary(workdir, spec.rank)
            victim = returncode > 0 and text_says_peer_lost(tail)
            err = self.failed("run", f"the rank process {how}{detail}", None, tail, died=True,
                              broken=victim)
        # A rank whose collective broke (or that raised after another rank) is likely the
        # victim of a peer's fault: wait a moment to learn it and raise that instead.
        secondary = victim or err.kind is FailureKind.RAISED
        wait = self.waits.root_wait if secondary else 0.0
        if victim and spec.options.stall_timeout is not None:
            # A stall's record is published once the watcher read the ranks' stacks: a
            # collective that broke meanwhile (a peer ended) waits for it that much longer.
            wait += self.waits.stacks_timeout
        raise self.root_or(err, wait, broken=victim)

    def failed(self, phase: str, what: str, cause: BaseException | None, tb: str,
               claimed: bool = False, died: bool = False, broken: bool = False,
               regroup: bool = False) -> RankFailedError:
        """The rank's error, published on the job's failure topic (``broken``: it says the
        rank's collective broke, see :func:`~dask_ddp._launch.wire.root_cause.better_record`;
        ``regroup``: its live group's verdict that it cannot go on)."""
        # A rank that gave up waiting for its peers: what they were doing is the diagnosis
        # (read before the abort below stops them; by the first rank to give up only, so
        # that many ranks timing out together do not all read every rank's stack).
        peers = (peer_stacks_text(self.client, self.spec, self.waits.stacks_timeout)
                 if _waited_for_peers(phase, what, broken) and not self.rendezvous.aborted()
                 else "")
        # Tell the peers first: they stop within one abort poll instead of waiting in a
        # collective until the backend's timeout.
        self.rendezvous.abort()
        spec = self.spec
        where = f" in {phase}" if phase in ("init_process_group", "rendezvous", "start") else ""
        msg = (f"rank {spec.rank} of job {spec.job_name!r} on worker {spec.worker} "
               f"failed{where}: {what}")
        if tb and not died:
            msg += f"\n\nTraceback from rank {spec.rank}:\n{tb.rstrip()}"
        msg += peers
        if cause is None and tb:
            cause = RemoteException(tb)
        kind = (FailureKind.REGROUP if regroup else FailureKind.DIED if died else
                FailureKind.RAISED_FIRST if claimed else FailureKind.RAISED)
        err = RankFailedError(msg, spec.rank, spec.worker, tb, cause, kind)
        self._publish({**record_of(err), "broken": broken})
        return err

    def root_or(self, err: JobError, wait: float, broken: bool = False) -> JobError:
        """The job's root fault, if another rank's fault is more fundamental than ``err``
        (``err`` chained as its ``__cause__``), else ``err``. ``broken``: ``err`` says the
        rank's collective broke.

        A seed-style ``client.gather(futures)`` raises the first failed future in rank
        order: so every future of the job names the root cause. Waits up to ``wait``
        seconds for the fault to be known (a peer's failure record, or its worker gone).
        """
        deadline = time.monotonic() + wait
        while True:
            best = self._better_fault(err.kind, broken)
            if best is not None:
                return root_error(best, err)
            if time.monotonic() >= deadline:
                return err
            time.sleep(0.2)

    def _publish(self, record: Mapping[str, Any]) -> None:
        with contextlib.suppress(Exception):
            self.worker.log_event(failure_topic(self.spec.job_id), dict(record))

    def _better_fault(self, kind: FailureKind, broken: bool) -> Mapping[str, Any] | None:
        records: list[Mapping[str, Any]] = []
        with contextlib.suppress(Exception):
            records = [m for _, m in self.client.sync(
                self.client.scheduler.events, topic=failure_topic(self.spec.job_id),
                callback_timeout=self.waits.scheduler_call)]
        records += self._lost_peers()
        return better_record(records, self.spec.rank, kind, broken)

    def _lost_peers(self) -> list[dict[str, Any]]:
        """Failure records of the ranks whose worker left the cluster (published too)."""
        spec = self.spec
        peers = sorted(set(spec.workers) - {spec.worker})
        if not peers:
            return []
        try:
            present = self.client.sync(self.client.scheduler.ncores, workers=peers,
                                       callback_timeout=self.waits.scheduler_call)
        except Exception:
            return []
        lost = [record_of(lost_error(spec.job_name, r, w)) for r, w in enumerate(spec.workers)
                if w in peers and w not in present]
        for record in lost[:1]:
            self._publish(record)
        return lost
