"""Workers in separate network namespaces: MASTER_ADDR must be routable, not 127.0.0.1.

Two namespaces joined by a bridge (10.x.0.0/24), the scheduler on the bridge in the root
namespace, one worker in each namespace. Inside a namespace, 127.0.0.1 is that namespace's
own loopback, so the job only succeeds if the ranks rendezvous on rank 0's worker address.
Needs root and ``ip netns``; skipped, with the reason, elsewhere.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from distributed import Client

import dask_ddp
from cluster_util import all_reduce_rank, wait_no_rank_processes
from dask_ddp._cluster import cluster_info

pytestmark = [pytest.mark.dask, pytest.mark.slow, pytest.mark.timeout(240)]


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def _netns_unavailable() -> str | None:
    if sys.platform != "linux":
        return "network namespaces are Linux only"
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is not installed"
    probe = f"ddpprobe{os.getpid()}"
    res = _ip("netns", "add", probe, check=False)
    if res.returncode != 0:
        return f"ip netns add failed: {res.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


@pytest.fixture
def netns_cluster() -> Iterator[tuple[str, list[str]]]:
    reason = _netns_unavailable()
    if reason:
        pytest.skip(reason)
    tag = f"{os.getpid() % 10000}"
    subnet = f"10.{100 + os.getpid() % 100}.0"
    bridge, spaces = f"ddpbr{tag}", [f"ddpa{tag}", f"ddpb{tag}"]
    procs: list[subprocess.Popen[bytes]] = []
    env = dict(os.environ)
    src = str(Path(dask_ddp.__file__).resolve().parents[1])
    tests = str(Path(__file__).resolve().parents[1])  # tests/: the shared helpers
    env["PYTHONPATH"] = os.pathsep.join([src, tests, env.get("PYTHONPATH", "")])
    try:
        _ip("link", "add", bridge, "type", "bridge")
        _ip("addr", "add", f"{subnet}.1/24", "dev", bridge)
        _ip("link", "set", bridge, "up")
        for i, ns in enumerate(spaces):
            _ip("netns", "add", ns)
            host_end = f"ddpv{tag}{i}"
            _ip("link", "add", host_end, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("link", "set", host_end, "master", bridge, "up")
            _ip("netns", "exec", ns, "ip", "addr", "add", f"{subnet}.{i + 2}/24", "dev", "eth0")
            _ip("netns", "exec", ns, "ip", "link", "set", "eth0", "up")
            _ip("netns", "exec", ns, "ip", "link", "set", "lo", "up")
        port = 20000 + os.getpid() % 20000
        sched_addr = f"tcp://{subnet}.1:{port}"
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", f"{subnet}.1",
             "--port", str(port), "--dashboard-address", ":0"], env=env,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        for i, ns in enumerate(spaces):
            procs.append(subprocess.Popen(
                ["ip", "netns", "exec", ns, sys.executable, "-m",
                 "distributed.cli.dask_worker", sched_addr, "--host", f"{subnet}.{i + 2}",
                 "--nthreads", "1", "--no-dashboard"], env=env,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        yield sched_addr, [f"{subnet}.2", f"{subnet}.3"]
    finally:
        # The workers first, while their scheduler still answers: a worker whose
        # scheduler went first spends its close trying to reach it.
        for group in (procs[1:], procs[:1]):
            for p in group:
                p.terminate()
            for p in group:
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        for ns in spaces:
            _ip("netns", "del", ns, check=False)
        _ip("link", "del", bridge, check=False)


def test_master_addr_is_routable_across_namespaces(
        netns_cluster: tuple[str, list[str]]) -> None:
    sched_addr, hosts = netns_cluster
    with Client(sched_addr, timeout=60) as client:
        client.wait_for_workers(2, timeout=90)
        workers = sorted(cluster_info(client)["workers"])
        assert sorted(h.split("//")[1].rsplit(":", 1)[0] for h in workers) == hosts
        out = dask_ddp.submit(client, all_reduce_rank, 0.5, workers=workers).result(120)
    rank0_host = workers[0].split("//")[1].rsplit(":", 1)[0]
    assert [o["sum"] for o in out] == [2.0, 2.0]
    assert {o["env"]["MASTER_ADDR"] for o in out} == {rank0_host}
    assert rank0_host != "127.0.0.1"
    # The collectives use each namespace's routable interface, not loopback.
    assert {o["env"]["GLOO_SOCKET_IFNAME"] for o in out} == {"eth0"}
    wait_no_rank_processes(sched_addr, 20)
