"""The checks of a process's waiting requests on one customer, read together
(pathlock._polls), with a read that the test controls: real threads, no
database."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from pathlock import _polls as polls
from pathlock._core.records import Watched
from pathlock._polls import Ask, SharedPolls

pytestmark = pytest.mark.timeout(30)

CUSTOMER = 7
HANG = 10.0


class Reads:
    """The read: each answers an ask with its own number of tickets ahead
    as the version, so that an answer shows whose it is. A read may be held
    (``hold``) until the test lets it go, or fail."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.started = threading.Event()
        self.hold: threading.Event | None = None
        self.error: BaseException | None = None
        self.lock = threading.Lock()

    def __call__(
        self, customer_id: int, asks: Sequence[Ask], _deadline: float | None
    ) -> list[Watched]:
        assert customer_id == CUSTOMER
        with self.lock:
            self.batches.append([ask.asker for ask in asks])
        self.started.set()
        if self.hold is not None:
            assert self.hold.wait(HANG)
        if self.error is not None:
            error, self.error = self.error, None
            raise error
        return [Watched(len(ask.ahead)) for ask in asks]


def _ask(asker: str, ahead: int = 0) -> Ask:
    return Ask(None, tuple(range(ahead)), (), asker)


@pytest.fixture
def reads() -> Reads:
    return Reads()


def _shared(reads: Reads, gather: float = 0.5) -> SharedPolls:
    return SharedPolls(reads, gather=gather, call_time=HANG)


def _checking(
    pool: ThreadPoolExecutor, shared: SharedPolls, ask: Ask, deadline: float | None = None
) -> Future[Watched]:
    return pool.submit(shared.check, CUSTOMER, ask, deadline)


def _until(condition: object, seconds: float = HANG) -> None:
    ends = time.monotonic() + seconds
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < ends, "never happened"
        time.sleep(0.001)


def test_a_lone_check_reads_at_once_and_again_when_due(reads: Reads) -> None:
    shared = _shared(reads)
    began = time.monotonic()
    assert shared.check(CUSTOMER, _ask("a", 3), None) == Watched(3)
    assert shared.check(CUSTOMER, _ask("a", 2), None) == Watched(2)  # not held back
    assert time.monotonic() - began < 0.25
    assert reads.batches == [["a"], ["a"]]


def test_checks_due_during_a_read_go_together_in_the_next(reads: Reads) -> None:
    shared = _shared(reads, gather=0.001)
    reads.hold = threading.Event()
    with ThreadPoolExecutor(6) as pool:
        first = _checking(pool, shared, _ask("a", 1))
        assert reads.started.wait(HANG)
        others = [_checking(pool, shared, _ask(f"w{n}", n + 2)) for n in range(5)]
        time.sleep(0.05)  # all five wait for the read under way
        assert len(reads.batches) == 1
        reads.hold.set()
        assert first.result(HANG) == Watched(1)
        assert [other.result(HANG) for other in others] == [Watched(n + 2) for n in range(5)]
    assert reads.batches[0] == ["a"]
    assert sorted(reads.batches[1]) == [f"w{n}" for n in range(5)]
    assert len(reads.batches) == 2


def test_a_read_for_another_request_gathers_the_checks_due_until_then(reads: Reads) -> None:
    shared = _shared(reads, gather=0.3)
    shared.check(CUSTOMER, _ask("a"), None)
    with ThreadPoolExecutor(4) as pool:
        began = time.monotonic()
        checks = [_checking(pool, shared, _ask(f"w{n}", n)) for n in range(4)]
        assert [check.result(HANG) for check in checks] == [Watched(n) for n in range(4)]
        took = time.monotonic() - began
    assert 0.2 < took < 2.0  # held back until 0.3 s after the first read
    assert len(reads.batches) == 2
    assert sorted(reads.batches[1]) == [f"w{n}" for n in range(4)]


def test_a_gathering_read_ends_by_its_checks_deadline(reads: Reads) -> None:
    shared = _shared(reads, gather=5.0)
    shared.check(CUSTOMER, _ask("a"), None)
    began = time.monotonic()
    assert shared.check(CUSTOMER, _ask("b"), began + 0.1) == Watched(0)
    assert time.monotonic() - began < 1.0


