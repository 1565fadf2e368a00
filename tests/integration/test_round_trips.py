"""How many round trips an operation costs on MySQL and MariaDB: the commands
PyMySQL sends, counted where it sends them."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import pymysql.connections
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import DBAPIError

from pathlock import PathLockManager
from pathlock import _batch as batch
from pathlock import _deadlines as deadlines
from tests.integration.commit_faults import CommitFaults


@contextmanager
def sent(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The SQL of every command sent meanwhile, one entry per round trip."""
    commands: list[str] = []
    send = pymysql.connections.Connection._execute_command

    def counted(self: pymysql.connections.Connection, command: int, sql: str | bytes) -> None:
        commands.append(sql.decode() if isinstance(sql, bytes) else sql)
        send(self, command, sql)

    with monkeypatch.context() as patch:
        patch.setattr(pymysql.connections.Connection, "_execute_command", counted)
        yield commands


def test_a_release_is_one_round_trip_on_the_engines_pathlock_creates(
    mariadb_url: str, customer_id: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    with PathLockManager(mariadb_url, heartbeat=False) as manager:
        locks = manager.for_customer(customer_id)
        lease = locks.lock_paths("/a/b", shared=["/c"])
        with sent(monkeypatch) as commands:
            lease.release()
        assert len(commands) == 1, commands
        assert commands[0].rstrip().endswith("COMMIT")
        assert locks.list_locks() == []
        # The connection's next transaction is a new one: nothing was left open.
        again = locks.lock_paths("/a/b")
        assert again.fencing_token > lease.fencing_token
        again.release()
        assert locks.list_locks() == []


def test_an_uncontended_grant_is_one_round_trip_with_its_commit(
    mariadb_url: str, customer_id: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    with PathLockManager(mariadb_url, heartbeat=False) as manager:
        locks = manager.for_customer(customer_id)
        locks.lock_paths("/first").release()  # the customer's sentinel row exists
        with sent(monkeypatch) as commands:
            lease = locks.lock_paths("/a/b", shared=["/c"])
        assert len(commands) == 1, commands
        assert commands[0].rstrip().endswith("COMMIT")
        # The rows carry the version the grant's sentinel write set.
        assert [info.fencing_token for info in locks.list_locks()] == [lease.fencing_token] * 2
        with manager.engine.connect() as connection:
            version = connection.execute(
                text("SELECT version FROM customer_locks WHERE customer_id = :c"),
                {"c": customer_id},
            ).scalar()
        assert version == lease.fencing_token
        with sent(monkeypatch) as commands:
            lease.release()
        assert len(commands) == 1, commands


@contextmanager
def sentinel_writes(url: str, customer_id: int) -> Iterator[Callable[[], int]]:
    """How many writes of the customer's sentinel row have been committed
    meanwhile (a trigger counts them in a table of its own)."""
    engine = create_engine(url)
    with engine.begin() as connection:
        connection.exec_driver_sql("CREATE TABLE sentinel_writes (customer_id BIGINT)")
        connection.exec_driver_sql(
            "CREATE TRIGGER count_sentinel_writes AFTER UPDATE ON customer_locks FOR EACH ROW "
            f"IF NEW.customer_id = {int(customer_id)} THEN "
            "INSERT INTO sentinel_writes VALUES (NEW.customer_id); END IF"
        )

    def count() -> int:
        with engine.connect() as connection:
            return int(connection.exec_driver_sql("SELECT COUNT(*) FROM sentinel_writes").scalar())

    try:
        yield count
    finally:
        with engine.begin() as connection:
            connection.exec_driver_sql("DROP TRIGGER count_sentinel_writes")
            connection.exec_driver_sql("DROP TABLE sentinel_writes")
        engine.dispose()


def test_a_denied_or_queued_request_commits_no_sentinel_write(
    mariadb_url: str, customer_id: int
) -> None:
    """On a cluster every committed sentinel write is certified against every
    other node's: a request that is only denied, or queued, writes none (its
    queue row alone is replicated). Grants and releases do."""
    with (
        PathLockManager(mariadb_url, heartbeat=False) as manager,
        sentinel_writes(mariadb_url, customer_id) as writes,
    ):
        locks = manager.for_customer(customer_id)
        holder = locks.lock_paths("/a")
        assert writes() == 1
        assert locks.try_lock_paths("/a/b") is None
        assert writes() == 1

        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(locks.lock_paths, "/a/b", timeout=30)
            deadline = time.monotonic() + 10
            while not manager.list_waiters(customer_id=customer_id) and time.monotonic() < deadline:
                time.sleep(0.01)
            assert manager.list_waiters(customer_id=customer_id)
            assert writes() == 1  # queued: no write
            holder.release()
            lease = waiting.result(timeout=30)
        # The release, and the grant of the request that waited, which also
        # left the queue in the grant's transaction.
        assert writes() == 3
        assert manager.list_waiters(customer_id=customer_id) == []
        lease.release()


def test_an_engine_passed_in_sends_the_commit_on_its_own(
    mariadb_url: str, customer_id: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = create_engine(mariadb_url)
    try:
        with PathLockManager(engine, heartbeat=False) as manager:
            locks = manager.for_customer(customer_id)
            lease = locks.lock_paths("/a")
            with sent(monkeypatch) as commands:
                lease.release()
            # Its connections take one statement per query: the sentinel
            # write, the DELETE and the COMMIT go one by one. Around them,
            # SQLAlchemy sets the connection's isolation level to pathlock's
            # at checkout and back to the engine's at return (8 in all).
            own = [command.split()[0] for command in commands[2:5]]
            assert own == ["UPDATE", "DELETE", "COMMIT"], commands
            assert len(commands) == 8, commands
            assert locks.list_locks() == []
    finally:
        engine.dispose()


def test_a_release_whose_commit_reply_is_lost_is_released(
    mariadb_url: str, customer_id: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The release's one round trip carries its COMMIT; the connection is cut
    before the reply. The release cannot tell whether it landed: it tries
    again, finds the rows gone, and counts the lease as released."""
    with PathLockManager(mariadb_url, heartbeat=False) as manager:
        locks = manager.for_customer(customer_id)
        lease = locks.lock_paths("/a")
        CommitFaults(monkeypatch).lose_reply()
        with sent(monkeypatch) as commands:
            lease.release()
        assert len(commands) >= 2, commands  # the batch, then the retry
        assert lease.released
        assert not lease.lost
        assert locks.list_locks() == []
        other = locks.try_lock_paths("/a")
        assert other is not None
        other.release()


@pytest.mark.parametrize("outcome", ["reply lost", "refused", "committed"])
def test_a_batch_that_carries_a_commit_says_when_its_reply_is_missing(
    mariadb_url: str, monkeypatch: pytest.MonkeyPatch, outcome: str
) -> None:
    """While a batch's COMMIT is on its way, the attempt's limit counts it
    unanswered: after a lost reply the attempt is in doubt; after an error
    the server answered with, or the COMMIT's own reply, it is not."""
    steps: list[tuple[Any, dict[str, Any]]] = [(text("DO 1"), {})]
    if outcome == "refused":
        steps.append((text("SELECT * FROM no_such_table"), {}))
    with (
        PathLockManager(mariadb_url, heartbeat=False) as manager,
        manager.engine.connect() as connection,
    ):
        assert batch.commits_in_batches(connection)

        if outcome == "reply lost":
            CommitFaults(monkeypatch).lose_reply()

        def attempt(limit: deadlines.Limit) -> bool:
            try:
                batch.run(connection, steps, commit=True)
            except DBAPIError:
                assert outcome != "committed"
            else:
                assert outcome == "committed"
                assert not connection.in_transaction()
            return limit.commit_unanswered

        unanswered = deadlines.within(time.monotonic() + 10, attempt)
    assert unanswered == (outcome == "reply lost")
