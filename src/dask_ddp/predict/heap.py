"""glibc's heap kept for reuse while a worker runs a model (Linux with glibc only).

Dask's nanny starts its workers with ``MALLOC_TRIM_THRESHOLD_=65536``
(``distributed.nanny.pre-spawn-environ``). Setting any of glibc's malloc thresholds turns
off their dynamic adjustment, so the mmap threshold stays at 128 KiB: every tensor larger
than that is a fresh ``mmap`` and its pages are faulted in and zeroed, then unmapped when
freed. torch's CPU allocator does not cache, so each activation of each batch pays that
again: a 32 -> 256 -> 256 -> 10 MLP's forward at 4096 rows a batch took 1.7x the CPU time
in a worker that it takes in a plain process. (A rank process of ``submit`` avoids it by
starting without the nanny's settings, :mod:`dask_ddp._launch.worker.rank_env`; ``predict`` runs
in the worker process itself.)

:func:`warm_heap` raises the mmap and trim thresholds while at least one ``predict`` task
of the process runs, so freed activations stay in the heap for the next batch, and when
the last task leaves restores the values the process started with and returns the free
heap to the kernel (``malloc_trim``), as the nanny's setting intends. A process whose
thresholds are dynamic (none set) is left alone: glibc already keeps such blocks.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import dataclasses
import functools
import logging
import os
import platform
import threading
from collections.abc import Iterator, Mapping

__all__ = ["HELD_MMAP_THRESHOLD", "HELD_TRIM_THRESHOLD", "Thresholds", "fixed_thresholds",
           "warm_heap"]

logger = logging.getLogger(__name__)

# mallopt's parameter numbers (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

#: The mmap threshold while a model runs: the largest glibc accepts on 64-bit (half its
#: 64 MiB arena heap), a 4096 x 2048 float32 activation.
HELD_MMAP_THRESHOLD = 32 << 20
#: The trim threshold while a model runs: free heap kept up to this much.
HELD_TRIM_THRESHOLD = 256 << 20

# glibc's defaults when a threshold is fixed but not given (malloc.c: DEFAULT_MMAP_THRESHOLD_MIN
# and DEFAULT_TRIM_THRESHOLD).
_DEFAULT_MMAP_THRESHOLD = 128 << 10
_DEFAULT_TRIM_THRESHOLD = 128 << 10

# The settings that fix the thresholds: environment variables and their GLIBC_TUNABLES names.
_FIXING = {"MALLOC_TRIM_THRESHOLD_": "glibc.malloc.trim_threshold",
           "MALLOC_MMAP_THRESHOLD_": "glibc.malloc.mmap_threshold",
           "MALLOC_TOP_PAD_": "glibc.malloc.top_pad",
           "MALLOC_MMAP_MAX_": "glibc.malloc.mmap_max"}


@dataclasses.dataclass(frozen=True)
class Thresholds:
    """glibc's fixed mmap and trim thresholds, in bytes."""

    mmap: int
    trim: int


def _size(text: str | None) -> int | None:
    """A threshold as glibc reads it (a decimal, ``0x`` hex or octal number), or None."""
    if text is None:
        return None
    try:
        return int(text.strip(), 0)
    except ValueError:
        return None


def fixed_thresholds(environ: Mapping[str, str]) -> Thresholds | None:
    """The thresholds glibc keeps fixed in a process started with ``environ``, or None
    when it adjusts them itself (no threshold set)."""
    tunables = dict(item.partition("=")[::2]
                    for item in environ.get("GLIBC_TUNABLES", "").split(":") if item)
    if not any(v in environ or t in tunables for v, t in _FIXING.items()):
        return None

    def given(variable: str, default: int) -> int:
        # A GLIBC_TUNABLES entry wins over its variable, as in glibc.
        for text in (tunables.get(_FIXING[variable]), environ.get(variable)):
            value = _size(text)
            if value is not None:
                return value
        return default

    return Thresholds(given("MALLOC_MMAP_THRESHOLD_", _DEFAULT_MMAP_THRESHOLD),
                      given("MALLOC_TRIM_THRESHOLD_", _DEFAULT_TRIM_THRESHOLD))


@functools.cache
def _glibc() -> tuple[ctypes.CDLL, Thresholds] | None:
    """glibc and the thresholds this process started with, when they are fixed."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    started = fixed_thresholds(os.environ)
    if started is None:
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt.argtypes, libc.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
        libc.malloc_trim.argtypes, libc.malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
    except (OSError, AttributeError) as e:
        logger.debug("predict: glibc's mallopt is not reachable (%s); the heap is left as is", e)
        return None
    return libc, started


def _set(libc: ctypes.CDLL, to: Thresholds) -> None:
    # mallopt returns 0 for a value it refuses (the previous one stays): log, go on.
    if not (libc.mallopt(_M_MMAP_THRESHOLD, to.mmap) and libc.mallopt(_M_TRIM_THRESHOLD, to.trim)):
        logger.debug("predict: glibc refused the malloc thresholds %s", to)


_lock = threading.Lock()
_users = 0


@contextlib.contextmanager
def warm_heap() -> Iterator[None]:
    """glibc's thresholds raised while inside (a no-op where they are dynamic or there is no
    glibc); the process's own restored and the free heap trimmed when the last concurrent
    task leaves (the setting is per process, tasks share it)."""
    global _users
    found = _glibc()
    if found is None:
        yield
        return
    libc, started = found
    with _lock:
        if _users == 0:
            _set(libc, Thresholds(HELD_MMAP_THRESHOLD, HELD_TRIM_THRESHOLD))
        _users += 1
    try:
        yield
    finally:
        with _lock:
            _users -= 1
            if _users == 0:
                _set(libc, started)
                libc.malloc_trim(0)
