"""A job's rendezvous: rank 0's store, its address and the job's abort, on the scheduler
(internal).

Rank 0's supervisor hosts the job's ``TCPStore`` (on a free port, as torchrun's agent
does) and publishes its address through a Dask ``Variable``, then sets a Dask ``Event`` of
the same name; the other ranks' supervisors wait on the Event, then read the Variable. When
rank 0 ends, its supervisor withdraws both: the address is of no use any more. The job's
abort Event closes the rendezvous for every rank (as torch's ``RendezvousHandler``'s
``set_closed``): a failing rank sets it, every supervisor polls it.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from dask_ddp._launch.wire.names import abort_event_name, master_variable_name
from dask_ddp._launch.wire.rank_spec import RankSpec

logger = logging.getLogger(__name__)


class RendezvousTimeout(Exception):
    """Rank 0's address was not there within the job's ``rendezvous_timeout``."""


class Rendezvous:
    """Rank 0's address for the job of ``spec``, through the scheduler of ``client``.

    Parameters
    ----------
    spec
        The rank's spec (its job, rank 0's host, the rendezvous timeout).
    client
        The worker's client.
    """

    def __init__(self, spec: RankSpec, client: Any) -> None:
        self.spec = spec
        self.client = client
        self.waits = spec.options.waits
        self.name = master_variable_name(spec.job_id)
        self._store: Any = None

    def host(self) -> int:
        """Rank 0: start the job's store on a free port (port 0: no fixed port, no race)
        and publish its address (the Variable, then the Event the peers wait on)."""
        from distributed import Event, Variable
        from torch.distributed import TCPStore

        self._store = TCPStore(self.spec.master_addr, 0, self.spec.world_size, True,
                               timedelta(seconds=self.spec.options.rendezvous_timeout),
                               wait_for_workers=False)
        port = int(self._store.port)
        Variable(self.name, client=self.client).set(f"{self.spec.master_addr}:{port}")
        Event(self.name, client=self.client).set()
        return port

    def close(self) -> None:
        """Rank 0, however it ended: withdraw its address (the client's cleanup may have run
        before it was published: a cancel that reached this worker only after the publish)
        and stop the store, freeing its port. Never raises."""
        if self._store is not None:
            self.withdraw()
            self._store = None

    def withdraw(self) -> None:
        """Take rank 0's address back off the scheduler (never raises)."""
        from distributed import Variable

        # Dask deletes a Variable through a stream message (no reply to wait for).
        with contextlib.suppress(Exception):
            Variable(self.name, client=self.client).delete()
        with contextlib.suppress(Exception):
            self.client.sync(self.client.scheduler.event_clear, name=self.name,
                             callback_timeout=self.waits.scheduler_call)

    def await_port(self, check_stop: Callable[[], None]) -> int:
        """Rank 0's store port, once published; ``check_stop()`` runs between waits (it
        raises when the rank must stop). Raises :class:`RendezvousTimeout`."""
        from distributed import Event, Variable

        timeout = self.spec.options.rendezvous_timeout
        # Wait on an Event (a timed-out wait is quiet; a timed-out Variable.get logs an
        # error on the scheduler), checking for an abort between waits.
        ready = Event(self.name, client=self.client)
        deadline = time.monotonic() + timeout
        while not ready.wait(timeout=self.waits.abort_poll):
            check_stop()
            if time.monotonic() > deadline:
                raise RendezvousTimeout(
                    f"rank 0 did not publish its rendezvous address within {timeout:.0f} s")
        # The Event was set after the Variable; the Variable can still be gone (the job
        # ended in between): read it with a bound, checking for the job's end between reads.
        variable = Variable(self.name, client=self.client)
        while True:
            try:
                value = variable.get(timeout=max(self.waits.abort_poll, 1.0))
                return int(str(value).rsplit(":", 1)[1])
            except TimeoutError:
                check_stop()
                if time.monotonic() > deadline:
                    raise RendezvousTimeout(
                        "rank 0's rendezvous address was withdrawn (its job ended) and not "
                        f"published again within {timeout:.0f} s") from None

    def aborted(self) -> bool:
        """Whether the job's abort Event is set; a scheduler that does not answer within
        ``scheduler-call`` counts as "not yet" (the next poll asks again)."""
        try:
            return bool(self.client.sync(self.client.scheduler.event_is_set,
                                         name=abort_event_name(self.spec.job_id),
                                         callback_timeout=self.waits.scheduler_call))
        except (TimeoutError, OSError) as exc:
            logger.warning("rank %d of job %r: the abort event could not be read: %s",
                           self.spec.rank, self.spec.job_name, exc)
            return False

    def abort(self) -> None:
        """Set the job's abort Event: every rank's supervisor stops its rank (never raises)."""
        from distributed import Event

        with contextlib.suppress(Exception):
            Event(abort_event_name(self.spec.job_id), client=self.client).set()
