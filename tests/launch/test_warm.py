"""Warm rank starts (dask_ddp._launch.worker.warm): real templates forking real rank processes."""

from __future__ import annotations

import datetime
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import cloudpickle
import psutil
import pytest

import cluster_util
from cluster_util import (
    child_then_sleep,
    exit_with,
    rank_facts,
    sleep_only,
    template_processes,
    wait_rank_processes,
)
from dask_ddp._launch.wire.launch_record import LaunchRecord
from dask_ddp._launch.wire.rank_report import RankStatus, read_report
from dask_ddp._launch.worker import warm
from waits import wait_until

SCHEDULER = "tcp://warm-test:1"
# Differ by design between two ranks of one environment: the channel's fd number, the
# rank's parent, its work directory and its store.
PER_START = {"DASK_DDP_CHANNEL_FD", "DASK_DDP_SUPERVISOR_PID", "MASTER_PORT",
             "TORCHELASTIC_ERROR_FILE"}

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")
_WORKDIRS: list[str] = []  # made by this module's tests; removed after each test


def workdir_for_test() -> str:
    """A rank's work directory, removed when the test ends."""
    path = tempfile.mkdtemp(prefix="dask-ddp-warmtest-")
    _WORKDIRS.append(path)
    return path


@pytest.fixture(autouse=True)
def _remove_workdirs() -> Iterator[None]:
    yield
    while _WORKDIRS:
        shutil.rmtree(_WORKDIRS.pop(), ignore_errors=True)


class Rank:
    """One rank process (warm or cold) of a test's job, with its results channel."""

    def __init__(self, proc: subprocess.Popen[bytes], workdir: str, channel: int) -> None:
        self.proc, self.workdir, self.channel = proc, workdir, channel

    def exited(self, timeout: float) -> bool:
        if isinstance(self.proc, warm.WarmProcess):
            return self.proc.wait_exit(timeout)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        return True

    def value(self, timeout: float = 120) -> Any:
        """The function's value, once the rank exited (with its output and channel)."""
        if not self.exited(timeout):
            raise AssertionError(f"rank {self.proc.pid} did not exit within {timeout} s")
        out = self.proc.stdout.read().decode() if self.proc.stdout else ""
        err = self.proc.stderr.read().decode() if self.proc.stderr else ""
        code = self.proc.wait()
        report = read_report(self.workdir)
        assert report is not None, f"no result; exit {code}, stderr:\n{err[-3000:]}"
        assert report.status is RankStatus.OK and report.value is not None, report.traceback
        assert code == 0
        channel = b""
        while chunk := os.read(self.channel, 65536):  # EOF: no other holder of its write end
            channel += chunk
        return {"value": cloudpickle.loads(report.value), "stdout": out, "stderr": err,
                "channel": channel.decode()}

    def close(self) -> None:
        os.close(self.channel)


def rank_env(rank: int, world: int, port: int, fd: int, workdir: str,
             extra: dict[str, str] | None = None) -> dict[str, str]:
    src = os.path.dirname(os.path.dirname(os.path.abspath(warm.__file__)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("DASK_DDP_")}
    env.update(extra or {})
    env.update({
        "PYTHONPATH": os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p),
        "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
        "TORCHELASTIC_ERROR_FILE": os.path.join(workdir, "error.json"),
        "DASK_DDP_CHANNEL_FD": str(fd), "DASK_DDP_SUPERVISOR_PID": str(os.getpid()),
        "DASK_DDP_SCHEDULER": SCHEDULER, "PYTHONUNBUFFERED": "1",
    })
    return env


