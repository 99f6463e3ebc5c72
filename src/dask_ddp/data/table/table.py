"""Tables: Dask DataFrames, Dask Arrays and Parquet as training data, where they are.

A :class:`Table` is a small, picklable description of a table (columns, dtypes, the rows
of each partition, the key of each partition and the worker holding it), never its
data. Passing a Dask DataFrame or Array to :func:`dask_ddp.submit` (or
:func:`dask_ddp.dispatch.run`) hands each rank a Table in its place; the rank's
:class:`~dask_ddp.data.Loader` reads its rows from the workers holding them::

    ddf = dd.read_parquet("s3://bucket/events/").persist()
    job = dask_ddp.submit(client, train, ddf, epochs=3)

    def train(table, epochs):
        loader = dask_ddp.data.Loader(table, batch_size=1024, shuffle=True, seed=0)
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            for batch in loader:   # dict: column name -> tensor of batch_size rows
                ...

:meth:`Table.from_parquet` describes Parquet files the ranks read themselves, row group
by row group, through :mod:`dask_ddp.storage` (any URL the engine reads).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from dask_ddp.data.table.columns import Column, TableColumnError

__all__ = ["Table", "TableColumnError", "replace_collections"]

logger = logging.getLogger(__name__)


class Table:
    """A table for training: a Dask DataFrame or Array, or Parquet files, described.

    Parameters
    ----------
    data : dask.dataframe.DataFrame or dask.array.Array
        The collection. Persisted (``.persist()``), its partitions are read where they
        are held; otherwise each partition is computed on the cluster when a rank needs
        it (its row counts are computed once here, on the cluster).
    columns : sequence of str, optional
        The columns to use (a DataFrame); for an Array, a one-element list naming its
        tensor (default ``"x"``). Columns left out are never read.
    client : distributed.Client, optional
        Default: the current client.

    Attributes
    ----------
    columns : list of str
    dtypes : dict of str to numpy.dtype
    shapes : dict of str to tuple
        The shape of one row of each column (``()`` for a scalar column).
    partition_rows : list of int
    workers : list of str or None
        The worker holding each partition (persisted collections).

    Raises
    ------
    TableColumnError
        A column is not numeric, bool or a fixed-length list (a ``TypeError`` and a
        ``ValueError``); its message names the column and its dtype.
    """

    def __init__(self, data: Any, columns: Sequence[str] | None = None, *,
                 client: Any = None) -> None:
        from dask_ddp.data.table import meta

        fields = meta.describe(data, columns, client)
        self.__dict__.update(fields)
        logger.info("%s", _summary(self))

    # -- construction from fields (unpickling, Parquet) --------------------------------------
    @classmethod
    def _from_fields(cls, **fields: Any) -> Table:
        return _rebuild(fields, cls)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (dict(self.__dict__),))

    @classmethod
    def from_parquet(cls, url_or_urls: str | Sequence[str], columns: Sequence[str] | None = None,
                     **storage_options: Any) -> Table:
        """Parquet files, read by the ranks themselves (row group by row group).

        Parameters
        ----------
        url_or_urls : str or sequence of str
            A ``.parquet`` file URL, a folder or prefix URL (its ``*.parquet`` objects,
            in key order), or a list of file URLs; any URL :func:`dask_ddp.storage.open`
            reads (``file://``, plain paths, ``s3://``, ``http(s)://``).
        columns : sequence of str, optional
            The columns to read (others are never fetched).
        **storage_options
            Passed to :func:`dask_ddp.storage.open` (``anon``, ``endpoint_url``, ...).

        Only the files' footers are read here (ranged GETs); each rank reads the row
        groups it needs through the engine's stores, decoded by pyarrow.
        """
        from dask_ddp.data.table import parquet

        table = cls._from_fields(**parquet.describe(url_or_urls, columns, storage_options))
        logger.info("%s", _summary(table))
        return table

    # -- description ----------------------------------------------------------------------
    _columns: list[Column]
    partition_rows: list[int]
    workers: list[str | None]
    source: str  # "dask" or "parquet"

    @property
    def columns(self) -> list[str]:
        return [c.name for c in self._columns]

    # Each column's description (name, dtype, row shape, storage), in order: what the
    # table's readers read (internal, as column(): not on the API page).
    @property
    def column_specs(self) -> list[Column]:
        return list(self._columns)

    @property
    def dtypes(self) -> dict[str, np.dtype]:
        return {c.name: np.dtype(c.dtype) for c in self._columns}

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {c.name: c.shape for c in self._columns}

    @property
    def npartitions(self) -> int:
        return len(self.partition_rows)

    @property
    def persisted(self) -> bool:
        """Whether the partitions are held in the cluster's memory (read where they are)."""
        return bool(self.__dict__.get("keys"))

    def column(self, name: str) -> Column:
        for c in self._columns:
            if c.name == name:
                return c
        raise KeyError(f"the table has no column {name!r}; its columns: {self.columns}")

    def __len__(self) -> int:
        return int(sum(self.partition_rows))

    @property
    def row_bytes(self) -> int:
        return sum(c.row_bytes for c in self._columns)

    def __repr__(self) -> str:
        cols = ", ".join(f"{c.name}: {np.dtype(c.dtype).name}{list(c.shape) if c.shape else ''}"
                         for c in self._columns)
        return f"Table({len(self)} rows, {self.npartitions} partitions, {{{cols}}})"


def _rebuild(fields: Mapping[str, Any], cls: type[Table] = Table) -> Table:
    """A ``cls`` holding ``fields``, nothing described: Table's unpickler (its
    ``__reduce__``) and its constructor from fields (``Table._from_fields``)."""
    table = cls.__new__(cls)
    table.__dict__.update(fields)
    return table


def _summary(table: Table) -> str:
    """A line of the table's size, partitions and where they are, for the log."""
    held: dict[str, int] = {}
    for w in table.workers:
        held[w or "-"] = held.get(w or "-", 0) + 1
    where = ", ".join(f"{w}: {k}" for w, k in sorted(held.items()))
    kind = ("persisted" if table.persisted else "computed as read") \
        if table.source == "dask" else "Parquet"
    return (f"table: {len(table):,} rows x {len(table.columns)} columns "
            f"({len(table) * table.row_bytes / 1e6:.1f} MB), {table.npartitions} partitions, "
            f"{kind}; partitions per worker: {where}")


def _is_collection(value: Any) -> bool:
    """A Dask DataFrame, Series or Array (without importing dask for other values)."""
    mod = type(value).__module__ or ""
    if mod.startswith("dask.array"):
        import dask.array as da

        return isinstance(value, da.Array)
    if mod.startswith(("dask.dataframe", "dask_expr")):
        import dask.dataframe as dd

        return isinstance(value, (dd.DataFrame, dd.Series))
    return False


def replace_collections(client: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]
                        ) -> tuple[tuple[Any, ...], dict[str, Any], list[Any]]:
    """``args`` and ``kwargs`` with each top-level Dask DataFrame or Array replaced by a
    :class:`Table` describing it, and the collections replaced (to keep their persisted
    partitions alive as long as the job)."""
    kept: list[Any] = []

    def swap(value: Any) -> Any:
        if isinstance(value, Table) or not _is_collection(value):
            return value
        kept.append(value)
        return Table(value, client=client)

    new_args = tuple(swap(a) for a in args)
    new_kwargs = {k: swap(v) for k, v in kwargs.items()}
    return new_args, new_kwargs, kept
