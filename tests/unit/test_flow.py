"""A lock request's decisions, driven step by step with a clock that stands
still unless the test moves it: no database, no threads, no sleeping."""

from __future__ import annotations

from collections.abc import Generator
from datetime import UTC, datetime
from typing import Any

import pytest

from pathlock import (
    ContentionTimeout,
    DatabaseTimeout,
    DeadlockDetected,
    LockCancelled,
    LockTimeout,
    ManagerClosed,
    Settings,
)
from pathlock._core.flow import (
    AcquireFlow,
    Attempt,
    Behind,
    Judge,
    Place,
    ReadVersion,
    Refresh,
    Result,
    Sleep,
    Step,
    Stop,
    TakeUp,
)
from pathlock._core.records import Blocked, Deadlocked, Granted, GrantRequest, Outlook, Watched
from pathlock.types import LockInfo, Owner, WaiterInfo

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
OWNER = Owner("node", 1, "t1", "key.t1")
OTHER = Owner("node", 2, "t1", "other.t1")


class StillClock:
    """Moves only when told to."""

    def __init__(self) -> None:
        self.time = 1000.0

    def now(self) -> float:
        return self.time + 5000.0  # another timeline than monotonic's

    def monotonic(self) -> float:
        return self.time


class Fixed:
    """A wait policy of fixed sleeps, that counts its resets."""

    def __init__(self, seconds: float = 0.01) -> None:
        self.seconds = seconds
        self.resets = 0

    def next(self) -> float:
        return self.seconds

    def reset(self) -> None:
        self.resets += 1


REQUEST = GrantRequest(
    customer_id=7,
    lease_id="lease-1",
    paths=(("/a", "exclusive"),),
    owner=OWNER,
    reason="",
    ttl=30.0,
)
HOLDER = LockInfo(7, "/a", "exclusive", "lease-0", OTHER, "", 3, EPOCH, EPOCH)


def waiter(ticket: int) -> WaiterInfo:
    return WaiterInfo(
        7, ticket, (("/a", "exclusive"),), f"lease-w{ticket}", OTHER, "", EPOCH, EPOCH
    )


def blocked(
    ticket: int | None,
    version: int,
    ahead: tuple[WaiterInfo, ...] = (),
    *,
    complete: bool = False,
) -> Blocked:
    return Blocked((HOLDER,), ahead, ticket, version, ahead_complete=complete)


class Run:
    """One flow and its generator, stepped by the test."""

    def __init__(
        self,
        *,
        blocking: bool = True,
        wait_limit: float | None = 10.0,
        settings: Settings | None = None,
        handed_over: bool = False,
        owner_busy: bool = False,
    ) -> None:
        self.clock = StillClock()
        self.delays = Fixed()
        self.settings = Settings(clock=self.clock) if settings is None else settings
        self.flow = AcquireFlow(
            REQUEST,
            self.settings,
            self.delays,
            blocking=blocking,
            wait_limit=wait_limit,
            handed_over=handed_over,
            owner_busy=owner_busy,
        )
        self.steps: Generator[Step, Any, Result] = self.flow.steps()
        self.step: Step = next(self.steps)

    def reply(self, value: object = None) -> Step:
        self.step = self.steps.send(value)
        return self.step

    def fail(self, error: BaseException) -> Step:
        self.step = self.steps.throw(error)
        return self.step

    def finish(self, value: object) -> Result:
        with pytest.raises(StopIteration) as done:
            self.steps.send(value)
        result: Result = done.value.value
        return result


def test_an_uncontended_grant_is_one_attempt() -> None:
    run = Run()
    assert run.step == Stop()
    attempt = run.reply(None)
    # The first: no row of the request's lease can exist before it.
    assert attempt == Attempt(None, queue=True, patience=1010.0, deadline=1010.0, first=True)
    assert run.finish(Granted(42)) == (42, 6000.0, None)  # token, lease clock, ttl
    assert run.flow.leave() is None
    assert run.flow.limit == 1010.0 + run.settings.grace


