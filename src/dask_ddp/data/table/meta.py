"""A Dask DataFrame or Array described as a :class:`~dask_ddp.data.Table` (internal).

Everything here is metadata: the collection's meta (dtypes), its chunks or its
partitions' row counts (computed on the cluster, never on the client), the keys of its
persisted partitions and the workers holding them.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from dask_ddp.data.table.columns import Column, TableColumnError, numeric, unsupported

logger = logging.getLogger(__name__)


def describe(data: Any, columns: Sequence[str] | None, client: Any) -> dict[str, Any]:
    """The Table fields of a Dask collection."""
    import cloudpickle
    import dask.array as da
    from distributed import futures_of, get_client, wait

    client = client or get_client()
    counts: list[int] | None = None
    if isinstance(data, da.Array):
        data, cols, counts = _describe_array(data, columns, client)
        kind = "array"
    else:
        import dask.dataframe as dd  # pandas: only for DataFrames

        if isinstance(data, dd.Series):
            data = data.to_frame()
        if not isinstance(data, dd.DataFrame):
            raise TypeError(f"a Table is made from a dask DataFrame or Array, not "
                            f"{type(data).__name__}")
        cols = _describe_frame(data, columns, client)
        kind = "dataframe"
    futures = futures_of(data)
    keys: list[Any] | None = None
    workers: list[str | None] = [None] * data.npartitions
    if futures and len(futures) == data.npartitions and _only_futures(data):
        wait(futures)
        by_index = sorted(futures, key=lambda f: tuple(f.key[1:]))
        keys = [f.key for f in by_index]
        who = client.who_has(by_index)
        workers = [(sorted(who.get(k) or ()) or [None])[0] for k in keys]
    if counts is None:
        counts = [int(n) for n in client.compute(data.map_partitions(len)).result()]
    return {
        "source": "dask",
        "kind": kind,
        "_columns": cols,
        "partition_rows": counts,
        "workers": workers,
        "keys": keys,
        "scheduler": client.scheduler.address,
        # Only a collection that is not persisted travels: its graph, to compute each
        # partition on the cluster when a rank needs it.
        "graph": None if keys is not None else cloudpickle.dumps(
            data[[c.name for c in cols]] if kind == "dataframe" else data),
    }


def _only_futures(data: Any) -> bool:
    """Whether the collection is its persisted partitions themselves (its graph holds
    only futures and aliases of them), not a computation on top of them."""
    graph = dict(data.__dask_graph__())
    return all(type(v).__name__ in ("Future", "Alias") for v in graph.values())


def _describe_array(arr: Any, columns: Sequence[str] | None, client: Any
                    ) -> tuple[Any, list[Column], list[int]]:
    names = list(columns) if columns is not None else ["x"]
    if len(names) != 1:
        raise ValueError(f"an Array table has one tensor; columns= names it, got {names}")
    if arr.ndim < 1:
        raise ValueError("an Array table needs at least one dimension (the rows)")
    dt = np.dtype(arr.dtype)
    if not numeric(dt):
        raise unsupported(names[0], dt)
    if any(len(c) > 1 for c in arr.chunks[1:]):
        # A row must sit in one block: one chunk along every other axis.
        logger.warning("the array has several chunks along axes after the first; rechunking "
                       "to one (the result is computed as read, not persisted)")
        arr = arr.rechunk({i: -1 for i in range(1, arr.ndim)})
    if any(np.isnan(c) for c in arr.chunks[0]):
        arr = arr.compute_chunk_sizes()
    tail = tuple(int(s) for s in arr.shape[1:])
    return arr, [Column(names[0], dt.str, tail, "numpy")], [int(c) for c in arr.chunks[0]]


def _describe_frame(ddf: Any, columns: Sequence[str] | None, client: Any) -> list[Column]:
    import pandas as pd

    meta = ddf._meta  # noqa: SLF001 (dask.dataframe's empty frame of the schema (its documented meta))
    names = list(meta.columns) if columns is None else list(columns)
    missing = [c for c in names if c not in meta.columns]
    if missing:
        raise KeyError(f"columns {missing} are not in the DataFrame; it has {list(meta.columns)}")
    cols: list[Column] = []
    peek: list[str] = []
    for name in names:
        dt = meta.dtypes[name]
        if isinstance(dt, np.dtype):
            if numeric(dt):
                cols.append(Column(str(name), dt.str))
            elif dt.kind == "O":
                peek.append(name)
                cols.append(Column(str(name), "", (), "object_list"))
            else:
                raise unsupported(name, dt)
        elif isinstance(dt, pd.ArrowDtype):
            cols.append(_arrow_column(str(name), dt))
            if cols[-1].kind == "arrow_list" and not cols[-1].shape:
                peek.append(name)
        elif (pd.api.types.is_numeric_dtype(dt) or pd.api.types.is_bool_dtype(dt)) \
                and hasattr(dt, "numpy_dtype"):
            cols.append(Column(str(name), np.dtype(dt.numpy_dtype).str, (), "ext"))
        else:
            raise unsupported(name, dt)
    if peek:
        first = _first_row(ddf[peek], client)
        for i, c in enumerate(cols):
            if c.name in peek:
                cols[i] = _list_column(c, first[c.name], meta.dtypes[c.name])
    return cols


def _arrow_column(name: str, dt: Any) -> Column:
    import pyarrow as pa

    t = dt.pyarrow_dtype
    if pa.types.is_fixed_size_list(t) or pa.types.is_list(t) or pa.types.is_large_list(t):
        value = np.dtype(t.value_type.to_pandas_dtype()) \
            if (pa.types.is_integer(t.value_type) or pa.types.is_floating(t.value_type)
                or pa.types.is_boolean(t.value_type)) else None
        if value is None:
            raise unsupported(name, dt)
        width = (int(t.list_size),) if pa.types.is_fixed_size_list(t) else ()
        return Column(name, value.str, width, "arrow_list")
    try:
        np_dt = np.dtype(t.to_pandas_dtype())
    except (NotImplementedError, TypeError) as exc:
        raise unsupported(name, dt) from exc
    if not numeric(np_dt) or pa.types.is_timestamp(t) or pa.types.is_date(t):
        raise unsupported(name, dt)
    return Column(name, np_dt.str, (), "ext")


def _first_row(ddf: Any, client: Any) -> Any:
    """The first row of the columns whose row shape the meta does not tell (one row of
    the first non-empty partition, computed on the cluster)."""
    for i in range(ddf.npartitions):
        head = client.compute(ddf.partitions[i].head(1, compute=False)).result()
        if len(head):
            return head.iloc[0]
    raise ValueError(f"the DataFrame is empty: cannot tell the shape of columns "
                     f"{list(ddf.columns)}")


def _list_column(c: Column, value: Any, dtype: Any) -> Column:
    """A fixed-length list column from its first value (lists, tuples or arrays of numbers),
    else the error naming the column and its dtype."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
        raise unsupported(c.name, f"{dtype} (holding {type(value).__name__})")
    arr = np.asarray(value)
    if c.kind == "arrow_list":
        return Column(c.name, c.dtype, (int(arr.shape[0]),), c.kind)
    if arr.ndim != 1 or not numeric(arr.dtype):
        raise unsupported(c.name, f"{dtype} (holding {type(value).__name__} of "
                                   f"{arr.dtype} {arr.shape})")
    return Column(c.name, arr.dtype.str, (int(arr.shape[0]),), "object_list")


__all__ = ["describe", "TableColumnError"]
