"""The one polling helper of the tests: every wait has a bound that ends in a diagnosis."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


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