def test_a_denied_try_lock_is_not_queued_and_returns_none() -> None:
    run = Run(blocking=False, wait_limit=0.0)
    attempt = run.reply(None)
    settings = run.settings
    assert attempt == Attempt(
        None,
        queue=False,
        patience=1000.0 + settings.try_patience,
        deadline=1000 + settings.try_time,
        first=True,
    )
    assert run.finish(blocked(None, 1)) is None
    assert run.flow.limit == 1000.0 + settings.try_time + settings.grace


def test_a_queued_request_attempts_again_when_the_version_moves_and_it_is_next() -> None:
    run = Run()
    assert run.reply(None).first  # type: ignore[union-attr]
    place = run.reply(blocked(5, version=1))
    assert place == Place(5, (), new=True)
    assert run.flow.ticket == 5
    sleep = run.reply()
    assert isinstance(sleep, Sleep)
    assert sleep.seconds == pytest.approx(0.01)
    run.clock.time += 0.01
    assert run.reply(False) == Behind()
    assert isinstance(run.reply(False), ReadVersion)
    # Unchanged: sleep on, idle at most until the queue row is due for a refresh.
    idle = 1000.0 + run.settings.waiter_refresh - run.clock.time
    assert run.reply(Watched(1)) == Sleep(pytest.approx(0.01), pytest.approx(idle))
    run.clock.time += 0.01
    run.reply(False)
    run.reply(False)
    # The version moved and nothing is ahead: straight to the attempt.
    assert run.reply(Watched(2)) == Stop()
    assert run.reply(None) == Attempt(5, queue=True, patience=1010.0, deadline=1010.0)
    assert run.delays.resets == 1
    assert run.finish(Granted(43)) == (43, 6000.02, None)
    assert run.flow.leave() is None  # the grant took the queue row


def test_a_move_of_the_version_while_the_lock_in_the_way_still_holds_is_slept_through() -> None:
    """With requests waiting in many folders, the version moves with every
    grant and release of the customer: the first in line of each folder
    attempted at each move, and was denied while its own holder held on."""
    run = Run()
    run.reply(None)
    run.reply(blocked(5, version=1))
    run.reply()
    run.clock.time += 0.01
    run.reply(False)  # Behind
    # The check asks whether the lease in the way still holds.
    assert run.reply(False) == ReadVersion(1010.0, held=("lease-0",))
    # It does: the move was someone else's, no attempt.
    assert isinstance(run.reply(Watched(2, held_left=1)), Sleep)
    run.clock.time += 0.01
    run.reply(False)
    run.reply(False)
    # It let go: straight to the attempt.
    assert run.reply(Watched(3, held_left=0)) == Stop()
    assert run.reply(None) == Attempt(5, queue=True, patience=1010.0, deadline=1010.0)


def test_a_request_behind_others_judges_before_it_attempts() -> None:
    run = Run()
    run.reply(None)
    assert run.reply(blocked(9, version=1, ahead=(waiter(4),))) == Place(9, (4,), new=True)
    run.reply()
    run.clock.time += 0.01
    run.reply(False)  # Behind
    run.reply(False)  # ReadVersion
    judge = run.reply(Watched(2))
    assert judge == Judge(9, 1010.0)
    # Not free yet, but next in line now: the next move goes straight to an attempt.
    assert isinstance(run.reply(Outlook(free=False, next_in_line=True)), Sleep)
    run.clock.time += 0.01
    run.reply(False)
    run.reply(False)
    assert run.reply(Watched(3)) == Stop()


def test_a_request_behind_a_waiter_of_this_process_does_not_poll() -> None:
    run = Run()
    run.reply(None)
    run.reply(blocked(9, version=1, ahead=(waiter(4),)))
    run.reply()
    run.clock.time += 0.01
    assert run.reply(False) == Behind()
    assert isinstance(run.reply(True), Sleep)  # no ReadVersion while behind


def test_a_release_in_this_process_wakes_the_request_at_once() -> None:
    run = Run()
    run.reply(None)
    run.reply(blocked(5, version=1))
    run.reply()
    assert run.reply(True) == Stop()  # the Sleep was cut short by a release


