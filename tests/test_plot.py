"""``dask-ddp plot``: real figures from run folders in the seed's and report()'s layouts."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from dask_ddp.plot import load_run, main


def seed_run(root: Path, workers: int, n: int = 60) -> Path:
    """A run folder as the seed's process_results leaves it: worker/<rank>.json lines."""
    for w in range(workers):
        path = root / "worker" / f"{w}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = []
        for count in range(1, n + 1):
            loss = math.exp(-count * workers / 40) + 0.05 * w
            lines.append(
                {
                    "loss": loss,
                    "learning_rate": 0.01,
                    "correct": min(100, count * workers),
                    "epoch": count // 20,
                    "count": count,
                    "worker": w,
                    "sample": "train",
                }
            )
            if count % 3 == 0:
                lines.append(
                    {
                        "loss": loss * 1.1,
                        "correct": count,
                        "epoch": count // 20,
                        "count": count // 3,
                        "worker": w,
                        "sample": "eval",
                    }
                )
        path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    (root / "checkpoint-100.pkl").write_bytes(b"\x80\x05not json")
    return root


def report_run(root: Path) -> Path:
    root.mkdir(parents=True)
    with open(root / "metrics.jsonl", "w") as f:
        for step in range(50):
            for rank in range(2):
                f.write(
                    json.dumps(
                        {
                            "rank": rank,
                            "step": step,
                            "time": 0.0,
                            "loss": 1 / (step + 1),
                            "accuracy": step / 50,
                        }
                    )
                    + "\n"
                )
    return root


def test_plot_several_runs_side_by_side(tmp_path: Path) -> None:
    runs = [seed_run(tmp_path / f"{k}_workers", k) for k in (1, 4, 10)]
    runs.append(report_run(tmp_path / "reported"))
    out = tmp_path / "fig" / "figure.png"
    assert main([str(r) for r in runs] + ["-o", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    img = np.asarray(Image.open(out).convert("RGB"))
    # 4 runs side by side (450 px each at dpi 100), 4 rows: train/eval x loss/accuracy.
    assert img.shape[1] == 4 * 450 and img.shape[0] == 4 * 300
    coloured = (img.max(axis=2).astype(int) - img.min(axis=2)) > 60
    assert coloured.mean() > 0.005, "no curves drawn"


def test_load_run_reads_seed_records(tmp_path: Path) -> None:
    run = load_run(seed_run(tmp_path / "r", 2, n=30))
    train_loss = run.curves[("train", "loss")]
    assert sorted(train_loss) == [0, 1]
    assert train_loss[1].x == [float(c) for c in range(1, 31)]
    assert len(run.curves[("eval", "accuracy")][0].y) == 10
    assert run.accuracy_label == "correct per batch"
    assert load_run(report_run(tmp_path / "m")).accuracy_label == "accuracy"
    sized = tmp_path / "sized"
    sized.mkdir()
    (sized / "metrics.jsonl").write_text(
        json.dumps({"rank": 0, "step": 1, "loss": 1.0, "correct": 12, "size": 16}) + "\n"
    )
    run = load_run(sized)
    assert run.curves[("train", "accuracy")][0].y == [0.75]
    assert run.accuracy_label == "accuracy"


def test_plot_errors(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "empty").mkdir()
    assert main([str(tmp_path / "empty"), "-o", str(tmp_path / "x.png")]) == 1
    assert main([str(tmp_path / "missing"), "-o", str(tmp_path / "x.png")]) == 2
    assert "no loss/accuracy records" in caplog.text and "is not a folder" in caplog.text
    assert not (tmp_path / "x.png").exists()


def test_dask_ddp_plot_command(tmp_path: Path) -> None:
    import subprocess
    import sys

    run = seed_run(tmp_path / "run", 2)
    out = tmp_path / "cli.png"
    code = "import sys; from dask_ddp.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.run(
        [sys.executable, "-c", code, "plot", str(run), "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert Image.open(out).format == "PNG"
