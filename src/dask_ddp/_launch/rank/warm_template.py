"""The template process of warm rank starts, and what crosses its sockets (internal).

``python -m dask_ddp._launch.rank.warm_template CONTROL_FD WORKER_PID`` runs :func:`main` here: it
imports what a rank imports, then forks a rank for each :class:`StartRequest` the worker
sends, reports each rank's exit (:class:`Reply`) without reaping it, and reaps it once
told (:class:`Reap`). The worker's side, and why it is built so:
:mod:`dask_ddp._launch.worker.warm`.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
import selectors
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Mapping

from dask_ddp._launch.wire.entry_points import RANK_MODULE
from dask_ddp._launch.wire.warm_protocol import Reap, Reply, StartRequest, recv, send

#: How often the template looks at its parent.
PARENT_POLL_S = 0.5
_PR_SET_NAME = 15


# -- the template -------------------------------------------------------------------------------

@dataclasses.dataclass
class _Rank:
    """A forked rank, as its template tracks it."""

    conn: socket.socket | None
    code: int | None = None      # its exit status once it exited (not reaped yet)
    reap_asked: bool = False


def _import_all() -> float:
    """What a rank imports before the user's function; returns the seconds it took."""
    t0 = time.perf_counter()
    import cloudpickle  # noqa: F401
    import torch
    import torch.distributed  # noqa: F401

    # (The dask_ddp package comes with them: user code names it, rank_info, report.)
    from dask_ddp._launch.rank import main, probe  # noqa: F401

    assert not torch.cuda.is_initialized()
    return time.perf_counter() - t0


def _stop_blas_threads() -> None:
    """Shut down OpenBLAS's thread pool (numpy starts it at import; a fork would copy a
    process with those threads). OpenBLAS starts it again at a child's first BLAS call."""
    with contextlib.suppress(OSError):
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "openblas" in line.lower()}
        for path in paths:
            with contextlib.suppress(OSError, AttributeError):
                ctypes.CDLL(path).blas_thread_shutdown_()


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def _unsafe_to_fork() -> str | None:
    """Why this template must not fork now, or ``None``."""
    import torch

    if torch.cuda.is_initialized():
        return "CUDA is initialised in the template"
    n = _threads()
    if n != 1:
        return f"the template runs {n} threads"
    return None


def serve(control: socket.socket, parent: int) -> None:
    """The template's loop: fork ranks on request, report their exits, reap when told."""
    sel = selectors.DefaultSelector()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    sel.register(control, selectors.EVENT_READ, None)
    sel.register(wake_r, selectors.EVENT_READ, None)
    ranks: dict[int, _Rank] = {}
    try:
        while os.getppid() == parent:
            for key, _ in sel.select(PARENT_POLL_S):
                if key.fileobj is control:
                    request, fds = recv(control)
                    if request is None:
                        return  # the worker let go of this template
                    _start(request, fds, ranks, sel)
                elif key.fileobj == wake_r:
                    with contextlib.suppress(BlockingIOError):
                        os.read(wake_r, 512)
                else:
                    _from_worker(key.data, ranks, sel)
            _report_exits(ranks, sel)
    finally:
        for pid in ranks:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
        for pid in ranks:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)


def _start(request: StartRequest, fds: list[int], ranks: dict[int, _Rank],
           sel: selectors.BaseSelector) -> None:
    conn = socket.socket(fileno=fds[0])
    problem = _unsafe_to_fork()
    pid = 0
    if problem is None:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            try:
                _become_rank(request, fds[1:])
            except BaseException:
                with contextlib.suppress(Exception):
                    os.write(2, traceback.format_exc().encode())
            os._exit(1)
    for fd in fds[1:]:
        os.close(fd)
    if problem is not None:
        with contextlib.suppress(OSError):
            send(conn, Reply("refused", message=problem))
        conn.close()
        return
    ranks[pid] = _Rank(conn)
    sel.register(conn, selectors.EVENT_READ, pid)
    with contextlib.suppress(OSError):
        send(conn, Reply("started", pid=pid))


def _from_worker(pid: int, ranks: dict[int, _Rank], sel: selectors.BaseSelector) -> None:
    rank = ranks[pid]
    assert rank.conn is not None
    try:
        message, _ = recv(rank.conn)
    except OSError:
        message = None
    if isinstance(message, Reap):
        rank.reap_asked = True
    elif message is None:
        # The supervisor is gone: nobody will killpg the rank's group after its exit.
        sel.unregister(rank.conn)
        rank.conn.close()
        rank.conn = None
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)
    _report_exits(ranks, sel)