def _waiting_for_hand_over() -> Run:
    """A request queued as ticket 5 where releases hand paths over, in its
    first sleep."""
    run = Run(handed_over=True)
    run.reply(None)
    run.reply(blocked(5, version=1))
    run.reply()
    return run


def test_the_next_in_line_looks_often_for_a_while_then_as_the_policy_says() -> None:
    """Behind a lock held for minutes, the next in line read the database
    every millisecond for minutes."""
    run = _waiting_for_hand_over()
    assert run.step == Sleep(
        pytest.approx(run.settings.hand_over_check), pytest.approx(1.0 / 3 * 5)
    )
    run.clock.time += run.settings.hand_over_window / 2
    run.reply(False)  # Behind
    run.reply(False)  # ReadVersion
    sleep = run.reply(Watched(1, looked=True, held_left=1))
    assert isinstance(sleep, Sleep)
    assert sleep.seconds == pytest.approx(run.settings.hand_over_check)
    run.clock.time += run.settings.hand_over_window
    run.reply(False)
    run.reply(False)
    sleep = run.reply(Watched(1, looked=True, held_left=1))
    assert isinstance(sleep, Sleep)
    assert sleep.seconds == pytest.approx(0.01)  # the policy's
    # An attempt (after the recheck's judgement, say) starts the window again.
    run.clock.time = 1000.0 + run.settings.recheck
    run.reply(False)
    run.reply(False)
    assert isinstance(run.reply(Watched(1, looked=True, held_left=1)), Judge)
    assert run.reply(Outlook(free=True, next_in_line=True)) == Stop()
    assert isinstance(run.reply(None), Attempt)
    run.reply(blocked(5, version=1))  # Place
    sleep = run.reply()
    assert isinstance(sleep, Sleep)
    assert sleep.seconds == pytest.approx(run.settings.hand_over_check)


def test_paths_a_release_handed_over_are_taken_up_without_an_attempt() -> None:
    run = _waiting_for_hand_over()
    run.clock.time += 0.01
    run.reply(False)  # Behind
    assert run.reply(False) == ReadVersion(1010.0, handed=True, held=("lease-0",))
    assert isinstance(run.reply(Watched(1, looked=True)), Sleep)  # not yet
    run.clock.time += 0.01
    run.reply(False)
    run.reply(False)
    # A release granted the paths to this request (token 44): taken up, no attempt.
    assert run.reply(Watched(2, 44, looked=True)) == TakeUp(1010.0)
    assert run.finish(True) == (44, 6000.02, None)
    assert run.flow.leave() is None  # the hand-over took the queue row


def test_handed_over_paths_may_be_taken_up_by_the_first_renewal() -> None:
    """Where the manager renews its leases, the paths are not extended at
    once: the lease lasts as long as the handed rows, counted from before the
    check that found them, until its first renewal."""
    run = _waiting_for_hand_over()
    run.clock.time += 0.01
    checked_at = run.clock.now()
    run.reply(False)
    run.reply(False)
    assert run.reply(Watched(2, 44, looked=True, handed_for=4.5)) == TakeUp(1010.0, later=True)
    run.clock.time += 0.01
    assert run.finish(None) == (44, checked_at, 4.5)
    assert run.flow.leave() is None


def test_handed_over_paths_that_lapsed_before_they_were_taken_up_queue_again() -> None:
    run = _waiting_for_hand_over()
    run.clock.time += 0.01
    run.reply(False)
    run.reply(False)
    assert run.reply(Watched(2, 44, looked=True)) == TakeUp(1010.0)
    assert run.reply(False) == Place(None, (), new=False)
    assert run.flow.ticket is None
    assert run.reply() == Stop()
    assert run.reply(None) == Attempt(None, queue=True, patience=1010.0, deadline=1010.0)


