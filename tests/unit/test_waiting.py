"""Unit tests of the wait policies: the reverse exponential backoff and the local
wake-ups. Thread tests assert only generous bounds: machines are noisy."""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pathlock.errors import InvalidArgument, PathLockError
from pathlock.waiting import ExponentialBackoff, LocalWakeups, ReverseExponentialBackoff, Watch

PROPERTY = settings(max_examples=200, deadline=None)
GENEROUS = 5.0  # seconds: how long a "prompt" wake-up may take on a loaded machine
TIMEOUT = 10.0  # seconds: the sleeps that a wake-up must cut short

# -- ReverseExponentialBackoff.delay ------------------------------------------------


def test_default_schedule() -> None:
    policy = ReverseExponentialBackoff()
    assert policy.delay(1) == pytest.approx(0.250)
    assert policy.delay(2) == pytest.approx(math.sqrt(250) / 1000)
    assert policy.delay(3) == pytest.approx(0.010)
    assert policy.delay(15) == pytest.approx(0.010)
    assert policy.delay(16) == pytest.approx(0.250)


@pytest.mark.parametrize("cycle", [1, 2, 3, 7, 15, 16, 100])
def test_delay_never_raises_and_never_goes_below_floor(cycle: int) -> None:
    policy = ReverseExponentialBackoff(cycle=cycle)
    for retry in range(1, 1001):
        delay = policy.delay(retry)
        assert math.isfinite(delay)
        assert policy.floor <= delay <= policy.first


@pytest.mark.parametrize("retry", [15, 30, 45, 60, 150, 1500, 15 * 10**6])
def test_every_fifteenth_retry_does_not_divide_by_zero(retry: int) -> None:
    # The original divided by retry % 15: zero on exactly these retries.
    policy = ReverseExponentialBackoff()
    assert policy.delay(retry) == pytest.approx(policy.floor)


def test_first_below_one_millisecond_is_rejected() -> None:
    # The formula works in milliseconds: below 1 ms, roots grow instead of
    # shrinking, so such a policy would not be "reverse exponential" at all.
    with pytest.raises(InvalidArgument, match="first"):
        ReverseExponentialBackoff(first=0.0005, floor=0.0001)


# Realistic parameters: the first wait is at least a millisecond.
floors = st.floats(min_value=1e-4, max_value=1.0)
firsts = st.floats(min_value=1e-3, max_value=600.0)
cycles = st.integers(min_value=1, max_value=40)


@st.composite
def policies(draw: st.DrawFn) -> ReverseExponentialBackoff:
    first = draw(firsts)
    floor = min(draw(floors), first)
    jitter = draw(st.floats(min_value=0.0, max_value=0.99))
    return ReverseExponentialBackoff(first=first, floor=floor, cycle=draw(cycles), jitter=jitter)


@PROPERTY
@given(policies(), st.integers(min_value=1, max_value=1000))
def test_delay_bounds_property(policy: ReverseExponentialBackoff, retry: int) -> None:
    delay = policy.delay(retry)
    assert math.isfinite(delay)
    assert delay >= policy.floor
    assert delay <= policy.first * (1 + 1e-12)


@PROPERTY
@given(policies())
def test_first_delay_is_first(policy: ReverseExponentialBackoff) -> None:
    assert policy.delay(1) == pytest.approx(policy.first, rel=1e-12)


@PROPERTY
@given(policies())
def test_delays_shrink_within_a_cycle(policy: ReverseExponentialBackoff) -> None:
    delays = [policy.delay(retry) for retry in range(1, policy.cycle + 1)]
    for earlier, later in itertools.pairwise(delays):
        assert later <= earlier


@PROPERTY
@given(policies(), st.integers(min_value=1, max_value=500))
def test_cycle_restarts(policy: ReverseExponentialBackoff, retry: int) -> None:
    assert policy.delay(policy.cycle + 1) == policy.delay(1)
    assert policy.delay(retry + policy.cycle) == policy.delay(retry)


# -- Delays (jitter) -----------------------------------------------------------------


