"""Which Loader reads a dataset: what ``Loader(dataset)`` makes (internal).

``Loader(dataset, ...)`` returns a Loader of the subclass that reads ``dataset``, as
``pathlib.Path(...)`` makes a ``PosixPath``: a :class:`~dask_ddp.data.TableLoader` for a
:class:`~dask_ddp.data.Table`, a pending one for a Dask collection (checked on the client,
built in the rank), else a :class:`~dask_ddp.data.Loader` (images, tar shards). One name to
call for every dataset, one type to check (``isinstance(loader, Loader)``) and one protocol
(``len``, ``set_epoch``, iteration, ``state_dict``, ``load_state_dict``, ``close``); the
subclass takes the options and yields the batches of its kind of data.

A dataset type names the subclass that reads it in its ``_dask_ddp_loader`` attribute
(``"module:Class"``), imported on first use: the subclass's module imports the Loader's,
never the reverse, and this module imports neither.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

__all__ = ["COLLECTION_LOADER", "InitSignature", "loader_type", "not_a_dataset"]

#: The Loader of a Dask collection given to ``Loader`` (its module imports the Loader's).
COLLECTION_LOADER = "dask_ddp.data.table.pending:PendingTableLoader"


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


def is_dask_collection(dataset: object) -> bool:
    """A Dask collection, told by its module (nothing imported)."""
    module = type(dataset).__module__ or ""
    return module.startswith(("dask.", "dask_expr"))


def class_at(where: str) -> type[Any]:
    """The Loader subclass at ``"module:Class"``, imported on first use."""
    module, _, name = where.partition(":")
    found: type[Any] = getattr(importlib.import_module(module), name)
    return found


def own_loader(dataset: object) -> type[Any] | None:
    """The Loader subclass ``dataset``'s type names (``_dask_ddp_loader``), if any."""
    where = getattr(type(dataset), "_dask_ddp_loader", None)
    return class_at(where) if isinstance(where, str) else None


def loader_type(cls: type[Any], dataset: object) -> type[Any]:
    """The class of the Loader that ``cls(dataset, ...)`` makes.

    ``cls`` itself, or the subclass of it that reads ``dataset``; or, for a user's subclass
    of the Loader given a dataset another Loader reads (a table), that Loader, which is not
    a subclass of ``cls``: the caller then makes it with the arguments (Python runs no
    ``__init__`` on an object that is not an instance of ``cls``).

    Raises
    ------
    TypeError
        No Loader reads ``dataset`` (in-memory data: the message says what to pass).
    """
    wrong = not_a_dataset(dataset)
    if wrong is not None:
        raise TypeError(wrong)
    if is_dask_collection(dataset):
        # A Dask collection: checked against its table here, built where it is used.
        pending = class_at(COLLECTION_LOADER)
        if issubclass(pending, cls):
            return pending
    own = own_loader(dataset)
    if own is None or issubclass(cls, own):
        return cls
    return own


class InitSignature:
    """``inspect.signature(cls)`` reads ``cls.__init__``'s parameters: the generic
    ``__new__`` (which picks the subclass) would otherwise hide them."""

    def __get__(self, obj: object, owner: type) -> inspect.Signature:
        sig = inspect.signature(owner.__init__)  # type: ignore[misc]
        return sig.replace(parameters=list(sig.parameters.values())[1:])