def test_a_release_in_this_process_may_have_handed_its_paths_over() -> None:
    run = _waiting_for_hand_over()
    # Woken by a release here: unless the manager closed (or the request
    # was cancelled), a look for paths handed over.
    assert run.reply(True) == Stop()
    assert run.reply(None) == ReadVersion(1010.0, handed=True, held=("lease-0",))
    assert run.reply(Watched(2, 45, looked=True)) == TakeUp(1010.0)
    assert run.finish(True) == (45, 6000.0, None)
    # Not handed to this one: an attempt, as without hand-overs.
    run = _waiting_for_hand_over()
    run.reply(True)
    run.reply(None)
    assert run.reply(Watched(2, looked=True)) == Stop()
    # Woken by the manager's close: no read, the error.
    run = _waiting_for_hand_over()
    assert run.reply(True) == Stop()
    with pytest.raises(ManagerClosed):
        run.reply(ManagerClosed("lock paths"))
    assert run.flow.leave() == 5


def test_a_release_here_that_handed_nothing_to_a_request_behind_others_brings_no_attempt() -> None:
    """Woken by a release of its process, a request whose check finds older
    requests still queued ahead of it sleeps on: they go first. It used to
    attempt at once, and with a hundred threads waiting in each of two
    processes, most such attempts were denied (the paths went to a request
    of the other process)."""
    run = Run(handed_over=True)
    run.reply(None)
    run.reply(blocked(9, version=1, ahead=(waiter(4), waiter(6))))
    run.reply()
    assert run.reply(True) == Stop()
    assert run.reply(None) == ReadVersion(1010.0, handed=True, ahead=(4, 6))
    assert isinstance(run.reply(Watched(2, None, 1, looked=True)), Sleep)
    # Woken again, both gone: it judges its place.
    assert run.reply(True) == Stop()
    assert run.reply(None) == ReadVersion(1010.0, handed=True, ahead=(4, 6))
    assert isinstance(run.reply(Watched(3, None, 0, looked=True)), Judge)


@pytest.mark.parametrize("owner_busy", [True, False])
def test_the_recheck_of_a_request_behind_others_still_queued(owner_busy: bool) -> None:
    """A request whose owner is a thread or a task (busy in this call: it
    takes no lock meanwhile) makes no judgement at its recheck while older
    requests that go first are still queued: they are enough to know an
    attempt would be denied. A named owner may take locks meanwhile, and
    so pass them (the fairness rule): its request judges at the recheck."""
    run = Run(owner_busy=owner_busy)
    run.reply(None)
    run.reply(blocked(9, version=1, ahead=(waiter(4),)))
    run.reply()
    run.clock.time += run.settings.recheck
    run.reply(False)
    assert run.reply(False) == ReadVersion(1010.0, ahead=(4,))
    step = run.reply(Watched(1, None, 1))
    if not owner_busy:
        assert step == Judge(9, 1010.0)
        return
    assert step == Sleep(pytest.approx(0.01), pytest.approx(1.0 / 3 * 5 - run.settings.recheck))
    # The next recheck is a recheck interval away, not due at every check.
    run.clock.time += 0.01
    run.reply(False)
    run.reply(False)
    assert isinstance(run.reply(Watched(1, None, 1)), Sleep)
    # Once they have left, it judges its place.
    run.clock.time += 0.01
    run.reply(False)
    run.reply(False)
    assert run.reply(Watched(2, None, 0)) == Judge(9, 1010.0)


def test_a_request_behind_others_judges_once_they_have_left() -> None:
    """Where releases hand paths over, a move of the version while older
    requests that go first are still queued is theirs: no judging then, and
    while two or more are left no sooner look either (the policy's gaps go
    on growing); with one left, the checks start over from the shortest gap.
    Once they have all left, the request judges its place (it is likely
    next)."""
    run = Run(handed_over=True)
    run.reply(None)
    run.reply(blocked(9, version=1, ahead=(waiter(4), waiter(6))))
    run.reply()
    run.clock.time += 0.01
    run.reply(False)
    assert run.reply(False) == ReadVersion(1010.0, handed=True, ahead=(4, 6))
    # Moved, but both still queued: sleep on, the gaps not started over.
    assert isinstance(run.reply(Watched(2, None, 2, looked=True)), Sleep)
    assert run.delays.resets == 0
    run.clock.time += 0.01
    run.reply(False)
    run.reply(False)
    # Moved again, one left: this request is one hand-over from its turn.
    assert isinstance(run.reply(Watched(3, None, 1, looked=True)), Sleep)
    assert run.delays.resets == 1
    run.clock.time += 0.01
    run.reply(False)
    run.reply(False)
    # Both gone, the version unmoved: judged all the same.
    assert run.reply(Watched(3, None, 0, looked=True)) == Judge(9, 1010.0)
    sleep = run.reply(Outlook(free=False, next_in_line=True))
    assert isinstance(sleep, Sleep)
    # Next in line: checks come every hand_over_check, without the policy's gaps.
    assert sleep.seconds == pytest.approx(run.settings.hand_over_check)
    run.clock.time += 0.001
    run.reply(False)
    assert run.reply(False) == ReadVersion(1010.0, handed=True, ahead=())


