"""The rank process: ``python -m dask_ddp._launch.rank.main WORKDIR`` (internal).

Started by the supervisor task (:mod:`dask_ddp._launch.worker.supervisor`) with the torchrun-style
environment set. It loads the user's function from the launch record in ``WORKDIR`` (a
:class:`~dask_ddp._launch.wire.launch_record.LaunchRecord`, written by the supervisor), joins
the job's rendezvous store, agrees on the backend, calls ``init_process_group``, runs the
function, and leaves its supervisor a
:class:`~dask_ddp._launch.wire.rank_report.RankReport` in ``WORKDIR``: the pickled return
value, or the failing phase, the formatted traceback, the pickled exception and the
rank's verdict on it, decided here with the exception in hand: whether it came from a
lost peer (:func:`~dask_ddp._launch.wire.peer_loss.is_peer_error`, by its type), which its
supervisor reads instead of the error's text.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import time
import warnings
from datetime import timedelta
from typing import Any

from dask_ddp._launch.rank import gpu_placement
from dask_ddp._launch.wire.live_records import LiveStart
from dask_ddp._launch.wire.rank_report import RankReport, write_report

PARENT_POLL_S = 0.5


def _watch_parent() -> None:
    """Kill this rank's process group when its worker dies.

    The kernel sends SIGKILL when the supervisor's thread ends (``PR_SET_PDEATHSIG``), and
    a thread compares the parent with the supervisor's pid the launcher passed: a worker
    killed before this ran has already made the rank an orphan.
    """
    expected = int(os.environ.get("DASK_DDP_SUPERVISOR_PID", os.getppid()))
    from dask_ddp._launch.rank.tether import die_with_parent

    die_with_parent()  # best effort: the thread below covers a kernel without it

    def orphaned() -> bool:
        return os.getppid() != expected

    if orphaned():
        os.killpg(os.getpgrp(), signal.SIGKILL)

    def loop() -> None:
        while True:
            time.sleep(PARENT_POLL_S)
            if orphaned():
                os.killpg(os.getpgrp(), signal.SIGKILL)

    threading.Thread(target=loop, name="dask-ddp-parent-watch", daemon=True).start()


def _join_devices(requested: str, store: Any, rank: int, world: int,
                  init_kwargs: dict[str, Any]) -> str:
    """Place this rank on its GPU and agree on the job's backend, through the job's store.

    Every rank publishes its host and visible GPUs and computes the same placement and
    backend (:mod:`~dask_ddp._launch.rank.gpu_placement`); rank 0 gives the one warning when
    ``auto`` falls back to gloo. A rank with a GPU selects it (``torch.cuda.set_device``,
    and :data:`~dask_ddp._launch.rank.gpu_placement.DEVICE_ENV` for ``rank_info().device``);
    where CUDA tensors go through NCCL, ``init_kwargs`` gets ``device_id=`` (unless the
    user gave one), which binds the group to that GPU and forms the NCCL communicator at
    once. A gloo-only group never gets it (it would move the group's barrier onto the GPU).

    Returns the backend for ``init_process_group``. Raises :class:`RuntimeError` for an
    NCCL backend that cannot work (a rank without a GPU, two ranks on one GPU).
    """
    import torch

    seen = gpu_placement.gather(store, rank, world)
    placement = gpu_placement.place(seen)
    choice = gpu_placement.choose_backend(requested, seen, placement)
    if choice.warning is not None and rank == 0:
        warnings.warn(choice.warning, RuntimeWarning, stacklevel=1)
    index = placement.devices[rank]
    if index is not None:
        os.environ[gpu_placement.DEVICE_ENV] = str(index)
        torch.cuda.set_device(index)
        if choice.uses_nccl:
            init_kwargs.setdefault("device_id", torch.device("cuda", index))
    return choice.backend


def _claim_root_cause(store: Any, rank: int) -> bool:
    """True if this rank is the first of its job to fail (atomic on the job's store)."""
    if store is None:
        return False
    try:
        return bool(store.compare_set("dask_ddp/first_failure", "", str(rank)) == str(rank)
                    .encode())
    except Exception:
        return False


def _finish_barrier(store: Any, world: int) -> None:
    """Wait until every rank's function has returned, before any rank process exits.

    torch has no barrier after ``init_process_group`` and gloo can still be completing a
    connection or a last transfer to a peer that returned early; a rank that exits then
    breaks its peers ("Connection closed by peer"). The store (not gloo) carries this
    barrier. Its bound is the job's: a peer that fails aborts the job, and a peer blocked
    for good in a collective while this rank waits here is a stall (``stall_timeout``),
    also inside ``backward()`` in DDP's gradient all-reduce (a step more than this rank
    took: the probe reads the rank's c10d collectives from torch's flight recorder); a
    peer still computing (rank 0's long evaluation) is waited for.
    """
    if store.add("dask_ddp/finished", 1) == world:
        store.set("dask_ddp/all_finished", "1")
    while True:
        try:
            store.wait(["dask_ddp/all_finished"], timedelta(seconds=300))
            return
        except Exception as exc:  # DistStoreError on timeout: a slow rank, keep waiting
            if "timeout" not in str(exc).lower():
                raise


def start_live(live: LiveStart, rank: int, world: int, record: Any,
               init_kwargs: dict[str, Any]) -> Any:
    """A job whose recovery policy regroups (``recovery="live"``): the default group,
    reconfigurable, on the job's store on the scheduler (``live``, written by the
    supervisor); every Checkpointer made then hooks its model and optimizer into it."""
    from dask_ddp import _compat
    from dask_ddp._launch.rank.live import attach as live_attach
    from dask_ddp._launch.rank.live import group as live_group
    from dask_ddp._launch.wire import live_store
    from dask_ddp.checkpoint import resume

    _compat.require_torch("recovery='live'")  # this worker's torch, which may be older
    store = live_store.connect(live.store, record.rendezvous_timeout)
    # Auto means gloo here, which also carries CUDA tensors: on NCCL the live group would
    # rebuild its groups (live/comms.py) but does not yet detect a rank lost inside an
    # all-reduce (the options refuse an explicit NCCL).
    requested = "gloo" if record.backend == "auto" else record.backend
    backend = _join_devices(requested, store, rank, world, {})
    timeout = init_kwargs.get("timeout", timedelta(seconds=60))
    group = live_group.LiveGroup(store, rank, world, backend=backend,
                                 timeout=timeout.total_seconds(), min_size=live.min_size,
                                 max_size=live.max_size)
    live_group.install(group)
    resume.on_checkpointer(live_attach.attach)
    # A worker that closes (retire_workers, a spot notice) SIGTERMs its rank: it leaves
    # at its next step boundary instead of dying inside a step.
    signal.signal(signal.SIGTERM, lambda *_: group.request_leave())
    if live.join:
        group.start_joining()  # a group of one until its Checkpointer joins the job's
    else:
        group.start()
    return store


def finish_live() -> None:
    """The finish barrier of a live job: its current members (see ``finish_barrier``)."""
    from dask_ddp._launch.rank.live import group as live

    group = live.current()
    assert group is not None
    group.finish_barrier()


def _exit(code: int) -> None:
    # Run atexit handlers (the results channel flushes there) but do not join threads a
    # user left running: a finished rank must end.
    sys.stdout.flush()
    sys.stderr.flush()
    atexit._run_exitfuncs()  # noqa: SLF001 (the exit handlers must run before os._exit, which skips them)
    os._exit(code)


def main(workdir: str) -> None:
    _watch_parent()
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    phase = "load"
    store = None
    try:
        from dask_ddp._launch.wire.launch_record import LaunchRecord

        record = LaunchRecord.read(workdir)
        for p in record.sys_path:
            if p not in sys.path:
                sys.path.append(p)
        import cloudpickle

        fn, args, kwargs = cloudpickle.loads(record.payload)
        init_kwargs = cloudpickle.loads(record.init_kwargs)
        phase = "rendezvous"
        import torch.distributed as dist

        from dask_ddp._launch.rank import probe

        probe.install(workdir)

        timeout = timedelta(seconds=record.rendezvous_timeout)
        # A peer frozen before the function starts leaves this rank waiting here: a stall.
        live = LiveStart.read(workdir)
        with probe.waiting_for_peers("rendezvous"):
            if live is not None:
                phase = "init_process_group"
                store = start_live(live, rank, world, record, init_kwargs)
            else:
                store = dist.TCPStore(os.environ["MASTER_ADDR"],
                                      int(os.environ["MASTER_PORT"]), world, False, timeout)
                phase = "init_process_group"
                backend = _join_devices(record.backend, store, rank, world, init_kwargs)
                dist.init_process_group(backend=backend, store=store, rank=rank,
                                        world_size=world, **init_kwargs)
        phase = "run"
        if record.pass_local_rank:
            kwargs = {**kwargs, "local_rank": int(os.environ["LOCAL_RANK"])}
        value = fn(*args, **kwargs)
        phase = "teardown"
        probe.mark_returned()
        if live is not None:
            finish_live()
        else:
            _finish_barrier(store, world)
        if dist.is_initialized():
            dist.destroy_process_group()
        write_report(workdir, RankReport.returned(cloudpickle.dumps(value)))
    except BaseException as exc:
        claimed = _claim_root_cause(store, rank)
        write_report(workdir, RankReport.raised(phase, exc, claimed))
        _exit(1)
    _exit(0)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.stderr.write("usage: python -m dask_ddp._launch.rank.main WORKDIR "
                         "(started by dask-ddp)\n")
        sys.exit(2)
    main(sys.argv[1])
