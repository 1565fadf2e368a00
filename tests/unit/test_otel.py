"""pathlock.otel: the OpenTelemetry instruments and spans made from a manager's
events, read back through the SDK's in-memory reader and exporter."""

from __future__ import annotations

import gc
import logging
import subprocess
import sys
import time
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    HistogramDataPoint,
    InMemoryMetricReader,
    Metric,
    NumberDataPoint,
)
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from pathlock import ArgumentTypeError, BackendError, InvalidArgument, events, otel
from pathlock.types import Owner, PathMode

PATHS: tuple[PathMode, ...] = (("/a", "exclusive"), ("/b", "shared"))
OWNER = Owner("node", 1, "2", "key")
NODE = "127.0.0.1:3306/test"


class Telemetry:
    """An SDK meter and tracer provider that keep what they record."""

    def __init__(self) -> None:
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader], shutdown_on_exit=False)
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider(shutdown_on_exit=False)
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))

    def hooks(self, local_waiters: Any = None) -> otel.MetricsHooks:
        hooks = otel.metrics_hooks(
            meter_provider=self.meter_provider,
            tracer_provider=self.tracer_provider,
            local_waiters=local_waiters,
        )
        assert hooks is not None
        return hooks

    def metrics(self) -> dict[str, Metric]:
        """The metrics of the last collection, by name (every one in scope ``pathlock``)."""
        found: dict[str, Metric] = {}
        data = self.reader.get_metrics_data()
        if data is None:
            return found
        for resource in data.resource_metrics:
            for scope in resource.scope_metrics:
                assert scope.scope.name == "pathlock"
                for metric in scope.metrics:
                    found[metric.name] = metric
        return found

    def points(self, name: str) -> list[Any]:
        metric = self.metrics().get(name)
        return [] if metric is None else list(metric.data.data_points)

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def close(self) -> None:
        self.meter_provider.shutdown()
        self.tracer_provider.shutdown()


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    telemetry = Telemetry()
    yield telemetry
    telemetry.close()


def granted(waited: float = 0.25, *, blocking: bool = True) -> events.Granted:
    return events.Granted(7, "lease-1", PATHS, OWNER, 11, waited, blocking)


def timed_out(waited: float = 0.5, *, blocking: bool = True) -> events.TimedOut:
    return events.TimedOut(7, "lease-2", PATHS, waited, blocking, unanswered=False)


def deadlocked(waited: float = 0.003) -> events.Deadlocked:
    return events.Deadlocked(7, "lease-3", PATHS, waited)


def failed(error: BaseException, waited: float = 1.5, *, blocking: bool = True) -> events.Failed:
    return events.Failed(7, "lease-4", PATHS, waited, error, blocking)


def attributes(point: Any) -> dict[str, Any]:
    return dict(point.attributes or {})


def by_attributes(points: list[Any]) -> dict[tuple[tuple[str, Any], ...], Any]:
    return {tuple(sorted(attributes(point).items())): point for point in points}


# Metrics


def test_every_instrument_has_its_name_unit_and_description(telemetry: Telemetry) -> None:
    hooks = telemetry.hooks(local_waiters=lambda: 0)
    hooks.lock_granted(granted())
    hooks.lease_released(events.Released(7, "lease-1", PATHS, 2.0))
    hooks.lease_lost(events.Lost(7, "lease-1", PATHS, "gone", 3.0))
    hooks.database_retried(events.Retried("lock paths", "transient", 1, 0.01, NODE, "boom"))
    hooks.failed_over(events.FailedOver(NODE, "boom", 5.0))
    hooks.expired_reaped(events.Reaped(1, 1, 0.01))
    metrics = telemetry.metrics()
    assert {name: metric.unit for name, metric in metrics.items()} == {
        "pathlock.lock.wait.duration": "s",
        "pathlock.lock.hold.duration": "s",
        "pathlock.lease.lost": "{lease}",
        "pathlock.db.retries": "{retry}",
        "pathlock.failovers": "{failover}",
        "pathlock.reaper.deleted": "{row}",
        "pathlock.lock.waiters": "{request}",
    }
    for metric in metrics.values():
        assert metric.description
        assert "\n" not in metric.description


