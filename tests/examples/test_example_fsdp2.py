"""examples/fsdp2_checkpoint.py end to end, as a user runs it (``--quick --moto``).

A LocalCluster of 2 worker processes trains an FSDP2 model with sharded checkpoints to a
real moto S3 server; rank 1 is SIGKILLed at step 35 of the first attempt, the job restarts
(``max_restarts``) from the newest complete checkpoint (step 30), and a 1-rank job loads
the final checkpoint into a plain model and must evaluate it well (the script's exit code).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from examples_util import EXAMPLES, run

pytestmark = [pytest.mark.slow, pytest.mark.dask, pytest.mark.s3, pytest.mark.timeout(400)]


def test_fsdp2_example_killed_resumed_and_evaluated(tmp_path: Path) -> None:
    out = tmp_path / "fsdp2"
    cmd = [sys.executable, str(EXAMPLES / "fsdp2_checkpoint.py"), "--quick", "--moto",
           "--async-save", "--out", str(out)]
    run(cmd, cwd=tmp_path, timeout=360)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["storage"].startswith("s3://")
    assert summary["restarts"] == [{"attempt": 0, "rank": 1, "kind": "died"}]
    # The second attempt resumed on both ranks from step 30 (saves every 10; killed at
    # 35), or 20 if step 30's async upload had not completed when rank 1 died.
    ranks = summary["ranks"]
    assert [(r["rank"], r["restart"]) for r in ranks] == [(0, 1), (1, 1)]
    assert ranks[0]["resumed_at"] == ranks[1]["resumed_at"] in (20, 30), ranks
    assert summary["checkpoints"] == [50, 60]  # keep=2 pruned the older steps on S3
    ev = summary["eval"]
    assert ev["step"] == 60 and ev["loss"] < 0.5 * ev["untrained"], ev
