"""What PostgreSQL does differently, attacked on a real server: waits bounded
by the call's time (a server that never answers, a network path that drops
everything), sessions that sit idle in a transaction ended, the session of a
dropped connection ended, paths longer than an index entry, and the
planner's time for the largest requests. The conformance suite runs on
PostgreSQL through the ``database_url`` fixture like on every backend."""

from __future__ import annotations

import secrets
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import create_engine, make_url, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool

import pathlock.dialects
from pathlock import BackendError, LockTimeout, PathLockManager, Settings, dialects
from pathlock._statements.leases import LEASE_ALIVE, RELEASE
from pathlock._statements.lookups import LEASE_ROWS
from pathlock.bench.database import delete_customers, insert_bulk_rows
from pathlock.dialects.base import SERVER_SESSION, ServerSession
from tests.integration.conftest import TcpProxy

FAST = Settings(try_time=2.0, call_time=2.0, close_time=2.5, schema_check_time=0.5)
# psycopg waits at least 2 s for a connection (libpq's least connect_timeout).
SLACK = 2.5


def _timed(call: Any) -> tuple[BaseException | None, float]:
    started = time.monotonic()
    try:
        call()
    except Exception as error:  # noqa: BLE001 - the test inspects it
        return error, time.monotonic() - started
    return None, time.monotonic() - started


def test_a_server_that_never_answers_costs_a_request_its_timeout(
    silent_port: int, customer_id: int
) -> None:
    url = f"postgresql+psycopg://postgres@127.0.0.1:{silent_port}/postgres"
    with PathLockManager(url, heartbeat=False, settings=FAST) as manager:
        locks = manager.for_customer(customer_id)
        error, took = _timed(lambda: locks.lock_paths("/a", timeout=1))
        assert isinstance(error, LockTimeout), repr(error)
        assert error.unanswered
        assert took < 1 + FAST.grace + SLACK
        error, took = _timed(lambda: locks.try_lock_paths("/a"))
        assert isinstance(error, BackendError), repr(error)
        assert isinstance(error, TimeoutError), repr(error)
        assert took < FAST.try_time + FAST.grace + SLACK


@pytest.fixture
def pg_proxy(postgresql_url: str) -> Iterator[TcpProxy]:
    url = make_url(postgresql_url)
    proxy = TcpProxy((url.host or "127.0.0.1", url.port or 5432))
    yield proxy
    proxy.cut()


def test_a_network_path_that_drops_everything_costs_a_request_its_timeout(
    postgresql_url: str, pg_proxy: TcpProxy, customer_id: int
) -> None:
    """A pooled connection whose packets stop getting through (the server
    alive, the path to it gone): every wait ends with the call's time."""
    through = make_url(postgresql_url).set(host="127.0.0.1", port=pg_proxy.port)
    with PathLockManager(through, heartbeat=False, settings=FAST) as manager:
        locks = manager.for_customer(customer_id)
        locks.lock_paths("/a").release()  # a pooled connection, alive
        pg_proxy.freeze()
        error, took = _timed(lambda: locks.lock_paths("/b", timeout=1))
        assert isinstance(error, LockTimeout), repr(error)
        assert took < 1 + FAST.grace + SLACK
        error, took = _timed(lambda: locks.try_lock_paths("/b"))
        assert isinstance(error, TimeoutError), repr(error)
        assert took < FAST.try_time + FAST.grace + SLACK
    # Nothing reached the server, or it was ended: /b is free.
    with PathLockManager(postgresql_url, heartbeat=False) as direct:
        lease = direct.for_customer(customer_id).try_lock_paths("/b")
        assert lease is not None
        lease.release()


def test_pathlocks_sessions_end_when_they_sit_idle_in_a_transaction(postgresql_url: str) -> None:
    """The server ends a session of pathlock's that sits inside a transaction
    for longer than ``idle_transaction_timeout``: what frees a customer's
    row from a client that froze mid-transaction."""
    settings = Settings(idle_transaction_timeout=1)
    with PathLockManager(postgresql_url, heartbeat=False, settings=settings) as manager:
        engine = manager.engine
        with engine.connect() as connection:
            shown = connection.exec_driver_sql("SHOW idle_in_transaction_session_timeout").scalar()
            assert shown == "1s"
            connection.exec_driver_sql("SELECT 1")  # inside a transaction now
            time.sleep(2.5)
            with pytest.raises(DBAPIError):
                connection.exec_driver_sql("SELECT 1")