def test_the_meter_is_pathlock_with_its_version(telemetry: Telemetry) -> None:
    telemetry.hooks().lock_granted(granted())
    data = telemetry.reader.get_metrics_data()
    assert data is not None
    scope = data.resource_metrics[0].scope_metrics[0].scope
    assert scope.name == "pathlock"
    assert scope.version == otel._version()


def test_each_request_is_one_wait_point_by_outcome(telemetry: Telemetry) -> None:
    hooks = telemetry.hooks()
    hooks.lock_granted(granted(0.25))
    hooks.lock_granted(granted(0.0005, blocking=False))
    hooks.lock_timed_out(timed_out(0.5))
    hooks.lock_timed_out(timed_out(0.001, blocking=False))
    hooks.deadlock_detected(deadlocked(0.003))
    hooks.lock_failed(failed(BackendError("lock paths", RuntimeError("down")), 1.5))
    hooks.lock_failed(failed(BackendError("lock paths", RuntimeError("down")), 2.5, blocking=False))
    points = by_attributes(telemetry.points("pathlock.lock.wait.duration"))
    expected = {
        ("granted", True): 0.25,
        ("granted", False): 0.0005,
        ("timeout", True): 0.5,
        ("timeout", False): 0.001,
        ("deadlock", True): 0.003,
        ("error", True): 1.5,
        ("error", False): 2.5,
    }
    assert len(points) == len(expected)
    for (outcome, blocking), waited in expected.items():
        point = points[("blocking", blocking), ("outcome", outcome)]
        assert isinstance(point, HistogramDataPoint)
        assert point.count == 1
        assert point.sum == pytest.approx(waited)


def test_wait_buckets_are_seconds(telemetry: Telemetry) -> None:
    hooks = telemetry.hooks()
    for waited in (0.002, 0.004, 0.2, 7.0):
        hooks.lock_granted(granted(waited))
    (point,) = telemetry.points("pathlock.lock.wait.duration")
    assert tuple(point.explicit_bounds) == otel.WAIT_BUCKETS
    counts = dict(zip((*otel.WAIT_BUCKETS, float("inf")), point.bucket_counts, strict=True))
    assert counts[0.0025] == 1  # 0.002
    assert counts[0.005] == 1  # 0.004
    assert counts[0.25] == 1  # 0.2
    assert counts[10.0] == 1  # 7.0
    assert point.min == pytest.approx(0.002)
    assert point.max == pytest.approx(7.0)


def test_a_clock_step_never_records_a_negative_wait(telemetry: Telemetry) -> None:
    telemetry.hooks().lock_granted(granted(-0.001))
    (point,) = telemetry.points("pathlock.lock.wait.duration")
    assert point.sum == 0.0


def test_each_release_is_one_hold_point(telemetry: Telemetry) -> None:
    hooks = telemetry.hooks()
    hooks.lease_released(events.Released(7, "lease-1", PATHS, 2.0))
    hooks.lease_released(events.Released(7, "lease-2", PATHS, 40.0))
    (point,) = telemetry.points("pathlock.lock.hold.duration")
    assert attributes(point) == {}
    assert point.count == 2
    assert point.sum == pytest.approx(42.0)
    assert tuple(point.explicit_bounds) == otel.HOLD_BUCKETS


