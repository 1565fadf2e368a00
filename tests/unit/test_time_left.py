"""The socket timeout PyMySQL gets under a limit (pathlock._deadlines.time_left):
the time left rounded up to the next 10 ms, at least SHORTEST_WAIT, never
more than the configured timeout."""

from __future__ import annotations

import math
import time

from hypothesis import given
from hypothesis import strategies as st

from pathlock import _deadlines as deadlines
from pathlock.dialects import _pymysql


def test_no_limit_and_an_endless_one_leave_the_configured_timeout() -> None:
    assert deadlines.time_left(5.0) == 5.0
    assert deadlines.time_left(None) is None
    assert deadlines.within(math.inf, lambda _limit: deadlines.time_left(5.0)) == 5.0
    assert deadlines.within(math.inf, lambda _limit: deadlines.time_left(None)) is None


@given(
    left=st.floats(min_value=-100.0, max_value=10_000.0),
    configured=st.none() | st.floats(min_value=0.001, max_value=1_000.0),
)
def test_the_time_left_is_rounded_up_to_10_ms_and_capped(
    left: float, configured: float | None
) -> None:
    def measure(limit: deadlines.Limit) -> tuple[float | None, float, float]:
        before = time.monotonic()
        got = deadlines.time_left(configured)
        return got, limit.ends - before, limit.ends - time.monotonic()

    got, most, least = deadlines.within(time.monotonic() + left, measure)
    assert got is not None
    if configured is not None:
        assert got <= configured
    if configured is None or got < configured:
        assert got >= deadlines.SHORTEST_WAIT
        if got > deadlines.SHORTEST_WAIT:
            assert least <= got < most + 0.01 + 1e-9
            assert round(got * 100) == got * 100 or math.isclose(round(got * 100), got * 100)


def test_a_bounded_connection_reads_its_timeouts_as_time_left() -> None:
    """PyMySQL reads the timeouts of a BoundedConnection before every packet:
    what it gets is time_left() of the configured ones."""
    connection = _pymysql.BoundedConnection(
        defer_connect=True, read_timeout=2.0, write_timeout=None, connect_timeout=3.0
    )
    assert (connection._read_timeout, connection._write_timeout) == (2.0, None)
    assert connection.connect_timeout == 3.0

    def timeouts(_limit: deadlines.Limit) -> tuple[float | None, ...]:
        return connection._read_timeout, connection._write_timeout, connection.connect_timeout

    assert deadlines.within(math.inf, timeouts) == (2.0, None, 3.0)
    assert deadlines.within(time.monotonic() + 60, timeouts) == (2.0, 60.0, 3.0)
    passed = deadlines.SHORTEST_WAIT
    assert deadlines.within(time.monotonic() - 1, timeouts) == (passed, passed, passed)
    connection._read_timeout = None
    assert deadlines.within(time.monotonic() - 1, timeouts)[0] == passed
    assert connection._read_timeout is None