@PROPERTY
@given(policies(), st.integers(min_value=1, max_value=40))
def test_jitter_stays_within_its_fraction(policy: ReverseExponentialBackoff, count: int) -> None:
    delays = policy.start()
    spread = policy.jitter
    for retry in range(1, count + 1):
        base = policy.delay(retry)
        got = delays.next()
        assert base * (1 - spread) * (1 - 1e-12) <= got <= base * (1 + spread) * (1 + 1e-12)


def test_no_jitter_means_exact_delays() -> None:
    policy = ReverseExponentialBackoff(jitter=0.0)
    delays = policy.start()
    assert [delays.next() for _ in range(31)] == [policy.delay(n) for n in range(1, 32)]


def test_each_request_gets_a_fresh_schedule() -> None:
    policy = ReverseExponentialBackoff(jitter=0.0)
    first = policy.start()
    for _ in range(5):
        first.next()
    second = policy.start()
    assert second.next() == policy.delay(1)
    assert first.next() == policy.delay(6)


def test_jitter_actually_spreads() -> None:
    policy = ReverseExponentialBackoff(jitter=0.5)
    seen = {policy.start().next() for _ in range(50)}
    assert len(seen) > 1


# -- constructor validation ------------------------------------------------------------

_BAD_OPTIONS = [
    {"first": 0.01, "floor": 0.02},
    {"first": -1.0},
    {"floor": -0.01},
    {"floor": 0.0},
    {"first": 0.0, "floor": 0.0},
    {"first": math.nan},
    {"floor": math.nan},
    {"first": math.inf},
    {"floor": math.inf, "first": math.inf},
    {"cycle": 0},
    {"cycle": -1},
    {"jitter": 1.0},
    {"jitter": 1.5},
    {"jitter": -0.1},
    {"jitter": math.nan},
]


def _option_id(options: dict[str, float]) -> str:
    return ",".join(f"{name}={value}" for name, value in options.items())


@pytest.mark.parametrize("options", _BAD_OPTIONS, ids=_option_id)
def test_constructor_rejects_bad_values(options: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=r"floor|first|cycle|jitter"):
        ReverseExponentialBackoff(**options)  # type: ignore[arg-type]


def test_constructor_errors_are_pathlock_errors() -> None:
    # DESIGN.md: every error the library raises derives from PathLockError (bad
    # input also from ValueError, i.e. InvalidArgument).
    foreign = []
    for options in _BAD_OPTIONS:
        try:
            ReverseExponentialBackoff(**options)  # type: ignore[arg-type]
        except PathLockError:
            pass
        except ValueError as error:
            foreign.append(f"{_option_id(options)}: {type(error).__name__}")
    assert foreign == [], "bad options raise errors outside the PathLockError family"


def test_constructor_accepts_edge_values() -> None:
    policy = ReverseExponentialBackoff(first=0.05, floor=0.05, cycle=1, jitter=0.0)
    assert [policy.delay(n) for n in range(1, 5)] == pytest.approx([0.05] * 4)
    ReverseExponentialBackoff(jitter=0.999)


def test_constructor_is_keyword_only() -> None:
    with pytest.raises(TypeError):
        ReverseExponentialBackoff(0.25)  # type: ignore[misc]


# -- LocalWakeups / Watch ------------------------------------------------------------


def _start(target: Callable[[], None]) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


def test_notify_wakes_a_waiter_of_the_same_customer() -> None:
    wakeups = LocalWakeups()
    watching = threading.Event()
    returned = threading.Event()

    def waiter() -> None:
        with wakeups.watch(7) as watch:
            watching.set()
            watch.wait(TIMEOUT)
            returned.set()

    thread = _start(waiter)
    assert watching.wait(GENEROUS)
    # Give the waiter time to fall asleep; the test holds either way, because a
    # notify before wait() must not be lost.
    time.sleep(0.1)
    assert not returned.is_set()
    wakeups.notify(7)
    assert returned.wait(GENEROUS), "notify did not wake the waiter"
    thread.join(GENEROUS)
    assert not thread.is_alive()
    assert wakeups._entries == {}


