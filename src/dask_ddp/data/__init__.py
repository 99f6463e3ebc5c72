"""Datasets over object stores and the C++ batch loader.

- :class:`ImageList` (keys and labels, e.g. from a CSV manifest with
  :meth:`ImageList.from_csv`), :class:`ImageFolder` (class folders) and
  :class:`S3ImageFolder` (the seed's): map-style datasets (PIL images, any torchvision
  transform, torch ``DataLoader`` compatible).
- :class:`TarShards` (WebDataset tar shards) and :func:`write_shards` (write them on Dask).
- :class:`Loader`: decode and transform in C++ threads; batches as tensors.
- :class:`Table`: a Dask DataFrame or Array, or Parquet files, for the Loader (rows read
  where Dask holds them, gathered into batches in C++); ``Loader(table)`` is made by
  :class:`TableLoader`, with the table's options.
- :class:`Source`: the seam of a data kind; ``Loader(source)`` reads any (see the user
  guide's "Adding a data kind").
- :mod:`dask_ddp.data.transforms`: the transforms the Loader runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dask_ddp._lazy import attribute_loader, public_dir

if TYPE_CHECKING:
    from dask_ddp.data import transforms
    from dask_ddp.data.datasets import IMG_EXTENSIONS, ImageFolder, ImageList, S3ImageFolder
    from dask_ddp.data.loader import Loader
    from dask_ddp.data.shards import TarShards, write_shards
    from dask_ddp.data.sources import Source
    from dask_ddp.data.table import Table, TableColumnError, TableLoader

# Names are imported on first use (PEP 562): a Dask worker serving a table's rows imports
# ``dask_ddp.data.table.fetch`` (numpy only), not torch through the datasets.
_WHERE = {
    "transforms": "dask_ddp.data.transforms",
    **{n: f"dask_ddp.data.datasets:{n}"
       for n in ("IMG_EXTENSIONS", "ImageFolder", "ImageList", "S3ImageFolder")},
    "Loader": "dask_ddp.data.loader:Loader",
    **{n: f"dask_ddp.data.shards:{n}" for n in ("TarShards", "write_shards")},
    "Source": "dask_ddp.data.sources:Source",
    "Table": "dask_ddp.data.table.table:Table",
    "TableColumnError": "dask_ddp.data.table.columns:TableColumnError",
    "TableLoader": "dask_ddp.data.table.loader:TableLoader",
}

__all__ = [
    "IMG_EXTENSIONS",
    "ImageFolder",
    "ImageList",
    "Loader",
    "S3ImageFolder",
    "Source",
    "Table",
    "TableColumnError",
    "TableLoader",
    "TarShards",
    "transforms",
    "write_shards",
]
__getattr__ = attribute_loader(__name__, _WHERE)
__dir__ = public_dir(__name__)
