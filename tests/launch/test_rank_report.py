"""The report a rank process leaves its supervisor, and what the supervisor makes of it
(no cluster, but two tests on a LocalCluster): a typed, frozen record written whole or not
at all, and read back as no report when it is truncated or foreign, so a rank killed while
it wrote ends as a killed rank; it carries the rank's own verdict on whether its error
came from a lost peer, which the supervisor reads instead of the error's text."""

from __future__ import annotations

import dataclasses
import os
import pickle
import signal
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
import torch.distributed as dist
from distributed import Client

import dask_ddp
from cluster_util import client_fixture
from dask_ddp._launch.wire.options import LaunchOptions
from dask_ddp._launch.wire.rank_report import (
    REPORT_FILE,
    RankReport,
    RankStatus,
    has_report,
    read_report,
    write_report,
)
from dask_ddp._launch.wire.rank_spec import RankSpec
from dask_ddp._launch.worker.outcome import RankOutcome
from dask_ddp.errors import FailureKind, RankFailedError, RemoteException
from launch_util import store_timeout

pytestmark = [pytest.mark.timeout(120)]


def test_a_returned_value_round_trips_and_the_report_is_frozen(tmp_path: Path) -> None:
    report = RankReport.returned(cloudpickle.dumps({"loss": 0.5}))
    write_report(str(tmp_path), report)
    assert has_report(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == [REPORT_FILE]  # the temporary file was renamed
    read = read_report(str(tmp_path))
    assert read == report and read.status is RankStatus.OK
    assert read.value is not None and cloudpickle.loads(read.value) == {"loss": 0.5}
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.status = RankStatus.ERROR  # type: ignore[misc]


def test_an_error_keeps_its_phase_traceback_and_exception(tmp_path: Path) -> None:
    try:
        raise ValueError("bad shape")
    except ValueError as exc:
        report = RankReport.raised("run", exc, claimed=True)
    write_report(str(tmp_path), report)
    read = read_report(str(tmp_path))
    assert read is not None and read.status is RankStatus.ERROR
    assert (read.phase, read.type_name, read.message, read.claimed) == (
        "run", "ValueError", "bad shape", True)
    assert "raise ValueError" in read.traceback and "bad shape" in read.traceback
    own = read.own_exception()
    assert isinstance(own, ValueError) and str(own) == "bad shape"


class Unloadable(Exception):
    """An exception that pickles but cannot be loaded back (a required argument)."""

    def __init__(self, a: int, b: int) -> None:
        super().__init__(f"{a}+{b}")


def test_an_exception_that_cannot_cross_leaves_its_text() -> None:
    try:
        raise Unloadable(1, 2)
    except Unloadable as exc:
        report = RankReport.raised("run", exc, claimed=False)
    assert report.exception is None and report.own_exception() is None
    assert report.type_name == "Unloadable" and "Unloadable" in report.traceback


def test_no_truncated_or_foreign_file_is_a_report(tmp_path: Path) -> None:
    workdir = str(tmp_path)
    assert read_report(workdir) is None and not has_report(workdir)
    # A rank killed while it wrote: its temporary file is no report.
    (tmp_path / f"{REPORT_FILE}.tmp").write_bytes(b"\x80\x05\x95")
    assert read_report(workdir) is None
    # A whole report cut short, and bytes that are no pickle at all.
    blob = pickle.dumps(RankReport.returned(b"x" * 1000))
    for data in (blob[: len(blob) // 2], b"not a pickle", b""):
        (tmp_path / REPORT_FILE).write_bytes(data)
        assert read_report(workdir) is None
    # The string-keyed dict of an older rank.
    (tmp_path / REPORT_FILE).write_bytes(pickle.dumps({"status": "ok", "value": b"x"}))
    assert read_report(workdir) is None


class FakeRendezvous:
    def aborted(self) -> bool:
        return False

    def abort(self) -> None:
        pass


class FakeWorker:
    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    def log_event(self, topic: str, msg: Any) -> None:
        self.events.append((topic, msg))


class FakeClient:
    def sync(self, *args: Any, **kwargs: Any) -> Any:
        raise OSError("no scheduler")


class FakeRank:
    def oom_reason(self) -> None:
        return None


def outcome() -> tuple[RankOutcome, FakeWorker]:
    """The outcome of rank 0 of a job of one rank, on fakes of its worker, its client (no
    scheduler answers) and its rendezvous."""
    options = LaunchOptions.build(name="report", payload=b"x")
    # A victim's wait for its peer's fault: none comes here (no scheduler answers).
    options = dataclasses.replace(options, waits=dataclasses.replace(options.waits,
                                                                     root_wait=0.0))
    spec = RankSpec(options=options, job_id="0" * 32, run_id="0" * 32, restart=0, rank=0,
                    local_rank=0, local_world_size=1, group_rank=0, group_world_size=1,
                    proc_index=0, workers=("tcp://w:1",), master_addr="127.0.0.1",
                    scheduler="tcp://s:1")
    worker = FakeWorker()
    return RankOutcome(spec, worker, FakeClient(), FakeRendezvous()), worker  # type: ignore[arg-type]


def test_a_rank_killed_while_writing_its_report_ends_as_killed(tmp_path: Path) -> None:
    judge, worker = outcome()
    (tmp_path / REPORT_FILE).write_bytes(pickle.dumps(RankReport.returned(b"x" * 100))[:20])
    with pytest.raises(RankFailedError, match="the rank process was killed by signal "
                       "SIGKILL") as info:
        judge.of_exit(-signal.SIGKILL, str(tmp_path), FakeRank(), ["last line"])  # type: ignore[arg-type]
    assert info.value.kind is FailureKind.DIED and "last line" in str(info.value)
    assert [m["kind"] for _, m in worker.events] == [str(FailureKind.DIED)]


def test_the_outcome_of_a_report(tmp_path: Path) -> None:
    judge, _ = outcome()
    write_report(str(tmp_path), RankReport.returned(cloudpickle.dumps([1, 2])))
    assert judge.of_exit(0, str(tmp_path), FakeRank(), []) == [1, 2]  # type: ignore[arg-type]
    try:
        raise KeyError("missing")
    except KeyError as exc:
        write_report(str(tmp_path), RankReport.raised("run", exc, claimed=True))
    with pytest.raises(RankFailedError, match="KeyError: 'missing'") as info:
        judge.of_exit(1, str(tmp_path), FakeRank(), [])  # type: ignore[arg-type]
    assert info.value.kind is FailureKind.RAISED_FIRST
    assert isinstance(info.value.__cause__, KeyError)
    # An exception that cannot be loaded back: its traceback stands in.
    write_report(str(tmp_path), dataclasses.replace(
        read_report(str(tmp_path)), exception=b"junk"))  # type: ignore[type-var]
    with pytest.raises(RankFailedError) as info:
        judge.of_exit(1, str(tmp_path), FakeRank(), [])  # type: ignore[arg-type]
    assert isinstance(info.value.__cause__, RemoteException)


def raised(exc: BaseException) -> RankReport:
    """The report of ``exc`` as the rank's handler writes it (``exc`` raised and caught)."""
    try:
        raise exc
    except BaseException as caught:
        return RankReport.raised("run", caught, claimed=True)


def test_the_rank_s_verdict_on_a_lost_peer_travels_in_its_report(tmp_path: Path) -> None:
    lost = raised(store_timeout())
    own = raised(RuntimeError("fetching shard 3 timed out"))
    assert lost.peer_lost and not own.peer_lost
    assert not RankReport.returned(b"x").peer_lost
    write_report(str(tmp_path), lost)
    assert read_report(str(tmp_path)) == lost


def test_a_report_written_before_the_verdict_existed_reads_as_no_lost_peer(
        tmp_path: Path) -> None:
    old = raised(dist.DistBackendError("NCCL error"))
    del old.__dict__["peer_lost"]  # the fields an older rank pickled
    (tmp_path / REPORT_FILE).write_bytes(pickle.dumps(old))
    read = read_report(str(tmp_path))
    assert read is not None and read.type_name == "DistBackendError"
    assert read.peer_lost is False


@pytest.mark.parametrize("exc", [
    RuntimeError("fetching shard 3 from the bucket timed out"),
    RuntimeError("NCCL is not available on this build: use backend='gloo'"),
], ids=["timed-out", "nccl"])
def test_a_user_s_words_do_not_make_a_rank_a_victim(tmp_path: Path, exc: Exception) -> None:
    """The supervisor reads the rank's verdict, not the error's text: a user's error that
    says "timed out" or names NCCL is the rank's own fault (it is not published as a
    broken collective, and the other ranks' stacks are not read for it)."""
    judge, worker = outcome()
    write_report(str(tmp_path), raised(exc))
    with pytest.raises(RankFailedError) as info:
        judge.of_exit(1, str(tmp_path), FakeRank(), [])  # type: ignore[arg-type]
    assert info.value.kind is FailureKind.RAISED_FIRST
    assert "stacks" not in str(info.value), str(info.value)
    assert [m["broken"] for _, m in worker.events] == [False]


def test_a_rank_whose_collective_broke_is_a_victim(tmp_path: Path) -> None:
    judge, worker = outcome()
    write_report(str(tmp_path), raised(store_timeout()))
    with pytest.raises(RankFailedError, match="DistStoreError"):
        judge.of_exit(1, str(tmp_path), FakeRank(), [])  # type: ignore[arg-type]
    assert [m["broken"] for _, m in worker.events] == [True]


def test_a_live_group_s_verdict_is_the_job_s_reason_over_its_lost_workers(
        tmp_path: Path) -> None:
    """A survivor's LiveRecoveryError (too few survivors), also raised from another error,
    is its group's verdict: the rank's own error of kind ``regroup``, never replaced by a
    lost worker's record, and the job's root cause among the lost ranks' errors."""
    from dask_ddp._launch.rank.live.errors import LiveRecoveryError
    from dask_ddp._launch.wire.root_cause import lost_error, pick_root

    verdict = LiveRecoveryError("1 of 3 ranks survived (ranks [0, 1] of generation 0 "
                                "lost), fewer than min_workers=2")
    try:
        try:
            raise store_timeout()
        except Exception as broke:
            raise verdict from broke
    except LiveRecoveryError as caught:
        report = RankReport.raised("run", caught, claimed=False)
    assert report.regroup_failed and not raised(KeyError("x")).regroup_failed
    judge, _ = outcome()
    write_report(str(tmp_path), report)
    with pytest.raises(RankFailedError, match="fewer than min_workers=2") as info:
        judge.of_exit(1, str(tmp_path), FakeRank(), [])  # type: ignore[arg-type]
    assert info.value.kind is FailureKind.REGROUP
    lost = [(r, lost_error("job", r, f"tcp://w:{r}")) for r in (0, 1)]
    assert pick_root([*lost, (2, info.value)]) is info.value
    assert pick_root(lost) is lost[0][1]  # without the verdict: the first lost rank


def truncate_report_then_die() -> None:
    """In a rank: leave a report cut short (as a write killed midway would, were it not
    renamed into place), then be killed."""
    workdir = os.path.dirname(os.environ["TORCHELASTIC_ERROR_FILE"])
    blob = pickle.dumps(RankReport.returned(cloudpickle.dumps("never")))
    with open(os.path.join(workdir, REPORT_FILE), "wb") as f:
        f.write(blob[: len(blob) // 2])
    os.kill(os.getpid(), signal.SIGKILL)


client = client_fixture(1)


def test_a_killed_rank_with_a_truncated_report_fails_as_killed(client: Client) -> None:
    job = dask_ddp.submit(client, truncate_report_then_die, n_workers=1, progress=False)
    with pytest.raises(dask_ddp.RankFailedError, match="killed by signal SIGKILL"):
        job.result(timeout=90)


def time_out_by_itself() -> None:
    """In a rank: rank 1 raises a user's error that says it timed out while rank 0 waits
    for it in a collective (until the job's abort stops it)."""
    if dist.get_rank() == 1:
        raise RuntimeError("fetching the shard timed out")
    dist.barrier()


def test_a_user_s_timed_out_error_is_its_own_on_a_cluster(client: Client) -> None:
    """Before, the text "timed out" made rank 1 a victim: its error carried the other
    ranks' stacks read for a wait that ran out, and waited for a better fault."""
    job = dask_ddp.submit(client, time_out_by_itself, n_workers=1, nprocs_per_worker=2,
                          progress=False)
    with pytest.raises(dask_ddp.RankFailedError, match="fetching the shard timed out") as info:
        job.result(timeout=90)
    err = info.value
    assert err.rank == 1 and err.kind is FailureKind.RAISED_FIRST
    assert "stacks of the other ranks" not in str(err), str(err)
    assert "ranks with no process running" not in str(err), str(err)
