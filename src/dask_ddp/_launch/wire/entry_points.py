"""Every entry into another process's code, named by its path (internal).

The client submits the workers' supervisor tasks, runs functions on workers and puts
plugins on the scheduler and the workers; a worker starts rank processes. None of them
imports the code it starts elsewhere: each names it here, and the process that runs it
imports it.

- A function run on a worker is a :class:`TaskRef`, ``"module:function"``. It pickles as
  its path and unpickles as the function itself (:func:`resolve`), so the worker (and the
  scheduler, which unpickles a task to read it) holds the real function, pickled by
  reference as before; called where it stands, it runs the function too.
- A plugin is a :class:`SchedulerPluginRef` or :class:`WorkerPluginRef`: Dask's
  ``register_plugin`` takes it for what it names (its name, ``idempotent``), and it
  unpickles on the scheduler or the worker as an instance of the plugin's class.
- A process a worker starts is ``python -m`` one of the modules below, or the tether
  script by its file.

Only paths under ``dask_ddp._launch.`` resolve: nothing from elsewhere is ever imported
by path.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin, WorkerPlugin

#: The package every path must be under.
ROOT = "dask_ddp._launch."


def _checked(path: str) -> tuple[str, str]:
    """``(module, name)`` of ``path``; raises :class:`ValueError` for a path that is not
    ``"dask_ddp._launch.<module>:<name>"``."""
    module, sep, name = path.partition(":")
    if not sep or not module.startswith(ROOT) or not name.isidentifier() or not all(
            part.isidentifier() for part in module.split(".")):
        raise ValueError(f"not a path to launcher code ({ROOT}<module>:<name>): {path!r}")
    return module, name


def resolve(path: str) -> Any:
    """The object at ``path`` (``"dask_ddp._launch.<module>:<name>"``), its module imported;
    raises :class:`ValueError` for any other path."""
    module, name = _checked(path)
    return getattr(importlib.import_module(module), name)


def path_of(func: Any) -> str:
    """``"module:name"`` of a function (or the path a :class:`TaskRef` names)."""
    if isinstance(func, TaskRef):
        return func.path
    return f"{getattr(func, '__module__', '')}:{getattr(func, '__qualname__', '')}"


class TaskRef:
    """A function of another process's room, by its path (see the module).

    Parameters
    ----------
    path
        ``"dask_ddp._launch.<module>:<function>"``.
    """

    __slots__ = ("path",)

    def __init__(self, path: str) -> None:
        _checked(path)
        self.path = path

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return resolve(self.path)(*args, **kwargs)

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (resolve, (self.path,))

    def __repr__(self) -> str:
        return f"TaskRef({self.path!r})"


def _plugin(path: str) -> Any:
    """A new instance of the plugin class at ``path`` (where a plugin reference unpickles)."""
    return resolve(path)()


class _PluginRef:
    """A plugin by the path of its class, and its ``name`` (see the module)."""

    idempotent = True

    def __init__(self, path: str, name: str) -> None:
        _checked(path)
        self.path = path
        self.name = name

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (_plugin, (self.path,))

    def install(self, client: Any) -> None:
        """Put the plugin on ``client``'s cluster: on its scheduler, or on every worker,
        present and future (idempotent: one cheap round trip)."""
        client.register_plugin(self)


class SchedulerPluginRef(_PluginRef, SchedulerPlugin):
    """A scheduler plugin by the path of its class (see the module)."""


class WorkerPluginRef(_PluginRef, WorkerPlugin):
    """A worker plugin by the path of its class (see the module)."""


# -- run on a worker ---------------------------------------------------------------------
#: The supervisor task of a rank (its key says the job and the rank).
RUN_RANK = TaskRef("dask_ddp._launch.worker.supervisor:run_rank")
#: ``client.run``: the live stacks of a job's ranks this worker supervises.
COLLECT_STACKS = TaskRef("dask_ddp._launch.worker.stacks:collect_stacks")
#: ``client.run``: SIGKILL a rank of a job, if it runs on this worker.
KILL_RANK = TaskRef("dask_ddp._launch.worker.rank_process:kill_rank")
#: ``client.run``: how many rank processes of a job still run on this worker.
LIVE_RANKS = TaskRef("dask_ddp._launch.worker.rank_process:live_ranks")

# -- plugins -------------------------------------------------------------------------------
#: Nothing of an ended job stays on the scheduler.
JOB_GUARD = SchedulerPluginRef("dask_ddp._launch.scheduler.job_guard:JobGuard",
                               "dask-ddp-job-guard")
#: The live jobs' stores, on the scheduler.
LIVE_STORES = SchedulerPluginRef("dask_ddp._launch.scheduler.live_stores:LiveStores",
                                 "dask-ddp-live-stores")
#: One log line per failed rank, not Dask's "Compute Failed" block.
QUIET_RANK_FAILURES = WorkerPluginRef("dask_ddp._launch.worker.quiet:QuietRankFailures",
                                      "dask-ddp-quiet-rank-failures")
#: A worker that joins removes the work dirs of dead ones.
WORKDIR_CLEANER = WorkerPluginRef("dask_ddp._launch.worker.workdir:WorkdirCleaner",
                                  "dask-ddp-workdir-cleaner")
#: A closing worker lets its live ranks leave first.
LEAVE_BEFORE_CLOSE = WorkerPluginRef("dask_ddp._launch.worker.live_leave:LeaveBeforeClose",
                                     "dask-ddp-live-leave")

# -- processes a worker starts -------------------------------------------------------------
#: A function's rank: ``python -m RANK_MODULE WORKDIR``.
RANK_MODULE = "dask_ddp._launch.rank.main"
#: A Python script's rank: ``python -m SCRIPT_MODULE SCRIPT ARGS...``.
SCRIPT_MODULE = "dask_ddp._launch.rank.script"
#: A warm template: ``python -m TEMPLATE_MODULE CONTROL_FD WORKER_PID [ROOM]``.
TEMPLATE_MODULE = "dask_ddp._launch.rank.warm_template"
#: ``python TETHER_SCRIPT CMD ...``: a command rank dies with its supervisor (run by its
#: file: it imports nothing of the package).
TETHER_SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                             "rank", "tether.py")
