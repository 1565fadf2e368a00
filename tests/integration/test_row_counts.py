"""The counts of lock and queue rows on each customer's sentinel row
(revision 0008), and the grant without searches they allow.

A grant to a customer with no lock row and no queue row skips the conflict
and queue searches (MySQL, MariaDB). That is safe only while the counts are
never below the real number of rows: every way rows come and go is checked
here against the tables themselves, and so are the ways counts stop being
trusted (a pathlock without them during a rolling upgrade, a sentinel row
deleted by hand) and are made again (the reaper).
"""

from __future__ import annotations

import contextlib
import random
import secrets
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pymysql
import pytest
from pymysql.constants import CLIENT, COMMAND
from sqlalchemy import DateTime, Engine, bindparam, create_engine, make_url, text
from sqlalchemy.pool import NullPool

from pathlock import LockTimeout, Owner, PathLockManager
from pathlock import _batch as batch
from pathlock._core.records import GrantRequest
from pathlock.paths import normalize_request
from tests.row_counts import miscounted, uncounted

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    engine = create_engine(database_url, poolclass=NullPool)
    yield engine
    engine.dispose()


def _exact(engine: Engine, customer_id: int) -> None:
    with engine.connect() as connection:
        assert miscounted(connection, [customer_id], exact=True) == []
        assert uncounted(connection, [customer_id]) == []


def _counts(engine: Engine, customer_id: int) -> tuple[int | None, int | None]:
    with engine.connect() as connection:
        row = connection.execute(
            text("SELECT lock_rows, waiter_rows FROM customer_locks WHERE customer_id = :c"),
            {"c": customer_id},
        ).one()
    return row.lock_rows, row.waiter_rows


def test_counts_stay_exact_through_every_way_rows_come_and_go(
    database_url: str, engine: Engine, customer_id: int
) -> None:
    """Grants of one and several paths, shared and exclusive; a queued request
    that times out and one that is granted; a release by owner; a lease in
    doubt forgotten; a node's clean-up; the reaper's deletes of expired locks
    and dead queue rows: after each, the counts equal the rows."""
    node = "doomed-" + secrets.token_hex(4)
    with (
        PathLockManager(database_url, heartbeat=False) as manager,
        PathLockManager(database_url, node_id=node, heartbeat=False) as doomed,
    ):
        locks = manager.for_customer(customer_id)
        first = locks.lock_paths("/a", "/b/c", shared=["/d"])
        _exact(engine, customer_id)
        assert _counts(engine, customer_id) == (3, 0)
        sibling = locks.lock_paths("/e")
        _exact(engine, customer_id)
        with pytest.raises(LockTimeout):
            locks.lock_paths("/a/x", timeout=0.3, owner="late")
        _exact(engine, customer_id)
        first.release()
        sibling.release()
        _exact(engine, customer_id)
        assert _counts(engine, customer_id) == (0, 0)

        # A request granted from the queue (its queue row goes, its rows come).
        holder = locks.lock_paths("/q")
        outcome: list[object] = []

        def wait() -> None:
            outcome.append(locks.lock_paths("/q/r", timeout=10, owner="queued"))

        waiting = threading.Thread(target=wait)
        waiting.start()
        deadline = time.monotonic() + 10
        while not manager.list_waiters(customer_id) and time.monotonic() < deadline:
            time.sleep(0.01)
        _exact(engine, customer_id)
        assert _counts(engine, customer_id) == (1, 1)
        holder.release()
        waiting.join()
        _exact(engine, customer_id)
        (granted,) = outcome
        assert _counts(engine, customer_id) == (1, 0)
        granted.release()  # type: ignore[attr-defined]

        # By owner, by node, by the operator's lease id.
        locks.lock_paths("/o1", owner="bulk")
        locks.lock_paths("/o2", owner="bulk")
        assert locks.release_locks(owner="bulk") == 2
        _exact(engine, customer_id)
        doomed.for_customer(customer_id).lock_paths("/n1", "/n2")
        assert manager.release_node(node) == 2
        _exact(engine, customer_id)
        orphan = locks.lock_paths("/op")
        assert manager.release_lease(orphan.lease_id) == 1
        _exact(engine, customer_id)

        # Expired rows count until the reaper deletes them.
        locks.lock_paths("/short", ttl=0.2)  # nothing renews it here
        time.sleep(0.5)
        assert _counts(engine, customer_id) == (1, 0)
        manager.reap_expired()
        _exact(engine, customer_id)
        assert _counts(engine, customer_id) == (0, 0)


@pytest.mark.parametrize("batch_size", [2, 1000])
def test_the_reaper_counts_down_each_customer_by_the_rows_it_deleted(
    database_url: str, engine: Engine, customer_id: int, batch_size: int
) -> None:
    """One reaper batch deletes different numbers of rows of different
    customers (and, in small batches, a customer's rows over several
    batches): each count goes down by exactly its customer's rows."""
    expiring = {customer_id + n: rows for n, rows in enumerate((1, 2, 3, 3, 5))}
    with PathLockManager(database_url, heartbeat=False) as manager:
        for customer, rows in expiring.items():
            locks = manager.for_customer(customer)
            locks.lock_paths("/live")
            for n in range(rows):
                locks.lock_paths(f"/short/{n}", ttl=0.2)  # nothing renews them here
        time.sleep(0.5)
        assert manager.reap_expired(batch_size=batch_size) >= sum(expiring.values())
        for customer in expiring:
            _exact(engine, customer)
            assert _counts(engine, customer) == (1, 0)  # the live lock


