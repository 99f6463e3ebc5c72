"""What a rank is doing, seen from its supervisor: its collective state and live stacks.

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
import signal
import struct
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from dask_ddp._states import RankActivity

#: The collectives of ``torch.distributed`` whose calls are tracked.
COLLECTIVES = (
    "all_reduce", "all_gather", "all_gather_object", "all_gather_into_tensor",
    "all_to_all", "all_to_all_single", "barrier", "monitored_barrier", "broadcast",
    "broadcast_object_list", "gather", "gather_object", "reduce", "reduce_scatter",
    "reduce_scatter_tensor", "scatter", "scatter_object_list", "send", "recv",
    "batch_isend_irecv", "rendezvous",
)
#: States in the file: working (in the function, outside a collective), returned (the
#: function returned; the rank waits for its peers), then one per collective.
WORKING, RETURNED, FIRST_COLLECTIVE = 0, 1, 2
STATE_FILE = "probe.bin"
STACKS_FILE = "stacks.txt"
STACKS_SIGNAL = signal.SIGUSR2
_LAYOUT = struct.Struct("<QdI4x")  # change counter, since (CLOCK_MONOTONIC), state
#: The rank's latest c10d collective: a counter (odd while being written), the length of
#: the JSON that follows, at this offset of the file.
_C10D_AT = 64
_C10D_HEAD = struct.Struct("<QI4x")
_C10D_MAX = 4096
_FILE_SIZE = _C10D_AT + _C10D_HEAD.size + _C10D_MAX
#: How often the probe's thread reads the flight recorder (seconds).
C10D_POLL_S = 0.5

# -------------------------------------------------------------------------- rank side


class _State:
    """The rank's side of the state file."""

    def __init__(self, path: str) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.ftruncate(fd, _FILE_SIZE)
            self.map = mmap.mmap(fd, _FILE_SIZE)
        finally:
            os.close(fd)
        self.changes = 0
        self.depth = 0
        self.c10d_changes = 0
        self.set(WORKING)

    def set(self, state: int) -> None:
        self.changes += 1
        _LAYOUT.pack_into(self.map, 0, self.changes, time.monotonic(), state)

    def set_c10d(self, record: dict[str, Any]) -> None:
        """Write the rank's latest c10d collective (one writer: the probe's thread)."""
        blob = json.dumps(record, separators=(",", ":")).encode()[:_C10D_MAX]
        self.c10d_changes += 1  # odd: a reader retries
        _C10D_HEAD.pack_into(self.map, _C10D_AT, self.c10d_changes, len(blob))
        start = _C10D_AT + _C10D_HEAD.size
        self.map[start:start + len(blob)] = blob
        self.c10d_changes += 1
        _C10D_HEAD.pack_into(self.map, _C10D_AT, self.c10d_changes, len(blob))

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

    from dask_ddp._launch.worker.rank_env import collective_defaults

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


# -------------------------------------------------------------------- supervisor side


class RankState:
    """What the supervisor reads of its rank: ``(activity, collective, seconds in it)``."""

    def __init__(self, workdir: str) -> None:
        self.path = os.path.join(workdir, STATE_FILE)
        self.map: mmap.mmap | None = None

    def read(self) -> tuple[RankActivity, str, float] | None:
        """``(activity, collective, seconds in it)``: :attr:`RankActivity.WORKING`,
        :attr:`RankActivity.RETURNED`, or :attr:`RankActivity.BLOCKED` with the name of the
        collective the rank is inside (its supervisor reports it as blocked only once it
        waited there long enough); ``None`` when the rank has not written its file (not
        started yet, or a command)."""
        if not self._open():
            return None
        assert self.map is not None
        for _ in range(3):  # a read racing a write: read again
            changes, since, state = _LAYOUT.unpack_from(self.map, 0)
            if _LAYOUT.unpack_from(self.map, 0)[0] == changes:
                break
        age = max(0.0, time.monotonic() - since)
        if state == WORKING:
            return (RankActivity.WORKING, "", age)
        if state == RETURNED:
            return (RankActivity.RETURNED, "", age)
        index = state - FIRST_COLLECTIVE
        name = COLLECTIVES[index] if 0 <= index < len(COLLECTIVES) else f"collective {index}"
        return (RankActivity.BLOCKED, name, age)

    def read_c10d(self) -> dict[str, Any] | None:
        """The rank's latest c10d collective as its probe's thread last wrote it
        (:func:`latest_c10d`'s plain data), or ``None`` (none yet, or no flight recorder)."""
        if not self._open():
            return None
        assert self.map is not None
        start = _C10D_AT + _C10D_HEAD.size
        for _ in range(5):  # a read racing the thread's write: read again
            changes, length = _C10D_HEAD.unpack_from(self.map, _C10D_AT)
            if changes == 0 or length > _C10D_MAX:
                return None
            blob = self.map[start:start + length]
            if changes % 2 == 0 and _C10D_HEAD.unpack_from(self.map, _C10D_AT)[0] == changes:
                try:
                    record = json.loads(blob)
                except ValueError:
                    return None
                return record if isinstance(record, dict) else None
            time.sleep(0.001)
        return None

    def _open(self) -> bool:
        if self.map is None:
            try:
                with open(self.path, "rb") as f:
                    self.map = mmap.mmap(f.fileno(), _FILE_SIZE, access=mmap.ACCESS_READ)
            except (OSError, ValueError):
                return False
        return True

    def close(self) -> None:
        if self.map is not None:
            with contextlib.suppress(Exception):
                self.map.close()
            self.map = None


def is_stopped(pid: int) -> bool:
    """True when process ``pid`` is stopped (SIGSTOP, a debugger)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    # "pid (comm) S ...": the state follows the last ')' (comm may hold one).
    fields = stat[stat.rfind(b")") + 2:].split()
    return bool(fields) and fields[0] in (b"T", b"t")


def read_stacks(pid: int, workdir: str, timeout: float) -> str:
    """The Python stack of every thread of rank process ``pid`` (blocking, up to
    ``timeout`` seconds)."""
    path = os.path.join(workdir, STACKS_FILE)
    if is_stopped(pid):
        return "(no stack: the rank process is stopped (SIGSTOP or a debugger); it is frozen)"
    if not os.path.exists(path):
        return "(no stack: the rank process does not answer stack requests: a command, " \
               "or it has not started its Python yet)"
    try:
        return _ask_stacks(pid, path, timeout)
    except FileNotFoundError:  # its job ended meanwhile: the supervisor removed the dir
        return "(no stack: the rank's work dir is gone: its job ended)"


def _ask_stacks(pid: int, path: str, timeout: float) -> str:
    """Signal the rank, then read ``path`` once its size stood still for 0.2 s."""
    with open(path, "r+") as f:
        f.truncate(0)
    try:
        os.kill(pid, STACKS_SIGNAL)
    except ProcessLookupError:
        return "(no stack: the rank process has exited)"
    deadline = time.monotonic() + timeout
    size, stable_since = -1, time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now_size = os.path.getsize(path)
        if now_size != size:
            size, stable_since = now_size, time.monotonic()
        elif size > 0 and time.monotonic() - stable_since >= 0.2:
            break
    with open(path, errors="replace") as f:
        text = f.read()
    return text.rstrip() or f"(no stack: the rank process did not answer within {timeout:g} s)"
