"""The process a Loader was made in: a fork()ed child does not read its parent's (internal).

``fork()`` copies a process's memory but only the thread that called it: in the child, a
Loader made by the parent has no engine threads, and its locks and connections are the
parent's. The engine frees nothing of such a Loader in the child (so a DataLoader worker
whose garbage collector meets one does not crash); reading it there raises instead.
"""

from __future__ import annotations

import os

__all__ = ["check_made_here"]


def check_made_here(made_in: int, what: str = "this Loader") -> None:
    """Raise unless the calling process is ``made_in`` (the pid of ``what``'s maker).

    Raises
    ------
    RuntimeError
        In another process (a ``fork()`` child), saying to build a new Loader there.
    """
    here = os.getpid()
    if here != made_in:
        raise RuntimeError(
            f"{what} was made in process {made_in} and is used in process {here}, a "
            "fork() of it (its engine threads, locks and connections stayed in the "
            "parent); build a new Loader in this process (e.g. in the DataLoader worker "
            "or Pool task that reads it)")
