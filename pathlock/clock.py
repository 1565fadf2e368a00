"""The client clock that lease deadlines are judged by.

``time.monotonic()`` (CLOCK_MONOTONIC on Linux) stops while the machine is
suspended: after a suspend longer than a lease's ttl, a holder judged by it
would still believe its lease held, and write with its old fencing token,
while the database has long let someone else in. Lease deadlines, and the
heartbeat that keeps them, therefore use CLOCK_BOOTTIME where the operating
system has it (Linux): it counts the time spent suspended. Elsewhere they fall
back to ``time.monotonic()``; on macOS that clock does not count suspend
either, and a holder that may be suspended must ask the database
(``lease.ensure_held(verify=True)``).

Waiting and call deadlines stay on ``time.monotonic()``: a wait that a suspend
lengthens costs time, never safety.
"""

from __future__ import annotations

import time
from collections.abc import Callable


def _boottime() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def _pick() -> tuple[Callable[[], float], bool]:
    if hasattr(time, "CLOCK_BOOTTIME"):
        try:
            _boottime()
        except OSError:  # the constant exists, the kernel refuses it
            pass
        else:
            return _boottime, True
    return time.monotonic, False


now, COUNTS_SUSPEND = _pick()
"""``now()``: seconds on the lease clock; ``COUNTS_SUSPEND``: whether it
counts time spent suspended."""
