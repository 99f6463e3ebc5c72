"""What a rank process runs: the launch record its supervisor writes (internal).

The supervisor of a function's rank writes one :class:`LaunchRecord` into the rank's work
directory (made 0700 by :mod:`dask_ddp._launch.worker.workdir`) before it starts the process;
the rank process (:mod:`dask_ddp._launch.rank.main`) reads it back. Both sides import this one
type: a field added, renamed or retyped is seen by both, and the rank checks that what it
read is a record before it uses it. A leaf module: the rank imports it first thing.
"""

from __future__ import annotations

import dataclasses
import os
import pickle

#: The record's file in the rank's work directory.
RECORD_FILE = "launch.pkl"


class LaunchRecordError(RuntimeError):
    """The launch record could not be read, or is not a :class:`LaunchRecord`."""


@dataclasses.dataclass(frozen=True)
class LaunchRecord:
    """What a function's rank runs, and how it joins its peers.

    Parameters
    ----------
    payload
        The rank's ``(fn, args, kwargs)``, pickled with cloudpickle by the client.
    init_kwargs
        Extra keyword arguments of ``init_process_group``, pickled with cloudpickle.
    backend
        ``"gloo"``, ``"nccl"`` or ``"auto"`` (agreed on by the ranks through the store).
    pass_local_rank
        Whether the function is called with ``local_rank=``.
    sys_path
        The worker's ``sys.path``, appended to the rank's (the user's modules the worker
        can import, the rank can too).
    worker
        The rank's worker address (for messages).
    rendezvous_timeout
        Seconds the rank waits for its peers at the store and ``init_process_group``.
    """

    payload: bytes
    init_kwargs: bytes
    backend: str
    pass_local_rank: bool
    sys_path: tuple[str, ...]
    worker: str
    rendezvous_timeout: float

    def write(self, workdir: str) -> None:
        """Write the record into ``workdir`` (the supervisor, before starting the rank)."""
        with open(os.path.join(workdir, RECORD_FILE), "wb") as f:
            pickle.dump(self, f)

    @classmethod
    def read(cls, workdir: str) -> LaunchRecord:
        """The record in ``workdir`` (the rank process); raises :class:`LaunchRecordError`
        naming the file when it is missing, unreadable or not a :class:`LaunchRecord`."""
        path = os.path.join(workdir, RECORD_FILE)
        try:
            with open(path, "rb") as f:
                record = pickle.load(f)
        except Exception as exc:
            raise LaunchRecordError(
                f"the rank's launch record {path} could not be read: "
                f"{type(exc).__name__}: {exc}") from exc
        if not isinstance(record, cls):
            raise LaunchRecordError(
                f"the rank's launch record {path} holds a {type(record).__name__}, "
                f"not a {cls.__name__} (a supervisor and a rank of different dask-ddp "
                "versions?)")
        return record
