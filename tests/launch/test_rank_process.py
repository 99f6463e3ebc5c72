"""A rank's process through its one entry point: started, watched, killed, its output read
(no cluster)."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from dask_ddp._launch.worker import rank_process
from dask_ddp._launch.worker.rank_process import RankProcess

pytestmark = [pytest.mark.timeout(60)]

CHILD = "import sys, time; print('out'); sys.stderr.write('err\\n'); sys.stdout.flush(); " \
        "time.sleep(60)"


def test_started_watched_killed_and_read(tmp_path: Path) -> None:
    lines: list[tuple[str, str]] = []
    rank = RankProcess.start([sys.executable, "-c", CHILD], dict(os.environ), str(tmp_path),
                             (), True, job_id="j" * 32, job_name="t", rank=3,
                             workdir=str(tmp_path))
    try:
        assert rank in rank_process.running_ranks()
        exited = rank.watch_exit()
        rank.start_pumps(lambda stream, line: lines.append((stream, line)))
        assert not exited.wait(0.5), "the rank ended before it was killed"
        os.kill(rank.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 5
        while not rank.is_stopped():
            assert time.monotonic() < deadline, "a SIGSTOPped rank does not read as stopped"
            time.sleep(0.05)
        os.kill(rank.pid, signal.SIGCONT)
    finally:
        rank.stop(grace=5.0)
    assert exited.wait(10), "the exit watch did not see the rank's end"
    assert rank.returncode == -signal.SIGTERM
    assert rank not in rank_process.running_ranks()
    assert sorted(lines) == [("stderr", "err"), ("stdout", "out")]


def test_start_failure_is_an_oserror(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        rank_process.start_process([str(tmp_path / "missing")], {}, str(tmp_path), (), False)
