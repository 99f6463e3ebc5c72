"""Warm rank starts: rank processes forked from a template that imported torch (internal).

A rank started cold (``python -m dask_ddp._launch.rank.main WORKDIR``) spends ~2 s starting
Python and importing torch before the user's function runs. A worker instead keeps a
*template* process, ``python -m dask_ddp._launch.rank.warm_template``, that has imported torch,
``torch.distributed``, cloudpickle and the rank module and then waits; each rank is a
``fork()`` of it that becomes exactly what the cold start would have been. This module
is the worker's side; the template's is :mod:`dask_ddp._launch.rank.warm_template`.

The template
    Started by the worker at its first function-mode rank (:func:`start_rank`), from a
    thread of the worker that lives as long as the worker (``PR_SET_PDEATHSIG`` follows
    the parent *thread*). Its environment is the rank environment's worker-given part
    (the worker's own variables, without the launcher's per-rank ones), so its imports see
    what a cold rank's would. It runs no torch op (no OpenMP or intra-op thread is ever
    started), never touches CUDA (checked before each fork), shuts down OpenBLAS's thread
    pool that numpy's import starts, and forks only with one thread (checked). It dies
    with its worker: ``PR_SET_PDEATHSIG``, a watch of its parent, the end of its control
    socket, and the worker's exit hook.

The template's key
    A template serves only ranks whose *import-relevant* environment equals its own: the
    variables CPython, glibc, the OpenMP/BLAS runtimes, numpy and torch read at start or
    import (:data:`IMPORT_PREFIXES`, :data:`IMPORT_NAMES`: ``PYTHON*``, ``LD_*``,
    ``MALLOC_*``, ``OMP_*``, ``MKL_*``, ``TORCH*``, ``PYTORCH_*``, locale, ``HOME``, ...;
    found by logging every ``getenv`` and ``os.environ`` read of those imports), plus
    ``DASK_DDP_SCHEDULER`` and the rank's working directory (``sys.path[0]``). A job whose
    key differs gets a template of its own, up to :data:`MAX_TEMPLATES` per worker.

Requests and the reaping protocol
    The worker talks to a template over a Unix socket pair (no path, no listening socket:
    nobody else can ask it to fork). A start request carries the rank's environment,
    working directory, work directory and CPU affinity; its file descriptors pass with
    ``SCM_RIGHTS``: a socket pair of the rank's own (its *rank connection*), the results
    channel's write end, and the stdout/stderr pipes (or the worker's own stdout/stderr).
    The forked child calls ``setsid()``, moves the descriptors to their numbers (the
    channel to the number named by ``DASK_DDP_CHANNEL_FD``, as a cold rank gets it) and
    closes every other one, changes directory, replaces ``os.environ`` wholesale, sets
    ``sys.argv``, re-seeds ``random``, names itself (``ddp-rank-N``; its
    ``/proc/PID/cmdline`` and ``/proc/PID/environ`` are rewritten in place to a cold
    rank's) and calls ``dask_ddp._launch.rank.main.main``. The template tells the worker the
    rank's exit status on its rank connection as soon as it exits, *without reaping it*
    (``waitid(WNOWAIT)``): the rank's pid, which is its process group's id, stays taken,
    so the supervisor's ``killpg`` after the exit reaches the rank's group and no
    stranger's. The template reaps the rank only when the worker says so (``wait()``), or
    when the rank connection closes (the supervisor is gone: the group is killed first).
    :class:`WarmProcess` is the worker's side: a ``subprocess.Popen`` with the same
    ``pid``, ``returncode``, ``poll``, ``wait`` and ``stdout``/``stderr``, and
    :meth:`WarmProcess.wait_exit` for "exited, not reaped yet".

Where ranks still start cold (``python -m dask_ddp._launch.rank.main`` or the user's command)
    - ``run_command``: the user's own program must be exec'd as it is.
    - Not Linux: the parent-death, ``prctl`` and ``/proc`` parts are Linux's.
    - ``dask-ddp.launch.warm-start: false`` (read on the worker).
    - A template that failed to start, died while asked for a rank, or refused a fork
      (more than one thread, CUDA initialised): logged once per worker with the reason,
      then every rank of that key starts cold. A template found dead before a request
      (the OOM killer takes templates and ranks before their worker,
      :mod:`~dask_ddp._launch.worker.oom`) is replaced by a new one.
    - A job whose key differs from every template's when the worker already has
      :data:`MAX_TEMPLATES` (each holds torch's memory).

What a warm rank shares with its template, unlike a cold one: the hash seed of ``str``
(randomised once per template unless ``PYTHONHASHSEED`` is set), and what torch and the
runtimes derived at import from the key's variables (equal by construction).
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import queue
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from typing import IO, Any

from dask_ddp._launch.wire.entry_points import RANK_MODULE, TEMPLATE_MODULE
from dask_ddp._launch.wire.warm_protocol import Reap, StartRequest, recv, send
from dask_ddp._launch.worker import at_exit, oom

logger = logging.getLogger(__name__)

#: Templates per worker; a job with another import environment then starts cold.
MAX_TEMPLATES = 2
#: Bound on a template's start (its imports), and on its answer to a start request.
START_TIMEOUT_S = 120.0
REQUEST_TIMEOUT_S = 30.0
#: Room in the template's argv and environ areas, that a forked rank rewrites in place
#: with its own command line and environment (as ps and /proc show them).
TITLE_ROOM = 512
ENVIRON_ROOM = 16384

#: Prefixes of the variables read while Python starts and torch, torch.distributed,
#: cloudpickle and the rank module are imported (logged through an LD_PRELOAD getenv
#: hook and a recording os.environ), generalised to their families.
IMPORT_PREFIXES = (
    "PYTHON", "LD_", "MALLOC_", "GLIBC", "LC_", "OMP_", "GOMP_", "KMP_", "MKL", "DNNL_",
    "ONEDNN_", "OPENBLAS_", "GOTO_", "NPY_", "NUMPY_", "TORCH", "PYTORCH_", "KINETO_",
    "CUDA_", "CUBLAS", "NVRTC_", "NV_", "I_MPI_", "MPI_", "OMPI_", "GFORTRAN_", "OPENSSL_",
    "FX_", "COMPILE_", "TRITON_",
)
IMPORT_NAMES = frozenset({
    "LANG", "LANGUAGE", "TZ", "HOME", "PATH", "TMPDIR", "TEMP", "TMP", "DASK_DDP_SCHEDULER",
})


def _per_rank_names() -> frozenset[str]:
    from dask_ddp._launch.worker.collective_dump import DUMP_VARIABLE
    from dask_ddp._launch.worker.rank_env import TORCHRUN_VARIABLES

    # CUDA_VISIBLE_DEVICES is rotated per rank process and read only when CUDA starts,
    # which the template never does. The collectives' dump file is in the job's own work
    # directory: were it in the key, no job would find the template an earlier job started.
    return TORCHRUN_VARIABLES | {"CUDA_VISIBLE_DEVICES", DUMP_VARIABLE}


def _import_relevant(name: str, per_rank: frozenset[str]) -> bool:
    if name in per_rank:
        return False
    return name in IMPORT_NAMES or name.startswith(IMPORT_PREFIXES)


def import_environment(env: Mapping[str, str]) -> dict[str, str]:
    """The part of a rank's environment its imports depend on: what a template must share."""
    per_rank = _per_rank_names()
    return {k: v for k, v in sorted(env.items()) if _import_relevant(k, per_rank)}