def test_a_request_knows_it_is_next_once_all_ahead_left_and_one_of_them_holds() -> None:
    """On a busy path the request just ahead leaves the queue because it was
    granted the paths. When the attempt's reads named every request ahead, a
    check that finds them all gone and one of their leases holding says the
    request is next in line, behind that lease: no judging, and the checks
    come every hand_over_check, asking whether that lease (or the lock that
    blocked the attempt) still holds."""
    run = Run(handed_over=True)
    run.reply(None)
    run.reply(blocked(9, version=1, ahead=(waiter(4), waiter(6)), complete=True))
    run.reply()
    run.clock.time += 0.01
    run.reply(False)
    leases = ("lease-w4", "lease-w6")
    assert run.reply(False) == ReadVersion(1010.0, handed=True, ahead=(4, 6), held=leases)
    assert isinstance(run.reply(Watched(2, None, 1, looked=True, held_left=1)), Sleep)
    run.clock.time += 0.01
    run.reply(False)
    run.reply(False)
    sleep = run.reply(Watched(3, None, 0, looked=True, held_left=1))
    assert isinstance(sleep, Sleep)
    assert sleep.seconds == pytest.approx(run.settings.hand_over_check)
    run.clock.time += 0.001
    run.reply(False)
    # Those leases, and the one that blocked its attempt (it may hold still).
    assert run.reply(False) == ReadVersion(1010.0, handed=True, ahead=(), held=("lease-0", *leases))
    # Another move while one of them still holds (someone else's): sleep on.
    assert isinstance(run.reply(Watched(4, None, None, looked=True, held_left=1)), Sleep)
    run.clock.time += 0.001
    run.reply(False)
    run.reply(False)
    # Released, and not handed over: straight to the attempt.
    assert run.reply(Watched(5, None, None, looked=True, held_left=0)) == Stop()


@pytest.mark.parametrize("complete", [True, False])
def test_a_request_judges_once_all_ahead_left_unless_it_knows_one_of_them_holds(
    complete: bool,
) -> None:
    """The requests ahead all gone, but none of them holding (they gave up,
    or were granted and released already), or the attempt's reads named only
    the youngest of them (a long queue): the request judges its place."""
    run = Run(handed_over=True)
    run.reply(None)
    run.reply(blocked(9, version=1, ahead=(waiter(4),), complete=complete))
    run.reply()
    run.clock.time += 0.01
    run.reply(False)
    assert isinstance(run.reply(False), ReadVersion)
    assert run.reply(Watched(2, None, 0, looked=True, held_left=int(not complete))) == Judge(
        9, 1010.0
    )


