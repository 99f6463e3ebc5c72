"""The ranks' printed lines on the client: :class:`RankOutput` (internal).

With ``stream_output``, each supervisor forwards its rank's stdout and stderr lines to the
job's output topic on the scheduler, and an end-of-output mark when the rank ends; the
client prints them prefixed with the rank and waits for every mark before the job's
result is returned, so no line comes after it.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Collection
from typing import Any


class RankOutput:
    """Prints one job's forwarded lines and counts its ranks' end-of-output marks."""

    def __init__(self) -> None:
        self._eof: set[int] = set()
        self._cond = threading.Condition()

    def on_event(self, event: Any) -> None:
        """One event of the output topic: ``(time, {"rank", "stream", "line"})``."""
        _, msg = event
        rank, stream, line = msg["rank"], msg["stream"], msg["line"]
        if stream == "eof":
            with self._cond:
                self._eof.add(rank)
                self._cond.notify_all()
            return
        out = sys.stderr if stream == "stderr" else sys.stdout
        out.write(f"[rank {rank}] {line}\n")
        out.flush()

    def handler(self) -> Callable[[Any], None]:
        """The topic's handler; it holds this object weakly (Dask keeps a topic's handler
        after an unsubscribe: the job would never go)."""
        ref = weakref.ref(self)

        def on_output(event: Any) -> None:
            alive = ref()
            if alive is not None:
                alive.on_event(event)

        return on_output

    def wait_eof(self, expected: Collection[int], timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the end marks of the ``expected`` ranks;
        whether all came."""
        deadline = time.monotonic() + timeout
        want = set(expected)
        with self._cond:
            while not want <= self._eof:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def finish(self, client: Any, topic: str, forget: Callable[[str], Awaitable[None]],
               expected: Collection[int], timeout: float) -> None:
        """Wait for the ``expected`` ranks' end marks (:meth:`wait_eof`), then stop reading
        ``topic`` and have the scheduler drop it (``forget``)."""
        self.wait_eof(expected, timeout)
        with contextlib.suppress(Exception):
            client.unsubscribe_topic(topic)
            client.sync(forget, topic)
