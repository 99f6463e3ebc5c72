"""Helpers shared by the tests that run the examples as a user does."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
TORCHRUN = Path(sys.executable).with_name("torchrun")

def run(argv: list[str], cwd: Path, timeout: float = 240.0) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` with this checkout on the path; fail with its output if it fails.

    It runs in a session of its own: on a timeout the whole session (a LocalCluster's
    workers too) is killed, and a finished run must leave none of its processes behind.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"),
                                                    env.get("PYTHONPATH", "")) if p)
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{argv} did not finish in {timeout} s; stderr:\n{err[-4000:]}")
    assert proc.returncode == 0, f"{argv} exited {proc.returncode}; stderr:\n{err[-4000:]}"
    deadline = time.monotonic() + 15
    while (left := session_processes(proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"{argv} left processes behind: {left}"
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def session_processes(sid: int) -> list[str]:
    """Command lines of the live processes in session ``sid``."""
    found = []
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            if os.getsid(p.info["pid"]) == sid and p.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(" ".join(p.info["cmdline"] or []))
        except (ProcessLookupError, PermissionError):
            continue
    return found


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
