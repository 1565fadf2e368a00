"""Unit tests of the local wake-ups by place in the queue: a release wakes the
local waiters that no other local waiter is ahead of, and a waiter that
leaves hands its place on. Thread tests assert only generous bounds."""

from __future__ import annotations

import threading
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from pathlock.waiting import LocalWakeups

GENEROUS = 5.0  # seconds a prompt wake-up may take on a loaded machine
SHORT = 0.2  # seconds a waiter that must not be woken sleeps


def test_a_release_wakes_only_the_waiter_that_nobody_local_is_ahead_of() -> None:
    wakeups = LocalWakeups()
    with wakeups.watch(1) as first, wakeups.watch(1) as second, wakeups.watch(1) as third:
        first.queued(10, ())
        second.queued(11, (10,))
        third.queued(12, (10, 11))
        wakeups.notify(1)
        assert first.wait(GENEROUS)
        assert not second.wait(SHORT)
        assert not third.wait(SHORT)


def test_waiters_of_other_paths_are_each_woken() -> None:
    wakeups = LocalWakeups()
    with wakeups.watch(1) as one, wakeups.watch(1) as other:
        one.queued(10, ())
        other.queued(11, ())  # nothing ahead: it does not conflict with ticket 10
        wakeups.notify(1)
        assert one.wait(GENEROUS)
        assert other.wait(GENEROUS)


def test_a_waiter_that_leaves_wakes_the_one_behind_it_to_look() -> None:
    wakeups = LocalWakeups()
    with wakeups.watch(1) as behind:
        behind.queued(11, (10,))
        ahead = wakeups.watch(1).__enter__()
        ahead.queued(10, ())
        assert behind.behind()
        ahead.__exit__(None, None, None)  # granted: it leaves
        assert not behind.behind()
        # Woken to look at the database again, not told of a release.
        started = time.monotonic()
        assert not behind.wait(GENEROUS)
        assert time.monotonic() - started < GENEROUS / 2


def test_a_release_the_leaver_did_not_use_passes_on() -> None:
    wakeups = LocalWakeups()
    with wakeups.watch(1) as behind:
        behind.queued(11, (10,))
        with wakeups.watch(1) as ahead:
            ahead.queued(10, ())
            wakeups.notify(1)  # for `ahead`, which gives up before it looks
        assert behind.wait(GENEROUS)


def test_a_waiter_behind_sleeps_the_idle_time_not_the_poll_time() -> None:
    wakeups = LocalWakeups()
    with wakeups.watch(1) as ahead, wakeups.watch(1) as behind:
        ahead.queued(10, ())
        behind.queued(11, (10,))
        woke = threading.Event()

        def sleep() -> None:
            behind.wait(0.001, idle=60.0)
            woke.set()

        thread = threading.Thread(target=sleep)
        thread.start()
        assert not woke.wait(SHORT), "a waiter behind another must not poll"
        ahead.queued(None, ())  # its row lapsed: it queues again, behind
        assert woke.wait(GENEROUS)
        thread.join()


def test_a_release_before_the_first_attempt_is_not_lost() -> None:
    wakeups = LocalWakeups()
    with wakeups.watch(1) as watch:
        wakeups.notify(1)  # lands while the first attempt runs
        watch.queued(10, ())
        assert watch.wait(GENEROUS)


def test_many_waiters_in_a_chain_are_served_one_at_a_time() -> None:
    wakeups = LocalWakeups()
    count = 50
    watches = [wakeups.watch(1).__enter__() for _ in range(count)]
    for number, watch in enumerate(watches):
        watch.queued(100 + number, range(100, 100 + number))
    for number, watch in enumerate(watches):
        assert [other.behind() for other in watches[number:]] == [False] + [True] * (
            count - number - 1
        )
        wakeups.notify(1)
        assert watch.wait(GENEROUS)
        watch.__exit__(None, None, None)


_TICKETS = st.integers(min_value=1, max_value=6)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["enter", "queued", "close", "notify"]),
            st.integers(min_value=0, max_value=4),
            st.none() | _TICKETS,
            st.frozensets(_TICKETS, max_size=3),
        ),
        max_size=40,
    )
)
def test_a_release_wakes_the_waiters_nobody_local_is_ahead_of_whatever_came_before(
    steps: list[tuple[str, int, int | None, frozenset[int]]],
) -> None:
    """Whatever came before (waiters entering, queueing with others ahead,
    leaving), a release wakes exactly the waiters that no queued request of
    the process is ahead of."""
    wakeups = LocalWakeups()
    watches = [wakeups.watch(1) for _ in range(5)]
    entered: set[int] = set()
    tickets: dict[int, int] = {}  # ticket -> the watch that holds it
    for action, number, ticket, ahead in steps:
        watch = watches[number]
        if action == "enter" and number not in entered:
            watch.__enter__()
            entered.add(number)
        elif action == "queued" and number in entered:
            if ticket is not None and tickets.get(ticket, number) != number:
                continue  # a ticket is one request's
            for held in [held for held, owner in tickets.items() if owner == number]:
                del tickets[held]
            if ticket is not None:
                tickets[ticket] = number
            watch.queued(ticket, ahead - {ticket} if ticket is not None else ahead)
        elif action == "close" and number in entered:
            watch.close()
            entered.discard(number)
            for held in [held for held, owner in tickets.items() if owner == number]:
                del tickets[held]
        elif action == "notify":
            for each in watches:
                each._released = False
            wakeups.notify(1)
            woken = {index for index, each in enumerate(watches) if each._released}
            expected = {
                index for index in entered if not set(tickets).intersection(watches[index]._ahead)
            }
            assert woken == expected