def test_the_session_of_a_dropped_connection_is_ended(postgresql_url: str) -> None:
    """Each connection of pathlock's records its server session; ending it
    from another connection waits until the server no longer lists it."""
    dialect = dialects.for_name("postgresql")
    with PathLockManager(postgresql_url, heartbeat=False) as manager:
        engine = manager.engine
        victim = engine.connect()
        session = victim.connection._connection_record.info[SERVER_SESSION]  # type: ignore[union-attr]
        assert isinstance(session, ServerSession)
        assert session.id == victim.connection.dbapi_connection.info.backend_pid  # type: ignore[union-attr]
        with engine.connect() as other:
            assert dialect.end_sessions(other, [session], time.monotonic() + 10) == set()
            listed = other.execute(
                text("SELECT count(*) FROM pg_stat_activity WHERE pid = :p"), {"p": session.id}
            ).scalar()
            other.rollback()
        assert listed == 0
        victim.invalidate()
        victim.close()


def test_a_new_session_that_took_a_dropped_ones_process_id_is_left_alone(
    postgresql_url: str,
) -> None:
    """PostgreSQL's session ids are process ids, which the system hands out
    again: a dropped connection's session that has ended may share its id
    and client address with a live session of another connection. Only a
    session that also began when the dropped one did is ended."""
    dialect = dialects.for_name("postgresql")
    with PathLockManager(postgresql_url, heartbeat=False) as manager:
        engine = manager.engine
        with engine.connect() as live, engine.connect() as other:
            session = live.connection._connection_record.info[SERVER_SESSION]  # type: ignore[union-attr]
            assert isinstance(session, ServerSession)
            assert session.since > 0
            # The ended session as it was recorded: same id, same address,
            # begun a second before this one.
            ended = ServerSession(session.id, session.host, session.since - 1_000_000)
            assert dialect.end_sessions(other, [ended], time.monotonic() + 0.2) == set()
            assert live.exec_driver_sql("SELECT 1").scalar() == 1  # still there
            live.rollback()


def test_a_path_longer_than_an_index_entry_locks_exactly_itself(
    postgresql_url: str, customer_id: int
) -> None:
    """A B-tree entry holds 2,704 bytes: a path of 4,000 characters that do
    not compress (up to 16,000 bytes) failed to insert ("index row size
    exceeds btree maximum") before the index held a prefix of the path."""
    alphabet = "abcdefghijklmnopqrstuvwxyz\U0001f600é"
    stem = "/" + "".join(secrets.choice(alphabet) for _ in range(2990))
    long_path = stem + "/" + "".join(secrets.choice(alphabet) for _ in range(1000))
    sibling = stem + "/" + "".join(secrets.choice(alphabet) for _ in range(1000))
    with (
        PathLockManager(postgresql_url, heartbeat=False) as first,
        PathLockManager(postgresql_url, heartbeat=False) as second,
    ):
        mine, theirs = first.for_customer(customer_id), second.for_customer(customer_id)
        with mine.lock_paths(long_path):
            assert theirs.try_lock_paths(long_path) is None
            assert theirs.try_lock_paths(stem) is None  # an ancestor
            other = theirs.try_lock_paths(sibling)  # shares the index's prefix
            assert other is not None
            other.release()
            assert [lock.path for lock in mine.locks_on(stem, descendants=True)] == [long_path]
        with mine.lock_paths(stem):
            assert theirs.try_lock_paths(long_path) is None  # a descendant


def test_the_largest_request_is_planned_in_time(postgresql_url: str, customer_id: int) -> None:
    """1,000 paths of 49 components: the lengths their ancestors are cut at
    were 49,000 UNION ALL branches, which PostgreSQL took 80 s to plan (an
    array now). A grant within the default call time, not a timeout."""
    emoji = "\U0001f600"
    wide = [f"/{n:03d}" + f"/{emoji}" * 48 for n in range(1000)]
    with PathLockManager(postgresql_url, heartbeat=False) as manager:
        lease = manager.for_customer(customer_id).lock_paths(*wide, timeout=10)
        assert len(lease.paths) == len(wide)
        lease.release()


