"""The rank environment: the worker's less the nanny's own settings, then env=, then torchrun.

Real LocalCluster workers (their nanny lives in this process) and real ``dask worker``
processes started with a chosen environment; not timed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

import pytest
from distributed import Client, LocalCluster

import dask_ddp
from cluster_util import client_fixture, wait_no_rank_processes
from dask_ddp import _identity
from dask_ddp._cluster import cluster_info
from dask_ddp._launch.worker import rank_env as _rankenv

pytestmark = [pytest.mark.dask, pytest.mark.timeout(180)]

NANNY_VARS = ("MALLOC_TRIM_THRESHOLD_", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
              "PYTHONHASHSEED")


def start_environ() -> dict[str, str]:
    """This test process's environment as it started (a LocalCluster's nanny's)."""
    env = _rankenv.start_environ(os.getpid())
    assert env is not None, "/proc/self/environ is unreadable"
    return env


def rank_env_and_threads() -> dict[str, Any]:
    """Rank side: the rank's environment and the Loader's default thread count."""
    from dask_ddp._identity import cores_per_rank, usable_cores

    return {"env": dict(os.environ), "cores_per_rank": cores_per_rank(),
            "usable": usable_cores()}


# -- the rule, on plain mappings ------------------------------------------------------------

DEFAULTS = {"MALLOC_TRIM_THRESHOLD_": "65536", "OMP_NUM_THREADS": "1",
            "PYTHONHASHSEED": "6640"}


def test_nanny_additions_are_dropped_and_the_users_kept() -> None:
    worker = {"PATH": "/bin", "MALLOC_TRIM_THRESHOLD_": "65536", "OMP_NUM_THREADS": "1",
              "PYTHONHASHSEED": "6640"}
    assert _rankenv.nanny_injected(worker, {"PATH": "/bin"}, DEFAULTS) == set(DEFAULTS)
    # Already in the nanny's environment when it started: the user's choice, kept.
    nanny = {"PATH": "/bin", "MALLOC_TRIM_THRESHOLD_": "65536"}
    assert _rankenv.nanny_injected(worker, nanny, DEFAULTS) == {"OMP_NUM_THREADS",
                                                                "PYTHONHASHSEED"}
    # A value other than Dask's (Nanny(env=...), distributed.nanny.environ): kept.
    assert "OMP_NUM_THREADS" not in _rankenv.nanny_injected(
        {**worker, "OMP_NUM_THREADS": "4"}, {}, DEFAULTS)
    # The nanny's environment unreadable: every Dask default value counts as added.
    assert _rankenv.nanny_injected(worker, None, DEFAULTS) == set(DEFAULTS)


def test_rank_environment_order_and_omp_rule() -> None:
    worker = {"PATH": "/bin", "MALLOC_TRIM_THRESHOLD_": "65536", "OMP_NUM_THREADS": "1",
              "RANK": "stale"}
    launcher = {"RANK": "3", "LOCAL_WORLD_SIZE": "2"}
    env = _rankenv.rank_environment(worker, {}, DEFAULTS, {}, launcher, local_world_size=2)
    assert "MALLOC_TRIM_THRESHOLD_" not in env
    assert env["OMP_NUM_THREADS"] == "1"  # torchrun's rule: >1 rank on the host
    assert env["RANK"] == "3" and env["PATH"] == "/bin"
    one = _rankenv.rank_environment(worker, {}, DEFAULTS, {}, launcher, local_world_size=1)
    assert "OMP_NUM_THREADS" not in one  # one rank per host: torch uses every core
    # The job's env= wins over the worker's and over the OMP rule; the launcher over all.
    job = {"MALLOC_TRIM_THRESHOLD_": "65536", "OMP_NUM_THREADS": "3", "RANK": "9"}
    env = _rankenv.rank_environment(worker, {}, DEFAULTS, job, launcher, local_world_size=2)
    assert env["MALLOC_TRIM_THRESHOLD_"] == "65536" and env["OMP_NUM_THREADS"] == "3"
    assert env["RANK"] == "3"


