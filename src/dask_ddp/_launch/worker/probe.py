"""What a rank is doing, seen from its supervisor: its collective state and live stacks
(internal).

The reader's side of the probe the rank installs (:mod:`dask_ddp._launch.rank.probe`,
which says how it works): :class:`RankState` reads the rank's state file at each poll of
its supervisor, :func:`read_stacks` signals the rank and reads the stacks it wrote.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import time
from typing import Any

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
from dask_ddp._states import RankActivity


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
            changes, since, state = LAYOUT.unpack_from(self.map, 0)
            if LAYOUT.unpack_from(self.map, 0)[0] == changes:
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
        start = C10D_AT + C10D_HEAD.size
        for _ in range(5):  # a read racing the thread's write: read again
            changes, length = C10D_HEAD.unpack_from(self.map, C10D_AT)
            if changes == 0 or length > C10D_MAX:
                return None
            blob = self.map[start:start + length]
            if changes % 2 == 0 and C10D_HEAD.unpack_from(self.map, C10D_AT)[0] == changes:
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
                    self.map = mmap.mmap(f.fileno(), FILE_SIZE, access=mmap.ACCESS_READ)
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