def start(fn: Callable[..., Any], args: tuple[Any, ...], rank: int, world: int, port: int,
          *, cold: bool = False, extra: dict[str, str] | None = None) -> Rank:
    """Start rank ``rank`` of ``fn(*args)`` warm (or cold, as the supervisor spawns)."""
    workdir = workdir_for_test()
    LaunchRecord(payload=cloudpickle.dumps((fn, args, {})), init_kwargs=cloudpickle.dumps({}),
                 backend="gloo", pass_local_rank=False, sys_path=tuple(sys.path),
                 worker="test", rendezvous_timeout=60).write(workdir)
    r, w = os.pipe()
    env = rank_env(rank, world, port, w, workdir, extra)
    try:
        if cold:
            proc: subprocess.Popen[bytes] | None = subprocess.Popen(
                [sys.executable, "-m", "dask_ddp._launch.rank.main", workdir], env=env,
                pass_fds=(w,), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                start_new_session=True, cwd=os.getcwd())
        else:
            proc = warm.start_rank(env, os.getcwd(), workdir, w, capture_output=True)
    finally:
        os.close(w)
    assert proc is not None, "the rank did not start warm"
    return Rank(proc, workdir, r)


def store(world: int) -> Any:
    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", 0, world, True, datetime.timedelta(seconds=60),
                         wait_for_workers=False)


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.fixture(scope="module")
def templates() -> Iterator[None]:
    """This module's templates are ended (and gone) after its tests."""
    yield
    pids = warm.template_pids()
    warm.stop_all()
    wait_until(lambda: [p for p in pids if not gone(p)], 20, "templates still running")


# -- the key ---------------------------------------------------------------------------------

def test_import_environment_keeps_what_imports_read() -> None:
    env = {"PYTHONPATH": "/x", "OMP_NUM_THREADS": "1", "LD_PRELOAD": "l", "MALLOC_ARENA_MAX": "2",
           "TORCH_LOGS": "+dynamo", "KMP_AFFINITY": "c", "DASK_DDP_SCHEDULER": "tcp://s:1",
           "RANK": "3", "MASTER_PORT": "5", "TORCHELASTIC_RUN_ID": "j", "DASK_DDP_JOB_ID": "j",
           "CUDA_VISIBLE_DEVICES": "1,0", "WANDB_PROJECT": "p",
           "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/tmp/dask-ddp-job1-r0/collectives-rank-"}
    assert warm.import_environment(env) == {
        "DASK_DDP_SCHEDULER": "tcp://s:1", "KMP_AFFINITY": "c", "LD_PRELOAD": "l",
        "MALLOC_ARENA_MAX": "2", "OMP_NUM_THREADS": "1", "PYTHONPATH": "/x",
        "TORCH_LOGS": "+dynamo"}
    # Each job points torch's collectives dump into its own work directory: not in the key,
    # or every job would start its ranks cold.
    other = {**env, "RANK": "4", "WANDB_PROJECT": "q", "CUDA_VISIBLE_DEVICES": "0,1",
             "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/tmp/dask-ddp-job2-r0/collectives-rank-"}
    assert warm.template_key(other, "/d") == warm.template_key(env, "/d")
    assert warm.template_key({**env, "OMP_NUM_THREADS": "2"}, "/d") != warm.template_key(env, "/d")
    assert warm.template_key(env, "/e") != warm.template_key(env, "/d")


def test_template_environment_is_the_workers_part() -> None:
    worker = {"HOME": "/h", "TERM": "xterm", "SHELL": "/bin/sh"}
    env = {"HOME": "/h", "TERM": "xterm", "SHELL": "/bin/bash", "RANK": "0", "OMP_NUM_THREADS": "1",
           "DASK_DDP_JOB_ID": "j", "DASK_DDP_SCHEDULER": "s"}
    # The job's own SHELL (differs from the worker's) and the launcher's variables stay out.
    assert warm.template_environment(env, worker) == {
        "HOME": "/h", "TERM": "xterm", "OMP_NUM_THREADS": "1", "DASK_DDP_SCHEDULER": "s"}


