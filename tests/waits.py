"""The one polling helper of the tests (every wait has a bound that ends in a diagnosis),
and the launcher's fast profile of waits the tests run with."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

# The launcher's waits in tests, in seconds: short, so a fault is a diagnosis within the
# test's own timeout, generous enough for a loaded 2-core machine. conftest.py sets them as
# the ``dask-ddp.launch.*`` keys around every test; they are read in the client when a job
# is built and reach the workers and ranks in the job's options. A test that times a wait
# states it as a multiple of these, never as seconds.
#: How often the client's watcher checks for lost workers, growth and a stall.
WORKER_CHECK = 0.5
#: How often a supervisor looks at its job's abort event, its task and its rank.
ABORT_POLL = 0.1
#: How long a rank that looks like a peer's victim waits to learn the peer's fault (2 s:
#: at 1 s a loaded 2-core box once named the victim of a SIGKILL, whose supervisor had not
#: yet seen its rank die, as the job's root cause).
ROOT_WAIT = 2.0
#: How long a restart waits for the workers a nanny brings back.
RESTART_GRACE = 2.0
#: A rank's SIGTERM before its SIGKILL.
TERM_GRACE = 2.0
#: Bound on reading the ranks' live stacks.
STACKS_TIMEOUT = 5.0
#: An ended job's event topics are dropped this long after its end.
FORGET_DELAY = 0.5
#: How often a rank's sampler sends the job page a sample.
DASHBOARD_SAMPLE = 0.5
#: The stall timeout of a job that does not set one (healthy jobs under load: generous).
STALL_TIMEOUT = 30.0

FAST_LAUNCH_WAITS = {
    "dask-ddp.launch.stall-timeout": STALL_TIMEOUT,
    "dask-ddp.launch.worker-check": WORKER_CHECK,
    "dask-ddp.launch.abort-poll": ABORT_POLL,
    "dask-ddp.launch.root-wait": ROOT_WAIT,
    "dask-ddp.launch.restart-grace": RESTART_GRACE,
    "dask-ddp.launch.term-grace": TERM_GRACE,
    "dask-ddp.launch.stacks-timeout": STACKS_TIMEOUT,
    "dask-ddp.launch.forget-delay": FORGET_DELAY,
    "dask-ddp.launch.dashboard-sample": DASHBOARD_SAMPLE,
    "dask-ddp.launch.watch-poll": 0.1,
    "dask-ddp.launch.worker-poll": 0.1,
    "dask-ddp.launch.forward-close": 20.0,
    "dask-ddp.launch.reclose": 1.0,
    "dask-ddp.launch.scheduler-call": 20.0,
}


def wait_until(check: Callable[[], Any], timeout: float, what: str,
               interval: float = 0.2) -> float:
    """Poll ``check()`` until it returns something falsy; return the seconds it took.

    ``check`` returns what is still missing (a list, a message: truthy) or nothing. After
    ``timeout`` seconds the test fails with ``what`` and the last thing missing.
    """
    t0 = time.monotonic()
    while True:
        left = check()
        if not left:
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"{what} after {timeout}s: {left}")
        time.sleep(interval)