def template_key(env: Mapping[str, str], cwd: str) -> tuple[tuple[str, str], ...]:
    """The key of the template that may start a rank with ``env`` in ``cwd``."""
    return (("", cwd), *import_environment(env).items())


def template_environment(env: Mapping[str, str],
                         worker_env: Mapping[str, str]) -> dict[str, str]:
    """The environment a template starts with, for a rank's ``env``: its import-relevant
    part and whatever the rank takes from its worker as it is (not the launcher's or the
    job's own variables), so that the template's imports see what a cold rank's see."""
    per_rank = _per_rank_names()
    return {k: v for k, v in env.items()
            if _import_relevant(k, per_rank)
            or (worker_env.get(k) == v and k not in per_rank and not k.startswith("DASK_DDP_"))}


# -- the worker's side -----------------------------------------------------------------------

class WarmProcess(subprocess.Popen[bytes]):
    """A rank forked by a template, as the supervisor sees a ``Popen``.

    ``returncode`` is set once the rank was reaped (:meth:`wait`, :meth:`poll`);
    :meth:`wait_exit` waits for its exit without reaping it. Signals go to its pid.
    """

    def __init__(self, pid: int, conn: socket.socket, stdout: IO[bytes] | None,
                 stderr: IO[bytes] | None, args: list[str]) -> None:
        # Not Popen.__init__ (it would start a process); the attributes Popen's own
        # methods read are set here.
        self.args = args
        self.pid = pid
        self.returncode: int | None = None
        self.stdin = None
        self.stdout = stdout
        self.stderr = stderr
        self.universal_newlines = False
        self.encoding = self.errors = None
        self.text_mode = False
        self._child_created = False  # Popen.__del__ must not waitpid a stranger's child
        self._waitpid_lock = threading.Lock()
        self._conn = conn
        self._exit_code: int | None = None
        self._exited = threading.Event()
        self._reaped = threading.Event()
        self._reader = threading.Thread(target=self._read, name=f"dask-ddp-warm-{pid}",
                                        daemon=True)
        self._reader.start()

    def _read(self) -> None:
        with contextlib.suppress(OSError, EOFError, pickle.UnpicklingError):
            while True:
                reply, _ = recv(self._conn)
                if reply is None:
                    break
                if reply.kind in ("exited", "reaped"):
                    self._exit_code = reply.code
                    self._exited.set()
                if reply.kind == "reaped":
                    break
        if self._exit_code is None:
            # The template died: the rank died with it (its parent-death signal) and was
            # reaped by whoever inherited it.
            logger.warning("rank process %d: its warm template ended before it reported "
                           "the rank's exit", self.pid)
            self._exit_code = -signal.SIGKILL
            self._exited.set()
        self.returncode = self._exit_code
        self._reaped.set()
        with contextlib.suppress(OSError):
            self._conn.close()

    def wait_exit(self, timeout: float | None) -> bool:
        """Wait up to ``timeout`` seconds (``None``: for good) for the rank's exit, without
        reaping it: its pid (its process group's id) stays taken. True once it exited."""
        return self._exited.wait(timeout)

    def poll(self) -> int | None:
        if self._exited.is_set():
            return self.wait()
        return None

    def wait(self, timeout: float | None = None) -> int:
        """Reap the rank (after its exit) and return its exit code, as ``Popen.wait``."""
        if not self._reaped.is_set():
            if not self._exited.wait(timeout):
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            with contextlib.suppress(OSError):
                send(self._conn, Reap())
            # The template reaps at once once asked (the rank has exited).
            if not self._reaped.wait(REQUEST_TIMEOUT_S if timeout is None else timeout):
                if timeout is not None:
                    raise subprocess.TimeoutExpired(self.args, timeout)
                # Its exit is known; left unreaped, its pid cannot be reused meanwhile.
                logger.warning("rank process %d: its warm template did not reap it within "
                               "%.0f s", self.pid, REQUEST_TIMEOUT_S)
                self.returncode = self._exit_code
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if not self._exited.is_set():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def __del__(self) -> None:  # Popen's would track a child that is not ours
        pass