def test_config_switch_turns_warm_starts_off() -> None:
    import dask

    for value in (False, "false", "0"):
        with dask.config.set({"dask-ddp.launch.warm-start": value}):
            assert not warm.enabled()
            assert warm.start_rank({}, "/", "/nonexistent", 0, capture_output=False) is None
    with dask.config.set({"dask-ddp.launch.warm-start": "maybe"}), \
            pytest.raises(ValueError, match="warm-start must be true or false"):
        warm.enabled()


# -- real templates and ranks ----------------------------------------------------------------

@linux_only
@pytest.mark.slow
def test_two_warm_ranks_all_reduce(templates: None) -> None:
    s = store(2)
    ranks = [start(cluster_util.all_reduce_rank, (0.5,), r, 2, s.port) for r in range(2)]
    values = [r.value()["value"] for r in ranks]
    assert [v["sum"] for v in values] == [2.0, 2.0]
    assert [v["rank"] for v in values] == [0, 1]
    assert values[0]["backend"] == "gloo"
    assert all(gone(v["pid"]) for v in values), "a rank was not reaped after wait()"
    for r in ranks:
        r.close()


@linux_only
@pytest.mark.slow
def test_environment_equals_a_cold_rank(templates: None) -> None:
    """Key by key, what the function sees in a warm rank is what it sees in a cold one."""
    seen = {}
    for mode in ("cold", "warm"):
        s = store(1)
        rank = start(rank_facts, (mode,), 0, 1, s.port, cold=mode == "cold")
        seen[mode] = rank.value()
        rank.close()
        facts = seen[mode]["value"]
        # Its own session and process group; the parent it is told of is its parent.
        assert facts["sid"] == facts["pgid"] == facts["pid"]
        assert facts["env"]["DASK_DDP_SUPERVISOR_PID"] == str(facts["ppid"])
        # The channel is at the number its environment names, and nobody else holds it.
        assert seen[mode]["channel"] == mode
        assert seen[mode]["stdout"] == f"out {mode}\n"
        assert seen[mode]["stderr"] == f"err {mode}\n"
    cold, hot = seen["cold"]["value"], seen["warm"]["value"]
    assert hot["ppid"] in warm.template_pids()
    for key in sorted(set(cold["env"]) | set(hot["env"])):
        if key not in PER_START:
            assert hot["env"].get(key) == cold["env"].get(key), key
    # The same open files (numbers aside): the template passes on nothing of its own.
    def kinds(fds: list[str]) -> list[str]:
        return sorted(os.path.basename(fd.split(":", 1)[1]) for fd in fds)

    assert kinds(hot["fds"]) == kinds(cold["fds"]), (hot["fds"], cold["fds"])
    for fact in ("cwd", "path0", "threads", "hashseed"):
        assert hot[fact] == cold[fact], fact
    assert hot["argv"][0] == cold["argv"][0]  # the rank module's file


@linux_only
@pytest.mark.slow
def test_exit_codes_signals_and_reaping(templates: None) -> None:
    s = store(1)
    rank = start(exit_with, (3,), 0, 1, s.port)
    proc = rank.proc
    assert isinstance(proc, warm.WarmProcess)
    assert proc.wait_exit(60)
    # Exited, not reaped: its pid (its group's id) stays taken until the supervisor says.
    assert proc.returncode is None
    assert psutil.Process(proc.pid).status() == psutil.STATUS_ZOMBIE
    assert proc.wait() == 3 and proc.returncode == 3
    wait_until(lambda: not gone(proc.pid), 10, "the rank is still not reaped")
    rank.close()

    s = store(1)
    rank = start(sleep_only, (600.0,), 0, 1, s.port)
    proc = rank.proc
    assert isinstance(proc, warm.WarmProcess)
    assert not proc.wait_exit(0.5)
    assert proc.poll() is None

    def looks_cold() -> str | None:
        # As ps and psutil see a cold rank: its command line and its environment.
        p = psutil.Process(proc.pid)
        seen = (p.name(), p.cmdline()[1:3], p.environ().get("RANK"),
                p.environ().get("DASK_DDP_SCHEDULER"))
        wanted = ("ddp-rank-0", ["-m", "dask_ddp._launch.rank.main"], "0", SCHEDULER)
        return None if seen == wanted else f"{seen} != {wanted}"

    wait_until(looks_cold, 30, "the warm rank does not read as a rank")
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait_exit(30)
    assert proc.wait() == -signal.SIGTERM
    rank.close()


