"""A dataset's store, opened in each process that reads it (internal).

A forked DataLoader worker inherits its parent's store handle but not the threads and
connections behind it, and a C++ handle does not survive pickling: a dataset holds a
:class:`ProcessStore`, which pickles without the handle and opens the store again in any
process other than the one it was opened in.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from dask_ddp import storage

__all__ = ["ProcessStore"]


class ProcessStore:
    """The store at ``url`` (:func:`dask_ddp.storage.open` with ``anon`` and
    ``storage_options``), opened in this process when first asked for.

    Parameters
    ----------
    url
        The store's URL or path.
    anon, storage_options
        As :func:`dask_ddp.storage.open`.
    store
        The store at ``url``, already opened in this process (e.g. by a manifest reader),
        or None to open it when asked.
    """

    def __init__(
        self,
        url: str,
        *,
        anon: bool = False,
        storage_options: Mapping[str, Any] | None = None,
        store: storage.Store | None = None,
    ) -> None:
        self.url = url
        self.anon = anon
        self.storage_options = dict(storage_options or {})
        self._store = store
        self._pid = os.getpid() if store is not None else 0

    def get(self) -> storage.Store:
        """The store, opened in this process (now, if it was not yet: a ``fork()`` child's
        or an unpickled copy's first call opens its own)."""
        if self._store is None or self._pid != os.getpid():
            self._store = storage.open(self.url, anon=self.anon, **self.storage_options)
            self._pid = os.getpid()
        return self._store

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_store"] = None  # a C++ handle: reopened after unpickling
        return state
