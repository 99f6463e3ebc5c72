"""``dask-ddp plot RUN_DIR... -o figure.png``: loss and accuracy against iteration.

One column per run (side by side, as the seed's figures comparing 1, 4 and 10 workers),
one row per (sample, quantity) present: train loss, train accuracy, eval loss, eval
accuracy; one line per worker. A run folder is read for ``metrics.jsonl`` (``report()``
records) and every other ``*.json``/``*.jsonl`` file of JSON lines below it, such as the
seed's ``worker/<rank>.json`` written by ``DaskResultsHandler.process_results``.

Records are read as the seed writes them: ``loss``, ``correct`` (right answers in the
batch), ``count`` (iteration), ``worker``, ``sample`` (``train``/``eval``), and as
``report()`` writes them: ``rank``, ``step``, ``loss``, ``accuracy``. Accuracy is
``accuracy`` when present, else ``correct / size`` (or ``/ batch_size``, ``/ total``) when
one of them is recorded, else the raw ``correct`` count.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

_X_KEYS = ("count", "step", "iteration", "t_count")
_TOTAL_KEYS = ("size", "batch_size", "total")
_EVAL_NAMES = {"eval", "val", "valid", "validation", "test"}


@dataclass
class Series:
    """Points of one worker for one (sample, quantity) of a run."""

    x: list[float] = field(default_factory=list)
    y: list[float] = field(default_factory=list)


@dataclass
class Run:
    """The curves of one run folder: ``curves[(sample, quantity)][worker]``."""

    name: str
    curves: dict[tuple[str, str], dict[Any, Series]] = field(
        default_factory=lambda: defaultdict(dict)
    )
    accuracy_label: str = "accuracy"
    records: int = 0


def _iter_json_lines(path: Path) -> Iterator[dict[str, Any]]:
    text = path.read_text(errors="replace")
    stripped = text.strip()
    if not stripped:
        return
    try:  # a whole-file JSON object (the seed's one-record-per-file layout)
        obj = json.loads(stripped)
        if isinstance(obj, dict):
            yield obj
            return
    except json.JSONDecodeError:
        pass
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            logger.warning("%s:%d: not JSON, skipped", path, n)
            continue
        if isinstance(obj, dict):
            yield obj


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


def load_run(run_dir: Path) -> Run:
    """Read every metric record under ``run_dir`` into curves."""
    run = Run(name=run_dir.name or str(run_dir))
    files = sorted(p for p in run_dir.rglob("*") if p.suffix in (".json", ".jsonl") and p.is_file())
    counters: dict[tuple[Any, str], int] = defaultdict(int)
    raw_correct = False
    for path in files:
        for rec in _iter_json_lines(path):
            worker = rec.get("worker", rec.get("rank", 0))
            sample = str(rec.get("sample", "train")).lower()
            sample = "eval" if sample in _EVAL_NAMES else "train"
            x = next((_number(rec[k]) for k in _X_KEYS if _number(rec.get(k)) is not None), None)
            if x is None:
                x = float(counters[(worker, sample)])
            counters[(worker, sample)] += 1
            loss = _number(rec.get("loss"))
            acc = _number(rec.get("accuracy"))
            if acc is None and _number(rec.get("correct")) is not None:
                total = next((_number(rec[k]) for k in _TOTAL_KEYS if _number(rec.get(k))), None)
                acc = _number(rec["correct"])
                if total:
                    acc = acc / total if acc is not None else None
                else:
                    raw_correct = True
            for quantity, y in (("loss", loss), ("accuracy", acc)):
                if y is None:
                    continue
                series = run.curves[(sample, quantity)].setdefault(worker, Series())
                series.x.append(x)
                series.y.append(y)
            if loss is not None or acc is not None:
                run.records += 1
    if raw_correct:
        run.accuracy_label = "correct per batch"
    for per_worker in run.curves.values():
        for s in per_worker.values():
            order = sorted(range(len(s.x)), key=s.x.__getitem__)
            s.x = [s.x[i] for i in order]
            s.y = [s.y[i] for i in order]
    return run


def plot_runs(runs: list[Run], output: Path, *, dpi: int = 100) -> None:
    """Draw ``runs`` side by side into ``output`` (PNG, PDF, SVG by its suffix)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    order = [("train", "loss"), ("train", "accuracy"), ("eval", "loss"), ("eval", "accuracy")]
    rows = [key for key in order if any(key in r.curves for r in runs)]
    fig, axes = plt.subplots(
        len(rows),
        len(runs),
        figsize=(4.5 * len(runs), 3.0 * len(rows)),
        squeeze=False,
        sharey="row",
    )
    for col, run in enumerate(runs):
        for row, key in enumerate(rows):
            ax = axes[row][col]
            sample, quantity = key
            for worker, s in sorted(run.curves.get(key, {}).items(), key=lambda kv: str(kv[0])):
                ax.plot(s.x, s.y, linewidth=0.8, label=f"worker {worker}")
            label = run.accuracy_label if quantity == "accuracy" else quantity
            ax.set_title(f"{run.name}: {sample} {label}", fontsize=9)
            ax.set_xlabel("iteration")
            if col == 0:
                ax.set_ylabel(label)
            if run.curves.get(key):
                ax.legend(fontsize=7, loc="best")
            ax.grid(True, alpha=0.3)
    fig.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=dpi)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``dask-ddp plot``; returns the exit code."""
    parser = argparse.ArgumentParser(
        prog="dask-ddp plot",
        description="Plot loss and accuracy against iteration, one line per worker, "
        "one column per run folder.",
    )
    parser.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR")
    parser.add_argument("-o", "--output", type=Path, default=Path("figure.png"))
    parser.add_argument("--dpi", type=int, default=100)
    args = parser.parse_args(argv)
    runs = []
    for d in args.run_dirs:
        if not d.is_dir():
            logger.error("dask-ddp plot: %s is not a folder", d)
            return 2
        run = load_run(d)
        if run.records == 0:
            logger.error("dask-ddp plot: no loss/accuracy records under %s", d)
            return 1
        runs.append(run)
    plot_runs(runs, args.output, dpi=args.dpi)
    logger.info("wrote %s", args.output)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
