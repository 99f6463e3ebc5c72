"""The results channel between rank processes and the client (internal).

Records go ``rank process -> pipe -> Forwarder (in the worker) -> scheduler -> client``,
each leg in its own module:

- :mod:`~dask_ddp._channel.wire`: the frames a rank writes and the
  :class:`~dask_ddp._channel.wire.Entry` a topic holds, the configuration
  (``dask-ddp.results.*``) and topic names;
- :mod:`~dask_ddp._channel.rank_writer`: :func:`write` in the rank, :class:`Forwarder` in
  its worker;
- :mod:`~dask_ddp._channel.scheduler`: the scheduler's per-topic logs (budget,
  acknowledgement, removal of abandoned topics);
- :mod:`~dask_ddp._channel.reader`: the client's :class:`Reader` and :func:`follow`, the
  fetch loop;
- :mod:`~dask_ddp._channel.records`: the record kinds (metrics, results, stored results);
- :mod:`~dask_ddp._channel.monitor`: the client's reader of a job's metrics.

The channel knows nothing of the launcher (an import-linter contract holds it). Contract
with the launcher: :func:`prepare` once per job before the rank tasks are submitted; the
supervisor task makes a pipe per rank, passes its write end to the rank process
(``pass_fds``, number in ``DASK_DDP_CHANNEL_FD``), closes it in the worker, runs
``Forwarder(job_id, rank, read_fd).start()`` in the rank's task and calls
:meth:`Forwarder.close` after the process has exited.

The names below are imported lazily: a rank process that only writes records never
imports the scheduler or client side.
"""

from __future__ import annotations

from dask_ddp._lazy import attribute_loader, public_dir

_WHERE = {
    **{n: f"dask_ddp._channel.scheduler:{n}" for n in ("ResultsExtension", "ResultsPlugin")},
    **{n: f"dask_ddp._channel.rank_writer:{n}"
       for n in ("Forwarder", "ForwarderStopped", "in_rank", "reset_writer", "write")},
    **{n: f"dask_ddp._channel.reader:{n}"
       for n in ("GapError", "Reader", "Record", "ensure_extension", "follow", "open_topic",
                 "prepare")},
    **{n: f"dask_ddp._channel.wire:{n}"
       for n in ("ENV_FD", "PIPE_BUF", "Entry", "budget_bytes", "checked_reply",
                 "metrics_topic", "part_size")},
}

__all__ = sorted(_WHERE)
__getattr__ = attribute_loader(__name__, _WHERE)
__dir__ = public_dir(__name__)
