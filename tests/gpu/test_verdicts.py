"""The GPU check's verdicts (tools/gpu/verdicts.py) on figures made up at each threshold:
met at the goal, missed just past it or when a figure is missing, and "not measured (cpu)"
on a run with --cpu. Runs on the CPU."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

VERDICTS = Path(__file__).resolve().parents[2] / "tools" / "gpu" / "verdicts.py"


@pytest.fixture(scope="module")
def verdicts() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_verdicts", VERDICTS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def figures(ratio: float = 0.95, loader: float = 15_000, predict: float = 7_000,
            share: float = 1.0, received: int = 150) -> dict[str, Any]:
    def row(name: str, median: float, ratio: float | None = None) -> dict[str, Any]:
        return {"name": name, "median": median, "runs": [median], "ratio": ratio}

    bench = {"rows": [row("ours_cuda_t15", loader),
                      row("resnet18_ours_cuda_t15", 9_000, ratio),
                      row("resnet18_report_call", 40.0), row("resnet18_report_share", share)],
             "report_records": {"sent": 150, "received": received}}
    return {"bench_gpu": bench,
            "bench_predict": {"rows": [{"row": "gpu/predict", "rate": predict},
                                       {"row": "gpu/model", "rate": 12_000}]},
            "seconds": 400.0, "steps": {"tests": "ok", "examples": "ok"}}


def test_every_goal_is_met_at_its_threshold(verdicts: ModuleType) -> None:
    lines, missed = verdicts.verdicts("gpu", figures())
    assert missed == 0, lines
    assert len(lines) == len(verdicts.GOALS) and all(x.startswith("- **met**") for x in lines)


@pytest.mark.parametrize(("change", "goal"), [
    ({"ratio": 0.949}, "loader-bound ResNet-18"),
    ({"loader": 14_999}, "the Loader alone"),
    ({"predict": 6_999}, "ResNet-50 bf16 inference"),
    ({"share": 1.01}, "report()"),
    ({"received": 149}, "report()"),  # a record lost: report() did not take its rank path
])
def test_a_figure_past_its_threshold_misses_its_goal_alone(
    verdicts: ModuleType, change: dict[str, float], goal: str
) -> None:
    lines, missed = verdicts.verdicts("gpu", figures(**change))
    assert missed == 1, lines
    [line] = [x for x in lines if x.startswith("- **MISSED**")]
    assert goal in line


def test_a_missing_figure_or_a_failed_step_is_missed_on_a_gpu(verdicts: ModuleType) -> None:
    found = figures()
    found["bench_predict"] = None
    found["steps"]["examples"] = "TIMEOUT (150 s)"
    found["seconds"] = 500.0
    lines, missed = verdicts.verdicts("gpu", found)
    assert missed == 3, lines
    assert any("not measured (bench_predict.json" in x for x in lines)


def test_with_cpu_the_thresholds_are_not_measured(verdicts: ModuleType, tmp_path: Path) -> None:
    (tmp_path / "bench_gpu.json").write_text(json.dumps(figures(ratio=0.1)["bench_gpu"]))
    code = verdicts.main(["--mode", "cpu", "--out", str(tmp_path), "--seconds", "900",
                          "--step", "tests=ok", "--step", "examples=ok"])
    assert code == 0
    lines, _ = verdicts.verdicts("cpu", figures(ratio=0.1))
    assert sum("not measured (cpu)" in x for x in lines) == 5
    assert verdicts.main(["--mode", "cpu", "--out", str(tmp_path),
                          "--step", "tests=FAILED (exit 1)", "--step", "examples=ok"]) == 1
