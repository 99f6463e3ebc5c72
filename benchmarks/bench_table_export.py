"""Tables: where one partition's first read goes, in one process, step by step.

A rank's first (or uncached) epoch moves each partition from the Dask worker holding it
into the host's memory file: the rank makes the file (space reserved), the worker packs
the partition's columns into records written through a mapping of it, and every local
rank maps it. This measures each step's user and system CPU on one partition of
bench_tables.py's shape (ROWS x COLS float32 + an int64 label), against the pack alone
into memory already in place, the floor of the records' own work. Medians of --repeat
interleaved repetitions.

Run:  python benchmarks/bench_table_export.py [--rows 125000] [--cols 32] [--repeat 25]
"""

from __future__ import annotations

import argparse
import logging
import os
import resource
import secrets
import statistics
from collections.abc import Callable

import benchenv  # noqa: F401 - first: the clean environment, before distributed is imported
import numpy as np
import pandas as pd

logger = logging.getLogger("bench_table_export")


def usage_ms(fn: Callable[[], object]) -> tuple[float, float]:
    """User and system CPU milliseconds of ``fn()`` in this process."""
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    fn()
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    return (r1.ru_utime - r0.ru_utime) * 1e3, (r1.ru_stime - r0.ru_stime) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=125_000, help="rows of the partition")
    ap.add_argument("--cols", type=int, default=32, help="float32 columns (plus an int64)")
    ap.add_argument("--repeat", type=int, default=25)
    ap.add_argument("--dir", default="/dev/shm", help="the memory file system")
    a = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    from dask_ddp import _core
    from dask_ddp.data.table import fetch
    from dask_ddp.data.table.columns import Column, record_layout

    n = a.rows
    rng = np.random.default_rng(0)
    df = pd.DataFrame({f"f{i}": rng.random(n, dtype=np.float32) for i in range(a.cols)})
    df["y"] = np.arange(n, dtype=np.int64)
    cols = [Column(f"f{i}", "<f4") for i in range(a.cols)] + [Column("y", "<i8")]
    rec = record_layout(cols)[1]
    out = np.zeros((n, rec), np.uint8)  # its pages in place
    steps = ["pack into memory already in place", "make the file (space reserved)",
             "export into it (mapped, packed)", "map it in a rank"]
    spent: dict[str, list[tuple[float, float]]] = {s: [] for s in steps}
    logger.info("start: load average %s", " ".join(open("/proc/loadavg").read().split()[:3]))
    for _ in range(a.repeat):
        spent[steps[0]].append(usage_ms(lambda: fetch._fill(out, df, (0, n), cols, 0)))
        tmp = os.path.join(a.dir, f"bench-table-export-{secrets.token_hex(4)}")
        final, token = tmp + ".records", secrets.token_bytes(16)
        target = {"path": tmp, "token": token, "size": fetch._file_size(cols, n)}
        try:
            spent[steps[1]].append(usage_ms(
                lambda: _core.create_records_file(tmp, n, rec, token)))  # noqa: B023
            spent[steps[2]].append(usage_ms(
                lambda: fetch.export_rows(df, (0, n), cols, target, 0)))  # noqa: B023
            _core.commit_records_file(tmp, final, n, rec)
            spent[steps[3]].append(usage_ms(lambda: _core.map_records(final, rec)))  # noqa: B023
        finally:
            for path in (tmp, final):
                if os.path.exists(path):
                    os.unlink(path)
    logger.info("one partition: %d rows x %d B = %.1f MiB", n, rec, n * rec / 2**20)
    for step, values in spent.items():
        user = statistics.median(u for u, _ in values)
        system = statistics.median(s for _, s in values)
        logger.info("  %-36s user %6.2f ms  sys %6.2f ms  (median of %d)", step, user, system,
                    len(values))
    logger.info("end: load average %s", " ".join(open("/proc/loadavg").read().split()[:3]))


if __name__ == "__main__":
    main()
