"""``python -m dask_ddp._launch.rank.script SCRIPT ARGS...``: a rank running a Python script
(``run_command``, ``dask-ddp run``), watched as a function's rank is (internal).

Installs the rank's probe (its collective state and live stacks, see
:mod:`dask_ddp._launch.rank.probe`) in the work directory the supervisor passes in
``DASK_DDP_WORKDIR``, then runs the script as ``python SCRIPT ARGS...`` would: as
``__main__``, with its own folder first on ``sys.path`` and ``sys.argv`` its arguments.

A job with ``recovery="live"`` (``dask-ddp run --recovery live``): the script's own
``init_process_group`` call makes the live group (reconfigurable, on the job's store on
the scheduler; :mod:`dask_ddp._launch.rank.live.group`) instead of torchrun's, with the script's
backend and timeout, and its ``destroy_process_group`` (or its exit) first waits until
the group's current members have all finished, as a function's ranks do (a script that
raised or exited non-zero does not wait; one that raised ends the job, as a function that
raised does, instead of reading as a lost rank). The script makes
its ``dask_ddp.Checkpointer(model, optimizer, loader=...)`` as a function would; a lost
peer then costs the survivors one step, not the job.
"""

from __future__ import annotations

import atexit
import logging
import os
import runpy
import socket
import sys
import traceback
from collections.abc import Callable
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

from dask_ddp._launch.wire.live_records import LiveStart

logger = logging.getLogger(__name__)


def main(argv: list[str]) -> None:
    if not argv:
        sys.stderr.write("usage: python -m dask_ddp._launch.rank.script SCRIPT [ARGS...] "
                         "(started by dask-ddp)\n")
        sys.exit(2)
    workdir = os.environ.get("DASK_DDP_WORKDIR")
    if workdir:
        from dask_ddp._launch.rank import probe

        try:
            probe.install(workdir)
        except Exception as exc:  # the script runs anyway, unwatched
            sys.stderr.write(f"dask-ddp: the rank's probe is not installed: {exc}\n")
    # Written by the supervisor when the policy regroups.
    live = LiveStart.read(workdir) if workdir else None
    finish = _live_group_for_the_script(live) if live is not None else None
    script = os.path.abspath(argv[0])
    sys.argv = list(argv)
    sys.path[0] = os.path.dirname(script)
    try:
        runpy.run_path(script, run_name="__main__")
        code = 0
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            sys.stderr.write(f"{exc.code}\n")
            code = 1
    except Exception as exc:
        traceback.print_exc()
        if finish is not None and workdir:
            # A live rank that raised ends the job, as a function's does: its report says
            # so (without one its exit would read as a lost rank, regrouped around).
            from dask_ddp._launch.wire.rank_report import RankReport, write_report

            write_report(workdir, RankReport.raised("run", exc, claimed=False))
        code = 1
    if code != 0 and finish is not None:
        # The live finish barrier waits for every member to finish: the others may be
        # blocked on this failed rank in a collective, which never comes.
        atexit.unregister(finish)
    _exit(code)


def _exit(code: int) -> None:
    """End as a function's rank does: atexit handlers run (the results channel flushes,
    the probe stops), then the process ends without tearing down torch's C++ state under
    threads still inside it ('terminate called without an active exception', SIGABRT, in
    about one script exit in a few hundred) and without waiting for threads a script
    left running."""
    sys.stdout.flush()
    sys.stderr.flush()
    atexit._run_exitfuncs()  # noqa: SLF001 (the exit handlers must run before os._exit, which skips them)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _live_group_for_the_script(live_start: LiveStart) -> Callable[[], None]:
    """Make the script's ``init_process_group`` start the live group (see the module);
    the finish barrier it runs at exit (``atexit``), which a failed rank drops."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    from dask_ddp._launch.rank.live import group as live
    from dask_ddp._launch.rank.main import finish_live, start_live

    my_rank, my_world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    real_init, real_destroy = c10d.init_process_group, c10d.destroy_process_group
    modules: tuple[Any, ...] = (dist, c10d)  # the names a script may call them by
    finished = False

    def finish() -> None:
        nonlocal finished
        if not finished and live.current() is not None and dist.is_initialized():
            finished = True
            finish_live()

    def init_process_group(backend: Any = None, init_method: Any = None,
                           timeout: timedelta | None = None, world_size: int = -1,
                           rank: int = -1, store: Any = None, **kwargs: Any) -> None:
        del init_method, store, kwargs  # the live group has its own store and rendezvous
        # The script's one call: the live group (which calls torch's own, as a later
        # call of the script does).
        for module in modules:
            module.init_process_group = real_init
        for name, given, mine in (("world_size", world_size, my_world),
                                  ("rank", rank, my_rank)):
            if given not in (-1, mine):
                raise ValueError(f"init_process_group({name}={given}) in a rank of a "
                                 f"dask-ddp job, whose {name} is {mine}")
        wait = timeout or timedelta(seconds=300)
        record = SimpleNamespace(backend=str(backend) if backend else "auto",
                                 rendezvous_timeout=wait.total_seconds(),
                                 worker=socket.gethostname())
        start_live(live_start, my_rank, my_world, record, {"timeout": wait})
        atexit.register(finish)  # a script that never destroys its group

    def destroy_process_group(group: Any = None) -> None:
        if group is None or group is dist.group.WORLD:
            finish()
        real_destroy(group)

    for module in modules:
        module.init_process_group = init_process_group
        module.destroy_process_group = destroy_process_group
    return finish


if __name__ == "__main__":
    main(sys.argv[1:])
