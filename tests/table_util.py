"""Rank-side functions of the table tests (an importable module, so ranks unpickle them by
reference), and the checks the tests share."""

from __future__ import annotations

from typing import Any

import numpy as np


def read_epochs(table: Any, epochs: int = 2, **loader_kwargs: Any) -> dict[str, Any]:
    """Every batch of ``epochs`` epochs: its ids, size and the row checks, per epoch."""
    import torch

    from dask_ddp.data import Loader

    loader = Loader(table, **loader_kwargs)
    out: dict[str, Any] = {"len": len(table), "columns": table.columns,
                           "num_batches": len(loader), "epochs": []}
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        ids, sizes, dtypes = [], [], {}
        for batch in loader:
            if isinstance(batch, dict):
                dtypes = {k: str(v.dtype) for k, v in batch.items()}
                shapes = {k: tuple(v.shape) for k, v in batch.items()}
                key = "id" if "id" in batch else "x"
                col = batch[key] if key == "id" else batch["x"][:, 0]
                if "a" in batch:  # the row's own values, intact
                    assert torch.equal(batch["a"], (batch["id"] * 0.5).to(torch.float32))
                if "b" in batch:
                    assert torch.equal(batch["b"], batch["id"] % 3 == 0)
                out.setdefault("shapes", shapes)
            else:
                x, y = batch
                dtypes = {"x": str(x.dtype), "y": str(y.dtype)}
                out.setdefault("shapes", {"x": tuple(x.shape), "y": tuple(y.shape)})
                col = y
            ids.extend(int(v) for v in col.reshape(-1).tolist())
            sizes.append(len(col))
        out["epochs"].append({"ids": ids, "sizes": sizes})
        out["dtypes"] = dtypes
    return out


def resume_exactly(table: Any, stop_after: int, edit: dict[str, Any] | None = None,
                   **loader_kwargs: Any) -> dict[str, Any]:
    """Epoch 1 read whole, and read again as stop_after batches + a fresh loader resumed
    from the state_dict (with ``edit`` applied: a key set to None is removed): the ids of
    both."""
    from dask_ddp.data import Loader

    def ids_of(batch: Any) -> list[int]:
        return [int(v) for v in batch["id"].tolist()]

    whole = Loader(table, **loader_kwargs)
    whole.set_epoch(1)
    full = [ids_of(b) for b in whole]
    first = Loader(table, **loader_kwargs)
    first.set_epoch(1)
    head = []
    for i, b in enumerate(first):
        head.append(ids_of(b))
        if i + 1 == stop_after:
            break
    state = {**first.state_dict(), **(edit or {})}
    state = {k: v for k, v in state.items() if v is not None}
    resumed = Loader(table, **loader_kwargs)
    resumed.load_state_dict(state)
    resumed.set_epoch(1)
    tail = [ids_of(b) for b in resumed]
    return {"full": full, "head": head, "tail": tail, "state": state}


def resume_other_world(table: Any, old_world: int, new_world: int, stop_after: int,
                       batch_size: int, cache: bool | None = None) -> dict[str, Any]:
    """In one process: ``old_world`` loaders read ``stop_after`` batches of epoch 0 and save,
    then ``new_world`` loaders resume from rank 0's state; the rows each part read."""
    from dask_ddp.data import Loader

    seen: list[int] = []
    state = None
    for r in range(old_world):
        ld = Loader(table, batch_size=batch_size, shuffle=True, seed=4, rank=r,
                    world_size=old_world, cache=cache)
        for i, b in enumerate(ld):
            seen.extend(int(v) for v in b["id"].tolist())
            if i + 1 == stop_after:
                break
        if r == 0:
            state = ld.state_dict()
    rest: list[list[int]] = []
    for r in range(new_world):
        ld = Loader(table, batch_size=batch_size, shuffle=True, seed=4, rank=r,
                    world_size=new_world, cache=cache)
        ld.load_state_dict(state)  # type: ignore[arg-type]
        rows: list[int] = []
        for b in ld:
            rows.extend(int(v) for v in b["id"].tolist())
        rest.append(rows)
    return {"seen": seen, "rest": rest}


