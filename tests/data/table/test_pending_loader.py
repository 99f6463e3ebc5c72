"""A table's Loader made on the client over a Dask collection: its arguments are checked
there at once (a wrong column or batch size fails before any rank starts), and passed to
submit it reads each rank's share in the rank; the collection stays alive with the job
(real LocalCluster, real ranks)."""

from __future__ import annotations

import gc
import pickle
import time
from typing import Any

import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest
import torch

import dask_ddp
from cluster_util import client_fixture
from dask_ddp.data import Loader, TableLoader

pytestmark = [pytest.mark.dask, pytest.mark.timeout(240)]

client = client_fixture(2)

ROWS = 1000


def _frame() -> Any:
    ids = np.arange(ROWS)
    pdf = pd.DataFrame({"a": (ids * 0.5).astype("float32"), "b": np.ones(ROWS, "float32"),
                        "id": ids})
    return dd.from_pandas(pdf, npartitions=8).persist()


@pytest.mark.parametrize("bad, error, text", [
    ({"features": ["a", "nope"]}, KeyError, "no column 'nope'; its columns: ['a', 'b', 'id']"),
    ({"label": "y"}, KeyError, "no column 'y'"),
    ({"batch_size": 0}, ValueError, "batch_size must be >= 1, got 0"),
    ({"shuffle": "yes"}, ValueError, "shuffle must be True, False or 'local'"),
])
def test_a_wrong_argument_fails_on_the_client_at_once(
        client: Any, bad: dict[str, Any], error: type[Exception], text: str) -> None:
    df = _frame()
    t0 = time.monotonic()
    with pytest.raises(error) as info:
        Loader(df, **{"batch_size": 32, **bad})
    assert text in str(info.value)
    assert time.monotonic() - t0 < 30, "the check waited for something"


def read_ids(loader: TableLoader) -> dict[str, Any]:
    """In a rank: the ids this rank's loader reads in one epoch, and its share."""
    ids = [int(i) for _, y in loader for i in y.tolist()]
    return {"ids": ids, "rank": loader.rank, "world": loader.world_size,
            "type": type(loader).__name__, "pending": isinstance(loader, TableLoader)}


def test_a_loader_made_on_the_client_reads_each_ranks_share(client: Any) -> None:
    # Made inline: nothing but the job holds the persisted frame once submit returned.
    job = dask_ddp.submit(client, read_ids,
                          Loader(_frame(), 25, features=["a", "b"], label="id", shuffle=True,
                                 seed=3, drop_last=False), n_workers=2, progress=False)
    gc.collect()
    out = job.result(timeout=180)
    assert [(o["rank"], o["world"]) for o in out] == [(0, 2), (1, 2)]
    assert all(o["pending"] for o in out)
    ids = out[0]["ids"] + out[1]["ids"]
    assert sorted(ids) == list(range(ROWS)), "every row once across the ranks"
    assert ids[:25] != list(range(25)), "the shuffle was taken"


def _counted(drop: Any, calls: list[int]) -> Any:
    def counted() -> None:
        calls.append(1)
        drop()

    return counted


def test_a_pending_loader_answers_as_the_loader_it_builds(client: Any) -> None:
    """What the Loader class defines (``device``, ``channels_last``, ``before_batch``, the
    stage its ``end_reads`` drops) is the opened loader's, on the client and as a rank
    receives it (through the former proxy, the class defaults answered: device None,
    channels_last False, and end_reads skipped the stage's drop)."""
    made = Loader(_frame(), 25, features=["a", "b"], label="id", device="cpu",
                  channels_last=True, shuffle=False)
    assert repr(made).endswith("(opened on first use)") and "_source" not in made.__dict__
    for loader in (made, pickle.loads(pickle.dumps(made))):
        try:
            assert type(loader) is Loader and isinstance(loader, TableLoader)
            assert loader.device == torch.device("cpu")
            assert loader.channels_last is True

            def hook() -> None:
                pass

            loader.before_batch = hook
            assert loader.before_batch is hook
            stage = loader._stage
            assert stage is not None
            drops: list[int] = []
            stage.drop = _counted(stage.drop, drops)  # type: ignore[method-assign]
            loader.set_epoch(0)
            it = iter(loader)
            x, y = next(it)
            assert x.device == torch.device("cpu") and y.tolist() == list(range(25))
            loader.end_reads()
            assert drops == [1], "end_reads() dropped the stage's held batches"
            assert next(it, None) is None
        finally:
            loader.close()