def test_notify_wakes_every_waiter_of_the_customer() -> None:
    wakeups = LocalWakeups()
    count = 4
    watching = threading.Barrier(count + 1)
    returned = [threading.Event() for _ in range(count)]

    def waiter(done: threading.Event) -> None:
        with wakeups.watch(3) as watch:
            watching.wait(GENEROUS)
            watch.wait(TIMEOUT)
            done.set()

    threads = [_start(lambda done=done: waiter(done)) for done in returned]
    watching.wait(GENEROUS)
    time.sleep(0.1)
    wakeups.notify(3)
    for done in returned:
        assert done.wait(GENEROUS), "a waiter was not woken"
    for thread in threads:
        thread.join(GENEROUS)
        assert not thread.is_alive()
    assert wakeups._entries == {}


def test_notify_for_another_customer_does_not_wake() -> None:
    wakeups = LocalWakeups()
    short = 0.2
    watching = threading.Barrier(3)
    other_returned = threading.Event()
    elapsed: list[float] = []

    def sleeper() -> None:
        with wakeups.watch(1) as watch:
            watching.wait(GENEROUS)
            started = time.monotonic()
            watch.wait(short)
            elapsed.append(time.monotonic() - started)

    def other() -> None:
        with wakeups.watch(2) as watch:
            watching.wait(GENEROUS)
            watch.wait(TIMEOUT)
            other_returned.set()

    threads = [_start(sleeper), _start(other)]
    watching.wait(GENEROUS)
    wakeups.notify(2)
    wakeups.notify(99)  # nobody watches customer 99: a no-op
    assert other_returned.wait(GENEROUS)
    for thread in threads:
        thread.join(GENEROUS)
        assert not thread.is_alive()
    # Only a lower bound: the sleeper of customer 1 slept its whole timeout.
    assert elapsed
    assert elapsed[0] >= short * 0.9
    assert wakeups._entries == {}


def test_notify_between_watch_and_wait_is_not_lost() -> None:
    wakeups = LocalWakeups()
    with wakeups.watch(5) as watch:
        wakeups.notify(5)  # e.g. a release lands during the attempt
        started = time.monotonic()
        watch.wait(TIMEOUT)
        assert time.monotonic() - started < GENEROUS
    assert wakeups._entries == {}


def test_notify_from_another_thread_between_watch_and_wait_is_not_lost() -> None:
    wakeups = LocalWakeups()
    notified = threading.Event()
    returned = threading.Event()

    def notifier() -> None:
        wakeups.notify(5)
        notified.set()

    def waiter() -> None:
        with wakeups.watch(5) as watch:
            _start(notifier).join(GENEROUS)
            assert notified.is_set()
            watch.wait(TIMEOUT)
            returned.set()

    thread = _start(waiter)
    assert returned.wait(GENEROUS), "a notify before wait() was lost"
    thread.join(GENEROUS)
    assert wakeups._entries == {}


def test_a_notify_wakes_only_one_wait() -> None:
    wakeups = LocalWakeups()
    short = 0.2
    with wakeups.watch(5) as watch:
        wakeups.notify(5)
        watch.wait(TIMEOUT)  # consumes the notify at once
        started = time.monotonic()
        watch.wait(short)  # nothing new: sleeps its whole timeout
        assert time.monotonic() - started >= short * 0.9


def test_notify_before_watch_is_not_remembered() -> None:
    wakeups = LocalWakeups()
    short = 0.2
    wakeups.notify(5)
    assert wakeups._entries == {}
    with wakeups.watch(5) as watch:
        started = time.monotonic()
        watch.wait(short)
        assert time.monotonic() - started >= short * 0.9


def test_wait_with_zero_timeout_returns() -> None:
    wakeups = LocalWakeups()
    with wakeups.watch(5) as watch:
        watch.wait(0)


def test_wait_outside_the_with_block_raises() -> None:
    wakeups = LocalWakeups()
    watch = wakeups.watch(5)
    with pytest.raises(RuntimeError, match="outside"):
        watch.wait(0)
    with watch:
        pass
    with pytest.raises(RuntimeError, match="outside"):
        watch.wait(0)