def test_counters(telemetry: Telemetry) -> None:
    hooks = telemetry.hooks()
    hooks.lease_lost(events.Lost(7, "lease-1", PATHS, "gone", 3.0))
    hooks.lease_lost(events.Lost(7, "lease-2", PATHS, "not renewed", 3.0))
    for count in (1, 2):
        hooks.database_retried(events.Retried("lock paths", "transient", count, 0.01, NODE, "x"))
    hooks.database_retried(events.Retried("release", "lost race", 1, 0.01, NODE, "deadlock"))
    hooks.failed_over(events.FailedOver(NODE, "gone away", 5.0))
    hooks.expired_reaped(events.Reaped(locks=5, waiters=2, seconds=0.01))
    hooks.expired_reaped(events.Reaped(locks=1, waiters=0, seconds=0.01))

    (lost,) = telemetry.points("pathlock.lease.lost")
    assert isinstance(lost, NumberDataPoint)
    assert (attributes(lost), lost.value) == ({}, 2)
    retries = {
        attributes(point)["reason"]: (attributes(point)["node"], point.value)
        for point in telemetry.points("pathlock.db.retries")
    }
    assert retries == {"transient": (NODE, 2), "lost race": (NODE, 1)}
    (failover,) = telemetry.points("pathlock.failovers")
    assert (attributes(failover), failover.value) == ({"node": NODE}, 1)
    reaped = {
        attributes(point)["kind"]: point.value
        for point in telemetry.points("pathlock.reaper.deleted")
    }
    assert reaped == {"lock": 6, "waiter": 2}
    metrics = telemetry.metrics()
    for name in ("pathlock.lease.lost", "pathlock.db.retries", "pathlock.reaper.deleted"):
        assert metrics[name].data.is_monotonic  # type: ignore[union-attr]


def test_no_customer_ids_paths_or_leases_in_metric_attributes(telemetry: Telemetry) -> None:
    hooks = telemetry.hooks(local_waiters=lambda: 1)
    hooks.lock_granted(granted())
    hooks.lock_timed_out(timed_out())
    hooks.deadlock_detected(deadlocked())
    hooks.lock_failed(failed(RuntimeError("x")))
    hooks.lease_released(events.Released(7, "lease-1", PATHS, 2.0))
    hooks.lease_lost(events.Lost(7, "lease-1", PATHS, "gone", 3.0))
    allowed = {"outcome", "blocking", "reason", "node", "kind"}
    for metric in telemetry.metrics().values():
        for point in metric.data.data_points:
            assert set(attributes(point)) <= allowed, metric.name


# The waiters gauge


def test_the_waiters_gauge_reads_the_function_at_each_collection(telemetry: Telemetry) -> None:
    waiting = [3]
    hooks = telemetry.hooks(local_waiters=lambda: waiting[0])
    (point,) = telemetry.points("pathlock.lock.waiters")
    assert point.value == 3
    waiting[0] = 0
    (point,) = telemetry.points("pathlock.lock.waiters")
    assert point.value == 0
    metric = telemetry.metrics()["pathlock.lock.waiters"]
    assert not metric.data.is_monotonic  # type: ignore[union-attr]
    del hooks


def test_the_waiters_of_managers_on_one_provider_add_up(telemetry: Telemetry) -> None:
    """A meter keeps the first instrument of a name, so one callback counts
    the waiters of every manager; a manager that is gone stops counting."""
    first = telemetry.hooks(local_waiters=lambda: 2)
    second = telemetry.hooks(local_waiters=lambda: 5)
    assert first._instruments is second._instruments
    (point,) = telemetry.points("pathlock.lock.waiters")
    assert point.value == 7
    del second
    gc.collect()
    (point,) = telemetry.points("pathlock.lock.waiters")
    assert point.value == 2
    del first
    gc.collect()
    assert telemetry.points("pathlock.lock.waiters") == []


def test_a_failing_waiter_count_is_logged_and_skipped(
    telemetry: Telemetry, caplog: pytest.LogCaptureFixture
) -> None:
    def broken() -> int:
        raise RuntimeError("closed")

    hooks = [telemetry.hooks(local_waiters=lambda: 2), telemetry.hooks(local_waiters=broken)]
    with caplog.at_level(logging.ERROR, logger="pathlock.otel"):
        (point,) = telemetry.points("pathlock.lock.waiters")
    assert point.value == 2
    assert "could not count the local waiters" in caplog.text
    del hooks


