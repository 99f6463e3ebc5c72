"""What kind of data a dataset is (:func:`kind_of`, asked by ``Loader`` and ``predict``), and
what makes the Loader of a kind whose options are not the Loader's own (internal).

``Loader(dataset, ...)`` is always a :class:`~dask_ddp.data.Loader` (one class, never
subclassed, over the kind's :class:`~dask_ddp.data.Source`); a table's takes options of its
own (``features``, ``window``, ...), so ``Loader(table, ...)`` is made by
:class:`~dask_ddp.data.TableLoader`, and ``Loader(<Dask collection>, ...)`` by the pending
one (checked on the client, opened in the rank). Classes are named here, never imported: a
class whose module was not imported has no instance, and the tables' modules import the
Loader's, never the reverse.
"""

from __future__ import annotations

import enum
import importlib
import inspect
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["InitSignature", "Kind", "kind_of", "maker_of", "not_a_dataset"]


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
#: What makes the Loader of each kind with options of its own (the others: the Loader).
_MAKERS = {Kind.TABLE: "dask_ddp.data.table.loader:TableLoader",
           Kind.FRAME: "dask_ddp.data.table.pending:pending_loader",
           Kind.ARRAY: "dask_ddp.data.table.pending:pending_loader"}


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


def maker_of(dataset: object) -> Callable[..., Any] | None:
    """What makes ``Loader(dataset, ...)`` when ``dataset``'s kind has options of its own
    (a table, a Dask collection), called with the same arguments; None: the Loader's
    own ``__init__``.

    Raises
    ------
    TypeError
        No Loader reads ``dataset`` (in-memory data: the message says what to pass).
    """
    wrong = not_a_dataset(dataset)
    if wrong is not None:
        raise TypeError(wrong)
    kind = kind_of(dataset)
    where = None if kind is None else _MAKERS.get(kind)
    if where is None:
        return None
    module, _, name = where.partition(":")
    maker: Callable[..., Any] = getattr(importlib.import_module(module), name)
    return maker


class InitSignature:
    """``inspect.signature(cls)`` reads ``cls.__init__``'s parameters: the metaclass's
    generic ``__call__`` (which picks the maker) would otherwise hide them."""

    def __get__(self, obj: object, owner: type) -> inspect.Signature:
        sig = inspect.signature(owner.__init__)  # type: ignore[misc]
        return sig.replace(parameters=list(sig.parameters.values())[1:])