@linux_only
@pytest.mark.slow
def test_killpg_reaches_the_ranks_children(templates: None, tmp_path: Any) -> None:
    s = store(1)
    pidfile = str(tmp_path / "child.pid")
    rank = start(child_then_sleep, (pidfile,), 0, 1, s.port)
    wait_until(lambda: not os.path.exists(pidfile), 60, "the rank's child never started")
    with open(pidfile) as f:
        child = int(f.read())
    assert os.getpgid(child) == rank.proc.pid
    os.killpg(rank.proc.pid, signal.SIGKILL)
    assert isinstance(rank.proc, warm.WarmProcess) and rank.proc.wait_exit(30)
    assert rank.proc.wait() == -signal.SIGKILL
    wait_until(lambda: not gone(child), 15, "the rank's child outlived its group's SIGKILL")
    rank.close()


@linux_only
@pytest.mark.slow
def test_a_differing_import_environment_gets_another_template(templates: None) -> None:
    # From no template: a test before it in this process (in any order) may have left some.
    before = warm.template_pids()
    warm.stop_all()
    wait_until(lambda: [p for p in before if not gone(p)], 20, "templates still running")
    pids = []
    # An import environment this process's own is not (a LocalCluster started earlier in
    # this process sets OMP_NUM_THREADS=1 in it): a malloc setting beside the thread count.
    threads = "1"
    third = {"OMP_NUM_THREADS": threads, "MALLOC_ARENA_MAX": "4"}
    for extra in ({}, {"UNRELATED_TO_IMPORTS": "1"}, third):
        s = store(1)
        rank = start(rank_facts, ("x",), 0, 1, s.port, extra=extra)
        facts = rank.value()["value"]
        rank.close()
        pids.append(facts["ppid"])
        if "OMP_NUM_THREADS" in extra:  # what torch derives from it, as a cold rank's
            assert facts["threads"] == int(threads)
        assert facts["env"].get("UNRELATED_TO_IMPORTS") == extra.get("UNRELATED_TO_IMPORTS")
    assert pids[0] == pids[1] != pids[2]
    assert len(warm.template_pids()) == warm.MAX_TEMPLATES == 2
    # The cache is full: a third import environment starts cold.
    workdir = workdir_for_test()
    env = rank_env(0, 1, 1, 0, workdir, {"OMP_NUM_THREADS": "7"})  # a third key
    assert warm.start_rank(env, os.getcwd(), workdir, 0, capture_output=False) is None


@linux_only
@pytest.mark.slow
def parent_pid() -> int:
    return os.getppid()


def test_template_death_kills_its_ranks_then_a_new_template_serves(
        templates: None, caplog: pytest.LogCaptureFixture) -> None:
    """A template killed (the OOM killer takes templates and ranks before their worker):
    its ranks die with it, and the next rank is forked by a new template, not started
    cold for the rest of the worker's life."""
    # From no template: a test before it may have filled the cache with other keys.
    before = warm.template_pids()
    warm.stop_all()
    wait_until(lambda: [p for p in before if not gone(p)], 20, "templates still running")
    s = store(1)
    rank = start(sleep_only, (600.0,), 0, 1, s.port)
    template = psutil.Process(rank.proc.pid).ppid()
    assert template in warm.template_pids()
    os.kill(template, signal.SIGKILL)
    assert isinstance(rank.proc, warm.WarmProcess) and rank.proc.wait_exit(30)
    assert rank.proc.wait(30) == -signal.SIGKILL
    wait_until(lambda: not gone(rank.proc.pid), 15, "the rank outlived its template")
    rank.close()
    with caplog.at_level(logging.WARNING, logger="dask_ddp._launch.worker.warm"):
        s = store(1)  # held: its server ends with the object
        again = start(parent_pid, (), 0, 1, s.port)  # raises if it started cold
        try:
            new = again.value()["value"]
        finally:
            again.close()
    assert new != template and warm.template_pids() == [new]
    said = [m for m in caplog.messages if f"warm template {template} " in m]
    assert len(said) == 1 and "exit code -9" in said[0], caplog.messages