def test_hooks_without_a_waiter_count_report_no_gauge(telemetry: Telemetry) -> None:
    telemetry.hooks().lock_granted(granted())
    assert "pathlock.lock.waiters" not in telemetry.metrics()


def test_a_dropped_provider_takes_its_instruments_along() -> None:
    telemetry = Telemetry()
    hooks = telemetry.hooks(local_waiters=lambda: 1)
    hooks.lock_granted(granted())
    instruments = weakref.ref(hooks._instruments)
    telemetry.close()
    del telemetry, hooks
    gc.collect()
    assert instruments() is None


# Spans


def test_a_request_is_one_back_dated_span(telemetry: Telemetry) -> None:
    hooks = telemetry.hooks()
    before = time.time_ns()
    hooks.lock_granted(granted(0.25))
    after = time.time_ns()
    (span,) = telemetry.spans()
    assert span.name == "pathlock.lock_paths"
    assert span.instrumentation_scope is not None
    assert span.instrumentation_scope.name == "pathlock"
    assert dict(span.attributes or {}) == {
        "pathlock.customer_id": 7,
        "pathlock.paths": 2,
        "pathlock.lease_id": "lease-1",
        "pathlock.outcome": "granted",
    }
    assert span.start_time is not None
    assert span.end_time is not None
    assert before <= span.end_time <= after
    assert span.end_time - span.start_time == 250_000_000
    assert span.status.status_code is StatusCode.UNSET


def test_try_locks_and_timeouts_are_named_and_not_errors(telemetry: Telemetry) -> None:
    hooks = telemetry.hooks()
    hooks.lock_granted(granted(0.001, blocking=False))
    hooks.lock_timed_out(timed_out(0.001, blocking=False))
    hooks.lock_timed_out(timed_out(0.5))
    hooks.deadlock_detected(deadlocked())
    spans = [
        (span.name, (span.attributes or {})["pathlock.outcome"], span.status.status_code)
        for span in telemetry.spans()
    ]
    assert spans == [
        ("pathlock.try_lock_paths", "granted", StatusCode.UNSET),
        ("pathlock.try_lock_paths", "timeout", StatusCode.UNSET),
        ("pathlock.lock_paths", "timeout", StatusCode.UNSET),
        ("pathlock.lock_paths", "deadlock", StatusCode.UNSET),
    ]


def test_an_error_span_records_the_exception(telemetry: Telemetry) -> None:
    error = BackendError("lock paths", RuntimeError("server has gone away"))
    telemetry.hooks().lock_failed(failed(error))
    (span,) = telemetry.spans()
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description is not None
    assert span.status.description.startswith("BackendError: ")
    assert (span.attributes or {})["error.type"] == "pathlock.errors.BackendError"
    assert (span.attributes or {})["pathlock.outcome"] == "error"
    (exception,) = span.events
    assert exception.name == "exception"
    assert (exception.attributes or {})["exception.type"] == "pathlock.errors.BackendError"
    assert "server has gone away" in str((exception.attributes or {})["exception.message"])


def test_the_span_is_a_child_of_the_callers_span(telemetry: Telemetry) -> None:
    tracer = telemetry.tracer_provider.get_tracer("app")
    hooks = telemetry.hooks()
    with tracer.start_as_current_span("GET /files") as request:
        hooks.lock_granted(granted())
    lock, outer = telemetry.spans()
    assert outer.name == "GET /files"
    assert lock.parent is not None
    assert lock.parent.span_id == request.get_span_context().span_id
    assert lock.context is not None
    assert lock.context.trace_id == request.get_span_context().trace_id


