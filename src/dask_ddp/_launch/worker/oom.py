"""Whether the kernel's OOM killer ended a rank, and the memory limit it hit (internal).

A rank killed by SIGKILL is most often out of memory: its memory cgroup's limit (a SLURM
job's, a container's, a Kubernetes pod's) or the whole machine's. The kernel counts its OOM
kills: per cgroup (``oom_kill`` in cgroup v2's ``memory.events``, in v1's
``memory.oom_control``) and for the machine (``oom_kill`` in ``/proc/vmstat``). A
:class:`MemoryWatch` reads those counters when the rank starts and again when it died, so
the error can say "killed by the kernel's OOM killer" with the limit, instead of a bare
SIGKILL. Reading them is a few small files once per rank; nothing here needs privileges.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass

logger = logging.getLogger(__name__)

_CGROUP_ROOT = "/sys/fs/cgroup"
_NO_LIMIT = 1 << 60  # cgroup v1 writes ~2^63 for "no limit"


@dataclass
class MemoryWatch:
    """The OOM-kill counters that concern one process, as they stood at its start."""

    cgroup: str | None  # the memory cgroup's folder, when one could be read
    cgroup_kills: int
    machine_kills: int

    @classmethod
    def of(cls, pid: int) -> MemoryWatch:
        """The counters for process ``pid`` now (call it while the process lives)."""
        folder = _memory_cgroup(pid)
        return cls(folder, _cgroup_kills(folder), _machine_kills())

    def oom_reason(self) -> str | None:
        """Why the process died, when an OOM kill was counted since :meth:`of`."""
        if self.cgroup is not None and _cgroup_kills(self.cgroup) > self.cgroup_kills:
            limit = _limit(self.cgroup)
            what = f"its memory limit of {_size(limit)}" if limit else "its memory limit"
            return (f"killed by the kernel's OOM killer: the memory cgroup {self.cgroup} "
                    f"hit {what} (the worker's memory: a SLURM --mem, a container or "
                    "pod limit)")
        if _machine_kills() > self.machine_kills:
            return ("probably killed by the kernel's OOM killer: the machine ran out of "
                    "memory while the rank ran (an OOM kill was counted in /proc/vmstat)")
        return None


def _memory_cgroup(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:  # v1: "4:memory:/path"; checked first (a hybrid host has both)
        parts = line.split(":", 2)
        if len(parts) == 3 and "memory" in parts[1].split(","):
            folder = os.path.join(_CGROUP_ROOT, "memory", parts[2].lstrip("/"))
            if os.path.exists(os.path.join(folder, "memory.oom_control")):
                return folder
    for line in lines:  # v2: "0::/path"
        parts = line.split(":", 2)
        if len(parts) == 3 and parts[0] == "0" and parts[1] == "":
            folder = os.path.join(_CGROUP_ROOT, parts[2].lstrip("/"))
            if os.path.exists(os.path.join(folder, "memory.events")):
                return folder
    return None


def _counter(path: str, name: str) -> int:
    with contextlib.suppress(OSError, ValueError):
        with open(path) as f:
            for line in f:
                key, _, value = line.partition(" ")
                if key == name:
                    return int(value)
    return 0


def _cgroup_kills(folder: str | None) -> int:
    if folder is None:
        return 0
    events = os.path.join(folder, "memory.events")
    if os.path.exists(events):
        return _counter(events, "oom_kill")
    return _counter(os.path.join(folder, "memory.oom_control"), "oom_kill")


def _machine_kills() -> int:
    return _counter("/proc/vmstat", "oom_kill")


def _limit(folder: str) -> int | None:
    for name in ("memory.max", "memory.limit_in_bytes"):
        with contextlib.suppress(OSError, ValueError):
            with open(os.path.join(folder, name)) as f:
                text = f.read().strip()
            if text == "max":
                return None
            value = int(text)
            return value if value < _NO_LIMIT else None
    return None


def _size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def victim_score() -> int | None:
    """The ``oom_score_adj`` for the ranks and warm templates this worker starts: the
    worker's own plus ``dask-ddp.launch.oom-score-adj``, at most 1000 (``None``: leave
    theirs as inherited). Read before a process starts: a bad value raises
    :class:`ValueError` naming the key, and nothing is left running.

    Without it the kernel takes the largest process of the cgroup, and when the memory of
    a rank it killed is not freed yet, the next allocation there (often the worker's)
    kills again: the worker, whose supervisor would have named the rank and its limit."""
    from dask_ddp import _config

    key = "dask-ddp.launch.oom-score-adj"
    value = _config.get(key)
    try:
        adj = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{key} must be an integer from 0 to 1000, got {value!r}") from None
    if not 0 <= adj <= 1000 or isinstance(value, float) and value != adj:
        raise ValueError(f"{key} must be an integer from 0 to 1000, got {value!r}")
    if adj == 0:
        return None
    try:
        with open("/proc/self/oom_score_adj") as f:
            own = int(f.read())
    except (OSError, ValueError):
        return None  # not Linux: nothing to set
    return min(1000, own + adj)


def prefer_as_victim(pid: int, score: int | None) -> None:
    """Set process ``pid``'s ``oom_score_adj`` to ``score`` (from :func:`victim_score`;
    ``None``: nothing). Raising a score needs no privilege; where the file cannot be
    written (a read-only /proc) it is left as it is."""
    if score is None:
        return
    try:
        with open(f"/proc/{pid}/oom_score_adj", "w") as f:
            f.write(str(score))
    except OSError as exc:
        logger.debug("the OOM score of process %d is left as it is: %s", pid, exc)