def test_entries_are_cleaned_up_after_the_last_watcher() -> None:
    wakeups = LocalWakeups()
    with wakeups.watch(1):
        with wakeups.watch(1):
            with wakeups.watch(2):
                assert set(wakeups._entries) == {1, 2}
            assert set(wakeups._entries) == {1}
        assert set(wakeups._entries) == {1}
    assert wakeups._entries == {}


def test_entries_are_cleaned_up_when_the_block_raises() -> None:
    wakeups = LocalWakeups()
    with pytest.raises(KeyError), wakeups.watch(1):
        raise KeyError("boom")
    assert wakeups._entries == {}


def test_entries_are_cleaned_up_after_many_threads() -> None:
    wakeups = LocalWakeups()
    count = 16
    start = threading.Barrier(count)
    errors: list[BaseException] = []

    def worker(index: int) -> None:
        try:
            start.wait(GENEROUS)
            for _ in range(50):
                with wakeups.watch(index % 3) as watch:
                    wakeups.notify(index % 3)
                    watch.wait(0.001)
        except BaseException as error:  # noqa: BLE001 - reported by the main thread
            errors.append(error)

    threads = [_start(lambda index=index: worker(index)) for index in range(count)]
    for thread in threads:
        thread.join(TIMEOUT * 3)
        assert not thread.is_alive()
    assert errors == []
    assert wakeups._entries == {}


# -- ExponentialBackoff --------------------------------------------------------------


def test_exponential_default_schedule() -> None:
    policy = ExponentialBackoff()
    assert [policy.delay(n) for n in range(1, 6)] == pytest.approx(
        [0.002, 0.004, 0.008, 0.010, 0.010]
    )


@pytest.mark.parametrize("check", [10**3, 10**6, 10**18])
def test_exponential_backoff_stays_at_its_maximum_for_long_waits(check: int) -> None:
    # factor ** check would overflow a float long before this.
    assert ExponentialBackoff().delay(check) == pytest.approx(0.010)


@given(
    first=st.floats(min_value=1e-4, max_value=1.0),
    ratio=st.floats(min_value=1.0, max_value=100.0),
    factor=st.floats(min_value=1.0, max_value=10.0),
    check=st.integers(min_value=1, max_value=10**6),
)
@PROPERTY
def test_exponential_backoff_grows_within_its_bounds(
    first: float, ratio: float, factor: float, check: int
) -> None:
    policy = ExponentialBackoff(first=first, maximum=first * ratio, factor=factor)
    delay = policy.delay(check)
    assert first <= delay <= policy.maximum * (1 + 1e-9)
    assert delay <= policy.delay(check + 1) * (1 + 1e-9)


@pytest.mark.parametrize(
    "options",
    [
        {"first": 0},
        {"first": -1},
        {"first": 0.2, "maximum": 0.1},
        {"maximum": math.inf},
        {"first": math.nan},
        {"factor": 0.5},
        {"factor": math.nan},
        {"jitter": 1.0},
        {"jitter": -0.1},
    ],
)
def test_exponential_backoff_rejects_bad_settings(options: dict[str, float]) -> None:
    with pytest.raises(InvalidArgument):
        ExponentialBackoff(**options)


def test_exponential_backoff_jitter_spreads_around_the_schedule() -> None:
    delays = ExponentialBackoff(jitter=0.2).start()
    first = [delays.next() for _ in range(3)]
    assert 0.0016 <= first[0] <= 0.0024
    assert 0.0032 <= first[1] <= 0.0048


def test_watch_wait_reports_whether_a_release_woke_it() -> None:
    wakeups = LocalWakeups()
    with wakeups.watch(1) as watch:
        assert watch.wait(0.001) is False
        wakeups.notify(1)
        assert watch.wait(TIMEOUT) is True
        wakeups.notify(2)  # another customer
        assert watch.wait(0.001) is False


def test_exponential_backoff_starts_over_when_the_queue_moves() -> None:
    delays = ExponentialBackoff(jitter=0).start()
    assert [delays.next() for _ in range(5)] == pytest.approx([0.002, 0.004, 0.008, 0.01, 0.01])
    delays.reset()
    assert delays.next() == pytest.approx(0.002)


