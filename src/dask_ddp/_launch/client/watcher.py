"""The client side of one job attempt's ranks: :class:`Watcher` (internal).

A :class:`~dask_ddp._launch.client.job.Job` is the handle its caller holds and the controller of
its attempts; each attempt's watcher owns the ranks' tasks and what is found about them.
It submits the supervisor tasks (pinned, never retried), then polls them on the client's
event loop: a failed rank aborts its peers, a worker that left fails its rank, a stall
ends the job (when ``stall_timeout`` is set), so a job ends with one error naming the
failing rank instead of hanging. At the end it reads the ranks' values and removes
everything the job left on the scheduler.

What a lost worker or a stall leads to is the job's recovery policy's to say
(:mod:`dask_ddp._launch.wire.policy`): the loop asks it once per event and carries out its
answer, with the machinery of a policy that regroups or of one that does not
(:mod:`dask_ddp._launch.client.recovery`), called at the same points whatever the policy.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from dask_ddp._dashboard import events as dashboard
from dask_ddp._launch.client import interrupt, registry, stall
from dask_ddp._launch.client.recovery import Recovery, Restart
from dask_ddp._launch.wire.entry_points import RUN_RANK
from dask_ddp._launch.wire.names import (
    FORGET_HANDLER,
    abort_event_name,
    failure_topic,
    master_variable_name,
    output_topic,
    progress_topic,
    rank_key,
)
from dask_ddp._launch.wire.options import LaunchOptions, LaunchWaits
from dask_ddp._launch.wire.policy import Action, RecoveryStatus, ask
from dask_ddp._launch.wire.rank_spec import RankSpec
from dask_ddp._launch.wire.root_cause import lost_error, pick_root, record_of
from dask_ddp._launch.wire.stack_request import read_job_stacks
from dask_ddp._states import JobState, RankActivity
from dask_ddp.errors import FailureKind, StallError, WorkerLostError

logger = logging.getLogger(__name__)

#: The statuses of a Dask future whose task will not run again (Dask's names).
FUTURE_ENDED = ("finished", "error", "cancelled", "lost")


class Watcher:
    """One job attempt's rank tasks and the watch loop over them (see the module).

    Parameters
    ----------
    client
        The job's (synchronous) client; the loop runs on its event loop.
    options
        The job's options (its recovery policy among them).
    job_id
        The job.
    workers
        The worker of each rank, in rank order.
    keep_values
        Read the ranks' return values as the job ends (a worker that dies afterwards
        cannot take them along).

    The watcher never refers to the job's handle: the handle is passed to :meth:`start`
    and held by the running loop alone, so the handle goes as soon as nobody holds it
    once the job ended (no reference cycle).
    """

    def __init__(self, client: Any, options: LaunchOptions, job_id: str,
                 workers: Sequence[str], *, keep_values: bool = True) -> None:
        self.client = client
        self.options = options
        self.job_id = job_id
        self.name = options.name
        #: The rank tasks' futures, in rank order (a live job's joining ranks appended).
        self.futures: list[Any] = []
        #: The worker of each rank, in rank order.
        self.workers: list[str] = list(workers)
        #: The ranks' specs as submitted (a rank that joins a live job is made from them).
        self.specs: list[RankSpec] = []
        self.keep_values = keep_values
        self.recovery: Recovery = Restart()
        #: The ranks whose worker left, with the error naming the loss.
        self.lost: dict[int, WorkerLostError] = {}
        #: The ranks' states as last read (stall detection's view).
        self.states: dict[int, Any] = {}
        #: When the loop first saw each rank's task finished (the stall rule's progress).
        self._finished_at: dict[int, float] = {}
        #: The stall that ended the job, if one did.
        self.stall: StallError | None = None
        #: The stuck ranks of stalls the policy let go on, and its answer (asked once per
        #: stall; a regroup's kill of a frozen rank is carried out until it took).
        self._stalls_met: dict[tuple[int, ...], Action] = {}
        #: The ranks the policy let go on without a lost one all returned: the end.
        self._survivors_ended = False
        #: Every rank finished: the job's outcome, fixed (a later loss changes nothing).
        self.all_finished = False
        self.cancelled = False
        #: The ranks' return values, read as the job ends (``keep_values``).
        self.values: list[Any] | None = None
        #: Set once every rank ended and the job's traces on the scheduler are gone.
        self.done = threading.Event()

    # -- submitting ----------------------------------------------------------------------
    def set_recovery(self, recovery: Recovery) -> None:
        """Use the job's ``recovery`` machinery (chosen once as the job starts; closed
        with it)."""
        self.recovery = recovery

    def start(self, specs: list[RankSpec], resources: list[dict[str, float] | None],
              handle: Any) -> None:
        """Submit the supervisor tasks, then watch them; ``handle`` (the job) is what
        :func:`~dask_ddp.dispatch.job_of` finds from their keys while the job runs.
        On an error the caller abandons the job (:meth:`abandon`)."""
        self.specs = list(specs)
        for spec, res in zip(specs, resources, strict=True):
            self._submit(spec, res)
        registry.remember(handle, [f.key for f in self.futures])

    def watch(self, handle: Any) -> None:
        """Start the loop on the client's event loop; it holds ``handle`` until the end."""
        self.client.loop.add_callback(self._watch, handle)

    def _submit(self, spec: RankSpec, resources: dict[str, float] | None) -> None:
        # Pinned, never moved, never retried: a rank belongs to its worker; if that worker
        # goes, the job fails (the loop notices) instead of waiting forever.
        self.futures.append(self.client.submit(
            RUN_RANK, spec, key=rank_key(self.name, self.job_id, spec.rank),
            workers=[spec.worker], allow_other_workers=False, pure=False, retries=0,
            resources=resources))

    def add_rank(self, spec: RankSpec) -> None:
        """A rank joining a live job on ``spec.worker`` (see ``recovery.Live.grow``)."""
        res = self.options.resources
        self.workers.append(spec.worker)
        self.specs.append(spec)
        self._submit(spec, dict(res) if res else None)

    def abandon(self, handle: Any) -> None:
        """A launch failed part-way: stop the ranks submitted so far and release them."""
        registry.forget(handle, [f.key for f in self.futures])
        bound = self.options.waits.scheduler_call
        with contextlib.suppress(Exception):
            self.client.sync(self.set_abort, callback_timeout=bound)
        with contextlib.suppress(Exception):
            self.client.cancel(self.futures, reason="dask-ddp launch failed",
                               msg=f"launching job {self.name!r} failed")
        with contextlib.suppress(Exception):
            self.client.sync(self._cleanup, callback_timeout=4 * bound)
        # The page showed the job "starting": it never runs.
        with contextlib.suppress(Exception):
            dashboard.job_state(self.client, self.job_id, JobState.CANCELLED)
        self.done.set()

    def cancel(self) -> None:
        """Stop every rank (their processes are killed) and cancel their futures; a job
        that already ended is left as it is."""
        if self.done.is_set():
            return
        self.cancelled = True
        interrupt.mark_cancelled(self.job_id)
        self.client.sync(self.set_abort, callback_timeout=self.options.waits.scheduler_call)
        self.client.cancel(self.futures, reason="dask-ddp job cancelled",
                           msg=f"job {self.name!r} was cancelled")

    def root_cause(self) -> BaseException | None:
        """The error naming the job's root cause, or ``None`` while no rank failed."""
        if self.stall is not None:
            return self.stall
        if self.all_finished:
            return None  # every rank finished: a value lost later changes nothing
        errors: list[tuple[int, BaseException]] = []
        for rank, fut in enumerate(self.futures):
            if rank in self.lost:
                errors.append((rank, self.lost[rank]))
            elif fut.status == "error":
                errors.append((rank, fut.exception()))
        return pick_root(errors)

    # -- the loop (runs on the client's event loop) --------------------------------------
    async def set_abort(self) -> None:
        """Tell every rank's supervisor to stop its rank."""
        with contextlib.suppress(Exception):
            await self.client.scheduler.event_set(name=abort_event_name(self.job_id))

    async def _watch(self, handle: Any) -> None:
        waits = self.options.waits
        aborted = False
        next_check = 0.0
        try:
            while True:
                statuses = [f.status for f in self.futures]
                if all(s in FUTURE_ENDED for s in statuses):
                    break
                if self.client.status in ("closing", "closed"):
                    break  # nothing left to watch with
                try:
                    if not aborted and self.recovery.fatal(statuses, self.lost):
                        await self._bounded(self.set_abort())
                        aborted = True
                    if time.monotonic() >= next_check:
                        next_check = time.monotonic() + waits.worker_check
                        # The policy may let the others go on without a lost rank.
                        if await self._check(statuses, handle) and not aborted:
                            await self._bounded(self.set_abort())
                            aborted = True
                except Exception as exc:
                    # One poll failed (the scheduler is slow or away for a moment): the
                    # job goes on and the next poll tries again.
                    logger.warning("watcher of job %r: %s: %s (retrying)", self.name,
                                   type(exc).__name__, exc)
                await asyncio.sleep(waits.watch_poll)
            await self._read_values()
        except Exception:
            logger.exception("watcher of job %r failed; stopping the job", self.name)
        finally:
            await self._cleanup()
            registry.forget(handle, [f.key for f in self.futures])
            dashboard.job_state(self.client, self.job_id, self.final_state())
            self.done.set()

    async def _check(self, statuses: list[str], handle: Any) -> bool:
        """The periodic checks: lost workers, the recovery's growth, a stall; whether the
        policy's answer to what was found ends the attempt."""
        left = await self._bounded(self.recovery.left())
        lost, ends = await self._bounded(self._check_workers(statuses, left))
        await self._bounded(self.recovery.publish())
        before = len(self.futures)
        await self._bounded(self.recovery.grow(statuses, left, self))
        if len(self.futures) > before:
            registry.remember(handle, [f.key for f in self.futures[before:]])
        if not lost and self.options.stall_timeout is not None:
            ends = await self._check_stall(statuses)
        if self.lost and not (ends or self._survivors_ended or self.options.policy.regroups):
            ends = self._survivors_ended = await self._bounded(
                self._survivors_returned(statuses))
        return ends

    async def _survivors_returned(self, statuses: Sequence[str]) -> bool:
        """Whether the ranks the policy let go on without a lost one (``CONTINUE``) have
        all returned: in a job that does not regroup they then wait in their finish
        barrier for the lost rank, which never comes, so the attempt ends (its error
        names the loss)."""
        events = await self.client.scheduler.events(topic=progress_topic(self.job_id))
        self.states = dict(stall.latest_states(events))
        running = [r for r, s in enumerate(statuses) if s == "pending" and r not in self.lost]
        if not running or any(stall.activity(self.states.get(r)) is not RankActivity.RETURNED
                              for r in running):
            return False
        logger.warning("job %r: ranks %s returned without ranks %s, whose workers left; "
                       "ending the attempt", self.name, running, sorted(self.lost))
        return True

    async def _read_values(self) -> None:
        statuses = [f.status for f in self.futures]
        self.all_finished = self.recovery.finished(statuses, self.lost)
        if not (self.all_finished and self.keep_values):
            return
        try:
            done = [f for f in self.futures if f.status == "finished"]
            self.values = self.recovery.values(list(await self._bounded(
                self.client.gather(done, asynchronous=True))))
        except Exception as exc:  # result() reads them again, or names the loss
            logger.warning("job %r: reading the ranks' return values failed: %s: %s",
                           self.name, type(exc).__name__, exc)

    async def _bounded(self, coro: Any) -> Any:
        """Await a call to the scheduler for at most ``dask-ddp.launch.scheduler-call``."""
        return await asyncio.wait_for(coro, self.options.waits.scheduler_call)

    async def read_stacks(self, timeout: float) -> dict[int, str]:
        """The running ranks' Python stacks (see :meth:`Job.stacks`)."""
        return await read_job_stacks(self.client, self.job_id, self.workers, timeout)

    async def _check_stall(self, statuses: list[str]) -> bool:
        """Read the ranks' states; end the job with a :class:`StallError` when it stalled."""
        timeout = self.options.stall_timeout
        assert timeout is not None
        events = await self._bounded(
            self.client.scheduler.events(topic=progress_topic(self.job_id)))
        self.states = dict(stall.latest_states(events))
        now = time.time()
        for r, s in enumerate(statuses):
            if s == "finished":
                self._finished_at.setdefault(r, now)
        finished = {r: t for r, t in self._finished_at.items() if statuses[r] == "finished"}
        found = stall.find_stall(self.states, finished, len(self.workers), now, timeout)
        if found is None or self.stall is not None:
            return False
        frozen = self.recovery.frozen(found)
        action = self._stalls_met.get(tuple(found.stuck))
        if action is None:
            action = self._ask(FailureKind.STALLED, (frozen or found.stuck)[0], statuses,
                               len(frozen), frozen=bool(frozen))
        elif action is not Action.REGROUP:
            return False
        if action is Action.REGROUP and frozen:
            self._stalls_met[tuple(found.stuck)] = action
            # Again at each check while they stay frozen: a kill that did not take (the
            # rank not found, the worker busy) is tried again instead of the job hanging.
            await self.recovery.end_frozen(frozen, self.workers)
            return False
        if action is Action.CONTINUE:
            logger.warning("job %r: ranks %s stalled in %s; its recovery policy lets the job "
                           "go on", self.name, found.stuck, found.collective)
            self._stalls_met[tuple(found.stuck)] = action
            return False
        try:
            stacks = await asyncio.wait_for(self.read_stacks(self.options.waits.stacks_timeout),
                                            self.options.waits.stacks_timeout + 10)
        except Exception as exc:
            logger.warning("job %r stalled; its stacks could not be read: %s", self.name, exc)
            stacks = {}
        err = stall.stall_error(found, self.name, self.workers, timeout, stacks, now)
        self.stall = err
        logger.error("%s", str(err).split("\n\n")[0])
        # Every rank's supervisor raises this in place of its abort (the seed's gather
        # names the stall too); a dashboard reads it on the failure topic.
        await self._bounded(self.client.scheduler.log_event(
            topic=failure_topic(self.job_id), msg=stall.stall_record(err)))
        return True

    def final_state(self) -> JobState:
        """The ended job's state for the job page (its root cause comes from the ranks)."""
        statuses = {f.status for f in self.futures}
        if self.all_finished:
            return JobState.DONE
        if self.cancelled:  # the ranks stopped by the cancel may have erred: not a failure
            return JobState.CANCELLED
        if self.lost or statuses & {"error", "lost"}:  # lost: a value went with its worker
            return JobState.FAILED
        return JobState.CANCELLED if statuses - {"finished"} else JobState.DONE

    async def _check_workers(self, statuses: list[str],
                             left: Mapping[str, int]) -> tuple[list[int], bool]:
        """Detect ranks whose worker left; cancel their futures (else they stay pending).
        ``left``: a live job's count of workers that left at each address. Returns the
        ranks found lost, and whether the policy's answer ends the attempt."""
        present = await self.client.scheduler.ncores(workers=sorted(set(self.workers)))
        gone = set(self.recovery.gone(self.workers, left))
        lost = [r for r, w in enumerate(self.workers)
                if (w not in present or r in gone) and statuses[r] == "pending"
                and r not in self.lost]
        for r in lost:
            self.lost[r] = lost_error(self.name, r, self.workers[r])
        # One question per lost rank: whether its peers go on without it.
        ends = any(self._ask(FailureKind.LOST, r, statuses, 0) in (Action.RESTART, Action.RAISE)
                   for r in lost)
        if ends and lost and self.options.policy.regroups:
            self._too_few(statuses)
        for r in lost:
            # Tell the other ranks' supervisors the root cause: a rank that failed because
            # its peer vanished then reports it at once instead of waiting for one.
            with contextlib.suppress(Exception):
                await self.client.scheduler.log_event(topic=failure_topic(self.job_id),
                                                      msg=record_of(self.lost[r]))
        if lost:
            await self.client.cancel([self.futures[r] for r in lost], asynchronous=True,
                                     reason="dask-ddp worker lost",
                                     msg="; ".join(str(self.lost[r]) for r in lost))
        return lost, ends

    def _running(self, statuses: Sequence[str]) -> int:
        """The ranks still running: pending, and not lost with their worker."""
        return sum(1 for r, s in enumerate(statuses) if s == "pending" and r not in self.lost)

    def _too_few(self, statuses: Sequence[str]) -> None:
        """A regrouping job ended by lost workers: where fewer than ``min_workers`` ranks
        still run, its root cause says so (kind ``regroup``, as a survivor's own verdict
        would), not merely that the first of them lost its worker."""
        running = self._running(statuses)
        least = self.options.min_workers or 1
        if running >= least:
            return
        every = sorted(self.lost)  # this check's and earlier checks' lost ranks
        first = every[0]
        gone = ", ".join(f"rank {r} (worker {self.workers[r]})" for r in every)
        self.lost[first] = WorkerLostError(
            f"job {self.name!r}: live recovery cannot go on: {running} of {len(statuses)} "
            f"ranks still run after the workers of {gone} left the cluster, fewer than "
            f"min_workers={least}", first, self.workers[first], kind=FailureKind.REGROUP)

    def _ask(self, kind: FailureKind, rank: int, statuses: Sequence[str], leaving: int, *,
             frozen: bool = False) -> Action:
        """The policy's answer to ``kind`` met by ``rank``; ``leaving``: ranks still
        running that leave with it (the frozen ranks of a stall)."""
        running = self._running(statuses)
        opts = self.options
        return ask(opts.policy, RecoveryStatus(
            kind=kind, rank=rank, restarts=self.specs[0].restart if self.specs else 0,
            max_restarts=opts.max_restarts, min_workers=opts.min_workers or 1,
            live_workers=max(running - leaving, 0), frozen=frozen))

    async def _cleanup(self) -> None:
        await self.recovery.close()
        await clear_job(self.client, self.job_id, self.futures, self.name, self.options.waits)

    async def forget_topics(self, *topics: str) -> None:
        """Have the scheduler drop these event topics of the ended job."""
        await forget_topics(self.client, self.options.waits, *topics)


