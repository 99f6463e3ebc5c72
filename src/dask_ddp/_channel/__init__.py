"""The results channel between rank processes and the client (internal).

Records go ``rank process -> pipe -> Forwarder (in the worker) -> scheduler -> client``,
each leg in its own module:

- :mod:`dask_ddp._wire`: the frames a rank writes and the :class:`~dask_ddp._wire.Entry`
  a topic holds, the configuration (``dask-ddp.results.*``) and topic names;
- :mod:`dask_ddp._rankwriter`: :func:`write` in the rank, :class:`Forwarder` in its worker;
- :mod:`dask_ddp._extension`: the scheduler's per-topic logs (budget, acknowledgement,
  removal of abandoned topics);
- :mod:`dask_ddp._reader`: the client's :class:`Reader` and :func:`follow`, the fetch loop.

This module gathers the names the launcher and :mod:`dask_ddp.results` use.

Contract with the launcher (dispatch.py, _supervisor.py): :func:`prepare` once per job
before the rank tasks are submitted; the supervisor task makes a pipe per rank, passes its
write end to the rank process (``pass_fds``, number in ``DASK_DDP_CHANNEL_FD``), closes it
in the worker, runs ``Forwarder(job_id, rank, read_fd).start()`` in the rank's task and
calls :meth:`Forwarder.close` after the process has exited.
"""

from __future__ import annotations

from dask_ddp._extension import ResultsExtension, ResultsPlugin
from dask_ddp._rankwriter import Forwarder, ForwarderStopped, in_rank, reset_writer, write
from dask_ddp._reader import (
    GapError,
    Reader,
    Record,
    ensure_extension,
    follow,
    open_topic,
    prepare,
)
from dask_ddp._wire import (
    ENV_FD,
    PIPE_BUF,
    Entry,
    budget_bytes,
    checked_reply,
    metrics_topic,
    part_size,
)

__all__ = [
    "ENV_FD",
    "PIPE_BUF",
    "Entry",
    "Forwarder",
    "ForwarderStopped",
    "GapError",
    "Reader",
    "Record",
    "ResultsExtension",
    "ResultsPlugin",
    "budget_bytes",
    "checked_reply",
    "ensure_extension",
    "follow",
    "in_rank",
    "metrics_topic",
    "open_topic",
    "part_size",
    "prepare",
    "reset_writer",
    "write",
]
