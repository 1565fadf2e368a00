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
from typing import Protocol


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


class Clock(Protocol):
    """The two clocks pathlock reads: :attr:`Settings.clock
    <pathlock.Settings.clock>`. Tests give the manager one of their own (a
    clock that jumps, as after a suspend); the lock request's loop
    (:mod:`pathlock._core.flow`) can be driven with one that never moves on its own."""

    def now(self) -> float:
        """Seconds on the lease clock: lease deadlines and their renewals."""
        ...

    def monotonic(self) -> float:
        """Seconds on ``time.monotonic()``'s timeline: a lock request's
        timeout, its waits and its rechecks. (The bounds of each database
        call keep ``time.monotonic()`` itself: a socket waits in real time.)"""
        ...


class SystemClock:
    """The clocks of the machine: the lease clock counts suspend where it can
    (:data:`COUNTS_SUSPEND`), the other is ``time.monotonic``."""

    def now(self) -> float:
        return now()

    def monotonic(self) -> float:
        return time.monotonic()

    def __repr__(self) -> str:
        return "SystemClock()"


SYSTEM = SystemClock()
"""The default clock."""
