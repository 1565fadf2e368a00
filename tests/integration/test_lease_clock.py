"""How a holder knows its lease is still held: a clock that counts suspend,
and asking the database before something irreversible."""

from __future__ import annotations

import sys
import threading
import time

import pytest
from sqlalchemy import Engine, delete

from pathlock import CustomerLocks, Lease, LeaseLost, PathLockManager, Settings, clock
from pathlock.clock import SystemClock
from pathlock.schema import path_locks


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="CLOCK_BOOTTIME is Linux's")
def test_the_lease_clock_counts_suspend_on_linux() -> None:
    assert clock.COUNTS_SUSPEND
    # CLOCK_BOOTTIME, not CLOCK_MONOTONIC: the two differ by the time spent suspended.
    assert abs(clock.now() - time.clock_gettime(time.CLOCK_BOOTTIME)) < 1


class SuspendableClock(SystemClock):
    """The machine's clocks, plus the time of suspends that have not happened."""

    def __init__(self) -> None:
        self.suspended = 0.0

    def now(self) -> float:
        return super().now() + self.suspended


def test_a_suspend_longer_than_the_ttl_loses_the_lease(database_url: str, customer_id: int) -> None:
    suspends = SuspendableClock()
    settings = Settings(clock=suspends)
    with PathLockManager(database_url, heartbeat=False, settings=settings) as manager:
        lease = manager.for_customer(customer_id).lock_paths("/Shared/a", ttl=5)
        lease.ensure_held()
        # A suspend of 60 s: CLOCK_MONOTONIC did not move, the lease clock did
        # (and so did the database's, by which the lease has expired).
        suspends.suspended = 60
        assert lease.lost
        with pytest.raises(LeaseLost, match="not renewed"):
            lease.ensure_held()


def test_verify_asks_the_database(locks: CustomerLocks, raw_engine: Engine) -> None:
    told: list[Lease] = []
    told_event = threading.Event()

    def on_lost(lease: Lease) -> None:
        told.append(lease)
        told_event.set()

    lease = locks.lock_paths("/Shared/a", on_lost=on_lost)
    lease.ensure_held(verify=True)
    # An operator (or the reaper, after an expiry the client missed) deleted it.
    with raw_engine.begin() as connection:
        connection.execute(delete(path_locks).where(path_locks.c.lease_id == lease.lease_id))
    lease.ensure_held()  # the local clock cannot know
    with pytest.raises(LeaseLost, match="no longer holds it"):
        lease.ensure_held(verify=True)
    assert lease.lost
    assert told_event.wait(10)
    assert told == [lease]
    with pytest.raises(LeaseLost):
        lease.ensure_held()