def test_where_releases_do_not_hand_over_a_request_behind_others_judges_once_they_left() -> None:
    """A Galera node's or SQLite's releases hand nothing over: the requests
    ahead grant themselves the paths and release them, each moving the
    version. A request behind them sleeps through those moves while any of
    them is still queued, and judges its place once they have all left."""
    run = Run()
    run.reply(None)
    run.reply(blocked(9, version=1, ahead=(waiter(4), waiter(6))))
    run.reply()
    run.clock.time += 0.01
    run.reply(False)
    assert run.reply(False) == ReadVersion(1010.0, ahead=(4, 6))
    assert isinstance(run.reply(Watched(2, None, 2)), Sleep)
    run.clock.time += 0.01
    run.reply(False)
    run.reply(False)
    assert isinstance(run.reply(Watched(3, None, 1)), Sleep)
    assert run.delays.resets == 1  # one left: the checks start over from the shortest gap
    run.clock.time += 0.01
    run.reply(False)
    run.reply(False)
    assert run.reply(Watched(4, None, 0)) == Judge(9, 1010.0)
    # Next in line: the next move (the release of the last one ahead) goes
    # straight to an attempt.
    sleep = run.reply(Outlook(free=False, next_in_line=True))
    assert isinstance(sleep, Sleep)
    assert sleep.seconds == pytest.approx(0.01)  # the policy's: no hand-over to look for
    run.clock.time += 0.01
    run.reply(False)
    assert run.reply(False) == ReadVersion(1010.0)
    assert run.reply(Watched(5)) == Stop()


def _judging_once_the_one_ahead_left() -> Run:
    """A request queued as ticket 9 behind ticket 4 where releases hand paths
    over; its check found 4 gone, and it judges its place."""
    run = Run(handed_over=True)
    run.reply(None)
    run.reply(blocked(9, version=1, ahead=(waiter(4),)))
    run.reply()
    run.clock.time += 0.01
    run.reply(False)
    assert run.reply(False) == ReadVersion(1010.0, handed=True, ahead=(4,))
    assert run.reply(Watched(2, None, 0, looked=True)) == Judge(9, 1010.0)
    return run


def test_paths_handed_over_before_a_judgement_are_taken_up_without_an_attempt() -> None:
    """The requests ahead have left (the last one was granted the paths), and
    by the time the request judges its place, that one has released and
    handed them to this one: taken up from what the judgement read, as a
    check that finds them does; an attempt would cost three round trips
    more (its grant denied by the rows of its own lease, the attempt that
    finds them, and the take-up)."""
    run = _judging_once_the_one_ahead_left()
    judged_at = run.clock.now()
    run.clock.time += 0.01
    handed = Outlook(free=True, next_in_line=True, handed=46, handed_for=4.5)
    assert run.reply(handed) == TakeUp(1010.0, later=True)
    # The lease lasts as long as the rows, counted from before the judgement.
    assert run.finish(None) == (46, judged_at, 4.5)
    assert run.flow.leave() is None  # the hand-over took the queue row
    # Rows with little time left are taken up at once.
    run = _judging_once_the_one_ahead_left()
    assert run.reply(Outlook(free=True, next_in_line=True, handed=46)) == TakeUp(1010.0)
    assert run.finish(True) == (46, run.clock.now(), None)


def test_a_database_whose_releases_do_not_hand_over_is_checked_as_before() -> None:
    """A check that could not look for paths handed over (a Galera node's
    connection) turns the looking off: plain version checks from then on,
    spaced by the wait policy."""
    run = _waiting_for_hand_over()
    run.clock.time += 0.01
    run.reply(False)
    assert run.reply(False) == ReadVersion(1010.0, handed=True, held=("lease-0",))
    sleep = run.reply(Watched(1))
    assert isinstance(sleep, Sleep)
    assert sleep.seconds == pytest.approx(0.01)  # the policy's, not hand_over_check
    run.clock.time += 0.01
    run.reply(False)
    assert run.reply(False) == ReadVersion(1010.0, held=("lease-0",))


def test_the_recheck_judges_even_when_the_version_stands_still() -> None:
    # An expired lock or a dead waiter moves no version.
    run = Run()
    run.reply(None)
    run.reply(blocked(5, version=1, ahead=(waiter(4),)))
    run.reply()
    run.clock.time += run.settings.recheck
    run.reply(False)
    run.reply(False)
    assert run.reply(Watched(1)) == Judge(5, 1010.0)
    assert run.reply(Outlook(free=True, next_in_line=True)) == Stop()