def test_the_reaper_corrects_counts_left_too_high_once_the_customer_has_no_rows(
    database_url: str, engine: Engine, customer_id: int
) -> None:
    """Counts too high on a trusted customer (what a session killed between
    a grant's claim and its INSERT, or after a release's DELETE, leaves) are
    safe but keep its grants searching: the reaper makes them again once the
    customer has no row left to count, and only then (a probe per customer,
    not a count)."""
    with PathLockManager(database_url, heartbeat=False) as manager:
        locks = manager.for_customer(customer_id)
        held = locks.lock_paths("/held")
        _raise_counts(engine, customer_id, "lock_rows = lock_rows + 2")
        manager.reap_expired()
        assert _counts(engine, customer_id) == (3, 0)  # a row left: not counted
        held.release()
        assert _counts(engine, customer_id) == (2, 0)
        manager.reap_expired()
        _exact(engine, customer_id)
        assert _counts(engine, customer_id) == (0, 0)
        _raise_counts(engine, customer_id, "waiter_rows = waiter_rows + 1")
        manager.reap_expired()
        _exact(engine, customer_id)
        assert _counts(engine, customer_id) == (0, 0)


def _raise_counts(engine: Engine, customer_id: int, assignment: str) -> None:
    """Make a trusted count too high (the version stays)."""
    with engine.begin() as connection:
        connection.execute(
            text(f"UPDATE customer_locks SET {assignment} WHERE customer_id = :c"),
            {"c": customer_id},
        )


def test_a_grant_without_searches_is_refused_by_a_lock_of_another_process(
    mariadb_url: str, customer_id: int
) -> None:
    """A manager that has never seen the customer tries the grant without
    searches; the customer's lock (another manager's) makes it write
    nothing, and the searching grant that follows is denied too."""
    with (
        PathLockManager(mariadb_url, heartbeat=False) as holder,
        PathLockManager(mariadb_url, heartbeat=False) as other,
    ):
        lease = holder.for_customer(customer_id).lock_paths("/a")
        version = lease.fencing_token
        assert other.for_customer(customer_id).try_lock_paths("/a/b") is None
        assert other.for_customer(customer_id).try_lock_paths("/") is None
        sibling = other.for_customer(customer_id).try_lock_paths("/b")
        assert sibling is not None
        assert sibling.fencing_token == version + 1
        sibling.release()
        lease.release()
    engine = create_engine(mariadb_url, poolclass=NullPool)
    _exact(engine, customer_id)
    engine.dispose()


def _as_an_older_pathlock(engine: Engine, customer_id: int, path: str) -> None:
    """What a pathlock without the counts does when it grants: the sentinel's
    version moves, and a row goes in, uncounted."""
    with engine.begin() as connection:
        connection.execute(
            text("UPDATE customer_locks SET version = version + 1 WHERE customer_id = :c"),
            {"c": customer_id},
        )
        connection.execute(
            text(
                "INSERT INTO path_locks (customer_id, lease_id, path, mode, node_id, pid, thread,"
                " reason, fencing_token, created_at, expires_at, owner_key)"
                " SELECT customer_id, :l, :p, 'exclusive', 'older', 1, 't', '', version,"
                " :now, :later, '' FROM customer_locks WHERE customer_id = :c"
            ).bindparams(bindparam("now", type_=DateTime), bindparam("later", type_=DateTime)),
            {
                "c": customer_id,
                "l": secrets.token_hex(16),
                "p": path,
                "now": datetime(2020, 1, 1),  # noqa: DTZ001 - UTC, as the columns hold it
                "later": datetime(2999, 1, 1),  # noqa: DTZ001
            },
        )


def test_a_lock_of_an_older_pathlock_during_a_rolling_upgrade_is_never_passed(
    database_url: str, engine: Engine, customer_id: int
) -> None:
    """During a rolling upgrade, a pathlock without the counts grants a path
    (the version moves alone): the counts are no longer trusted, so every
    grant searches and finds its lock; the reaper counts them again, with
    that lock among them."""
    with PathLockManager(database_url, heartbeat=False) as manager:
        locks = manager.for_customer(customer_id)
        locks.lock_paths("/warm").release()
        _exact(engine, customer_id)
        _as_an_older_pathlock(engine, customer_id, "/a")
        with engine.connect() as connection:
            assert uncounted(connection, [customer_id]) == [customer_id]
        assert locks.try_lock_paths("/a/b") is None
        assert locks.try_lock_paths("/") is None
        sibling = locks.lock_paths("/b")
        sibling.release()
        assert manager.reap_expired() >= 0  # counts the customer's rows again
        _exact(engine, customer_id)
        assert _counts(engine, customer_id) == (1, 0)
        assert locks.try_lock_paths("/a") is None
        with engine.begin() as connection:
            connection.execute(
                text("DELETE FROM path_locks WHERE customer_id = :c"), {"c": customer_id}
            )