class _Template:
    """One template process of this worker and the socket to it."""

    def __init__(self, key: tuple[tuple[str, str], ...]) -> None:
        self.key = key
        self.proc: subprocess.Popen[bytes] | None = None
        self.control: socket.socket | None = None
        self.ready = threading.Event()
        self.problem: str | None = None  # why it cannot serve (then ranks start cold)
        self.lock = threading.Lock()
        self.stderr_tail: list[str] = []

    def start(self, env: Mapping[str, str], cwd: str) -> None:
        """Start the process and wait for its imports (sets :attr:`problem` on failure)."""
        try:
            self._start(env, cwd)
        except Exception as exc:
            self.problem = f"it could not start: {exc}"
            self.stop()
        finally:
            self.ready.set()

    def _start(self, env: Mapping[str, str], cwd: str) -> None:
        score = oom.victim_score()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        environment = dict(template_environment(env, os.environ))
        environment["DASK_DDP_WARM_ROOM"] = " " * ENVIRON_ROOM
        argv = [sys.executable, "-m", TEMPLATE_MODULE, str(theirs.fileno()),
                str(os.getpid()), " " * TITLE_ROOM]
        try:
            self.proc = _in_launcher_thread(lambda: subprocess.Popen(
                argv, env=environment, cwd=cwd, pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                start_new_session=True))
        finally:
            theirs.close()
        oom.prefer_as_victim(self.proc.pid, score)  # as it imports; its ranks inherit it
        self.control = ours
        threading.Thread(target=self._log_stderr, name="dask-ddp-warm-stderr",
                         daemon=True).start()
        ours.settimeout(START_TIMEOUT_S)
        try:
            reply, _ = recv(ours)
        except TimeoutError:
            raise RuntimeError(f"no answer within {START_TIMEOUT_S:.0f} s") from None
        if reply is None or reply.kind != "ready":
            self.proc.wait(5)
            tail = "\n".join(self.stderr_tail[-10:])
            raise RuntimeError(f"it exited with code {self.proc.returncode}"
                               + (f":\n{tail}" if tail else ""))
        logger.info("warm template %d ready (imports took %s s)", self.proc.pid,
                    reply.message)

    def _log_stderr(self) -> None:
        proc = self.proc
        assert proc is not None and proc.stderr is not None
        with proc.stderr:
            for raw in iter(proc.stderr.readline, b""):
                line = raw.decode(errors="replace").rstrip("\n")
                self.stderr_tail = [*self.stderr_tail[-29:], line]
                logger.warning("warm template %d: %s", proc.pid, line)
        proc.wait()  # reaped here: it ended

    def start_rank(self, request: StartRequest, fds: list[int]) -> WarmProcess | str:
        """Ask the template to fork a rank; the process, or why it could not."""
        assert self.control is not None and self.proc is not None
        if self.proc.poll() is not None:
            return f"it exited with code {self.proc.returncode}"
        conn, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            with self.lock:
                send(self.control, request, [theirs.fileno(), *fds])
        except OSError as exc:
            conn.close()
            return f"it does not take requests any more ({exc})"
        finally:
            theirs.close()
        conn.settimeout(REQUEST_TIMEOUT_S)
        try:
            reply, _ = recv(conn)
        except (OSError, TimeoutError) as exc:
            reply, problem = None, f"no answer to a start request ({exc})"
        else:
            problem = "it ended while starting a rank"
        if reply is not None and reply.kind == "refused":
            problem = f"it refused to fork: {reply.message}"
        if reply is None or reply.kind != "started":
            conn.close()
            return problem
        conn.settimeout(None)
        return WarmProcess(reply.pid, conn, None, None,
                           [sys.executable, "-m", RANK_MODULE, request.workdir])

    def died(self) -> bool:
        """Whether a template that started and served died since (killed: by the OOM
        killer, by hand). One that failed keeps its :attr:`problem`: it is not retried."""
        return (self.ready.is_set() and self.problem is None and self.proc is not None
                and self.proc.poll() is not None)

    def stop(self) -> None:
        """End the template (its ranks die with it)."""
        if self.control is not None:
            with contextlib.suppress(OSError):
                self.control.close()
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(OSError):
                self.proc.kill()


