"""Ctrl-C in a client waiting for a job (_launch/client/interrupt.py): a real client process
gets a real SIGINT; the job is cancelled, its ranks stopped, the user told once, and the
job page says cancelled."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import psutil
import pytest

from cluster_util import client_fixture
from dashboard_util import dashboard_root, get_json, wait_job
from waits import wait_until

client = client_fixture(2)

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1] / "src"

# The client installs Python's own Ctrl-C handler first, as a user's terminal session has
# it: a process started in the background by a non-interactive shell (`make test &`, a
# CI runner's script) inherits SIGINT ignored, and CPython then installs no
# KeyboardInterrupt handler, so the test's SIGINT would be ignored and nothing tested.
SCRIPT = '''
import signal
import sys
signal.signal(signal.SIGINT, signal.default_int_handler)
from distributed import Client
import dask_ddp
from launch_util import spin_with_pid

with Client(sys.argv[1]) as client:
    print("SUBMITTING", flush=True)
    job = dask_ddp.submit(client, spin_with_pid, sys.argv[2], name=sys.argv[3],
                          progress=False, max_restarts=int(sys.argv[4]))
    print("SUBMITTED", job.id, flush=True)
    job.result()
'''


def _start_client(client: Any, tmp_path: Path, name: str,
                  max_restarts: int = 0) -> subprocess.Popen[str]:
    script = tmp_path / "client.py"
    script.write_text(textwrap.dedent(SCRIPT))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), str(HERE.parent)])}
    return subprocess.Popen(
        [sys.executable, str(script), client.scheduler.address, str(tmp_path), name,
         str(max_restarts)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _read_line(proc: subprocess.Popen[str], prefix: str) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline()  # bounded: the process prints it or exits (EOF)
    assert line.startswith(prefix), f"expected {prefix!r}, got {line!r}; stderr: " \
        f"{proc.stderr.read() if proc.stderr and proc.poll() is not None else ''}"
    return line


def _finish(proc: subprocess.Popen[str]) -> str:
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate(timeout=10)
        raise AssertionError(
            f"the client did not end within 60 s of its Ctrl-C:\n{err}") from None
    return err


@pytest.mark.parametrize("max_restarts", [0, 1], ids=["job", "elastic-job"])
def test_ctrl_c_cancels_the_job_and_stops_its_ranks(client: Any, tmp_path: Path,
                                                    max_restarts: int) -> None:
    proc = _start_client(client, tmp_path, "spin", max_restarts)
    try:
        _read_line(proc, "SUBMITTING")
        job_id = _read_line(proc, "SUBMITTED").split()[1]
        pids: list[int] = []

        def ranks_started() -> str | None:
            found = sorted(tmp_path.glob("rank-*.pid"))
            if len(found) < 2:
                return f"{len(found)} of 2 ranks wrote their pid"
            pids[:] = [int(p.read_text()) for p in found]
            return None

        wait_until(ranks_started, 120, "both ranks running")
        proc.send_signal(signal.SIGINT)
        err = _finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert err.count("cancelled (Ctrl-C)") == 1, err
    assert "KeyboardInterrupt: job 'spin' cancelled (Ctrl-C); ranks stopped" in err, err
    assert "threading.py" not in err and "may have died" not in err, err
    assert [p for p in pids if psutil.pid_exists(p)] == []  # gone before the message
    page = wait_job(dashboard_root(client), job_id, "cancelled, its ranks exited",
                    lambda j: j["end"] is not None
                    and all(r["state"] == "exited" for r in j["ranks"]), timeout=30)
    assert page["state"] == "cancelled" and page["root_cause"] is None, page
    assert {r["exit"] for r in page["ranks"]} <= {"stopped: the job was cancelled",
                                                  "exit code 0"}, page["ranks"]


def test_ctrl_c_during_submit_never_leaves_the_job_starting(client: Any,
                                                            tmp_path: Path) -> None:
    proc = _start_client(client, tmp_path, "cut-at-launch")
    try:
        _read_line(proc, "SUBMITTING")
        proc.send_signal(signal.SIGINT)  # lands in submit() or just after it
        err = _finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert "KeyboardInterrupt" in err and "threading.py" not in err, err
    root = dashboard_root(client)

    def not_ended() -> list[str]:
        jobs = get_json(root + "api/jobs")["jobs"]
        return [f"{j['id'][:8]}: {j['state']}" for j in jobs
                if j["name"] == "cut-at-launch" and j["state"] != "cancelled"]

    wait_until(not_ended, 30, "every job of the interrupted client cancelled")
