"""examples/tabular.py end to end, as a user runs it: a LocalCluster of 2 worker processes,
a persisted Dask DataFrame handed to 2 ranks as a Table, an MLP reaching its held-out R²."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from examples_util import EXAMPLES, run

pytestmark = [pytest.mark.slow, pytest.mark.dask, pytest.mark.timeout(400)]


def test_tabular_example_reaches_its_held_out_r2(tmp_path: Path) -> None:
    out = tmp_path / "out"
    run([sys.executable, str(EXAMPLES / "tabular.py"), "--quick", "--out", str(out)],
        cwd=tmp_path, timeout=300)
    summary = json.loads((out / "summary.json").read_text())
    ranks = summary["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1] and summary["r2"] >= 0.9, summary
    assert ranks[0]["r2"] == ranks[1]["r2"]  # all-reduced
    # Equal batch counts: 6 epochs of ceil(48,000 / 2 / 256) batches on each rank.
    assert [r["steps"] for r in ranks] == [6 * 94, 6 * 94]
    assert all(r["rows"] == 48_000 for r in ranks)