_templates: dict[tuple[tuple[str, str], ...], _Template] = {}
_templates_lock = threading.Lock()
_logged: set[str] = set()


def _log_once(what: str) -> None:
    with _templates_lock:
        if what in _logged:
            return
        _logged.add(what)
    logger.warning("%s; its ranks start cold", what)


def enabled() -> bool:
    """Whether ranks of this worker may start warm (Linux, ``dask-ddp.launch.warm-start``)."""
    if not sys.platform.startswith("linux"):
        return False
    from dask_ddp import _config

    return _config.flag("dask-ddp.launch.warm-start")


def start_rank(env: Mapping[str, str], cwd: str, workdir: str, channel_fd: int,
               capture_output: bool) -> WarmProcess | None:
    """Start a function-mode rank from this worker's template for ``env``; ``None`` when it
    must start cold (see the module's docstring for when).

    ``env`` is the rank's whole environment (``DASK_DDP_CHANNEL_FD`` naming
    ``channel_fd``, the write end of its results channel, which stays the caller's to
    close); ``DASK_DDP_SUPERVISOR_PID`` is set to the template's pid, the rank's parent.
    The rank's stdout and stderr are pipes (``stdout``/``stderr`` of the result) when
    ``capture_output``, else this worker's own.
    """
    if not enabled():
        return None
    template = _template_for(template_key(env, cwd), env, cwd)
    if template is None:
        return None
    assert template.proc is not None
    env = {**env, "DASK_DDP_SUPERVISOR_PID": str(template.proc.pid)}
    try:
        affinity: tuple[int, ...] | None = tuple(sorted(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        affinity = None
    request = StartRequest(env=env, cwd=cwd, workdir=workdir, channel_fd=channel_fd,
                           affinity=affinity)
    pipes = [os.pipe(), os.pipe()] if capture_output else []
    fds = [channel_fd, *(w for _, w in pipes)] if pipes else [channel_fd, 1, 2]
    try:
        proc = template.start_rank(request, fds)
    finally:
        for _, w in pipes:
            os.close(w)
    if isinstance(proc, str):
        for r, _ in pipes:
            os.close(r)
        template.problem = proc
        _log_once(f"the warm template {template.proc.pid} of this worker cannot start "
                  f"ranks: {proc}")
        return None
    if pipes:
        proc.stdout = open(pipes[0][0], "rb")  # noqa: SIM115 - the supervisor's pump closes it
        proc.stderr = open(pipes[1][0], "rb")  # noqa: SIM115
    return proc


def _template_for(key: tuple[tuple[str, str], ...], env: Mapping[str, str],
                  cwd: str) -> _Template | None:
    """The ready template for ``key``, started if need be; ``None``: start cold."""
    with _templates_lock:
        template = _templates.get(key)
        if template is not None and template.died():
            assert template.proc is not None  # died() says it ran
            logger.warning("warm template %d of this worker ended (exit code %s); a new "
                           "one starts for the next rank", template.proc.pid,
                           template.proc.returncode)
            template.stop()  # its control socket
            del _templates[key]
            template = None
        starting = template is None and len(_templates) < MAX_TEMPLATES
        if starting:
            template = _templates[key] = _Template(key)
    if template is None:
        _log_once(f"this worker has {MAX_TEMPLATES} warm templates already, none for the "
                  "import environment of a new job")
        return None
    if starting:
        at_exit.once(stop_all)
        template.start(env, cwd)
        if template.problem is not None:
            _log_once(f"the warm template of this worker: {template.problem}")
    template.ready.wait()
    return None if template.problem is not None else template


def template_pids() -> list[int]:
    """The pids of this worker's live templates."""
    with _templates_lock:
        return [t.proc.pid for t in _templates.values()
                if t.proc is not None and t.proc.returncode is None]


def stop_all() -> None:
    """End this worker's templates (at its exit)."""
    with _templates_lock:
        templates = list(_templates.values())
        _templates.clear()
    for template in templates:
        template.stop()


# The thread templates are started from: PR_SET_PDEATHSIG fires when the parent *thread*
# ends, and a supervisor's thread ends with its task; this one lives as long as the worker.
_launcher_queue: queue.SimpleQueue[tuple[Callable[[], Any], queue.SimpleQueue[Any]]] | None = None
_launcher_lock = threading.Lock()


def _in_launcher_thread(fn: Callable[[], Any]) -> Any:
    global _launcher_queue
    with _launcher_lock:
        if _launcher_queue is None:
            _launcher_queue = queue.SimpleQueue()
            threading.Thread(target=_launcher_loop, args=(_launcher_queue,), daemon=True,
                             name="dask-ddp-warm-launcher").start()
    answer: queue.SimpleQueue[Any] = queue.SimpleQueue()
    _launcher_queue.put((fn, answer))
    ok, value = answer.get()
    if not ok:
        raise value
    return value


def _launcher_loop(requests: queue.SimpleQueue[tuple[Callable[[], Any],
                                                     queue.SimpleQueue[Any]]]) -> None:
    while True:
        fn, answer = requests.get()
        try:
            answer.put((True, fn()))
        except BaseException as exc:
            answer.put((False, exc))
