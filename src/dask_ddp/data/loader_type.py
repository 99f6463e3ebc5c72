"""What kind of data a dataset is (:func:`kind_of`, asked by ``Loader`` and ``predict``), and
which Loader reads it (internal).

``Loader(dataset, ...)`` returns a Loader of the subclass that reads the kind, as
``pathlib.Path(...)`` makes a ``PosixPath``: a :class:`~dask_ddp.data.TableLoader` for a
:class:`~dask_ddp.data.Table`, a pending one for a Dask collection (checked on the client,
built in the rank), else a :class:`~dask_ddp.data.Loader` (images, tar shards): one name to
call, one type to check (``isinstance(loader, Loader)``), one protocol. Classes are named
here, never imported: a class whose module was not imported has no instance, and the
subclasses' modules import the Loader's, never the reverse.
"""

from __future__ import annotations

import enum
import importlib
import inspect
import sys
from typing import Any

__all__ = ["InitSignature", "Kind", "kind_of", "loader_type", "not_a_dataset"]


class Kind(enum.Enum):
    """The kinds of data dask-ddp reads."""

    IMAGES = "images"  #: an ImageList (ImageFolder, S3ImageFolder) or a torch Subset of one
    SHARDS = "shards"  #: TarShards
    TABLE = "table"  #: a dask_ddp Table
    FRAME = "frame"  #: a Dask DataFrame or Series
    ARRAY = "array"  #: a Dask Array
    SOURCE = "source"  #: any dask_ddp.data.Source (a data kind of its own)


#: The class of each kind read from a type of ours or torch's, by ``"module:Class"``.
_CLASSES = {Kind.SOURCE: "dask_ddp.data.sources:Source",
            Kind.SHARDS: "dask_ddp.data.shards:TarShards",
            Kind.IMAGES: "dask_ddp.data.datasets:ImageList",
            Kind.TABLE: "dask_ddp.data.table.table:Table"}
#: The Loader subclass of each kind that has one (the others: the Loader itself).
_LOADERS = {Kind.TABLE: "dask_ddp.data.table.loader:TableLoader",
            Kind.FRAME: "dask_ddp.data.table.pending:PendingTableLoader",
            Kind.ARRAY: "dask_ddp.data.table.pending:PendingTableLoader"}


def _is_a(data: object, where: str) -> bool:
    module, _, name = where.partition(":")
    loaded = sys.modules.get(module)
    return loaded is not None and isinstance(data, getattr(loaded, name))


def kind_of(data: object) -> Kind | None:
    """The kind of ``data`` (None: none dask-ddp reads); a torch ``Subset`` is of images
    (what it holds is checked where it is read)."""
    module = type(data).__module__ or ""
    if module.startswith(("dask.dataframe", "dask_expr")):
        return Kind.FRAME
    if module.startswith("dask.array"):
        return Kind.ARRAY
    for kind, where in _CLASSES.items():
        if _is_a(data, where):
            return kind
    return Kind.IMAGES if _is_a(data, "torch.utils.data:Subset") else None


def not_a_dataset(dataset: object) -> str | None:
    """Why ``dataset`` cannot be read by any Loader, with the fix (``None``: it may be).

    In-memory data (a pandas or numpy object, a list) would otherwise fail later with a
    message about the Loader's own arguments (``features``) instead of naming the data.
    """
    kind = type(dataset)
    module = (kind.__module__ or "").split(".")[0]
    if module == "pandas":
        return (f"Loader got a pandas {kind.__name__}, which it does not read: pass a Dask "
                "DataFrame to submit() instead (dask.dataframe.from_pandas(df, "
                "npartitions=...).persist()); the rank receives it as a "
                "dask_ddp.data.Table, which Loader(table, batch_size, features=..., "
                "label=...) reads")
    if module == "numpy" or isinstance(dataset, (list, tuple, dict)):
        return (f"Loader got a {kind.__module__}.{kind.__name__}" if module == "numpy"
                else f"Loader got a {kind.__name__}") + (
            ", which it does not read: for in-memory data use a torch DataLoader, or pass "
            "a Dask Array or DataFrame to submit() (it arrives as a dask_ddp.data.Table); "
            "for images, an ImageList (ImageList.from_csv, or keys and labels), an "
            "ImageFolder or TarShards")
    return None


def loader_type(cls: type[Any], dataset: object) -> type[Any]:
    """The class of the Loader that ``cls(dataset, ...)`` makes.

    ``cls`` itself, or the subclass of it that reads ``dataset``'s kind; or, for a user's
    subclass of the Loader given a dataset another Loader reads (a table), that Loader,
    which is not a subclass of ``cls``: the caller then makes it with the arguments
    (Python runs no ``__init__`` on an object that is not an instance of ``cls``).

    Raises
    ------
    TypeError
        No Loader reads ``dataset`` (in-memory data: the message says what to pass).
    """
    wrong = not_a_dataset(dataset)
    if wrong is not None:
        raise TypeError(wrong)
    kind = kind_of(dataset)
    where = None if kind is None else _LOADERS.get(kind)
    if where is None:
        return cls
    module, _, name = where.partition(":")
    own: type[Any] = getattr(importlib.import_module(module), name)
    if kind in (Kind.FRAME, Kind.ARRAY):
        # A Dask collection: checked against its table here, built where it is used.
        return own if issubclass(own, cls) else cls
    return cls if issubclass(cls, own) else own


class InitSignature:
    """``inspect.signature(cls)`` reads ``cls.__init__``'s parameters: the generic
    ``__new__`` (which picks the subclass) would otherwise hide them."""

    def __get__(self, obj: object, owner: type) -> inspect.Signature:
        sig = inspect.signature(owner.__init__)  # type: ignore[misc]
        return sig.replace(parameters=list(sig.parameters.values())[1:])
