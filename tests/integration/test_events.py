"""The events a manager tells its hooks, against the real databases: one end
per request (granted, timed out, deadlocked, failed) with the seconds it took,
the queue, retries and failover, renewals, losses, releases and the reaper."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import create_engine, delete

from pathlock import (
    ArgumentTypeError,
    BackendError,
    DeadlockDetected,
    Hooks,
    LeaseLost,
    LockTimeout,
    ManagerClosed,
    PathLockManager,
    events,
)
from pathlock.schema import path_locks


class Recorder(Hooks):
    """Every event, in order, by the name of the method that got it."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, Any]] = []
        self._lock = threading.Lock()

    def _add(self, name: str, event: object) -> None:
        with self._lock:
            self.seen.append((name, event))

    def of(self, name: str) -> list[Any]:
        with self._lock:
            return [event for seen, event in self.seen if seen == name]

    def lock_granted(self, event: events.Granted) -> None:
        self._add("granted", event)

    def lock_queued(self, event: events.Queued) -> None:
        self._add("queued", event)

    def lock_timed_out(self, event: events.TimedOut) -> None:
        self._add("timed_out", event)

    def deadlock_detected(self, event: events.Deadlocked) -> None:
        self._add("deadlocked", event)

    def lock_failed(self, event: events.Failed) -> None:
        self._add("failed", event)

    def database_retried(self, event: events.Retried) -> None:
        self._add("retried", event)

    def failed_over(self, event: events.FailedOver) -> None:
        self._add("failed_over", event)

    def leases_renewed(self, event: events.Renewed) -> None:
        self._add("renewed", event)

    def lease_lost(self, event: events.Lost) -> None:
        self._add("lost", event)

    def lease_released(self, event: events.Released) -> None:
        self._add("released", event)

    def expired_reaped(self, event: events.Reaped) -> None:
        self._add("reaped", event)


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def told(database_url: str, recorder: Recorder) -> Iterator[PathLockManager]:
    with PathLockManager(
        database_url, node_id="events", heartbeat=False, hooks=[recorder]
    ) as manager:
        yield manager


def test_a_grant_and_its_release(
    told: PathLockManager, recorder: Recorder, customer_id: int
) -> None:
    locks = told.for_customer(customer_id)
    with locks.lock_paths("/a", shared=["/b"]) as lease:
        time.sleep(0.05)
    (granted,) = recorder.of("granted")
    assert granted.customer_id == customer_id
    assert granted.lease_id == lease.lease_id
    assert granted.paths == (("/a", "exclusive"), ("/b", "shared"))
    assert granted.fencing_token == lease.fencing_token
    assert granted.owner == lease.owner
    assert granted.blocking
    assert 0 <= granted.waited < 5
    (released,) = recorder.of("released")
    assert released.lease_id == lease.lease_id
    assert released.held >= 0.05
    assert not recorder.of("queued")
    assert not recorder.of("lost")
    # A release called again releases nothing more, and says nothing more.
    lease.release()
    assert len(recorder.of("released")) == 1
    # The owner's bulk release tells of each lease.
    first, second = locks.lock_paths("/c"), locks.lock_paths("/d")
    assert locks.release_locks() == 2
    assert [event.lease_id for event in recorder.of("released")[1:]] == [
        first.lease_id,
        second.lease_id,
    ]


def test_a_wait_is_queued_then_granted_or_timed_out(
    told: PathLockManager, recorder: Recorder, customer_id: int
) -> None:
    locks = told.for_customer(customer_id)
    holder = locks.lock_paths("/a", owner="holder")
    with pytest.raises(LockTimeout):
        locks.lock_paths("/a/b", timeout=0.2, owner="waiter")
    (queued,) = recorder.of("queued")
    assert queued.paths == (("/a/b", "exclusive"),)
    assert queued.ahead == 0
    (timed_out,) = recorder.of("timed_out")
    assert timed_out.lease_id == queued.lease_id
    assert timed_out.blocking
    assert not timed_out.unanswered
    assert 0.2 <= timed_out.waited < 5

    # A try-lock that finds the conflict is a request that timed out at once.
    assert locks.try_lock_paths("/a", owner="other") is None
    denied = recorder.of("timed_out")[-1]
    assert not denied.blocking
    assert not recorder.of("granted")[1:]

    threading.Timer(0.2, holder.release).start()
    with locks.lock_paths("/a", timeout=10, owner="third") as lease:
        pass
    granted = recorder.of("granted")[-1]
    assert granted.lease_id == lease.lease_id
    assert granted.waited >= 0.15
    assert recorder.of("queued")[-1].lease_id == lease.lease_id


def test_a_deadlock_and_a_failure_end_their_requests(
    database_url: str, recorder: Recorder, customer_id: int
) -> None:
    manager = PathLockManager(database_url, node_id="events", heartbeat=False, hooks=[recorder])
    locks = manager.for_customer(customer_id)
    held = locks.lock_paths("/a")
    with pytest.raises(DeadlockDetected):
        locks.lock_paths("/a/b", timeout=5)  # the same owner (this thread)
    (deadlocked,) = recorder.of("deadlocked")
    assert deadlocked.paths == (("/a/b", "exclusive"),)

    # close() while a request waits: that request fails with ManagerClosed.
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            locks.lock_paths("/a", owner="waiter", timeout=30)
        except ManagerClosed as error:
            errors.append(error)

    waiter = threading.Thread(target=wait)
    waiter.start()
    deadline = time.monotonic() + 10
    while not recorder.of("queued") and time.monotonic() < deadline:
        time.sleep(0.01)
    manager.close()
    waiter.join(10)
    assert errors
    (failed,) = recorder.of("failed")
    assert failed.error is errors[0]
    assert failed.paths == (("/a", "exclusive"),)
    assert held.released
    assert held.lease_id in [event.lease_id for event in recorder.of("released")]


