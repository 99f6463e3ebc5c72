"""A table's Loader made on the client over a Dask collection (internal).

``Loader(frame, batch_size, features=..., label=...)`` with a Dask DataFrame or Array
checks every argument against the collection's table where it is made, at once: a wrong
column name or ``batch_size=0`` fails in the notebook cell that made it, before any rank
starts. It returns a :class:`~dask_ddp.data.Loader` that opens on first use (an
:class:`~dask_ddp.data.table.loader.Opens` of the table and the arguments): passed to
:func:`dask_ddp.submit` like any argument, it travels as the table and the arguments, and
each rank opens its own (after the process group is up, so it takes that rank's share).
"""

from __future__ import annotations

from typing import Any

from dask_ddp.data.device import check_device_name
from dask_ddp.data.loader import Loader
from dask_ddp.data.table.loader import Opens, TableLoader
from dask_ddp.data.table.table import Table

__all__ = ["pending_loader"]


def _client() -> Any:
    from distributed import get_client

    try:
        return get_client()
    except ValueError:
        raise ValueError(
            "Loader(<Dask collection>) describes the collection's partitions with the Dask "
            "client: make a distributed.Client first (or pass the collection to submit() "
            "and make the Loader in the rank)") from None


def pending_loader(data: Any, batch_size: int, **options: Any) -> Loader:
    """The Loader of ``Loader(data, batch_size, **options)`` for a Dask DataFrame, Series
    or Array ``data`` (described as a Table with the default Dask client), opened on
    first use; ``options`` as :class:`~dask_ddp.data.TableLoader`'s.

    Raises
    ------
    ValueError, KeyError
        As :class:`~dask_ddp.data.TableLoader`, at once.
    """
    table = Table(data, client=_client())
    # Every check the rank would make, here: a loader for rank 0 of the ranks the options
    # name (or of one), made and closed at once; it reads nothing. The device is the
    # ranks' (this client may have no GPU): its name is checked here.
    check_device_name(options.get("device"))
    probe = {"rank": 0, "world_size": 1, "num_threads": 1, **options,
             "device": "cpu" if options.get("device") is not None else None}
    TableLoader(table, batch_size=batch_size, **probe).close()
    # The Dask collection described: what submit() keeps alive while the job runs.
    return Loader.opened_later(Opens(table, {"batch_size": batch_size, **options}),
                               keep_alive=data)
