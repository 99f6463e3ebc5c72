"""The probe's reader: a rank's activity as :class:`RankActivity` members (no cluster)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dask_ddp._launch import probe
from dask_ddp._states import RankActivity

pytestmark = [pytest.mark.timeout(30)]


def test_reader_names_the_activity_with_the_enum(tmp_path: Path) -> None:
    reader = probe.RankState(str(tmp_path))
    try:
        assert reader.read() is None  # the rank has not written its file yet
        writer = probe._State(str(tmp_path / probe.STATE_FILE))
        seen = reader.read()
        assert seen is not None and seen[:2] == (RankActivity.WORKING, "")
        writer.set(probe.FIRST_COLLECTIVE + probe.COLLECTIVES.index("all_reduce"))
        seen = reader.read()
        assert seen is not None and seen[:2] == (RankActivity.BLOCKED, "all_reduce")
        assert seen[2] >= 0.0
        writer.set(probe.RETURNED)
        seen = reader.read()
        assert seen is not None and seen[0] is RankActivity.RETURNED
        # The progress topic carries the plain value.
        assert seen[0].value == "returned"
    finally:
        reader.close()