def test_renewals_losses_and_the_reaper(
    database_url: str, recorder: Recorder, customer_id: int
) -> None:
    with PathLockManager(
        database_url, node_id="events", heartbeat=False, ttl=30, hooks=[recorder]
    ) as manager:
        locks = manager.for_customer(customer_id)
        kept = locks.lock_paths("/kept")
        gone = locks.lock_paths("/gone")
        kept.renew()
        (renewed,) = recorder.of("renewed")
        assert (renewed.leases, renewed.gone, renewed.background) == (1, 0, False)

        manager.release_lease(gone.lease_id, requested_by="test")
        with pytest.raises(LeaseLost):
            gone.renew()
        assert recorder.of("renewed")[-1].gone == 1
        (lost,) = recorder.of("lost")
        assert lost.lease_id == gone.lease_id
        assert "gone" in lost.reason
        gone.release()
        assert gone.lease_id not in [event.lease_id for event in recorder.of("released")]

        short = locks.lock_paths("/short", ttl=1)
        time.sleep(1.5)
        manager.reap_expired()
        reaped = recorder.of("reaped")[-1]
        assert reaped.locks >= 1
        assert reaped.seconds >= 0
        # Released after its rows were reaped: lost, not released.
        short.release()
        assert recorder.of("lost")[-1].lease_id == short.lease_id
        kept.release()


def _refused_url() -> str:
    """A MariaDB URL on a loopback port where nobody listens."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"mysql+pymysql://root@127.0.0.1:{port}/test"


def test_retries_failover_and_a_backend_error(
    mariadb_url: str, recorder: Recorder, customer_id: int
) -> None:
    dead = _refused_url()
    with (
        PathLockManager(
            [dead, mariadb_url], node_id="events", heartbeat=False, hooks=[recorder]
        ) as manager,
        manager.for_customer(customer_id).lock_paths("/a"),
    ):
        pass
    (failed_over,) = recorder.of("failed_over")
    assert failed_over.node == dead.split("@", 1)[1]
    assert "2003" in failed_over.error
    assert failed_over.set_aside == manager.settings.set_aside
    assert len(recorder.of("granted")) == 1

    with (
        PathLockManager(dead, node_id="events", max_attempts=3, hooks=[recorder]) as alone,
        pytest.raises(BackendError),
    ):
        alone.for_customer(customer_id).lock_paths("/a", timeout=10)
    # The request's own retries (its lease, left in doubt, is then released
    # by lease id, with retries of its own).
    retried = [event for event in recorder.of("retried") if event.action == "acquiring locks"]
    assert [event.count for event in retried] == [1, 2]
    assert all(event.reason == "transient" for event in recorder.of("retried"))
    assert all(event.node == dead.split("@", 1)[1] for event in recorder.of("retried"))
    assert isinstance(recorder.of("failed")[-1].error, BackendError)


def test_the_log_lines_are_one_implementation(
    mariadb_url: str, customer_id: int, caplog: pytest.LogCaptureFixture
) -> None:
    # The same lines as before the hooks, under the same logger names.
    dead = _refused_url()
    with caplog.at_level(logging.INFO, logger="pathlock"):
        with (
            PathLockManager(dead, node_id="events", max_attempts=2) as alone,
            pytest.raises(BackendError),
        ):
            alone.for_customer(customer_id).lock_paths("/a", timeout=10)
        with PathLockManager(mariadb_url, node_id="events", heartbeat=False) as manager:
            lease = manager.for_customer(customer_id).lock_paths("/a", ttl=1)
            engine = create_engine(mariadb_url)
            mine = path_locks.c.lease_id == lease.lease_id
            with engine.begin() as connection:
                connection.execute(delete(path_locks).where(mine))
            engine.dispose()
            with pytest.raises(LeaseLost):
                lease.renew()
    lines = [(record.name, record.getMessage()) for record in caplog.records]
    assert any(
        name == "pathlock.store" and "transient database error (attempt 1 of 2" in message
        for name, message in lines
    ), lines
    assert any(
        name == "pathlock.lease" and f"lease {lease.lease_id} (/a (exclusive)) lost:" in message
        for name, message in lines
    ), lines


def test_a_hook_that_raises_changes_nothing(
    database_url: str, recorder: Recorder, customer_id: int, caplog: pytest.LogCaptureFixture
) -> None:
    class Broken(Hooks):
        def lock_granted(self, event: events.Granted) -> None:
            raise RuntimeError(f"broken hook ({event.lease_id})")

    with (
        caplog.at_level(logging.ERROR, logger="pathlock.events"),
        PathLockManager(
            database_url, node_id="events", heartbeat=False, hooks=[Broken(), recorder]
        ) as manager,
        manager.for_customer(customer_id).lock_paths("/a") as lease,
    ):
        assert not lease.lost
    assert len(recorder.of("granted")) == 1  # the next hook still heard of it
    assert any("broken hook" in (record.exc_text or "") for record in caplog.records)


@pytest.mark.parametrize("hooks", [Recorder(), [object()], "hooks", [Recorder, None]])
def test_hooks_must_be_a_list_of_hooks(sqlite_url: str, hooks: object) -> None:
    with pytest.raises(ArgumentTypeError, match="hooks must be"):
        PathLockManager(sqlite_url, hooks=hooks)  # type: ignore[arg-type]
