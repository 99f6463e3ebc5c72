"""The demo (examples/transfer_learning.py) end to end, in its quick form.

A real LocalCluster (the demo's own for the seed's API, a leased one for the Loader's), real
gloo DDP, real image files from scikit-learn's
digits: it must reach a real accuracy and write its results, plots and summary.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


#: The epochs of the demo's quick form (``--quick``).
QUICK_EPOCHS = 4

_DEMO_MARKS = (pytest.mark.slow, pytest.mark.dask, pytest.mark.timeout(600))


# One test per API: ``make test`` deals its longest tests to its processes in turn
# (tests/scheduling.py), so the two demo runs go side by side.
class TestDemoSeedApi:
    pytestmark = list(_DEMO_MARKS)

    def test_demo_quick_reaches_accuracy_and_writes_outputs(self, tmp_path: Path,
                                                            lease: Any) -> None:
        check_demo_quick_reaches_accuracy_and_writes_outputs(tmp_path, "seed", lease)


class TestDemoLoaderApi:
    pytestmark = list(_DEMO_MARKS)

    def test_demo_quick_reaches_accuracy_and_writes_outputs(self, tmp_path: Path,
                                                            lease: Any) -> None:
        check_demo_quick_reaches_accuracy_and_writes_outputs(tmp_path, "loader", lease)


def check_demo_quick_reaches_accuracy_and_writes_outputs(tmp_path: Path, api: str,
                                                         lease: Any) -> None:
    out = tmp_path / "demo"
    # The seed's tutorial at two ranks, on a LocalCluster the demo starts (the README's
    # main job); the Loader variant at one and two (the world sizes compared once: the
    # launch is the same for both APIs), on a running cluster (``--scheduler``, the demo's
    # other way to run): its workers have imported torch already.
    sizes = [2] if api == "seed" else [1, 2]
    if api == "seed":
        run_demo(out, "--api", api, "--world-sizes", "2")
    else:
        with lease(2) as client:
            run_demo(out, "--api", api, "--world-sizes", "1,2",
                     "--scheduler", client.scheduler.address)
    rows = json.loads((out / "summary.json").read_text())
    assert [r["world_size"] for r in rows] == sizes
    for r in rows:
        assert r["eval_accuracy"] >= 0.90, r
    if api == "loader":
        # Twice the ranks, half the iterations per rank for the same epochs.
        assert rows[1]["iterations"] < rows[0]["iterations"]
    png = out / f"{api}.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    if api == "seed":
        # The seed's per-iteration JSON files from both ranks, written by process_results.
        stats = list((out / "seed-ws2" / "worker").glob("*/*.json"))
        assert {p.parent.name for p in stats} == {"0", "1"}
        assert len(stats) >= 2 * rows[0]["iterations"]
    else:
        metrics = (out / "loader-ws2" / "metrics.jsonl").read_text().splitlines()
        assert len(metrics) >= 2 * rows[1]["iterations"]
        assert any((out / "loader-ws2" / "checkpoints").rglob("*"))
        # Run again: a fresh run by default (it trains again: one epoch's iterations, where a
        # resume from the finished run's epoch 4 would train nothing; one epoch is enough to
        # tell them apart), --resume continues from that run's last checkpoint (nothing to
        # train, the same accuracy).
        with lease(1) as client:
            on = ("--scheduler", client.scheduler.address)
            run_demo(out, "--api", api, "--world-sizes", "1", "--epochs", "1", *on)
            again = json.loads((out / "summary.json").read_text())[0]
            assert again["iterations"] * QUICK_EPOCHS == rows[0]["iterations"], (again, rows)
            run_demo(out, "--api", api, "--world-sizes", "1", "--epochs", "1", "--resume", *on)
        resumed = json.loads((out / "summary.json").read_text())[0]
        assert resumed["iterations"] == 0
        assert resumed["eval_accuracy"] == again["eval_accuracy"]


def run_demo(out: Path, *args: str) -> None:
    """Run the demo's quick form into ``out``; fail with its stderr if it fails."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "transfer_learning.py"), "--quick",
         "--out", str(out), *args],
        capture_output=True, text=True, timeout=540,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