def test_the_naive_algorithms_backoff_never_starts_over() -> None:
    # The original counted retries per request; a reset would send it back to 250 ms.
    delays = ReverseExponentialBackoff(jitter=0).start()
    assert [delays.next() for _ in range(3)] == pytest.approx([0.25, 0.0158, 0.01], rel=1e-2)
    delays.reset()
    assert delays.next() == pytest.approx(0.01)


def test_a_release_wakes_only_the_waiters_whose_paths_it_may_free() -> None:
    """With requests waiting in many folders, a release in one of them wakes
    its waiters, not every folder's: each would attempt, and be denied."""
    wakeups = LocalWakeups()
    with (
        wakeups.watch(1, (("/a/x", "exclusive"),)) as inside,
        wakeups.watch(1, (("/b", "exclusive"),)) as sibling,
        wakeups.watch(1, (("/a", "shared"),)) as reader,
        wakeups.watch(1) as anything,
    ):
        wakeups.notify(1, (("/a", "exclusive"),))
        assert inside.wait(TIMEOUT) is True
        assert reader.wait(TIMEOUT) is True
        assert anything.wait(TIMEOUT) is True  # paths unknown: any release
        assert sibling.wait(0.001) is False
        wakeups.notify(1, (("/a/y", "shared"),))  # shared beside shared
        assert reader.wait(0.001) is False
        wakeups.notify(1)  # paths unknown: everyone
        assert sibling.wait(TIMEOUT) is True


def test_a_waiter_is_woken_when_the_last_local_request_ahead_of_it_leaves() -> None:
    wakeups = LocalWakeups()
    with (
        wakeups.watch(1, (("/a", "exclusive"),)) as first,
        wakeups.watch(1, (("/a", "exclusive"),)) as second,
        wakeups.watch(1, (("/a", "exclusive"),)) as third,
    ):
        first.queued(10, ())
        second.queued(11, (10,))
        third.queued(12, (10, 11))
        assert not first.behind()
        assert second.behind()
        assert third.behind()
        wakeups.notify(1, (("/a", "exclusive"),))  # only the first is woken
        assert first.wait(TIMEOUT) is True
        assert second.wait(0.001) is False
        assert third.wait(0.001) is False
        first.queued(None, ())  # granted: the second is next here
        assert _woken_within(second, GENEROUS)
        assert not second.behind()
        assert third.behind()
        second.close()  # gave up: the third is next
        assert not third.behind()
        assert _woken_within(third, GENEROUS)
    assert not wakeups._entries  # nothing left behind


def _woken_within(watch: Watch, seconds: float) -> bool:
    """Whether ``watch``'s sleep of up to TIMEOUT ended within ``seconds``
    (woken because a request ahead of it left: no release, so False)."""
    started = time.monotonic()
    assert watch.wait(TIMEOUT, idle=TIMEOUT) is False
    return time.monotonic() - started < seconds


def test_a_refresh_takes_along_the_queue_rows_of_the_process_that_are_due() -> None:
    """The waiters of a process keep their rows alive together: a refresh
    takes every row that is due and not already being refreshed, and a
    request whose row such a refresh keeps alive sends nothing. 300 waiting
    threads each sent a refresh of all 300 rows while the one before was
    under way, and the process made no progress."""
    wakeups = LocalWakeups()
    with (
        wakeups.watch(1) as first,
        wakeups.watch(1) as second,
        wakeups.watch(1) as third,
    ):
        for watch, ticket in ((first, 10), (second, 11), (third, 12)):
            watch.queued(ticket, ())
        assert first.to_refresh(10, since=99.0, now=100.0) == [10, 11, 12]
        assert second.to_refresh(11, since=99.5, now=100.5) == []  # under way
        first.kept_alive([10, 11, 12], {10, 12}, began=100.0)  # 11 lapsed
        assert third.to_refresh(12, since=99.9, now=101.0) == []  # found alive
        assert second.to_refresh(11, since=99.9, now=101.2) == [11]  # not found alive
        second.kept_alive([11], None, began=101.2)  # failed: no longer under way
        assert second.to_refresh(11, since=99.9, now=101.7) == [11]
        # Much later: all due again, the failed one's too.
        assert third.to_refresh(12, since=150.0, now=151.0) == [10, 11, 12]