def test_the_checks_of_a_failed_read_read_alone_and_its_reader_gets_the_error(
    reads: Reads,
) -> None:
    shared = _shared(reads, gather=0.001)
    reads.hold = threading.Event()
    reads.error = RuntimeError("the database went away")
    with ThreadPoolExecutor(4) as pool:
        first = _checking(pool, shared, _ask("a"))
        assert reads.started.wait(HANG)
        # These wait for the next read: it is handed to one of them, whose
        # read answers all three.
        others = [_checking(pool, shared, _ask(f"w{n}", n)) for n in range(3)]
        time.sleep(0.05)
        reads.hold.set()
        with pytest.raises(RuntimeError, match="went away"):
            first.result(HANG)
        assert [other.result(HANG) for other in others] == [Watched(n) for n in range(3)]


def test_an_interrupted_read_leaves_its_checks_to_read_alone(
    reads: Reads, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(polls, "STALLED", 8.0)
    shared = _shared(reads, gather=0.3)
    shared.check(CUSTOMER, _ask("x"), None)
    reads.error = KeyboardInterrupt()
    with ThreadPoolExecutor(4) as pool:
        # One read gathers the three; it is interrupted.
        checks = [_checking(pool, shared, _ask(f"w{n}", n)) for n in range(3)]
        _until(lambda: len(reads.batches) >= 2)
        outcomes = []
        for check in checks:
            try:
                outcomes.append(check.result(HANG))
            except KeyboardInterrupt:
                outcomes.append(None)
    assert outcomes.count(None) == 1  # the reader's
    assert sorted(reads.batches[1]) == ["w0", "w1", "w2"]
    assert sorted(batch[0] for batch in reads.batches[2:]) == sorted(
        f"w{n}" for n, outcome in enumerate(outcomes) if outcome is not None
    )  # each of the others read again, alone
    assert all(len(batch) == 1 for batch in reads.batches[2:])
    # Nothing is left under way: the next check reads within the gathering
    # time (a read left under way would hold it for polls.STALLED).
    began = time.monotonic()
    assert shared.check(CUSTOMER, _ask("w0", 1), None) == Watched(1)
    assert time.monotonic() - began < 4.0
    assert reads.batches[-1] == ["w0"]


def test_a_check_whose_time_runs_out_reads_alone(reads: Reads) -> None:
    shared = _shared(reads, gather=0.001)
    reads.hold = threading.Event()
    with ThreadPoolExecutor(2) as pool:
        first = _checking(pool, shared, _ask("a"))
        assert reads.started.wait(HANG)
        # Its read alone is held too: let it go once it began.
        late = _checking(pool, shared, _ask("b", 2), time.monotonic() + 0.1)
        _until(lambda: len(reads.batches) == 2)
        assert reads.batches[1] == ["b"]  # alone, after its 0.1 s
        reads.hold.set()
        assert late.result(HANG) == Watched(2)
        assert first.result(HANG) == Watched(0)


def test_a_stalled_read_is_not_waited_for(reads: Reads, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(polls, "STALLED", 0.1)
    shared = _shared(reads, gather=0.001)
    reads.hold = threading.Event()
    with ThreadPoolExecutor(3) as pool:
        first = _checking(pool, shared, _ask("a"))
        assert reads.started.wait(HANG)
        time.sleep(0.15)
        # The read under way began more than 0.1 s ago: this one reads now.
        second = _checking(pool, shared, _ask("b", 1))
        _until(lambda: len(reads.batches) == 2)
        reads.hold.set()
        assert second.result(HANG) == Watched(1)
        assert first.result(HANG) == Watched(0)


def test_many_threads_checking_often_share_their_reads(reads: Reads) -> None:
    """40 threads, each checking every millisecond for 0.5 s: the process
    reads the customer about every ``gather`` seconds, not 20,000 times."""
    shared = _shared(reads, gather=0.01)
    stop = time.monotonic() + 0.5
    checks = [0] * 40

    def waiter(number: int) -> None:
        while time.monotonic() < stop:
            assert shared.check(CUSTOMER, _ask(f"w{number}", number), None) == Watched(number)
            checks[number] += 1
            time.sleep(0.001)

    threads = [threading.Thread(target=waiter, args=(n,)) for n in range(40)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(HANG)
    assert sum(checks) > 200
    assert len(reads.batches) < 0.6 / 0.01 * 2  # one read per gather, and the next