def test_no_tracing_sdk_means_no_spans_but_metrics(telemetry: Telemetry) -> None:
    """Without a tracer provider the global one is used: OpenTelemetry's
    no-op until an application installs an SDK."""
    hooks = otel.metrics_hooks(meter_provider=telemetry.meter_provider)
    assert hooks is not None
    hooks.lock_failed(failed(RuntimeError("x")))
    assert telemetry.spans() == []
    assert len(telemetry.points("pathlock.lock.wait.duration")) == 1


# Construction


def test_the_global_providers_are_used_without_arguments() -> None:
    """No provider given: OpenTelemetry's global ones, looked up once for
    every manager (its proxy meter keeps every instrument made on it)."""
    first = otel.metrics_hooks(local_waiters=lambda: 1)
    second = otel.metrics_hooks()
    assert isinstance(first, otel.MetricsHooks)
    assert isinstance(second, otel.MetricsHooks)
    assert first._instruments is second._instruments
    first.lock_granted(granted())  # a no-op without an SDK, and no error
    first.expired_reaped(events.Reaped(1, 1, 0.1))


def test_a_global_provider_set_later_gets_everything() -> None:
    """Managers are often made before the application sets up OpenTelemetry
    (at import time): the global providers' proxies pass what they record
    on to the SDK set later. In a child process, since a global provider can
    be set only once per process."""
    script = """
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pathlock import events, otel
from pathlock.types import Owner

early = otel.metrics_hooks(local_waiters=lambda: 2)
reader = InMemoryMetricReader()
metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
exporter = InMemorySpanExporter()
tracer_provider = TracerProvider()
tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(tracer_provider)
late = otel.metrics_hooks(local_waiters=lambda: 3)
assert late._instruments is early._instruments
early.lock_granted(events.Granted(1, "l", (("/a", "exclusive"),), Owner("n", 1, "t"), 1, 0.5, True))
found = {
    metric.name: [point for point in metric.data.data_points]
    for resource in reader.get_metrics_data().resource_metrics
    for scope in resource.scope_metrics
    for metric in scope.metrics
}
print(found["pathlock.lock.wait.duration"][0].sum, found["pathlock.lock.waiters"][0].value)
print([span.name for span in exporter.get_finished_spans()])
"""
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["0.5 5", "['pathlock.lock_paths']"]


def test_the_hooks_are_hooks(telemetry: Telemetry) -> None:
    assert isinstance(telemetry.hooks(), events.Hooks)
    assert events.checked([telemetry.hooks()])


@pytest.mark.parametrize(
    ("argument", "value"),
    [
        ("meter_provider", "http://collector:4317"),
        ("tracer_provider", object()),
        ("meter_provider", TracerProvider(shutdown_on_exit=False)),
        ("local_waiters", 5),
    ],
)
def test_wrong_types_are_refused(argument: str, value: object) -> None:
    with pytest.raises(ArgumentTypeError, match=argument):
        otel.metrics_hooks(**{argument: value})  # type: ignore[arg-type]


@pytest.fixture
def without_opentelemetry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Imports of opentelemetry fail, as when it is not installed."""
    for name in list(sys.modules):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "opentelemetry", None)


@pytest.mark.usefixtures("without_opentelemetry")
@pytest.mark.parametrize("argument", ["meter_provider", "tracer_provider"])
def test_a_provider_without_opentelemetry_names_the_extra(argument: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        otel.metrics_hooks(**{argument: object()}, local_waiters=lambda: 0)
    assert "pip install 'pathlock[otel]'" in str(caught.value)


@pytest.mark.usefixtures("without_opentelemetry")
def test_no_opentelemetry_and_no_provider_means_no_hooks() -> None:
    assert otel.metrics_hooks(local_waiters=lambda: 0) is None


def test_the_module_imports_without_opentelemetry() -> None:
    script = (
        "import sys\n"
        "sys.modules['opentelemetry'] = None\n"
        "import pathlock, pathlock.otel\n"
        "print(pathlock.otel.metrics_hooks())\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "None"
