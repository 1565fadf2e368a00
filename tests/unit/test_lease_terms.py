"""A lease's deadlines: its ttl from the attempt that granted it, or, for
paths a release handed over, the handed rows' own short term until its first
renewal."""

from __future__ import annotations

from typing import Any

import pytest

from pathlock import Owner, Settings
from pathlock.lease import Lease


class StillClock:
    def __init__(self) -> None:
        self.time = 1000.0

    def now(self) -> float:
        return self.time

    def monotonic(self) -> float:
        return self.time


class Keeper:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the lease called its keeper's {name}")


def _lease(clock: StillClock, first_term: float | None) -> Lease:
    return Lease(
        Keeper(Settings(clock=clock)),
        customer_id=1,
        lease_id="l" * 32,
        paths=(("/a", "exclusive"),),
        fencing_token=7,
        owner=Owner("n", 1, "t", "k"),
        reason="",
        ttl=30.0,
        attempt_started=999.0,
        first_term=first_term,
    )


def test_a_lease_lasts_its_ttl_from_the_attempt_that_granted_it() -> None:
    clock = StillClock()
    lease = _lease(clock, None)
    assert lease.expires_in == 29.0
    assert lease.renew_due == 1009.0
    assert lease.lost_at == 999.0 + 30.0 - 3.0  # margin: a tenth of the ttl


def test_handed_over_paths_last_their_own_term_until_the_first_renewal() -> None:
    clock = StillClock()
    lease = _lease(clock, 4.5)
    assert lease.expires_in == pytest.approx(3.5)
    assert lease.renew_due == 999.0 + 1.5  # a third of the term
    assert lease.lost_at == 999.0 + 4.5 - 0.45  # a tenth of the term, not of the ttl
    assert not lease.lost
    clock.time = 1003.1
    assert lease.lost  # never renewed: lost before the rows could lapse
    # Renewed in time (the heartbeat's first round): the ttl from then on.
    clock.time = 1001.0
    lease._extend(1000.9)
    assert lease.expires_in == pytest.approx(29.9)
    assert lease.lost_at == 1000.9 + 30.0 - 3.0
    assert not lease.lost
