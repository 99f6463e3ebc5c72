"""What a rank process ended with: the report it leaves its supervisor (internal).

A function's rank process (:mod:`dask_ddp._launch.rank.main`) writes one :class:`RankReport`
into its work directory as it ends (:func:`write_report`): the pickled return value, or
the failing phase, the error and its traceback. Its supervisor reads it back once the
process exited (:func:`read_report`) and turns it into its task's outcome
(:mod:`dask_ddp._launch.worker.outcome`). Both sides import this one type, as they do the
:class:`~dask_ddp._launch.wire.launch_record.LaunchRecord` the supervisor writes first.

The file is written whole or not at all (a temporary file, renamed), and the reader takes
anything else as no report: a rank killed while it wrote, or a file that is not a report,
ends as a rank that left none (its exit code, its signal, its last stderr lines). A report
written by an older dask-ddp, without a field added since, reads with that field's default.
A rank's error carries the rank's own verdict on it (:attr:`RankReport.peer_lost`, decided
from the exception itself by :func:`~dask_ddp._launch.wire.peer_loss.is_peer_error`): its
supervisor reads the verdict, not the error's text. A leaf module, as the launch record's
(it imports only the leaf :mod:`~dask_ddp._launch.wire.peer_loss`): the rank imports it before
it runs anything.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import os
import pickle
import traceback

from dask_ddp._launch.wire.peer_loss import LiveRecoveryError, chain, is_peer_error

logger = logging.getLogger(__name__)

#: The report's file in the rank's work directory.
REPORT_FILE = "result.pkl"


class RankStatus(enum.Enum):
    """How a rank's function ended."""

    OK = "ok"  # it returned (and every rank's function did: the finish barrier passed)
    ERROR = "error"  # it raised, or its rendezvous or process group setup failed


@dataclasses.dataclass(frozen=True)
class RankReport:
    """How a rank's function ended (see the module).

    Parameters
    ----------
    status
        Whether it returned or raised.
    value
        What it returned, pickled with cloudpickle (``OK``).
    phase
        Where it failed (``ERROR``): ``"load"``, ``"rendezvous"``,
        ``"init_process_group"``, ``"run"`` or ``"teardown"``.
    type_name
        The error's type (``ERROR``), e.g. ``"ValueError"``.
    message
        The error's text (``ERROR``).
    traceback
        The error's formatted traceback (``ERROR``).
    exception
        The error itself, pickled; ``None`` when it could not be pickled and loaded back.
    claimed
        Whether this rank was the first of its job to fail (it claimed the job's first
        failure on the store).
    peer_lost
        Whether the error came from a lost peer (``ERROR``): the rank's verdict on its
        exception, by type (:func:`~dask_ddp._launch.wire.peer_loss.is_peer_error`). ``False``
        in a report written before the field existed.
    regroup_failed
        Whether the error is its live group's verdict that it cannot go on (a
        :class:`~dask_ddp._launch.rank.live.errors.LiveRecoveryError` along the exception's
        causes: too few survivors, no agreement in time): the reason a live job ends,
        which its lost workers are not (the group was there to survive them).
    """

    status: RankStatus
    value: bytes | None = None
    phase: str = ""
    type_name: str = ""
    message: str = ""
    traceback: str = ""
    exception: bytes | None = None
    claimed: bool = False
    peer_lost: bool = False
    regroup_failed: bool = False

    @classmethod
    def returned(cls, value: bytes) -> RankReport:
        """The report of a function that returned ``value`` (pickled)."""
        return cls(RankStatus.OK, value=value)

    @classmethod
    def raised(cls, phase: str, exc: BaseException, claimed: bool) -> RankReport:
        """The report of ``exc``, raised in ``phase`` (the exception being handled), with
        the rank's verdict on whether it came from a lost peer."""
        blob: bytes | None
        try:
            blob = pickle.dumps(exc)
            pickle.loads(blob)  # the supervisor must be able to load it
        except Exception:
            blob = None
        return cls(RankStatus.ERROR, phase=phase, type_name=type(exc).__name__,
                   message=str(exc), traceback="".join(traceback.format_exception(exc)),
                   exception=blob, claimed=claimed, peer_lost=is_peer_error(exc),
                   regroup_failed=any(isinstance(e, LiveRecoveryError) for e in chain(exc)))

    def own_exception(self) -> BaseException | None:
        """The rank's own exception, loaded back; ``None`` when there is none to load."""
        if self.exception is None:
            return None
        try:
            exc = pickle.loads(self.exception)
        except Exception:
            return None
        return exc if isinstance(exc, BaseException) else None


def report_path(workdir: str) -> str:
    """The report's path in the rank's work directory ``workdir``."""
    return os.path.join(workdir, REPORT_FILE)


def write_report(workdir: str, report: RankReport) -> None:
    """Write ``report`` into ``workdir`` (the rank process, as it ends), whole or not at
    all: into a temporary file, then renamed."""
    tmp = report_path(workdir) + ".tmp"
    with open(tmp, "wb") as f:
        pickle.dump(report, f)
    os.replace(tmp, report_path(workdir))


def has_report(workdir: str) -> bool:
    """Whether the rank process in ``workdir`` left a report (it returned or raised)."""
    return os.path.exists(report_path(workdir))


def read_report(workdir: str) -> RankReport | None:
    """The report the rank process left in ``workdir``; ``None`` when it left none, or the
    file cannot be read or is not a :class:`RankReport` (logged): the supervisor then
    judges the rank by its exit."""
    path = report_path(workdir)
    try:
        with open(path, "rb") as f:
            report = pickle.load(f)
    except FileNotFoundError:
        return None
    except Exception as exc:  # truncated, or not a pickle: it is no report
        logger.warning("the rank's report %s cannot be read: %s: %s", path,
                       type(exc).__name__, exc)
        return None
    if not isinstance(report, RankReport):
        logger.warning("the rank's report %s holds a %s, not a RankReport (a supervisor "
                       "and a rank of different dask-ddp versions?)", path,
                       type(report).__name__)
        return None
    return report