def test_the_queue_row_is_refreshed_and_a_lapsed_one_queues_again() -> None:
    run = Run(settings=Settings(clock=StillClock(), waiter_ttl=3.0, recheck=5.0))
    run.clock = run.settings.clock  # type: ignore[assignment]
    run.reply(None)
    run.reply(blocked(5, version=1))
    sleep = run.reply()
    assert isinstance(sleep, Sleep)
    run.clock.time += 1.0  # waiter_refresh = waiter_ttl / 3
    assert run.reply(False) == Refresh(5, 1010.0)
    assert run.reply(False) == Place(None, (), new=False)  # gone: queue anew
    assert run.flow.ticket is None
    assert run.reply() == Stop()
    assert run.reply(None) == Attempt(None, queue=True, patience=1010.0, deadline=1010.0)


def test_the_deadline_ends_the_wait_with_the_last_blockers() -> None:
    run = Run(wait_limit=1.0)
    run.reply(None)
    run.reply(blocked(5, version=1, ahead=(waiter(4),)))
    run.reply()
    run.clock.time += 1.0
    assert run.reply(False) == Stop()  # one last attempt, for its answer
    last = run.reply(None)
    assert last == Attempt(5, queue=False, patience=1001.0, deadline=None)
    run.reply(blocked(5, version=2, ahead=(waiter(4),)))
    with pytest.raises(LockTimeout) as raised:
        run.reply()
    assert raised.value.held_by == (HOLDER,)
    assert [info.ticket for info in raised.value.queued_behind] == [4]
    assert run.flow.leave() == 5  # the driver gives the place up
    assert run.flow.leave() is None


def test_a_deadlock_ends_the_request() -> None:
    run = Run()
    run.reply(None)
    with pytest.raises(DeadlockDetected):
        run.reply(Deadlocked(party=None, held_by=(HOLDER,)))


def test_a_cancelled_request_raises_what_the_driver_says() -> None:
    run = Run()
    run.reply(None)
    run.reply(blocked(5, version=1))
    run.reply()
    assert run.reply(True) == Stop()  # woken: the event was set
    with pytest.raises(LockCancelled):
        run.reply(LockCancelled(REQUEST.paths))
    assert run.flow.leave() == 5  # and the driver gives the place up


def test_a_closed_manager_ends_the_request_before_its_next_attempt() -> None:
    run = Run()
    with pytest.raises(ManagerClosed):
        run.reply(ManagerClosed("lock paths"))


def test_no_answer_in_time_is_a_lock_timeout_that_says_so() -> None:
    run = Run()
    run.reply(None)
    with pytest.raises(LockTimeout) as raised:
        run.fail(DatabaseTimeout("acquiring locks", TimeoutError("timed out"), "no answer"))
    assert raised.value.unanswered
    assert isinstance(raised.value.__cause__, DatabaseTimeout)


@pytest.mark.parametrize("read", ["refresh", "version", "judge"])
def test_a_read_cut_short_by_the_deadline_is_followed_by_the_last_attempt(read: str) -> None:
    """On a loaded machine a read between attempts, started just before the
    deadline, runs out of the request's time: that is a plain timeout if the
    last attempt gets its answer, not one the database failed to answer."""
    settings = Settings(clock=StillClock(), waiter_ttl=3.0, recheck=0.5)
    run = Run(wait_limit=2.0, settings=settings)
    run.clock = settings.clock  # type: ignore[assignment]
    run.reply(None)
    run.reply(blocked(5, version=1))
    run.reply()
    run.clock.time += 1.0 if read == "refresh" else 0.5  # refresh due at +1.0, recheck at +0.5
    step = run.reply(False)
    if read != "refresh":
        assert step == Behind()
        assert run.reply(False) == ReadVersion(1002.0, held=("lease-0",))
        if read == "judge":
            run.reply(Watched(1))  # the version stood still past the recheck
        step = run.step
    assert type(step) is {"refresh": Refresh, "version": ReadVersion, "judge": Judge}[read]
    run.clock.time = 1002.0
    timed_out = DatabaseTimeout("reading", TimeoutError("timed out"), "no answer within 0.5 s")
    assert run.fail(timed_out) == Stop()
    assert run.reply(None) == Attempt(5, queue=False, patience=1002.0, deadline=None)
    run.reply(blocked(5, version=2))
    with pytest.raises(LockTimeout) as raised:
        run.reply()
    assert not raised.value.unanswered
    # Before the deadline, a read that gets no answer ends the request.
    run = Run(wait_limit=2.0, settings=settings)
    run.clock = settings.clock  # type: ignore[assignment]
    run.reply(None)
    run.reply(blocked(5, version=1))
    run.reply()
    run.clock.time += 0.01
    run.reply(False)
    assert isinstance(run.step, Behind)
    run.reply(False)
    with pytest.raises(LockTimeout) as raised:
        run.fail(timed_out)
    assert raised.value.unanswered


