"""The rank's probe: its collective state and live stacks, for its supervisor to read
(internal; the file's layout is :mod:`dask_ddp._launch.wire.probe_file`, the supervisor's
reader :mod:`dask_ddp._launch.worker.probe`).

- **Collective state**: the rank process wraps the collectives of ``torch.distributed``
  (:data:`COLLECTIVES`) so that entering and leaving one writes three numbers into a small
  memory-mapped file of its work directory (a change counter, the state, since when). The
  supervisor reads the file at each poll: no call, no syscall in the rank, a few stores
  per collective. The rank also marks the moment its function returned (it then waits in
  the launcher's finish barrier).
- **Live stacks**: the rank registers :mod:`faulthandler` on :data:`STACKS_SIGNAL`,
  writing into a file of its work directory; the supervisor truncates the file, sends the
  signal and reads what the rank wrote. faulthandler dumps every thread's Python stack from
  the signal handler without the GIL, so a rank blocked in C++ (gloo, NCCL, the store)
  still answers; a frozen (SIGSTOPped) rank cannot, and says so. py-spy would also read a
  stopped process, but it needs ptrace rights a container usually lacks and a binary
  outside the standard library.

- **c10d collectives**: what the Python wrappers cannot see, DDP's gradient all-reduce
  issued by its reducer from C++ inside ``backward()``, its forward-time broadcasts, any
  collective a C++ extension issues. torch's flight recorder (on in every rank: the
  launcher sets ``TORCH_FR_BUFFER_SIZE``, see :mod:`~dask_ddp._launch.worker.rank_env`) keeps
  each process group's last collectives in a ring, gloo's as NCCL's, each with its
  per-group sequence number, its name (``gloo:all_reduce``), when it was issued and
  whether it completed. A daemon thread of the probe reads the ring every
  :data:`C10D_POLL_S` and writes the rank's latest collective and its count per group
  (plain data, JSON) into a second area of the same file: the training thread does no
  work for it; the ring costs one record per collective (not measurable against a 15 µs
  gloo all-reduce, let alone a DDP step), a read of a 64-entry ring about 0.3 ms (a
  2000-entry ring: 18 ms, hence the small default). The
  supervisor publishes it with the rank's state; the stall rule compares counts
  (:mod:`~dask_ddp._launch.client.stall`). Without a flight recorder (an old torch) the area
  stays empty and only the Python collectives are seen.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import mmap
import os
import pickle
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from dask_ddp._launch.wire.collective_env import collective_defaults
from dask_ddp._launch.wire.probe_file import (
    C10D_AT,
    C10D_HEAD,
    C10D_MAX,
    COLLECTIVES,
    FILE_SIZE,
    FIRST_COLLECTIVE,
    LAYOUT,
    RETURNED,
    STACKS_FILE,
    STACKS_SIGNAL,
    STATE_FILE,
    WORKING,
)

#: How often the probe's thread reads the flight recorder (seconds).
C10D_POLL_S = 0.5


class _State:
    """The rank's side of the state file."""

    def __init__(self, path: str) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.ftruncate(fd, FILE_SIZE)
            self.map = mmap.mmap(fd, FILE_SIZE)
        finally:
            os.close(fd)
        self.changes = 0
        self.depth = 0
        self.c10d_changes = 0
        self.set(WORKING)

    def set(self, state: int) -> None:
        self.changes += 1
        LAYOUT.pack_into(self.map, 0, self.changes, time.monotonic(), state)

    def set_c10d(self, record: dict[str, Any]) -> None:
        """Write the rank's latest c10d collective (one writer: the probe's thread)."""
        blob = json.dumps(record, separators=(",", ":")).encode()[:C10D_MAX]
        self.c10d_changes += 1  # odd: a reader retries
        C10D_HEAD.pack_into(self.map, C10D_AT, self.c10d_changes, len(blob))
        start = C10D_AT + C10D_HEAD.size
        self.map[start:start + len(blob)] = blob
        self.c10d_changes += 1
        C10D_HEAD.pack_into(self.map, C10D_AT, self.c10d_changes, len(blob))

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        state = FIRST_COLLECTIVE + COLLECTIVES.index(name)

        @functools.wraps(fn)
        def tracked(*args: Any, **kwargs: Any) -> Any:
            # Only the outermost collective counts (all_gather_object calls all_gather).
            self.depth += 1
            if self.depth == 1:
                self.set(state)
            try:
                return fn(*args, **kwargs)
            finally:
                self.depth -= 1
                if self.depth == 0:
                    self.set(WORKING)

        tracked.__dask_ddp_tracked__ = True  # type: ignore[attr-defined]
        return tracked


