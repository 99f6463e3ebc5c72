"""Tables: a rank's cached epoch with the batches gathered ahead on the engine's thread
against gathered in the training loop's thread (the default for a rank with one core and
no GPU), in the same ranks, interleaved.

Workload: bench_tables.py's (ROWS x COLS float32 + an int64 label, PARTS persisted
partitions on a LocalCluster of 2 workers, 2 ranks, batch 1024, shuffle=True, (x, y)
batches, the host cache). Each rank makes a Loader per pass and mode (ahead, inline,
ahead, inline), runs --epochs epochs, and reports its best cached epoch's process CPU
seconds and wall seconds; the figure is each mode's best over its passes, per rank, and
the ratio inline / ahead of the CPU.

Run:  python benchmarks/bench_table_gather.py [--rows 2000000] [--parts 16] [--epochs 4]
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from typing import Any

import benchenv

logger = logging.getLogger("bench_table_gather")


def rank_passes(table: Any, cols: int, epochs: int) -> dict[str, list[list[float]]]:
    """Per mode, each pass's best cached epoch as [CPU s, wall s] (in a rank)."""
    from bench_tables import _features

    from dask_ddp.data import Loader

    out: dict[str, list[list[float]]] = {"ahead": [], "inline": []}
    for mode in ("ahead", "inline", "ahead", "inline"):
        loader = Loader(table, batch_size=1024, shuffle=True, seed=0, features=_features(cols),
                        label="y")
        loader._source.batches = dataclasses.replace(loader._source.batches,
                                                     gather_ahead=mode == "ahead")
        spent = []
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            wall, cpu = time.perf_counter(), time.process_time()
            for _ in loader:
                pass
            spent.append((time.process_time() - cpu, time.perf_counter() - wall))
        out[mode].append(list(min(spent[1:])))
    return out


def main() -> None:
    from bench_tables import start_logs, workload_arguments

    a = workload_arguments(__doc__, 4).parse_args()
    start_logs(logger)
    import dask
    import dask.dataframe as dd
    from bench_tables import make_part
    from distributed import Client, LocalCluster, wait

    import dask_ddp

    per = a.rows // a.parts
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        ddf = dd.from_delayed([dask.delayed(make_part)(0, i, per, a.cols)
                               for i in range(a.parts)], meta=make_part(0, 0, 0, a.cols),
                              verify_meta=False).persist()
        wait(ddf)
        res = dask_ddp.submit(client, rank_passes, ddf, a.cols, max(2, a.epochs),
                              progress=False).result(timeout=1800)
    figures: dict[str, Any] = {}
    for rank, modes in enumerate(res):
        best = {m: min(v) for m, v in modes.items()}
        for m, (cpu, wall) in best.items():
            logger.info("rank %d %-6s best cached epoch: %.3f CPU s, %.3f s", rank, m, cpu, wall)
        figures[f"rank{rank}_inline_over_ahead_cpu"] = best["inline"][0] / best["ahead"][0]
        figures[f"rank{rank}_inline_over_ahead_wall"] = best["inline"][1] / best["ahead"][1]
    figures["load"] = benchenv.load_average()
    for k, v in figures.items():
        logger.info("%-30s %s", k, f"{v:.3f}" if isinstance(v, float) else v)
    print(json.dumps(figures))  # noqa: T201 - the benchmark's result line


if __name__ == "__main__":
    main()
