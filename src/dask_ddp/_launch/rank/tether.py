"""``python tether.py CMD ARGS...``: exec CMD so that it dies with its supervisor (internal).

Run as a script (standard library only, no package import, ~20 ms): it asks the kernel
to SIGKILL this process when the supervisor's thread ends (``PR_SET_PDEATHSIG``, kept
across ``exec``), checks the supervisor is still its parent (else the worker died
already), then replaces itself with the user's command. A rank started by
``run_command`` so never outlives a worker killed with SIGKILL.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def die_with_parent() -> str | None:
    """Ask the kernel to SIGKILL this process when its parent's thread ends.

    Returns ``None``, or why it could not (not Linux, or prctl failed). The setting is
    kept across ``exec``; the rank process (:mod:`dask_ddp._launch.rank.main`) sets it too.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
            return f"prctl(PR_SET_PDEATHSIG) failed: {os.strerror(ctypes.get_errno())}"
    except (OSError, AttributeError) as exc:  # no libc prctl (not Linux)
        return f"prctl(PR_SET_PDEATHSIG) unavailable: {exc}"
    return None


def main(argv: list[str]) -> None:
    if not argv:
        sys.stderr.write("usage: python tether.py CMD [ARGS...] (started by dask-ddp)\n")
        sys.exit(2)
    problem = die_with_parent()
    if problem is not None:
        sys.stderr.write(f"dask-ddp: {problem}\n")
    expected = os.environ.get("DASK_DDP_SUPERVISOR_PID")
    if expected is not None and os.getppid() != int(expected):
        sys.exit(137)  # the worker is gone already
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        sys.stderr.write(f"dask-ddp: cannot run {argv[0]!r}: {exc}\n")
        sys.exit(127)


if __name__ == "__main__":
    main(sys.argv[1:])