def test_a_psycopg_whose_waits_take_no_timeout_is_refused(
    postgresql_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before 3.3.6 psycopg's Connection.wait() took no timeout: the bounded
    wait would fail at the first statement with a TypeError."""
    import psycopg  # noqa: PLC0415 - the extra, on this backend only

    def old_wait(self: Any, gen: Any, interval: float = 0.1) -> Any:  # noqa: ARG001
        raise AssertionError("never called")

    monkeypatch.setattr(psycopg.Connection, "wait", old_wait)
    # Imported afresh, as in a process that has a psycopg older than 3.3.6.
    monkeypatch.delitem(sys.modules, "pathlock.dialects._psycopg", raising=False)
    monkeypatch.delattr(pathlock.dialects, "_psycopg", raising=False)
    with pytest.raises(BackendError, match=r"psycopg 3\.3\.6 or later"):
        PathLockManager(postgresql_url, heartbeat=False)


@pytest.mark.parametrize("refused", ["role", "database"])
def test_a_connection_the_server_refuses_for_good_fails_at_once(
    postgresql_url: str, refused: str, caplog: pytest.LogCaptureFixture
) -> None:
    # libpq passes the server's FATAL on without a SQLSTATE, as it does a
    # connection that could not be made: that one is retried, this one was
    # too, five times, saying "transient".
    url = make_url(postgresql_url)
    nobody = f"pathlock_no_{secrets.token_hex(4)}"
    url = url.set(username=nobody) if refused == "role" else url.set(database=nobody)
    with (
        PathLockManager(url.render_as_string(hide_password=False), heartbeat=False) as manager,
        pytest.raises(BackendError, match=f'{refused} "{nobody}" does not exist') as raised,
    ):
        manager.for_customer(1).lock_paths("/Shared/a", timeout=5)
    assert "persisted" not in str(raised.value)
    assert not [record for record in caplog.records if "transient" in record.getMessage()]


def _rows_read(plan: dict[str, Any]) -> int:
    """The most rows any scan of ``plan`` (EXPLAIN's JSON) returned."""
    read = int(plan.get("Actual Rows", 0)) if "Scan" in plan["Node Type"] else 0
    return max([read, *(_rows_read(child) for child in plan.get("Plans", ()))])


def test_a_leases_rows_are_found_without_reading_the_customers(
    postgresql_url: str, customer_id: int
) -> None:
    """A release, a check that a lease is alive, a read of a lease and a
    grant's count of its rows look a lease up by its id. With statistics from before a customer
    had rows (it grew since the last ANALYZE: autovacuum's thresholds), the
    planner intersected the lease id's index with the customer's own and read
    an entry for each of the customer's rows: 2.5 ms per lookup at 100,000
    rows, several per grant. Counted in rows, not timed."""
    engine = create_engine(postgresql_url, poolclass=NullPool)
    customers = range(customer_id, customer_id + 1)
    with engine.begin() as connection:
        connection.exec_driver_sql("ANALYZE path_locks")  # the customer has no rows yet
    insert_bulk_rows(engine, customers, 20_000, expires_in=timedelta(hours=1), prefix="/bulk/")
    try:
        with PathLockManager(postgresql_url, heartbeat=False) as manager:
            lease = manager.for_customer(customer_id).lock_paths("/a")
            parameters = {"c_id": customer_id, "l_id": lease.lease_id}
            for statement in (RELEASE, LEASE_ALIVE, LEASE_ROWS):
                sql = str(statement.compile(dialect=engine.dialect))
                with engine.connect() as connection:
                    (plan,) = connection.exec_driver_sql(
                        f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", parameters
                    ).scalar_one()
                    connection.rollback()  # EXPLAIN ANALYZE ran the DELETE
                assert _rows_read(plan["Plan"]) <= 1, (sql, plan)
            lease.release()
    finally:
        delete_customers(engine, customers)
