"""The results channel between rank processes and the client (internal).

Contract between the launcher (dispatch.py, _rank.py) and results.py:

- Client side: the launcher calls :func:`prepare` once per job, before submitting the rank
  tasks.
- Worker side: the launcher's supervisor task makes a pipe per rank, passes its write end
  to the rank process (``pass_fds``, and its number in ``DASK_DDP_CHANNEL_FD``), closes the
  write end in the worker, and runs a :class:`Forwarder` on the read end while the rank
  process lives, calling :meth:`Forwarder.close` after the process has exited: records
  already in the pipe are still delivered, also when the rank crashed.
- Rank side: results.py writes framed records to ``DASK_DDP_CHANNEL_FD``.

PLACEHOLDER: the results issue replaces the bodies below with the real channel.
"""

from __future__ import annotations

import os
import threading
from typing import Any


def prepare(client: Any, job_id: str) -> None:
    """Make the scheduler ready to carry the records of ``job_id`` (idempotent)."""


class Forwarder:
    """Reads a rank's framed records from ``read_fd`` and forwards them to the scheduler."""

    def __init__(self, job_id: str, rank: int, read_fd: int) -> None:
        self.job_id = job_id
        self.rank = rank
        self.read_fd = read_fd
        self._thread = threading.Thread(target=self._drain, name=f"dask-ddp-forward-{rank}",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _drain(self) -> None:
        while os.read(self.read_fd, 1 << 16):
            pass

    def close(self, timeout: float = 30.0) -> None:
        """Deliver what is left in the pipe (the rank has exited), then release it."""
        self._thread.join(timeout)
        os.close(self.read_fd)