FAKE_WORKER = """
import datetime, os, sys, tempfile, time
import cloudpickle, torch.distributed as dist
sys.path[:0] = sys.argv[1:]
import test_warm
s = test_warm.store(1)
rank = test_warm.start(test_warm.sleep_only, (600.0,), 0, 1, s.port)
print(test_warm.warm.template_pids()[0], rank.proc.pid, rank.workdir, flush=True)
time.sleep(600)
"""


@linux_only
@pytest.mark.slow
def test_template_and_ranks_die_with_their_worker() -> None:
    """A worker killed with SIGKILL leaves neither its template nor its ranks behind."""
    here = os.path.dirname(os.path.abspath(__file__))
    worker = subprocess.Popen(
        [sys.executable, "-c", FAKE_WORKER, here, os.path.dirname(here)],
        stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (os.path.dirname(os.path.dirname(warm.__file__)),
                        os.environ.get("PYTHONPATH")) if p)})
    try:
        assert worker.stdout is not None
        line = worker.stdout.readline().decode()
        assert line, f"the worker ended (code {worker.poll()}) before starting its rank"
        template_, rank_, workdir = line.split()
        _WORKDIRS.append(workdir)  # the worker, killed, cannot remove it
        template, rank = int(template_), int(rank_)
        assert psutil.Process(rank).ppid() == template
        worker.kill()
        took = wait_until(lambda: [p for p in (template, rank) if not gone(p)], 15,
                          "the template or its rank outlived the worker")
        logging.getLogger(__name__).info("gone %.2f s after the worker", took)
    finally:
        worker.kill()
        worker.wait()


@pytest.mark.dask
@pytest.mark.slow
@linux_only
def test_killed_worker_leaves_no_template(lease: Any) -> None:
    """On a real cluster: a rank starts warm, and a worker killed with SIGKILL takes its
    template and its ranks along."""
    import dask_ddp

    with lease(1, fresh=True) as client:  # fresh: its only template is this job's
        addr = client.scheduler.address
        job = dask_ddp.submit(client, sleep_only, 600.0, n_workers=1, progress=False)
        wait_rank_processes(addr, 1)
        templates_ = template_processes(addr)
        assert len(templates_) == 1, "the rank did not start warm"
        ranks = cluster_util.rank_processes(addr)
        assert [p.ppid() for p in ranks] == [templates_[0].pid]
        worker_pid = templates_[0].ppid()
        os.kill(worker_pid, signal.SIGKILL)
        wait_until(lambda: [p.pid for p in (*templates_, *ranks) if not gone(p.pid)], 15,
                   "the template or its rank outlived the killed worker")
        job.cancel()
        time.sleep(0.1)


@pytest.mark.dask
@pytest.mark.slow
@linux_only
def test_a_later_job_forks_from_the_template_an_earlier_one_started(lease: Any) -> None:
    """On a real cluster: each job's ranks get their own work directory (and torch's
    collectives dump in it), yet the next job's rank forks from the same template."""
    import dask_ddp

    with lease(1, fresh=True) as client:  # fresh: its only template is these jobs'
        parents = [dask_ddp.submit(client, os.getppid, n_workers=1, progress=False).result()[0]
                   for _ in range(3)]
        templates_ = template_processes(client.scheduler.address)
        assert len(templates_) == 1, templates_
        assert parents == [templates_[0].pid] * 3
