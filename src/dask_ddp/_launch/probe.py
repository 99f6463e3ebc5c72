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

Collectives reached without the Python API (DDP's gradient all-reduce inside
``backward()``) are not seen: a rank waiting there counts as working.
"""

from __future__ import annotations

import contextlib
import functools
import mmap
import os
import signal
import struct
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

# -------------------------------------------------------------------------- rank side


class _State:
    """The rank's side of the state file."""

    def __init__(self, path: str) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.ftruncate(fd, _LAYOUT.size)
            self.map = mmap.mmap(fd, _LAYOUT.size)
        finally:
            os.close(fd)
        self.changes = 0
        self.depth = 0
        self.set(WORKING)

    def set(self, state: int) -> None:
        self.changes += 1
        _LAYOUT.pack_into(self.map, 0, self.changes, time.monotonic(), state)

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


_state: _State | None = None
_stacks_file: Any = None


def install(workdir: str) -> None:
    """In the rank process, before the user's function: track collectives, answer the
    stacks signal."""
    global _state, _stacks_file
    import faulthandler

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
        if self.map is None:
            try:
                with open(self.path, "rb") as f:
                    self.map = mmap.mmap(f.fileno(), _LAYOUT.size, access=mmap.ACCESS_READ)
            except (OSError, ValueError):
                return None
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
