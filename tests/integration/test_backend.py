"""Transient database failures are retried, permanent ones are reported clearly,
and engines passed in are used the way the design needs."""

from __future__ import annotations

import logging
import secrets
import threading
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, create_engine, make_url, text

from pathlock import BackendError, CustomerLocks, InvalidArgument, PathLockManager


def _pooled_connection_id(manager: PathLockManager) -> int:
    with manager.engine.connect() as connection:
        connection_id = connection.execute(text("SELECT CONNECTION_ID()")).scalar_one()
        connection.rollback()
    return int(connection_id)


def test_killed_connection_is_retried_with_a_warning(
    manager: PathLockManager,
    locks: CustomerLocks,
    raw_engine: Engine,
    caplog: pytest.LogCaptureFixture,
) -> None:
    locks.lock_paths("/warm/up/the/pool").release()
    victim = _pooled_connection_id(manager)
    with raw_engine.connect() as admin:
        admin.execute(text(f"KILL CONNECTION {victim}"))
    with caplog.at_level(logging.WARNING, logger="pathlock"):
        lease = locks.lock_paths("/after/kill", timeout=5)
    lease.release()
    retries = [record for record in caplog.records if "transient" in record.getMessage()]
    assert retries, "the lost connection should have been retried and logged"
    assert all(record.name.startswith("pathlock") for record in retries)
    assert all(record.levelno == logging.WARNING for record in retries)


def test_lock_wait_timeout_is_retried(
    database_url: str, customer_id: int, raw_engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    impatient = PathLockManager(
        database_url,
        engine_options={"connect_args": {"init_command": "SET innodb_lock_wait_timeout = 1"}},
    )
    with impatient:
        locks = impatient.for_customer(customer_id)
        locks.lock_paths("/create/the/sentinel").release()
        # Another session sits on the sentinel row longer than the lock-wait
        # timeout, then lets go: the first attempt fails with 1205, a retry wins.
        blocker = raw_engine.connect()
        blocker.execute(
            text("UPDATE customer_locks SET version = version WHERE customer_id = :c"),
            {"c": customer_id},
        )
        timer = threading.Timer(1.5, blocker.rollback)
        timer.start()
        try:
            with caplog.at_level(logging.WARNING, logger="pathlock"):
                locks.lock_paths("/x", timeout=10).release()
        finally:
            timer.join()
            blocker.close()
    assert any("1205" in record.getMessage() for record in caplog.records)


def test_persistent_transient_error_becomes_backend_error(
    database_url: str, customer_id: int, raw_engine: Engine
) -> None:
    impatient = PathLockManager(
        database_url,
        max_attempts=2,
        engine_options={"connect_args": {"init_command": "SET innodb_lock_wait_timeout = 1"}},
    )
    with impatient:
        locks = impatient.for_customer(customer_id)
        locks.lock_paths("/create/the/sentinel").release()
        with raw_engine.connect() as blocker:
            blocker.execute(
                text("UPDATE customer_locks SET version = version WHERE customer_id = :c"),
                {"c": customer_id},
            )
            with pytest.raises(BackendError, match="2 attempts") as caught:
                locks.lock_paths("/x", timeout=10)
            blocker.rollback()
        assert "1205" in str(caught.value.cause)
        # Nothing was granted.
        assert locks.list_locks() == []


@pytest.fixture
def empty_database(database_url: str) -> Iterator[str]:
    """A fresh database on the same server, without pathlock's tables."""
    url = make_url(database_url)
    name = f"pathlock_empty_{secrets.token_hex(4)}"
    admin = create_engine(url)
    with admin.connect() as connection:
        connection.execute(text(f"CREATE DATABASE {name}"))
    try:
        yield url.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.execute(text(f"DROP DATABASE {name}"))
        admin.dispose()


def test_missing_tables_give_a_clear_error(empty_database: str) -> None:
    with PathLockManager(empty_database) as manager:
        with pytest.raises(BackendError, match="migrations"):
            manager.for_customer(1).lock_paths("/a")
        manager.create_schema()
        manager.create_schema()  # idempotent
        with manager.for_customer(1).lock_paths("/a") as lease:
            assert lease.fencing_token == 1


def test_engine_passed_in_runs_read_committed_and_is_not_disposed(
    database_url: str, customer_id: int
) -> None:
    engine = create_engine(database_url)  # the server default: REPEATABLE READ
    with PathLockManager(engine) as manager:
        with manager.engine.connect() as connection:
            level = connection.execute(text("SELECT @@tx_isolation")).scalar_one()
            connection.rollback()
        assert level == "READ-COMMITTED"
        manager.for_customer(customer_id).lock_paths("/a").release()
    # The caller's engine still works after close().
    with engine.connect() as connection:
        assert connection.execute(text("SELECT 1")).scalar_one() == 1
    engine.dispose()


def test_unreachable_server_is_a_backend_error(customer_id: int) -> None:
    url = "mysql+pymysql://root@127.0.0.1:9/test"  # discard port: nothing listens
    with (
        PathLockManager(url, max_attempts=2) as manager,
        pytest.raises(BackendError, match="2 attempts"),
    ):
        manager.for_customer(customer_id).lock_paths("/a")


def test_bad_constructor_arguments() -> None:
    with pytest.raises(TypeError):
        PathLockManager(42)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="unsupported database"):
        PathLockManager("postgresql+psycopg2://localhost/test")
    with pytest.raises(InvalidArgument, match="ttl"):
        PathLockManager("mysql+pymysql://root@127.0.0.1/test", ttl=-1)
    with pytest.raises(InvalidArgument, match="node_id"):
        PathLockManager("mysql+pymysql://root@127.0.0.1/test", node_id="")
