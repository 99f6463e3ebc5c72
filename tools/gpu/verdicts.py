"""The GPU check's goals and their verdicts (tools/gpu/check.sh), one line per goal.

Reads what the check's steps left (``bench_gpu.json``, ``bench_predict.json``, the status
of its test and example steps, its time) and prints a Markdown list: each goal met,
missed, or, on a run with ``--cpu``, ``not measured (cpu)``. On a GPU a goal whose figure
is missing (its step failed or was cut short) is missed: a check that could not measure
does not pass. Exit status 1 when a goal was missed.

    python tools/gpu/verdicts.py --mode gpu --out OUT --seconds 412 \\
        --step tests=ok --step examples="FAILED (exit 1)"
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The check's whole time on the GPU machine, seconds (its deadline in check.sh is shorter).
CHECK_SECONDS = 480


@dataclass(frozen=True)
class Figure:
    """A measured figure, or why there is none."""

    value: float | None
    shown: str

    @classmethod
    def missing(cls, why: str) -> Figure:
        return cls(None, f"not measured ({why})")


@dataclass(frozen=True)
class Goal:
    """One goal: its name, how its figure is found, and whether the figure meets it."""

    name: str
    target: str
    figure: Callable[[dict[str, Any]], Figure]
    met: Callable[[float], bool]
    measured_on_cpu: bool = False


def _bench_row(found: dict[str, Any], prefix: str) -> dict[str, Any] | None:
    rows = (found.get("bench_gpu") or {}).get("rows", [])
    hits = [r for r in rows if r["name"].startswith(prefix) and r.get("runs")]
    return hits[0] if hits else None


def loader_bound_resnet18(found: dict[str, Any]) -> Figure:
    row = _bench_row(found, "resnet18_ours_cuda")
    if row is None or row.get("ratio") is None:
        return Figure.missing("bench_gpu.json has no resnet18_ours_cuda row with a ratio")
    return Figure(row["ratio"], f"{row['ratio']:.3f} of its rate on a resident batch "
                  f"({row['median']:,.0f} img/s, rounds {_runs(row)})")


def loader_alone(found: dict[str, Any]) -> Figure:
    row = _bench_row(found, "ours_cuda")
    if row is None:
        return Figure.missing("bench_gpu.json has no ours_cuda row")
    return Figure(row["median"], f"{row['median']:,.0f} img/s (rounds {_runs(row)})")


def resnet50_inference(found: dict[str, Any]) -> Figure:
    rows = (found.get("bench_predict") or {}).get("rows", [])
    hits = [r for r in rows if r.get("row") == "gpu/predict"]
    if not hits:
        return Figure.missing("bench_predict.json has no gpu/predict row")
    rate = float(hits[0]["rate"])
    model = [r for r in rows if r.get("row") == "gpu/model"]
    alone = f"; the model alone on a resident batch: {model[0]['rate']:,.0f} img/s" if model \
        else ""
    return Figure(rate, f"predict(precision='bf16'): {rate:,.0f} img/s{alone}")


def report_share(found: dict[str, Any]) -> Figure:
    bench = found.get("bench_gpu") or {}
    row = _bench_row(found, "resnet18_report_share")
    if row is None:
        return Figure.missing("bench_gpu.json has no resnet18_report_share row")
    counts = bench.get("report_records") or {}
    if not counts.get("sent") or counts.get("received") != counts.get("sent"):
        return Figure.missing(f"records sent and read back differ: {counts}; report() did "
                              "not take its rank path")
    call = _bench_row(found, "resnet18_report_call")
    per_call = f", {call['median']:.1f} us a call" if call else ""
    return Figure(row["median"], f"{row['median']:.3f}% of a step{per_call}, "
                  f"{counts['received']} records read back")


def check_time(found: dict[str, Any]) -> Figure:
    s = found.get("seconds")
    return Figure.missing("no time given") if s is None else Figure(float(s), f"{s:.0f} s")


def step_status(name: str) -> Callable[[dict[str, Any]], Figure]:
    def figure(found: dict[str, Any]) -> Figure:
        status = found["steps"].get(name)
        if status is None:
            return Figure.missing(f"no {name} step")
        return Figure(1.0 if status == "ok" else 0.0, status)

    return figure


GOALS = (
    Goal("loader-bound ResNet-18 (Loader(device='cuda') feeding the training)",
         ">= 0.95 of its rate on a resident batch", loader_bound_resnet18, lambda v: v >= 0.95),
    Goal("the Loader alone into CUDA memory", ">= 15,000 img/s", loader_alone,
         lambda v: v >= 15_000),
    Goal("ResNet-50 bf16 inference", ">= 7,000 img/s", resnet50_inference,
         lambda v: v >= 7_000),
    Goal("report() of the loss every step", "<= 1% of a step", report_share,
         lambda v: v <= 1.0),
    Goal("the gpu tests", "all pass", step_status("tests"), lambda v: v == 1.0,
         measured_on_cpu=True),
    Goal("every example with its defaults", "each ends with status 0", step_status("examples"),
         lambda v: v == 1.0, measured_on_cpu=True),
    Goal("the whole check", f"< {CHECK_SECONDS} s", check_time, lambda v: v < CHECK_SECONDS),
)


def _runs(row: dict[str, Any]) -> str:
    return ", ".join(f"{v:,.3g}" for v in row["runs"])


def _load(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def verdicts(mode: str, found: dict[str, Any]) -> tuple[list[str], int]:
    """The Markdown lines, one per goal, and how many goals were missed."""
    lines, missed = [], 0
    for goal in GOALS:
        if mode == "cpu" and not goal.measured_on_cpu:
            lines.append(f"- **not measured (cpu)**: {goal.name} (goal {goal.target})")
            continue
        fig = goal.figure(found)
        ok = fig.value is not None and goal.met(fig.value)
        missed += not ok
        lines.append(f"- **{'met' if ok else 'MISSED'}**: {goal.name}: {fig.shown} "
                     f"(goal {goal.target})")
    return lines, missed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=["gpu", "cpu"], required=True)
    p.add_argument("--out", type=Path, required=True, help="the check's results folder")
    p.add_argument("--seconds", type=float, help="the check's time so far")
    p.add_argument("--step", action="append", default=[], metavar="NAME=STATUS")
    args = p.parse_args(argv)
    found = {"bench_gpu": _load(args.out / "bench_gpu.json"),
             "bench_predict": _load(args.out / "bench_predict.json"),
             "seconds": args.seconds,
             "steps": dict(s.split("=", 1) for s in args.step)}
    lines, missed = verdicts(args.mode, found)
    print("\n".join(lines))  # noqa: T201 - the summary's verdicts
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
