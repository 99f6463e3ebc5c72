"""run_command and the ``dask-ddp run`` CLI: torchrun-style scripts over Dask."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from distributed import Client

import dask_ddp
from cluster_util import client_fixture, wait_no_rank_processes

pytestmark = [pytest.mark.dask, pytest.mark.timeout(180)]

SCRIPT = textwrap.dedent("""
    import os, sys
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")  # env://, as under torchrun
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    print(f"sum={t.item():.0f} rank={os.environ['RANK']} local={os.environ['LOCAL_RANK']} "
          f"world={os.environ['WORLD_SIZE']} args={sys.argv[1:]}", flush=True)
    print(f"warning from {dist.get_rank()}", file=sys.stderr, flush=True)
    if "DDP_TEST_VALUE" in os.environ:
        print(f"value={os.environ['DDP_TEST_VALUE']} rank={os.environ['RANK']}", flush=True)
    dist.destroy_process_group()
    if len(sys.argv) > 1 and sys.argv[1] == "fail" and os.environ["RANK"] == "1":
        sys.exit(7)
""")


client = client_fixture(2)


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train_cmd.py"
    path.write_text(SCRIPT)
    return path


def test_run_command_streams_prefixed_output(client: Client, script: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    codes = dask_ddp.run_command(client, ["python", str(script), "a", "b"], timeout=120)
    assert codes == [0, 0]
    out, err = capsys.readouterr()
    for r in (0, 1):
        assert f"[rank {r}] sum=3 rank={r} local={r} world=2 args=['a', 'b']" in out
        assert f"[rank {r}] warning from {r}" in err


def test_run_command_nonzero_exit(client: Client, script: Path) -> None:
    with pytest.raises(dask_ddp.RankFailedError, match="exited with code 7") as info:
        dask_ddp.run_command(client, [str(script), "fail"], timeout=120)
    assert info.value.rank == 1
    wait_no_rank_processes(client.scheduler.address, 10, marker=str(script))


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    src = str(Path(dask_ddp.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "dask_ddp", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=150)


@pytest.mark.slow
def test_cli_local_cluster(script: Path) -> None:
    res = _cli(["run", "--n-workers", "2", "--env", "DDP_TEST_VALUE=a=b c", script.name, "x"],
               cwd=script.parent)
    assert res.returncode == 0, res.stderr
    for r in (0, 1):
        assert f"[rank {r}] sum=3 rank={r} local={r} world=2 args=['x']" in res.stdout
        assert f"[rank {r}] value=a=b c rank={r}" in res.stdout


def test_cli_existing_scheduler_and_failure(client: Client, script: Path) -> None:
    addr = client.scheduler.address
    ok = _cli(["run", "--scheduler", addr, str(script)], cwd=script.parent)
    assert ok.returncode == 0, ok.stderr
    assert "[rank 1] sum=3" in ok.stdout
    bad = _cli(["run", "--scheduler", addr, str(script), "fail"], cwd=script.parent)
    assert bad.returncode == 1
    assert "rank 1" in bad.stderr and "exited with code 7" in bad.stderr


def test_cli_usage() -> None:
    res = _cli(["bogus"], cwd=Path.cwd())
    assert res.returncode == 2 and "unknown command 'bogus'" in res.stderr
    res = _cli(["run", "--env", "NOEQUALS", "x.py"], cwd=Path.cwd())
    assert res.returncode == 2
    assert "--env wants KEY=VALUE" in res.stderr and "'NOEQUALS'" in res.stderr