def test_a_try_lock_that_gets_no_answer_raises_the_database_timeout() -> None:
    run = Run(blocking=False, wait_limit=0.0)
    run.reply(None)
    with pytest.raises(DatabaseTimeout):
        run.fail(DatabaseTimeout("acquiring locks", TimeoutError("timed out"), "no answer"))


def test_lost_races_until_the_deadline_are_a_contended_timeout() -> None:
    run = Run()
    run.reply(None)
    with pytest.raises(LockTimeout) as raised:
        run.fail(ContentionTimeout("acquiring locks", RuntimeError("1213"), "lost 9 races"))
    assert raised.value.contended
    # A try-lock reports the ContentionTimeout itself (the manager turns it into None).
    run = Run(blocking=False, wait_limit=0.0)
    run.reply(None)
    with pytest.raises(ContentionTimeout):
        run.fail(ContentionTimeout("acquiring locks", RuntimeError("1213"), "lost 9 races"))


def test_without_a_timeout_the_calls_keep_their_own_bounds() -> None:
    run = Run(wait_limit=None)
    attempt = run.reply(None)
    assert isinstance(attempt, Attempt)
    assert attempt.deadline is None  # each call: settings.call_time
    assert attempt.patience == float("inf")
    run.reply(blocked(5, version=1))
    run.reply()
    run.clock.time += 0.01
    run.reply(False)
    assert run.reply(False) == ReadVersion(None, held=("lease-0",))


# -- a first attempt made before the steps (the driver's entry) ------------------


def _first_made(outcome_or_error: object, **options: Any) -> Run:
    """A run whose driver made the first attempt before the steps, as
    pathlock._acquire does, and gave the steps its outcome or error."""
    run = Run(**options)
    run.flow = AcquireFlow(
        REQUEST,
        run.settings,
        run.delays,
        blocking=options.get("blocking", True),
        wait_limit=options.get("wait_limit", 10.0),
    )
    run.attempt = run.flow.attempt()  # type: ignore[attr-defined]
    run.steps = run.flow.steps(outcome_or_error)
    return run


def test_a_first_attempt_made_by_the_driver_is_the_steps_first() -> None:
    run = Run()
    made = _first_made(None)
    assert made.attempt == run.reply(None)  # type: ignore[attr-defined]
    assert made.flow.granted(Granted(42)) == (42, 6000.0, None)
    assert made.flow.leave() is None


def test_the_steps_go_on_from_a_first_attempt_that_was_denied() -> None:
    made = _first_made(blocked(5, version=1))
    assert next(made.steps) == Place(5, (), new=True)
    assert made.flow.ticket == 5
    assert isinstance(made.reply(), Sleep)
    # A try-lock that was denied only reports it.
    made = _first_made(blocked(None, 1), blocking=False, wait_limit=0.0)
    with pytest.raises(StopIteration) as done:
        next(made.steps)
    assert done.value.value is None


def test_a_first_attempt_that_failed_ends_the_steps_as_if_thrown_in() -> None:
    contended = ContentionTimeout("acquiring locks", RuntimeError("1213"), "lost 9 races")
    with pytest.raises(LockTimeout) as raised:
        next(_first_made(contended).steps)
    assert raised.value.contended
    with pytest.raises(ContentionTimeout):
        next(_first_made(contended, blocking=False, wait_limit=0.0).steps)
    unanswered = DatabaseTimeout("acquiring locks", TimeoutError("timed out"), "no answer")
    with pytest.raises(LockTimeout) as timed_out:
        next(_first_made(unanswered).steps)
    assert timed_out.value.unanswered