def check_epoch_coverage(results: list[dict[str, Any]], n: int, world: int) -> None:
    """Every row once per epoch across the ranks, at most world - 1 repeats, equal batch
    counts, and a different order each epoch."""
    assert len({r["num_batches"] for r in results}) == 1
    epochs = len(results[0]["epochs"])
    for e in range(epochs):
        per_rank = [r["epochs"][e] for r in results]
        assert len({len(p["sizes"]) for p in per_rank}) == 1, [p["sizes"] for p in per_rank]
        ids = np.concatenate([np.asarray(p["ids"], np.int64) for p in per_rank])
        assert set(ids.tolist()) == set(range(n))
        assert 0 <= len(ids) - n <= world - 1
    if epochs > 1:
        assert results[0]["epochs"][0]["ids"] != results[0]["epochs"][1]["ids"]


def loader_warnings(table: Any, epochs: int = 2, **loader_kwargs: Any) -> list[str]:
    """A rank function: read ``epochs`` passes of ``table``, return the warnings the table
    loader logged meanwhile."""
    import logging

    from dask_ddp.data import Loader

    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    log = logging.getLogger("dask_ddp.data.table.loader")
    handler = Keep(logging.WARNING)
    log.addHandler(handler)
    try:
        loader = Loader(table, 512, **loader_kwargs)
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            for _ in loader:
                pass
        loader.close()
    finally:
        log.removeHandler(handler)
    return seen


def read_host_cached(table: Any, epochs: int = 2, kill_rank: int = -1, marker: str = "",
                     **loader_kwargs: Any) -> dict[str, Any]:
    """Every batch's ids of ``epochs`` epochs with the cache on, the partitions this rank
    read from the source, and its host cache directory's files (``name: bytes``). With
    ``kill_rank``: that rank writes its files into ``marker`` after the first epoch and
    kills itself; the others wait to be ended."""
    import json
    import os
    import signal
    import time

    import torch.distributed as dist

    from dask_ddp.data import Loader

    loader = Loader(table, cache=True, **loader_kwargs)
    host = loader._source.reads
    out: dict[str, Any] = {"epochs": []}
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        out["epochs"].append([b["id"].tolist() for b in loader])
        if kill_rank >= 0:
            break
    cache = host.host
    out["dir"] = cache.directory if cache is not None else None
    out["files"] = {f: os.path.getsize(os.path.join(cache.directory, f))
                    for f in sorted(os.listdir(cache.directory))} if cache else {}
    out["fetched"] = host.fetched
    if kill_rank >= 0:
        dist.barrier()  # every rank has read its first epoch
        if dist.get_rank() == kill_rank:
            with open(marker + ".tmp", "w") as f:
                json.dump(out, f)
            os.replace(marker + ".tmp", marker)
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(300)  # ended by the job when its peer dies
    return out


def parquet_table(root: Any, rows: int, row_group_size: int) -> Any:
    """A :class:`~dask_ddp.data.Table` of one Parquet file under ``root``: ``id`` numbers
    the rows, ``a`` is half of it (float32)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dask_ddp.data import Table

    ids = np.arange(rows, dtype=np.int64)
    pq.write_table(pa.table({"id": ids, "a": (ids * 0.5).astype(np.float32)}),
                   f"{root}/t.parquet", row_group_size=row_group_size)
    return Table.from_parquet(f"{root}/t.parquet")


def feeding_threads(rank: int = 0) -> set[Any]:
    """The tables' feeding threads of rank ``rank`` alive now (``TableReader``'s)."""
    import threading

    return {t for t in threading.enumerate() if t.name == f"dask-ddp-table-{rank}"}
