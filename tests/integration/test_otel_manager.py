"""A manager's OpenTelemetry metrics and spans, and its hooks, against the
real databases: what an operator's dashboard would show for each thing that
can happen to a lock."""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from pathlock import (
    DeadlockDetected,
    Hooks,
    InvalidArgument,
    LeaseLost,
    LockTimeout,
    PathLockManager,
    events,
)

WAIT = "pathlock.lock.wait.duration"
HOLD = "pathlock.lock.hold.duration"


class Telemetry:
    """SDK providers that keep what a manager records."""

    def __init__(self) -> None:
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader], shutdown_on_exit=False)
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider(shutdown_on_exit=False)
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))

    def points(self, name: str) -> list[Any]:
        data = self.reader.get_metrics_data()
        if data is None:
            return []
        return [
            point
            for resource in data.resource_metrics
            for scope in resource.scope_metrics
            for metric in scope.metrics
            if metric.name == name
            for point in metric.data.data_points
        ]

    def waits(self) -> dict[tuple[str, bool], Any]:
        """The wait histogram's points by (outcome, blocking)."""
        points = self.points(WAIT)
        found = {
            (point.attributes["outcome"], point.attributes["blocking"]): point for point in points
        }
        assert len(found) == len(points)
        return found

    def total(self, name: str, **attributes: object) -> float:
        """The sum of a counter's points whose attributes include ``attributes``."""
        return float(
            sum(
                point.value
                for point in self.points(name)
                if attributes.items() <= dict(point.attributes or {}).items()
            )
        )

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def close(self) -> None:
        self.meter_provider.shutdown()
        self.tracer_provider.shutdown()


@contextmanager
def observed(database_url: str, **options: Any) -> Iterator[tuple[PathLockManager, Telemetry]]:
    telemetry = Telemetry()
    try:
        with PathLockManager(
            database_url,
            node_id="otel-test",
            meter_provider=telemetry.meter_provider,
            tracer_provider=telemetry.tracer_provider,
            **options,
        ) as manager:
            yield manager, telemetry
    finally:
        telemetry.close()


class Recorder(Hooks):
    """A user's hooks: keeps every event it hears of."""

    def __init__(self) -> None:
        self.events: list[object] = []

    def lock_granted(self, event: events.Granted) -> None:
        self.events.append(event)

    def lock_timed_out(self, event: events.TimedOut) -> None:
        self.events.append(event)

    def deadlock_detected(self, event: events.Deadlocked) -> None:
        self.events.append(event)

    def lease_released(self, event: events.Released) -> None:
        self.events.append(event)

    def lease_lost(self, event: events.Lost) -> None:
        self.events.append(event)

    def expired_reaped(self, event: events.Reaped) -> None:
        self.events.append(event)


def test_a_grant_and_its_release(database_url: str, customer_id: int) -> None:
    with observed(database_url, heartbeat=False) as (manager, telemetry):
        lease = manager.for_customer(customer_id).lock_paths("/docs", shared=["/templates"])
        time.sleep(0.05)
        lease.release()

        waits = telemetry.waits()
        assert list(waits) == [("granted", True)]
        assert waits["granted", True].count == 1
        (hold,) = telemetry.points(HOLD)
        assert hold.count == 1
        assert 0.05 <= hold.sum < 30

        (span,) = telemetry.spans()
        assert span.name == "pathlock.lock_paths"
        assert dict(span.attributes or {}) == {
            "pathlock.customer_id": customer_id,
            "pathlock.paths": 2,
            "pathlock.lease_id": lease.lease_id,
            "pathlock.outcome": "granted",
        }


def test_a_denied_try_lock_is_a_timeout(database_url: str, customer_id: int) -> None:
    with observed(database_url, heartbeat=False) as (manager, telemetry):
        locks = manager.for_customer(customer_id)
        with locks.lock_paths("/shared", owner="holder"):
            assert locks.try_lock_paths("/shared/file") is None
        waits = telemetry.waits()
        assert set(waits) == {("granted", True), ("timeout", False)}
        assert waits["timeout", False].count == 1
        assert [span.name for span in telemetry.spans()] == [
            "pathlock.lock_paths",
            "pathlock.try_lock_paths",
        ]


def test_a_blocked_request_times_out(database_url: str, customer_id: int) -> None:
    with observed(database_url, heartbeat=False) as (manager, telemetry):
        locks = manager.for_customer(customer_id)
        with locks.lock_paths("/project", owner="holder"), pytest.raises(LockTimeout):
            locks.lock_paths("/project/file", timeout=0.2)
        timeout = telemetry.waits()["timeout", True]
        assert timeout.count == 1
        assert 0.2 <= timeout.sum < 10
        span = telemetry.spans()[-1]
        assert (span.attributes or {})["pathlock.outcome"] == "timeout"
        assert span.start_time is not None
        assert span.end_time is not None
        assert span.end_time - span.start_time >= 200_000_000


