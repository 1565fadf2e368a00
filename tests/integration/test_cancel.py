"""``lock_paths(cancel=event)``: another thread ends a wait without a signal,
and nothing of the request is left behind."""

from __future__ import annotations

import threading
import time

import pytest

from pathlock import ArgumentTypeError, CustomerLocks, LockCancelled, PathLockManager


def _wait_in_thread(
    locks: CustomerLocks, cancel: threading.Event, outcome: list[object]
) -> threading.Thread:
    def wait() -> None:
        try:
            outcome.append(locks.lock_paths("/a/b", timeout=60, owner="waiter", cancel=cancel))
        except BaseException as error:  # noqa: BLE001 - the test inspects it
            outcome.append(error)

    thread = threading.Thread(target=wait)
    thread.start()
    return thread


def _until(condition: object, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_cancelled_wait_ends_and_leaves_the_queue(
    manager: PathLockManager, customer_id: int
) -> None:
    locks = manager.for_customer(customer_id)
    holder = locks.lock_paths("/a", owner="holder")
    cancel = threading.Event()
    outcome: list[object] = []
    waiter = _wait_in_thread(locks, cancel, outcome)
    _until(lambda: manager.list_waiters(customer_id))
    time.sleep(0.3)  # well into its sleeps between checks
    cancelled_at = time.monotonic()
    cancel.set()
    waiter.join(10)
    took = time.monotonic() - cancelled_at
    (error,) = outcome
    assert isinstance(error, LockCancelled), error
    assert error.paths == (("/a/b", "exclusive"),)
    assert "was cancelled" in str(error)
    assert took < 5  # within 50 ms on an idle machine; a loaded one is slower
    assert manager.list_waiters(customer_id) == []
    assert [info.path for info in manager.list_locks(customer_id)] == ["/a"]
    holder.release()
    with locks.lock_paths("/a/b", timeout=5, owner="next"):
        pass


def test_a_request_cancelled_before_it_starts_makes_no_attempt(
    manager: PathLockManager, customer_id: int
) -> None:
    locks = manager.for_customer(customer_id)
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(LockCancelled):
        locks.lock_paths("/free", cancel=cancel)
    assert manager.list_locks(customer_id) == []
    # An event that is not set changes nothing.
    with locks.lock_paths("/free", cancel=threading.Event()) as lease:
        assert not lease.lost


def test_cancel_must_be_an_event(manager: PathLockManager, customer_id: int) -> None:
    with pytest.raises(ArgumentTypeError, match=r"cancel must be a threading\.Event"):
        manager.for_customer(customer_id).lock_paths("/a", cancel=True)  # type: ignore[arg-type]
