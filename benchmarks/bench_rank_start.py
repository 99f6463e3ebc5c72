"""Rank start-up: what a rank process imports before the user's function runs.

A rank is ``python -m dask_ddp._launch.rank.main WORKDIR``: it imports its own module, then
``torch.distributed`` and cloudpickle, unpickles the user's function (whose globals name
``dask_ddp``) and calls it; a training function then reads ``dask_ddp.rank_info()`` and
calls ``dask_ddp.report()``. This benchmark runs exactly those imports in a fresh process
under ``python -X importtime``, for this checkout and for another source tree given with
``--baseline-src`` (e.g. a checkout of an older commit, with its ``_core`` module built),
alternating the two, and prints per tree the medians of: the wall time of the process, the
import time of each top-level import of the program with all it pulled in (``dask_ddp``:
everything importing the package and its rank module cost beyond torch and cloudpickle),
and whether the rank imported ``distributed`` or ``tornado`` at all.

Usage::

    PYTHONPATH=src .venv/bin/python benchmarks/bench_rank_start.py \
        --baseline-src /tmp/old/src --runs 7
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import statistics
import subprocess
import sys
import time

import benchenv  # first: the environment before dask is imported

logger = logging.getLogger("bench_rank_start")

# The rank's imports up to the user's function, then what a training function touches.
# torch and cloudpickle come first, so that what dask_ddp adds is counted as dask_ddp's.
RANK_PROGRAM = """
import importlib, sys
import torch.distributed
import cloudpickle
importlib.import_module(sys.argv[1])
import dask_ddp
dask_ddp.rank_info
dask_ddp.report
"""

LINE = re.compile(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)")


def rank_module(src: str) -> str:
    """The rank's module in the tree at ``src`` (it moved into ``_launch/``)."""
    if os.path.exists(os.path.join(src, "dask_ddp", "_launch", "rank.py")):
        return "dask_ddp._launch.rank.main"
    return "dask_ddp._rank"


def one_run(src: str) -> dict[str, float]:
    """Wall seconds of one rank start-up, and the cumulative import ms of each watched root."""
    env = benchenv.clean_env(PYTHONPATH=src)
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", RANK_PROGRAM,
                          rank_module(src)], env=env, capture_output=True, text=True,
                         timeout=120, check=True)
    wall = time.perf_counter() - t0
    figures: dict[str, float] = {"wall_s": wall}
    for line in out.stderr.splitlines():
        m = LINE.match(line)
        if m is None:
            continue
        cumulative_us, top_level, name = int(m.group(2)), len(m.group(3)) == 1, m.group(4)
        root = name.split(".")[0]
        if top_level:  # what each import of the program cost, with all it imported
            key = f"{root}_ms"
            figures[key] = figures.get(key, 0.0) + cumulative_us / 1000
        if name in ("distributed", "tornado"):
            figures[f"loads_{name}"] = 1.0
    return figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline-src", required=True, help="the other tree's src/ folder")
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    trees = {"this checkout": here, "baseline": os.path.abspath(args.baseline_src)}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for src in trees.values():  # warm the page cache once each
        one_run(src)
    for _ in range(args.runs):
        for name, src in trees.items():
            runs[name].append(one_run(src))
    logger.info("rank start-up imports, %d runs each, median; %s", args.runs,
                benchenv.load_average())
    for name, results in runs.items():
        keys = ["wall_s", "torch_ms", "dask_ddp_ms"]
        cells = ", ".join(
            f"{k[:-3] if k.endswith('_ms') else k[:-2]} "
            f"{statistics.median(r.get(k, 0.0) for r in results):.{3 if k.endswith('_s') else 0}f}"
            f"{' s' if k.endswith('_s') else ' ms'}" for k in keys)
        loaded = [k[6:] for k in ("loads_distributed", "loads_tornado")
                  if any(k in r for r in results)]
        logger.info("%s: %s", name, cells)
        logger.info("  the rank imports %s",
                    " and ".join(loaded) or "neither distributed nor tornado")
    ratio = (statistics.median(r["wall_s"] for r in runs["this checkout"])
             / statistics.median(r["wall_s"] for r in runs["baseline"]))
    logger.info("wall time, this checkout / baseline: %.2f", ratio)


if __name__ == "__main__":
    main()
