"""What a worker process runs as it exits: its ranks killed, its templates stopped
(internal).

Registered once each, with the first rank or template, both with :mod:`atexit` and as a
multiprocessing finaliser: a worker process its nanny started ends through
multiprocessing's bootstrap, which runs the finalisers and not :mod:`atexit`'s handlers;
a worker started otherwise (``dask worker --no-nanny``) runs both, and each function is
safe to run twice. A worker killed outright runs neither: its ranks and templates watch
their parent instead.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

_registered: set[Callable[[], None]] = set()
_lock = threading.Lock()


def once(fn: Callable[[], None]) -> None:
    """Run ``fn`` when this process exits; a second call with the same ``fn`` does
    nothing."""
    with _lock:
        if fn in _registered:
            return
        _registered.add(fn)
    import atexit
    from multiprocessing import util

    atexit.register(fn)
    util.Finalize(None, fn, exitpriority=100)