def test_a_deadlock(database_url: str, customer_id: int) -> None:
    with observed(database_url, heartbeat=False) as (manager, telemetry):
        locks = manager.for_customer(customer_id)
        with locks.lock_paths("/a/b"), pytest.raises(DeadlockDetected):
            locks.lock_paths("/a", timeout=None)
        waits = telemetry.waits()
        assert waits["deadlock", True].count == 1
        assert waits["deadlock", True].sum < 10


def test_a_lease_released_by_an_operator_is_lost(database_url: str, customer_id: int) -> None:
    with observed(database_url, heartbeat=False) as (manager, telemetry):
        lease = manager.for_customer(customer_id).lock_paths("/hung")
        assert manager.release_lease(lease.lease_id, requested_by="test") == 1
        with pytest.raises(LeaseLost):
            lease.renew()
        assert telemetry.total("pathlock.lease.lost") == 1
        lease.release()
        assert telemetry.total("pathlock.lease.lost") == 1


def test_reaped_rows_are_counted(database_url: str, customer_id: int) -> None:
    with observed(database_url, heartbeat=False) as (manager, telemetry):
        lease = manager.for_customer(customer_id).lock_paths("/expiring", ttl=1)
        time.sleep(2.2)  # past the ttl, by the database's clock too (whole seconds)
        deleted = manager.reap_expired()
        assert deleted >= 1
        locks = telemetry.total("pathlock.reaper.deleted", kind="lock")
        waiters = telemetry.total("pathlock.reaper.deleted", kind="waiter")
        assert locks >= 1
        assert locks + waiters == deleted
        del lease


def test_the_waiters_gauge_counts_this_process_queued_requests(
    database_url: str, customer_id: int
) -> None:
    with observed(database_url, heartbeat=False) as (manager, telemetry):
        locks = manager.for_customer(customer_id)

        def waiting() -> float:
            return float(sum(point.value for point in telemetry.points("pathlock.lock.waiters")))

        assert waiting() == 0
        holder = locks.lock_paths("/queue", owner="holder")
        granted = threading.Event()

        def wait() -> None:
            with locks.lock_paths("/queue", timeout=30):
                granted.set()

        thread = threading.Thread(target=wait)
        thread.start()
        deadline = time.monotonic() + 10
        while waiting() != 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert waiting() == 1
        holder.release()
        assert granted.wait(30)
        thread.join()
        assert waiting() == 0


def test_a_users_hooks_hear_of_every_request(database_url: str, customer_id: int) -> None:
    recorder = Recorder()
    with observed(database_url, heartbeat=False, hooks=[recorder]) as (manager, _):
        locks = manager.for_customer(customer_id)
        with locks.lock_paths("/one", reason="move") as lease:
            assert locks.try_lock_paths("/one", owner="other") is None
            with pytest.raises(DeadlockDetected):
                locks.lock_paths("/one/two", timeout=None)
    kinds = [type(event) for event in recorder.events]
    assert kinds == [events.Granted, events.TimedOut, events.Deadlocked, events.Released]
    first, denied, deadlocked, released = recorder.events
    assert isinstance(first, events.Granted)
    assert (first.customer_id, first.lease_id, first.paths) == (
        customer_id,
        lease.lease_id,
        (("/one", "exclusive"),),
    )
    assert first.blocking
    assert isinstance(denied, events.TimedOut)
    assert not denied.blocking
    assert isinstance(deadlocked, events.Deadlocked)
    assert isinstance(released, events.Released)
    assert released.lease_id == lease.lease_id


def test_a_hook_that_raises_breaks_nothing(
    database_url: str, customer_id: int, caplog: pytest.LogCaptureFixture
) -> None:
    class Broken(Hooks):
        def lock_granted(self, event: events.Granted) -> None:  # noqa: ARG002
            raise RuntimeError("the dashboard is down")

    recorder = Recorder()
    with (
        caplog.at_level(logging.ERROR, logger="pathlock.events"),
        observed(database_url, heartbeat=False, hooks=[Broken(), recorder]) as (
            manager,
            telemetry,
        ),
    ):
        lease = manager.for_customer(customer_id).lock_paths("/still/works")
        lease.ensure_held(verify=True)
        lease.release()
    assert telemetry.waits()["granted", True].count == 1
    assert [type(event) for event in recorder.events] == [events.Granted, events.Released]
    (record,) = [r for r in caplog.records if r.name == "pathlock.events"]
    assert record.levelno == logging.ERROR
    assert "lock_granted" in record.getMessage()
    assert record.exc_info is not None
    assert "the dashboard is down" in str(record.exc_info[1])


def test_a_provider_without_opentelemetry_is_refused(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in list(sys.modules):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(InvalidArgument, match=r"pip install 'pathlock\[otel\]'"):
        PathLockManager(database_url, heartbeat=False, meter_provider=object())
