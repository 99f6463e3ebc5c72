"""A table's Loader made on the client: :class:`PendingTableLoader` (internal).

``Loader(frame, batch_size, features=..., label=...)`` with a Dask DataFrame or Array
checks every argument against the collection's table where it is made, at once: a wrong
column name or ``batch_size=0`` fails in the notebook cell that made it, before any rank
starts. Passed to :func:`dask_ddp.submit` like any argument, it
travels as the table and the arguments, and each rank builds its own
:class:`~dask_ddp.data.TableLoader` on first use (after the process group is up, so it
takes that rank's share). Used on the client, it is that TableLoader, built on first use.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from dask_ddp.data.device import check_device_name
from dask_ddp.data.table.loader import TableLoader
from dask_ddp.data.table.table import Table

__all__ = ["PendingTableLoader"]


def _client() -> Any:
    from distributed import get_client

    try:
        return get_client()
    except ValueError:
        raise ValueError(
            "Loader(<Dask collection>) describes the collection's partitions with the Dask "
            "client: make a distributed.Client first (or pass the collection to submit() "
            "and make the Loader in the rank)") from None


def _rebuild(table: Table, options: dict[str, Any]) -> PendingTableLoader:
    loader = object.__new__(PendingTableLoader)
    loader._init(table, options, None)
    return loader


#: The attributes a PendingTableLoader answers itself (see its ``__getattribute__``).
_OWN = frozenset({"_table", "_options", "_loader", "_dask_ddp_keep_alive", "_init", "_real",
                  "close"})


class PendingTableLoader(TableLoader):
    """A :class:`~dask_ddp.data.TableLoader` whose arguments were checked where it was
    made, built on first use (see the module).

    Parameters
    ----------
    data
        A Dask DataFrame, Series or Array, described as a Table with the default Dask
        client.
    batch_size, **options
        As :class:`~dask_ddp.data.TableLoader`.

    Raises
    ------
    ValueError, KeyError
        As :class:`~dask_ddp.data.TableLoader`, at once.
    """

    def __init__(self, data: Any, batch_size: int, **options: Any) -> None:
        table = Table(data, client=_client())
        self._init(table, {"batch_size": batch_size, **options}, data)
        # Every check the rank would make, here: a loader for rank 0 of the ranks the
        # options name (or of one), made and closed at once; it reads nothing.
        # The device is the ranks' (this client may have no GPU): its name is checked here.
        check_device_name(options.get("device"))
        probe = {"rank": 0, "world_size": 1, "num_threads": 1, **options,
                 "device": "cpu" if options.get("device") is not None else None}
        TableLoader(table, batch_size=batch_size, **probe).close()

    def _init(self, table: Table, options: dict[str, Any], collection: Any) -> None:
        self.__dict__["_table"] = table
        self.__dict__["_options"] = options
        #: The Dask collection described: what submit() keeps alive while the job runs.
        self.__dict__["_dask_ddp_keep_alive"] = collection
        self.__dict__["_loader"] = None

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (self._table, dict(self._options)))

    def _real(self) -> TableLoader:
        loader: TableLoader | None = self.__dict__["_loader"]
        if loader is None:
            loader = self.__dict__["_loader"] = TableLoader(self._table, **self._options)
        return loader

    def __getattribute__(self, name: str) -> Any:
        # Every attribute is the built loader's, bound to it: an inherited method run on
        # this proxy would read the Loader's class defaults (``_stage = None``), not the
        # built loader's values. Special names, and what this class answers without
        # building (the pickle, the close of one never built), stay its own.
        if name in _OWN or name.startswith("__"):
            return object.__getattribute__(self, name)
        return getattr(object.__getattribute__(self, "_real")(), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._real(), name, value)

    def __len__(self) -> int:
        return len(self._real())

    def __iter__(self) -> Iterator[Any]:
        return iter(self._real())

    def close(self) -> None:
        loader = self.__dict__["_loader"]
        if loader is not None:
            loader.close()

    def __repr__(self) -> str:
        loader = self.__dict__["_loader"]
        if loader is not None:
            return repr(loader)
        opts = ", ".join(f"{k}={v!r}" for k, v in self._options.items())
        return f"TableLoader({self._table!r}, {opts}) (built on first use)"
