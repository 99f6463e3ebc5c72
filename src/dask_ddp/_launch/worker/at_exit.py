"""What a worker process runs as it exits: its ranks killed, its templates stopped
(internal).

Registered once each, with the first rank or template, both with :mod:`atexit` and with
multiprocessing's finaliser (a worker that a nanny stops exits through
``multiprocessing``'s own exit function, which runs its finalisers first). A worker
killed outright runs neither: its ranks and templates watch their parent instead.
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