def _report_exits(ranks: dict[int, _Rank], sel: selectors.BaseSelector) -> None:
    for pid, rank in list(ranks.items()):
        if rank.code is None:
            info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            if info is None:
                continue
            rank.code = (info.si_status if info.si_code == os.CLD_EXITED
                         else -info.si_status)
            _tell(rank, Reply("exited", pid=pid, code=rank.code))
        if rank.reap_asked or rank.conn is None:
            os.waitpid(pid, 0)
            del ranks[pid]
            _tell(rank, Reply("reaped", pid=pid, code=rank.code))
            if rank.conn is not None:
                sel.unregister(rank.conn)
                rank.conn.close()


def _tell(rank: _Rank, reply: Reply) -> None:
    if rank.conn is not None:
        with contextlib.suppress(OSError):
            send(rank.conn, reply)


def _become_rank(request: StartRequest, fds: list[int]) -> None:
    """In the forked child: become the rank a cold start would have made, then run it."""
    import fcntl
    import random

    os.setsid()  # its own process group, whose id is its pid, as start_new_session=True
    from dask_ddp._launch.rank.tether import die_with_parent

    die_with_parent()
    if os.getppid() != int(request.env["DASK_DDP_SUPERVISOR_PID"]):
        os._exit(137)  # the template ended meanwhile
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    # The fds to their numbers (stdout, stderr, the channel's), every other one closed.
    channel_fd, stdout_fd, stderr_fd = fds
    base = max(request.channel_fd, 2) + 1
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, base) for fd in fds]
    os.dup2(high[1], 1)
    os.dup2(high[2], 2)
    os.dup2(high[0], request.channel_fd)
    os.closerange(3, request.channel_fd)
    os.closerange(request.channel_fd + 1, _max_fd())
    os.chdir(request.cwd)
    os.environ.clear()
    os.environ.update(request.env)
    workdir = request.workdir
    from dask_ddp._launch.rank import main as rank

    sys.argv = [rank.__file__, workdir]
    sys.orig_argv = [sys.executable, "-m", RANK_MODULE, workdir]
    sys.path[0] = os.getcwd()  # what ``python -m`` puts first
    random.seed()
    if "numpy.random" in sys.modules:
        sys.modules["numpy.random"].seed()
    if request.affinity is not None:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, request.affinity)
    _retitle(request.env.get("RANK", "?"), sys.orig_argv, request.env)
    rank.main(workdir)
    os._exit(0)


def _max_fd() -> int:
    try:
        return int(os.sysconf("SC_OPEN_MAX"))
    except (OSError, ValueError):
        return 65536


def _retitle(rank: str, argv: list[str], env: Mapping[str, str]) -> None:
    """Make this forked rank read as a cold-started one: its name (``ddp-rank-N``), and
    ``/proc/self/cmdline`` and ``/proc/self/environ`` rewritten in place (the areas of the
    template's own, which it left room in), as ``setproctitle`` does. Best effort."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_NAME, ctypes.c_char_p(f"ddp-rank-{rank}".encode()[:15]), 0, 0, 0)
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        arg_start, arg_end, env_start, env_end = (int(x) for x in fields[45:49])
    except (OSError, ValueError, IndexError):
        return
    # The kernel reads a title up to its NUL when the argv area's last byte is not NUL.
    title = " ".join(argv).encode()[:arg_end - arg_start - 2]
    room = arg_end - arg_start
    ctypes.memmove(arg_start, title + b"\0" * (room - len(title) - 1) + b" ", room)
    block = b""
    for k, v in env.items():
        entry = f"{k}={v}".encode() + b"\0"
        if len(block) + len(entry) >= env_end - env_start:
            break
        block += entry
    ctypes.memmove(env_start, block.ljust(env_end - env_start, b"\0"), env_end - env_start)


def main(argv: list[str]) -> None:
    """``python -m dask_ddp._launch.rank.warm_template CONTROL_FD WORKER_PID [ROOM]``."""
    from dask_ddp._launch.rank.tether import die_with_parent

    control_fd, parent = int(argv[0]), int(argv[1])
    problem = die_with_parent()
    if problem is not None:
        sys.stderr.write(f"{problem}\n")
    if os.getppid() != parent:
        sys.exit(137)  # the worker is gone already
    control = socket.socket(fileno=control_fd)
    seconds = _import_all()
    _stop_blas_threads()
    import gc

    gc.collect()
    gc.freeze()  # the ranks' collections leave the template's objects (and pages) alone
    send(control, Reply("ready", pid=os.getpid(), message=f"{seconds:.2f}"))
    serve(control, parent)


if __name__ == "__main__":
    main(sys.argv[1:3])