def gather_values(client: Any, futures: Sequence[Any], workers: Sequence[str],
                  name: str) -> list[Any]:
    """The ranks' return values from their ``futures`` (the loop could not read them); a
    value lost with its worker raises instead of waiting for a recomputation that cannot
    run (each rank is pinned to its worker)."""
    for r, f in enumerate(futures):
        if f.status in ("lost", "cancelled"):
            raise WorkerLostError(
                f"rank {r} of job {name!r} finished, but its return value was lost "
                f"with its worker {workers[r]} before the client read it",
                r, workers[r], kind=FailureKind.LOST)
    return list(client.gather(futures))


async def clear_job(client: Any, job_id: str, futures: Sequence[Any], name: str,
                    waits: LaunchWaits) -> None:
    """Remove what an ended job left on the scheduler: its unfinished tasks, its abort
    event, its master's Variable and its event topics (each call at most the waits'
    ``scheduler_call``; the topics go ``forget_delay`` later)."""
    bound = waits.scheduler_call
    # No task of an ended job stays on the scheduler (a pinned task of a lost worker
    # would wait in no-worker and ask an adaptive cluster for workers).
    # A "lost" future (its rank finished, then its worker died with the value) is not
    # cancelled: the scheduler's JobGuard errs it with the loss (see
    # :mod:`dask_ddp._launch.scheduler.job_guard`).
    left = [f for f in futures if f.status not in FUTURE_ENDED]
    if left:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(client.cancel(
                left, asynchronous=True, reason="dask-ddp job ended",
                msg=f"job {name!r} ended"), bound)
    # Dask deletes a Variable through a stream message (no reply to wait for).
    with contextlib.suppress(Exception):
        from distributed import Variable

        Variable(master_variable_name(job_id), client=client).delete()
    for event in (abort_event_name(job_id), master_variable_name(job_id)):
        with contextlib.suppress(Exception):
            await asyncio.wait_for(client.scheduler.event_clear(name=event), bound)
    await forget_topics(client, waits, progress_topic(job_id), failure_topic(job_id),
                        output_topic(job_id),
                        # Dask's topic of the Variable's pseudo-client
                        f"variable-{master_variable_name(job_id)}")


async def forget_topics(client: Any, waits: LaunchWaits, *topics: str) -> None:
    """Have the scheduler drop these event topics of an ended job ``waits.forget_delay``
    seconds from now (see :mod:`dask_ddp._launch.scheduler.job_guard`)."""
    with contextlib.suppress(Exception):
        await asyncio.wait_for(getattr(client.scheduler, FORGET_HANDLER)(
            topics=list(topics), delay=waits.forget_delay), waits.scheduler_call)
