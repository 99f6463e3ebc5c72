"""Tables as training data: a Dask DataFrame or Array, or Parquet files, read by the ranks.

The public names are :class:`Table`, :class:`TableColumnError` and :class:`TableLoader`,
also exported by :mod:`dask_ddp.data`. The modules:

- ``table``: :class:`Table`, the picklable description a rank receives, and the swap of
  a job's Dask collections for Tables (``replace_collections``, used by the launcher).
- ``columns``: the columns' dtypes and row shapes, and the records a row's columns make.
- ``meta``: a Dask collection described (metadata only); ``parquet``: Parquet files
  described, and the rank's Parquet reader.
- ``fetch``: the rank's reads of a Dask table's partitions and the task that serves them
  on the worker (numpy only: it runs in Dask workers, which import no torch).
- ``plan``: which rows each rank reads in an epoch, in which order.
- ``host_cache``: the partitions kept once per host (files in /dev/shm every local rank
  maps).
- ``loader``: ``TableSource``, the :class:`~dask_ddp.data.Source` of a Table, and
  :class:`TableLoader`, which makes the :class:`~dask_ddp.data.Loader` over one;
  ``pending``, a table's Loader made on the client over a Dask collection.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dask_ddp._lazy import attribute_loader, public_dir

if TYPE_CHECKING:
    from dask_ddp.data.table.columns import TableColumnError
    from dask_ddp.data.table.loader import TableLoader
    from dask_ddp.data.table.table import Table
    from dask_ddp.data.table.table import replace_collections as replace_collections

# Names are imported on first use (PEP 562): a Dask worker serving a table's rows imports
# this package on the way to ``fetch`` and must not import the loader (torch).
_WHERE = {
    "Table": "dask_ddp.data.table.table:Table",
    "TableColumnError": "dask_ddp.data.table.columns:TableColumnError",
    "TableLoader": "dask_ddp.data.table.loader:TableLoader",
    "replace_collections": "dask_ddp.data.table.table:replace_collections",
}

__all__ = ["Table", "TableColumnError", "TableLoader"]
__getattr__ = attribute_loader(__name__, _WHERE)
__dir__ = public_dir(__name__)