def test_a_sentinel_row_deleted_by_hand_is_counted_again_when_made(
    database_url: str, engine: Engine, customer_id: int
) -> None:
    """An operator deletes a customer's sentinel row while it holds a lock:
    the next grant makes the row again, counting the rows it finds, so the
    lock is never passed."""
    with PathLockManager(database_url, heartbeat=False) as manager:
        locks = manager.for_customer(customer_id)
        lease = locks.lock_paths("/a")
        with engine.begin() as connection:
            connection.execute(
                text("DELETE FROM customer_locks WHERE customer_id = :c"), {"c": customer_id}
            )
        assert locks.try_lock_paths("/a/b") is None
        _exact(engine, customer_id)
        assert _counts(engine, customer_id) == (1, 0)
        lease.release()
        _exact(engine, customer_id)
        again = locks.lock_paths("/a/b")
        again.release()


def test_grants_killed_at_random_moments_of_their_round_trip_leave_exact_counts(
    mariadb_url: str, customer_id: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client sends a grant in one round trip (its COMMIT included) and
    hangs up; its session is killed, as a manager kills the sessions of its
    dropped connections before its next write, and the request, in doubt,
    is forgotten (its rows deleted by lease id, and counted down). MariaDB
    may run the rest of a killed batch, its COMMIT included, with ROW_COUNT()
    at -1 for the statement after the one the kill struck: a sentinel write
    conditioned on it was skipped while the grant's rows committed,
    uncounted (and with the token the next grant gets too), and the forget
    then took the count below the rows (seen with random interrupts, see
    test_lifecycle). Here the sentinel write reads the grant's rows
    themselves: however the kills fall, the counts stay exact."""
    with PathLockManager(mariadb_url, heartbeat=False) as manager:
        locks = manager.for_customer(customer_id)
        locks.lock_paths("/warm").release()
        store = manager._store
        sends: list[tuple[str, Any]] = []
        leases: list[str] = []

        def record(connection: Any, steps: Any, *, commit: bool = False, **_kw: Any) -> Any:
            sql, parameters = batch._compose(
                connection.dialect, steps, end="COMMIT" if commit else None
            )
            sends.append((sql, parameters))
            raise _Sent

        monkeypatch.setattr(batch, "run", record)
        for number in range(100):
            request = GrantRequest(
                customer_id,
                secrets.token_hex(16),
                normalize_request([f"/p/{number}"], []),
                Owner("gone", 1, "t"),
                "",
                60.0,
            )
            leases.append(request.lease_id)
            with manager.engine.connect() as connection, pytest.raises(_Sent):
                store.grants._grant_in_one(connection, request, None, first=True)
        monkeypatch.undo()
        url = make_url(mariadb_url)
        control = manager.engine.raw_connection()
        engine = create_engine(mariadb_url, poolclass=NullPool)
        for (sql, parameters), lease_id in zip(sends, leases, strict=True):
            client = pymysql.connect(
                host=url.host,
                port=url.port or 3306,
                user=url.username,
                password=url.password or "",
                database=url.database,
                client_flag=CLIENT.MULTI_STATEMENTS | CLIENT.FOUND_ROWS,
            )
            client._execute_command(COMMAND.COM_QUERY, sql % _escaped(client, parameters))
            session = client.thread_id()
            time.sleep(random.uniform(0.0, 0.003))  # the batch under way, or not yet
            client._sock.close()  # hangs up without reading a reply
            # What a manager does before its next write (dialects/mysql.py):
            # kill the session until it is gone.
            cursor = control.cursor()
            while cursor.execute(
                "SELECT 1 FROM information_schema.processlist WHERE id = %s", (session,)
            ):
                with contextlib.suppress(pymysql.MySQLError):
                    cursor.execute(f"KILL CONNECTION {session:d}")
                time.sleep(0.002)
            # The request is in doubt: its manager deletes its rows by lease.
            store.queue.forget(customer_id, lease_id)
            with engine.connect() as connection:
                assert miscounted(connection, [customer_id], exact=True) == []
        control.close()
        with engine.connect() as connection:
            assert miscounted(connection, [customer_id], exact=True) == []
            tokens = (
                connection.execute(
                    text("SELECT fencing_token FROM path_locks WHERE customer_id = :c"),
                    {"c": customer_id},
                )
                .scalars()
                .all()
            )
        assert tokens == []  # every one forgotten
        engine.dispose()


class _Sent(Exception):
    """The batch was composed, not sent."""


def _escaped(client: pymysql.connections.Connection, parameters: Any) -> Any:
    if isinstance(parameters, dict):
        return {name: client.escape(value) for name, value in parameters.items()}
    return tuple(client.escape(value) for value in parameters)