def test_a_slurm_started_worker_gives_lightning_2_0_one_job() -> None:
    """Lightning 2.0.x reads SLURM before torchrun's variables: on a worker started by
    SLURM (dask-jobqueue) every rank trained alone (checked by hand with Lightning 2.0.9:
    its connector chose SLURMEnvironment, world size 1, rank 0, for rank 1 of 2; with the
    job named "interactive" it chose TorchElasticEnvironment, world size 2, rank 1)."""
    worker = {"SLURM_NTASKS": "1", "SLURM_JOB_NAME": "dask-worker", "SLURM_PROCID": "0"}
    env = _rankenv.rank_environment(worker, {}, DEFAULTS, {}, {"RANK": "1"}, 1)
    assert env["SLURM_JOB_NAME"] == "interactive"
    assert env["DASK_DDP_SLURM_JOB_NAME"] == "dask-worker" and env["SLURM_NTASKS"] == "1"
    # Not on SLURM, or the job's env= names the job: left as it is.
    assert "SLURM_JOB_NAME" not in _rankenv.rank_environment({}, {}, DEFAULTS, {}, {}, 1)
    mine = _rankenv.rank_environment(worker, {}, DEFAULTS, {"SLURM_JOB_NAME": "x"}, {}, 1)
    assert mine["SLURM_JOB_NAME"] == "x" and "DASK_DDP_SLURM_JOB_NAME" not in mine


def test_cores_per_rank_divides_the_affinity_mask(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(96)), raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert _identity.cores_per_rank() == 12
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "200")
    assert _identity.cores_per_rank() == 1  # never zero threads
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert _identity.cores_per_rank() == 96  # not a launched rank: the whole mask
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {5}, raising=False)
    assert _identity.usable_cores() == 1


