"""The renewal schedule, driven step by step with a clock that stands still
unless the test moves it: no database, no threads, no tasks. Both drivers
(the heartbeat thread and the asyncio API's task) carry out these decisions."""

from __future__ import annotations

import pytest

from pathlock._core.schedule import Schedule
from pathlock.lease import Renewals


class Clock:
    def __init__(self) -> None:
        self.time = 100.0

    def now(self) -> float:
        return self.time


class FakeLease:
    """What the schedule reads of a lease: renewed at a third of its ttl,
    lost a margin before it could expire."""

    def __init__(self, clock: Clock, ttl: float = 30.0, margin: float = 3.0) -> None:
        self.clock = clock
        self.ttl = ttl
        self.released = False
        self.renewals = Renewals()
        self._margin = margin
        self.renewed(clock.time)

    def renewed(self, started: float) -> None:
        self.renew_due = started + self.ttl / 3
        self.lost_at = started + self.ttl - self._margin

    @property
    def lost(self) -> bool:
        return not self.released and self.clock.time >= self.lost_at


def test_a_lease_is_renewed_at_a_third_of_its_ttl() -> None:
    clock = Clock()
    schedule = Schedule()
    lease = FakeLease(clock)
    assert schedule.add(lease)  # the earliest entry: the driver looks again
    assert schedule.next_at() == 110.0
    assert schedule.due(109.9) == ([], [])
    clock.time = 110.0
    assert schedule.due(clock.time) == ([], [lease])
    # While its round is in flight it is watched for loss only.
    assert schedule.next_at() == lease.lost_at
    lease.renewed(110.0)
    schedule.round_over([lease], None)
    assert schedule.next_at() == 120.0


def test_one_round_at_a_time_and_the_rest_wait_for_it() -> None:
    clock = Clock()
    schedule = Schedule()
    first = FakeLease(clock)
    clock.time = 101.0
    second = FakeLease(clock)
    assert schedule.add(second)
    assert schedule.add(first)  # due earlier than the second
    clock.time = 109.0
    third = FakeLease(clock)
    assert not schedule.add(third)  # later than both: no need to look again
    clock.time = 110.0
    assert schedule.due(clock.time) == ([], [first])
    clock.time = 111.0
    assert schedule.due(clock.time) == ([], [])  # due, but a round is in flight
    first.renewed(110.0)
    schedule.round_over([first], None)
    assert schedule.due(clock.time) == ([], [second])
    clock.time = 119.0
    second.renewed(112.0)
    schedule.round_over([second], None)
    assert schedule.due(clock.time) == ([], [third])


def test_a_failed_round_is_tried_again_soon_and_a_lease_never_renewed_is_lost() -> None:
    clock = Clock()
    schedule = Schedule(retry_after=1.0)
    lease = FakeLease(clock, ttl=6.0, margin=1.0)  # renew at 102, lost at 105
    schedule.add(lease)
    clock.time = 102.0
    assert schedule.due(clock.time) == ([], [lease])
    schedule.round_over([lease], failed_at=102.5)
    assert lease.renew_due == pytest.approx(102.5 + 0.6)  # a tenth of the ttl, under 1 s
    clock.time = 103.1
    assert schedule.due(clock.time) == ([], [lease])
    # This round hangs; the loss is declared on time all the same.
    clock.time = 105.0
    assert schedule.due(clock.time) == ([lease], [])
    schedule.round_over([lease], failed_at=None)
    assert schedule.next_at() is None  # declared lost: no longer scheduled


def test_released_leases_leave_the_schedule() -> None:
    clock = Clock()
    schedule = Schedule()
    lease = FakeLease(clock)
    schedule.add(lease)
    lease.released = True
    clock.time = 110.0
    assert schedule.due(clock.time) == ([], [])
    assert schedule.next_at() is None


def test_a_lease_renewed_by_hand_during_its_round_is_watched_to_its_new_deadline() -> None:
    clock = Clock()
    schedule = Schedule()
    lease = FakeLease(clock, ttl=6.0, margin=1.0)
    schedule.add(lease)
    clock.time = 102.0
    schedule.due(clock.time)  # in flight
    lease.renewed(104.0)  # Lease.renew() meanwhile: due at 106, lost at 109
    clock.time = 105.0  # its old loss deadline: not lost
    assert schedule.due(clock.time) == ([], [])
    assert schedule.next_at() == 109.0  # while its round is out, only its loss
    schedule.round_over([lease], None)
    assert schedule.next_at() == 106.0