def latest_c10d(dump: Any) -> dict[str, Any] | None:
    """The rank's latest c10d collective in a flight-recorder dump (``None``: none yet).

    ``{"seq": its sequence number in its process group, "group": the group's name, "name":
    "gloo:all_reduce"..., "since": when it was issued (``time.time()``), "done": whether
    it completed, "counts": {group: the group's latest sequence number}}``. Point-to-point
    operations have their own counters and are left out (they are Python calls the
    collective state sees).
    """
    entries = dump.get("entries") if isinstance(dump, dict) else None
    latest: dict[str, Any] | None = None
    counts: dict[str, int] = {}
    for entry in entries or ():
        if entry.get("is_p2p"):
            continue
        group = str((entry.get("process_group") or ("?",))[0])
        seq = int(entry.get("collective_seq_id") or 0)
        counts[group] = max(counts.get(group, 0), seq)
        if latest is None or int(entry.get("record_id", 0)) >= int(latest.get("record_id", 0)):
            latest = entry
    if latest is None:
        return None
    group = str((latest.get("process_group") or ("?",))[0])
    if len(counts) > 32:  # the file's area is bounded: the latest's group is what counts
        counts = {group: counts[group]}
    return {"seq": int(latest.get("collective_seq_id") or 0), "group": group,
            "name": str(latest.get("profiling_name", "")),
            "since": int(latest.get("time_created_ns") or 0) / 1e9,
            "done": bool(latest.get("retired")) or latest.get("state") == "completed",
            "counts": counts}


def _watch_c10d(state: _State) -> None:
    """The probe's thread: the flight recorder's latest collective into the state file.

    The pickled dump without stack traces is torch's cheapest read of the ring (a 64-entry
    ring: about 0.3 ms, against 0.5 ms for its JSON); it holds the recorder's lock only to
    copy the entries, so the training thread's next record waits at most that long.
    """
    try:
        import torch._C._distributed_c10d as c10d_core
    except ImportError:  # a torch without distributed support
        return
    dump = getattr(c10d_core, "_dump_fr_trace", None)
    if dump is None:  # a torch without a flight recorder: Python collectives only
        return
    last: dict[str, Any] | None = None
    while not _c10d_stop.wait(C10D_POLL_S):
        try:
            record = latest_c10d(pickle.loads(dump(True, False, False)))
        except Exception:  # the recorder is unreadable (the process is ending): stop
            return
        if record is not None and record != last:
            state.set_c10d(record)
            last = record


_state: _State | None = None
_stacks_file: Any = None
#: Set at the interpreter's exit: the c10d watcher stops before torch's C++ state goes.
_c10d_stop = threading.Event()


def _stop_c10d(watcher: threading.Thread) -> None:
    """At exit: stop the watcher and wait for it. A daemon thread still inside torch's
    flight recorder while the process tears down its C++ state aborted the process
    ("terminate called without an active exception") in about one exit of four."""
    _c10d_stop.set()
    watcher.join(timeout=5.0)


def install(workdir: str) -> None:
    """In the rank process, before the user's function: track collectives, answer the
    stacks signal."""
    global _state, _stacks_file
    import faulthandler

    # The rank's environment has them (rank_env); a script started some other way, or a
    # user's os.environ edit before this, may not: before torch makes a process group.
    for key, value in collective_defaults(os.environ).items():
        os.environ[key] = value
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    # Append mode: the supervisor truncates the file before each request and each dump
    # starts at its new end. The supervisor signals only once the file has its name, so it
    # gets it after the handler is in place: the signal's default action kills a process.
    path = os.path.join(workdir, STACKS_FILE)
    _stacks_file = open(path + ".new", "a")  # noqa: SIM115 - for life
    faulthandler.register(STACKS_SIGNAL, file=_stacks_file, all_threads=True, chain=False)
    os.replace(path + ".new", path)
    _state = _State(os.path.join(workdir, STATE_FILE))
    watcher = threading.Thread(target=_watch_c10d, args=(_state,),
                               name="dask-ddp-c10d-probe", daemon=True)
    watcher.start()
    atexit.register(_stop_c10d, watcher)
    for name in COLLECTIVES:
        fn = getattr(c10d, name, None)
        if fn is None or getattr(fn, "__dask_ddp_tracked__", False):
            continue
        tracked = _state.wrap(name, fn)
        setattr(c10d, name, tracked)  # the calls between collectives inside torch
        if getattr(dist, name, None) is fn:
            setattr(dist, name, tracked)


@contextlib.contextmanager
def waiting_for_peers(name: str) -> Iterator[None]:
    """Mark a wait on the peers that is not a torch collective (the launcher's
    rendezvous: the store, the backend's agreement, ``init_process_group``) as one."""
    if _state is None:
        yield
        return
    _state.depth += 1
    _state.set(FIRST_COLLECTIVE + COLLECTIVES.index(name))
    try:
        yield
    finally:
        _state.depth -= 1
        _state.set(WORKING)


def mark_returned() -> None:
    """The rank's function returned: it now waits for its peers (not a stall by itself)."""
    if _state is not None:
        _state.set(RETURNED)


