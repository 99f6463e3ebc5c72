"""The console of a user's first runs (cli.py, and a script's exit): ``dask-ddp run``'s own
cluster is quiet unless ``-v``, a rank failure is one error (no "Compute Failed" blocks),
``dask-ddp plot`` without matplotlib names the extra, and a script that succeeded exits
without an alarm."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
ENV = {**os.environ, "PYTHONPATH": str(SRC)}


def _run(args: list[str], cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=cwd, env=ENV, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.dask  # the command starts a LocalCluster (in its own process)
@pytest.mark.parametrize("verbose", [False, True], ids=["quiet", "verbose"])
def test_run_with_its_own_cluster_is_quiet_unless_verbose(tmp_path: Path,
                                                          verbose: bool) -> None:
    (tmp_path / "ok.py").write_text("import os\nprint('hello from', os.environ['RANK'])\n")
    out = _run(["-m", "dask_ddp", "run", "--n-workers", "2", *(["-v"] if verbose else []),
                "ok.py"], tmp_path)
    assert out.returncode == 0, out.stderr
    assert "[rank 0] hello from 0" in out.stdout and "[rank 1] hello from 1" in out.stdout
    dask_info = [line for line in out.stderr.splitlines()
                 if "Register worker" in line or "Scheduler at" in line]
    assert bool(dask_info) is verbose, out.stderr


@pytest.mark.dask  # the command starts a LocalCluster (in its own process)
def test_a_rank_failure_is_one_error_without_compute_failed_blocks(tmp_path: Path) -> None:
    (tmp_path / "bad.py").write_text(
        "import os\nraise ValueError('bad rank ' + os.environ['RANK'])\n")
    out = _run(["-m", "dask_ddp", "run", "--n-workers", "2", "bad.py"], tmp_path)
    assert out.returncode == 1, out.stderr
    assert "Compute Failed" not in out.stderr, out.stderr
    errors = [line for line in out.stderr.splitlines() if line.startswith("dask-ddp: ")]
    assert len(errors) == 1 and "failed: the rank process exited with code 1" in errors[0], \
        out.stderr


def test_plot_without_matplotlib_names_the_extra(tmp_path: Path) -> None:
    code = ("import sys; sys.modules['matplotlib'] = None; from dask_ddp.cli import main; "
            "sys.exit(main(['plot', 'run', '-o', 'x.png']))")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text(
        "".join(f'{{"rank": 0, "step": {i}, "time": {i}.0, "loss": 1.0}}\n' for i in range(3)))
    out = _run(["-c", code], tmp_path, timeout=120)
    assert out.returncode == 1
    assert "pip install 'dask-ddp[plot]'" in out.stderr and "Traceback" not in out.stderr, \
        out.stderr


SCRIPT = '''
from distributed import Client, LocalCluster
import dask_ddp


def train():
    import torch.distributed as dist
    return dist.get_rank()


if __name__ == "__main__":
    cluster = LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0")
    client = Client(cluster)
    job = dask_ddp.submit(client, train, progress=False)
    print("RESULT", job.result(timeout=120), flush=True)
    # exits without closing the cluster, as a quick script does
'''


@pytest.mark.dask  # the script starts a LocalCluster (in its own process)
def test_a_script_that_succeeded_exits_without_an_alarm(tmp_path: Path) -> None:
    (tmp_path / "quick.py").write_text(textwrap.dedent(SCRIPT))
    out = _run(["quick.py"], tmp_path)
    assert out.returncode == 0, out.stderr
    assert "RESULT [0, 1]" in out.stdout
    assert "was lost" not in out.stderr and "lose already computed" not in out.stderr, \
        out.stderr