def test_loader_default_threads_follow_local_world_size(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    from dask_ddp.data import ImageFolder, Loader
    from dask_ddp.data import transforms as T
    from images import file_putter, write_folder

    write_folder(file_putter(str(tmp_path)), ["a", "b"], per_class=2)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    tf = T.Compose([T.Resize((8, 8)), T.ToTensor()])
    loader = Loader(ImageFolder(str(tmp_path)), batch_size=2, transform=tf)
    try:
        assert loader.num_threads == 4
        assert sum(int(x.shape[0]) for x, _ in loader) == 4
    finally:
        loader.close()
    explicit = Loader(ImageFolder(str(tmp_path)), batch_size=2, transform=tf, num_threads=3)
    try:
        assert explicit.num_threads == 3
    finally:
        explicit.close()


# -- on a LocalCluster: the nanny runs in this process ---------------------------------------

client = client_fixture(2)


def test_local_cluster_rank_lacks_the_nannys_settings(client: Client) -> None:
    # The workers have them (the nanny put them there, and into this process too).
    worker_envs = client.run(lambda: dict(os.environ))
    assert all(e.get("MALLOC_TRIM_THRESHOLD_") == "65536" for e in worker_envs.values())
    start = start_environ()
    out = dask_ddp.submit(client, rank_env_and_threads, n_workers=2).result(timeout=120)
    for o in out:
        env = o["env"]
        for key in NANNY_VARS:
            assert env.get(key) == start.get(key), key
        # Two ranks on this host: OMP_NUM_THREADS=1 as torchrun sets it, unless the user had it.
        assert env["OMP_NUM_THREADS"] == start.get("OMP_NUM_THREADS", "1")
        assert env["LOCAL_WORLD_SIZE"] == "2"
        assert o["cores_per_rank"] == max(1, o["usable"] // 2)


def test_env_argument_puts_them_back(client: Client) -> None:
    job_env = {"MALLOC_TRIM_THRESHOLD_": "65536", "OMP_NUM_THREADS": "2", "DASK_DDP_T": "x"}
    out = dask_ddp.submit(client, rank_env_and_threads, n_workers=2,
                          env=job_env).result(timeout=120)
    for o in out:
        assert {k: o["env"].get(k) for k in job_env} == job_env


def test_one_rank_per_host_leaves_omp_unset(client: Client) -> None:
    out = dask_ddp.submit(client, rank_env_and_threads, n_workers=1).result(timeout=120)
    env = out[0]["env"]
    assert env.get("OMP_NUM_THREADS") == start_environ().get("OMP_NUM_THREADS")
    assert env["LOCAL_WORLD_SIZE"] == "1"
    assert out[0]["cores_per_rank"] == out[0]["usable"]


# -- `dask worker` processes: what their own environment had is kept --------------------------

def _worker_proc(address: str, env: dict[str, str], name: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_worker", address, "--nthreads", "1",
         "--no-dashboard", "--name", name], env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def test_dask_worker_started_with_the_variable_keeps_it() -> None:
    base = start_environ()
    base.pop("MALLOC_TRIM_THRESHOLD_", None)
    base["PYTHONPATH"] = os.pathsep.join(sys.path)
    procs = []
    # A cluster of its own: no workers of its own, the test starts them with its environment.
    with LocalCluster(n_workers=0, processes=True, dashboard_address=":0",
                      scheduler_port=0) as cluster, Client(cluster) as c:
        try:
            procs.append(_worker_proc(cluster.scheduler_address,
                                      {**base, "MALLOC_TRIM_THRESHOLD_": "65536"}, "with"))
            procs.append(_worker_proc(cluster.scheduler_address, base, "without"))
            c.wait_for_workers(2, timeout=90)
            by_name = {w["name"]: addr for addr, w in
                       cluster_info(c)["workers"].items()}
            out = dask_ddp.submit(c, rank_env_and_threads,
                                  workers=[by_name["with"], by_name["without"]]
                                  ).result(timeout=120)
            # Both workers' processes hold Dask's value; only the one whose launcher
            # had it passes it to its rank.
            assert out[0]["env"].get("MALLOC_TRIM_THRESHOLD_") == "65536"
            assert "MALLOC_TRIM_THRESHOLD_" not in out[1]["env"]
            assert all("PYTHONHASHSEED" not in o["env"] for o in out)
            wait_no_rank_processes(cluster.scheduler_address, 20)
        finally:
            for p in procs:
                p.terminate()
            deadline = time.monotonic() + 20
            for p in procs:
                try:
                    p.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


# -- torchrun's whole contract ---------------------------------------------------------------

def test_rank_layout_numbers_hosts_as_torchrun_numbers_nodes() -> None:
    from dask_ddp._launch.client.placement import rank_layout

    workers = ["tcp://10.0.0.2:1", "tcp://10.0.0.3:1", "tcp://10.0.0.2:2"]
    layout = rank_layout(workers, nprocs_per_worker=2)
    assert [x["group_rank"] for x in layout] == [0, 0, 1, 1, 0, 0]
    assert {x["group_world_size"] for x in layout} == {2}
    assert [x["local_rank"] for x in layout] == [0, 1, 0, 1, 2, 3]
    assert [x["local_world_size"] for x in layout] == [4, 4, 2, 2, 4, 4]


def torchelastic_view() -> dict[str, Any]:
    """Rank side: what torch and the frameworks read to tell a torchrun launch."""
    import torch.distributed as dist

    return {"launched": dist.is_torchelastic_launched(), "env": dict(os.environ),
            "device": str(dask_ddp.rank_info().device)}


def test_every_torchrun_variable_is_set(client: Client) -> None:
    job = dask_ddp.submit(client, torchelastic_view, n_workers=2)
    out = job.result(timeout=120)
    for rank, o in enumerate(out):
        env = o["env"]
        assert o["launched"] is True
        assert {k: env[k] for k in ("RANK", "ROLE_RANK", "GROUP_RANK", "GROUP_WORLD_SIZE",
                                    "ROLE_NAME", "ROLE_WORLD_SIZE", "WORLD_SIZE",
                                    "TORCHELASTIC_RESTART_COUNT",
                                    "TORCHELASTIC_MAX_RESTARTS")} == {
            "RANK": str(rank), "ROLE_RANK": str(rank), "GROUP_RANK": "0",
            "GROUP_WORLD_SIZE": "1", "ROLE_NAME": "default", "ROLE_WORLD_SIZE": "2",
            "WORLD_SIZE": "2", "TORCHELASTIC_RESTART_COUNT": "0",
            "TORCHELASTIC_MAX_RESTARTS": "0"}
        assert env["TORCHELASTIC_RUN_ID"] == job.id == env["DASK_DDP_JOB_ID"]
        assert env["TORCHELASTIC_ERROR_FILE"].endswith("error.json")
        assert o["device"] == "cpu"  # rank_info().device without CUDA
    assert len({o["env"]["TORCHELASTIC_ERROR_FILE"] for o in out}) == 2


@pytest.mark.parametrize(("visible", "nprocs"), [("0,1,2,3", 4), ("5,7", 2), ("0,1", 3)])
def test_each_ranks_gpu_is_cuda_0_under_the_rotation(visible: str, nprocs: int) -> None:
    """rank_info().device over the environment the launcher gives each process of a
    worker: its own GPU is the first it sees, and no two processes (while there are
    enough GPUs) share one."""
    gpus = []
    for proc in range(nprocs):
        rotated = _rankenv.rotated_devices(visible, proc, nprocs)
        assert rotated is not None
        env = {"DASK_DDP_JOB_ID": "j", "LOCAL_RANK": str(proc),
               "CUDA_VISIBLE_DEVICES": rotated}
        index = _identity.device_index(env, cuda_devices=len(rotated.split(",")))
        assert index == 0
        gpus.append(rotated.split(",")[index])
    n = len(visible.split(","))
    assert gpus == [visible.split(",")[p % n] for p in range(nprocs)]


def test_device_index_elsewhere() -> None:
    assert _identity.device_index({"DASK_DDP_JOB_ID": "j", "LOCAL_RANK": "3"}, 0) is None
    assert _identity.device_index({"DASK_DDP_JOB_ID": "j", "LOCAL_RANK": "3"}, 1) == 0
    # torchrun: every rank sees every GPU, LOCAL_RANK picks its own
    assert _identity.device_index({"LOCAL_RANK": "3"}, 4) == 3
    assert _identity.device_index({"LOCAL_RANK": "3"}, 2) == 1
    assert _identity.device_index({}, 2) == 0
    assert _identity.device_index({"LOCAL_RANK": "1"}, 0) is None


def test_elastic_job_keeps_one_run_id_and_states_max_restarts(client: Client) -> None:
    job = dask_ddp.submit(client, torchelastic_view, n_workers=2, max_restarts=3)
    out = job.result(timeout=120)
    assert {o["env"]["TORCHELASTIC_MAX_RESTARTS"] for o in out} == {"3"}
    assert {o["env"]["TORCHELASTIC_RUN_ID"] for o in out} == {job.run_id}
    assert job.run_id != out[0]["env"]["DASK_DDP_JOB_ID"]


RECORDED = """
from torch.distributed.elastic.multiprocessing.errors import record

@record
def main():
    raise ValueError("bad learning rate 7.5 in rank-side config")

main()
"""


def test_record_decorated_script_reports_its_traceback(client: Client, tmp_path: Any) -> None:
    script = tmp_path / "recorded.py"
    script.write_text(RECORDED)
    with pytest.raises(dask_ddp.RankFailedError) as info:
        dask_ddp.run_command(client, ["python", str(script)], n_workers=1, timeout=120)
    msg = str(info.value)
    assert "ValueError: bad learning rate 7.5 in rank-side config" in msg
    # Read from the error file (not guessed from stderr): the traceback is the rank's own.
    assert "exited with code" not in msg and "Traceback from rank 0" in msg
    assert "recorded.py" in msg and "line 6" in msg
