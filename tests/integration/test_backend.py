"""Transient database failures are retried, permanent ones are reported clearly,
and engines passed in are used the way the design needs.

Most of these are about what a server does (killed connections, lock-wait
timeouts, databases without the tables), so they run on MariaDB; the SQLite
ones check the embedded backend's own failure modes.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import secrets
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, event, func, make_url, select, text

from pathlock import (
    ArgumentTypeError,
    AsyncPathLockManager,
    BackendError,
    CustomerLocks,
    ExponentialBackoff,
    InvalidArgument,
    PathLockManager,
    Settings,
)
from pathlock import _backends as backends
from pathlock import _batch as batch
from pathlock._backends import CONFIG_ENV_VAR, URL_ENV_VAR
from pathlock._statements.grants import BUMP, CREATE_SENTINEL
from pathlock.schema import REVISION, customer_locks, path_lock_waiters, path_locks


def _pooled_connection_id(manager: PathLockManager) -> int:
    with manager.engine.connect() as connection:
        connection_id = connection.execute(text("SELECT CONNECTION_ID()")).scalar_one()
        connection.rollback()
    return int(connection_id)


@pytest.fixture
def mariadb_engine(mariadb_url: str) -> Iterator[Engine]:
    engine = create_engine(mariadb_url)
    yield engine
    engine.dispose()


def test_killed_connection_is_retried_with_a_warning(
    mariadb_url: str,
    customer_id: int,
    mariadb_engine: Engine,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with PathLockManager(mariadb_url) as manager:
        locks = manager.for_customer(customer_id)
        locks.lock_paths("/warm/up/the/pool").release()
        victim = _pooled_connection_id(manager)
        with mariadb_engine.connect() as admin:
            admin.execute(text(f"KILL CONNECTION {victim}"))
        with caplog.at_level(logging.WARNING, logger="pathlock"):
            lease = locks.lock_paths("/after/kill", timeout=5)
        lease.release()
    retries = [record for record in caplog.records if "transient" in record.getMessage()]
    assert retries, "the lost connection should have been retried and logged"
    assert all(record.name.startswith("pathlock") for record in retries)
    assert all(record.levelno == logging.WARNING for record in retries)


def test_lock_wait_timeout_is_retried(
    mariadb_url: str, customer_id: int, mariadb_engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    impatient = PathLockManager(
        mariadb_url,
        engine_options={"connect_args": {"init_command": "SET innodb_lock_wait_timeout = 1"}},
    )
    with impatient:
        locks = impatient.for_customer(customer_id)
        locks.lock_paths("/create/the/sentinel").release()
        # Another session sits on the sentinel row longer than the lock-wait
        # timeout, then lets go: the first attempt fails with 1205, a retry wins.
        blocker = mariadb_engine.connect()
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


_BUMP_SQL = text("UPDATE customer_locks SET version = version + 1 WHERE customer_id = :c")
_IMPATIENT = {"init_command": "SET innodb_lock_wait_timeout = 1"}


def _fail_mid_transaction(engine: Engine, customer_id: int) -> None:
    with engine.connect() as connection:
        connection.execute(_BUMP_SQL, {"c": customer_id})
        raise RuntimeError("mid-transaction")


def test_a_connection_given_back_mid_transaction_holds_no_lock(
    mariadb_url: str, customer_id: int
) -> None:
    # pathlock's engines skip the pool's reset-on-return rollback: closing a
    # Connection inside a transaction must still roll it back.
    options = {"pool_size": 1, "max_overflow": 0, "connect_args": _IMPATIENT}
    with PathLockManager(mariadb_url, heartbeat=False, engine_options=options) as manager:
        locks = manager.for_customer(customer_id)
        locks.lock_paths("/create/the/sentinel").release()
        with pytest.raises(RuntimeError, match="mid-transaction"):
            _fail_mid_transaction(manager.engine, customer_id)
        # Another session writes the row at once (a held lock would time out
        # after 1 s with 1205), and the pooled connection grants as usual.
        other = create_engine(mariadb_url, connect_args=_IMPATIENT)
        try:
            with other.begin() as connection:
                connection.execute(_BUMP_SQL, {"c": customer_id})
        finally:
            other.dispose()
        locks.lock_paths("/after", timeout=5).release()


def test_persistent_transient_error_becomes_backend_error(
    mariadb_url: str, customer_id: int, mariadb_engine: Engine
) -> None:
    impatient = PathLockManager(
        mariadb_url,
        max_attempts=2,
        engine_options={"connect_args": {"init_command": "SET innodb_lock_wait_timeout = 1"}},
    )
    with impatient:
        locks = impatient.for_customer(customer_id)
        locks.lock_paths("/create/the/sentinel").release()
        with mariadb_engine.connect() as blocker:
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
def empty_database(mariadb_url: str) -> Iterator[str]:
    """A fresh database on the same server, without pathlock's tables."""
    url = make_url(mariadb_url)
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
        with pytest.raises(BackendError, match="run `pathlock db upgrade`"):
            manager.for_customer(1).lock_paths("/a")
        manager.create_schema()
        manager.create_schema()  # idempotent
        with manager.for_customer(1).lock_paths("/a") as lease:
            # The failed request left nothing to clean up: the first grant.
            assert lease.fencing_token == 1


def test_engine_passed_in_runs_read_committed_and_is_not_disposed(
    mariadb_url: str, customer_id: int
) -> None:
    engine = create_engine(mariadb_url)  # the server default: REPEATABLE READ
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


@pytest.mark.parametrize("given", ["url", "engine"])
def test_statements_are_batched_only_where_the_connection_allows_it(
    mariadb_url: str, given: str
) -> None:
    # pathlock's own engines send the sentinel write with the grant (and with
    # the release's DELETE) in one round trip; an engine passed in keeps its
    # connection flags, and the statements go one by one. Same results.
    engine = create_engine(mariadb_url) if given == "engine" else None
    try:
        with PathLockManager(engine or mariadb_url, heartbeat=False) as manager:
            with manager.engine.connect() as connection:
                assert batch.supports_batches(connection) == (given == "url")
                connection.rollback()
            locks = manager.for_customer(secrets.randbelow(2**62) + 1)  # a new customer
            first = locks.lock_paths("/a/b", shared=["/c"])
            assert locks.try_lock_paths("/a") is None
            second = locks.lock_paths("/a/x", shared=["/c/d"])
            assert second.fencing_token > first.fencing_token
            first.release()
            assert sorted(info.path for info in locks.list_locks()) == ["/a/x", "/c/d"]
            second.release()
            assert locks.list_locks() == []
    finally:
        if engine is not None:
            engine.dispose()


def test_batched_statements_must_agree_on_shared_parameters(mariadb_url: str) -> None:
    with (
        PathLockManager(mariadb_url, heartbeat=False) as manager,
        manager.engine.connect() as connection,
        pytest.raises(ValueError, match="c_id"),
    ):
        batch.run(connection, [(BUMP, {"c_id": 1}), (BUMP, {"c_id": 2})])


def test_unreachable_server_is_a_backend_error(customer_id: int) -> None:
    url = "mysql+pymysql://root@127.0.0.1:9/test"  # discard port: nothing listens
    with (
        PathLockManager(url, max_attempts=2) as manager,
        pytest.raises(BackendError, match="2 attempts"),
    ):
        manager.for_customer(customer_id).lock_paths("/a")


def test_a_single_failure_says_attempt(customer_id: int) -> None:
    url = "mysql+pymysql://root@127.0.0.1:9/test"
    with (
        PathLockManager(url, max_attempts=1) as manager,
        pytest.raises(BackendError, match=r"persisted through 1 attempt(?!s)"),
    ):
        manager.for_customer(customer_id).lock_paths("/a")


def _refusal(api: type[PathLockManager | AsyncPathLockManager], url: str) -> str:
    with pytest.raises(InvalidArgument) as refused:
        api(url)
    return str(refused.value)


@pytest.mark.parametrize(
    "scheme", ["mysql", "mariadb", "mysql+mysqldb", "mariadb+mysqlconnector", "sqlite+pysqlcipher"]
)
def test_both_apis_refuse_a_url_of_another_driver_alike(scheme: str, tmp_path: Path) -> None:
    """The asyncio API used to take mysql:// (and any other MySQL driver) and
    read it with asyncmy, where the synchronous one refused it, and only
    because MySQLdb is not installed: one rule decides for both now, whatever
    is installed, with one message that says what to write."""
    backend = scheme.split("+", maxsplit=1)[0]
    driver = "pymysql" if backend != "sqlite" else "pysqlite"
    url = f"{scheme}://root@127.0.0.1/test" if backend != "sqlite" else f"{scheme}:///{tmp_path}/x"
    refused = _refusal(PathLockManager, url)
    assert refused == _refusal(AsyncPathLockManager, url)
    assert f"write {backend}+{driver}://... instead of {scheme}://..." in refused


@pytest.mark.parametrize("backend", ["mysql", "mariadb"])
def test_both_apis_lock_through_a_pymysql_url(
    mariadb_url: str, customer_id: int, backend: str
) -> None:
    url = make_url(mariadb_url).set(drivername=f"{backend}+pymysql")
    with PathLockManager(url, heartbeat=False) as manager:
        manager.for_customer(customer_id).lock_paths("/sync").release()

    async def asynchronous() -> None:
        async with AsyncPathLockManager(url, heartbeat=False) as manager:
            lease = await manager.for_customer(customer_id).lock_paths("/async")
            await lease.release()

    asyncio.run(asynchronous())


def test_bad_constructor_arguments() -> None:
    with pytest.raises(TypeError):
        PathLockManager(42)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="unsupported database"):
        PathLockManager("oracle+oracledb://localhost/test")
    with pytest.raises(InvalidArgument, match=r"write postgresql\+psycopg://"):
        PathLockManager("postgresql+psycopg2://localhost/test")
    with pytest.raises(InvalidArgument, match="ttl"):
        PathLockManager("mysql+pymysql://root@127.0.0.1/test", ttl=-1)
    with pytest.raises(InvalidArgument, match="node_id"):
        PathLockManager("mysql+pymysql://root@127.0.0.1/test", node_id="")


class _NoReset:
    """A wait policy whose schedules cannot start over: the first version
    that moved failed the request with an AttributeError."""

    class _Delays:
        def next(self) -> float:
            return 0.01

    def start(self) -> _Delays:
        return self._Delays()


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"backoff": object()}, ArgumentTypeError, "backoff must be a wait policy"),
        ({"backoff": ExponentialBackoff}, ArgumentTypeError, "backoff must be a wait policy"),
        ({"backoff": _NoReset()}, ArgumentTypeError, "next\\(\\) -> seconds and reset\\(\\)"),
        ({"on_lost": 42}, ArgumentTypeError, "on_lost must be a function"),
        ({"affinity": True}, InvalidArgument, "affinity=True chooses among the nodes"),
        ({"engine_options": 5}, ArgumentTypeError, "engine_options must be a dict.* got int"),
        ({"engine_options": [("echo", True)]}, ArgumentTypeError, "got list"),
        ({"engine_options": {1: True}}, ArgumentTypeError, "keys must be names.* got int"),
    ],
    ids=[
        "backoff-object",
        "backoff-class",
        "backoff-no-reset",
        "on_lost-int",
        "affinity-one-database",
        "engine_options-int",
        "engine_options-list",
        "engine_options-int-key",
    ],
)
def test_options_are_checked_when_the_manager_is_built(
    mariadb_url: str, options: dict[str, Any], error: type[Exception], match: str
) -> None:
    """Before, each of these was accepted: the first lock failed with an
    AttributeError, a lost lease with a TypeError in the callback thread, or
    affinity was silently ignored; engine_options failed with a bare TypeError."""
    with pytest.raises(error, match=match):
        PathLockManager(mariadb_url, **options)


@pytest.mark.parametrize("on_lost", [42, "callback", object()])
def test_a_requests_on_lost_is_checked_before_anything_is_written(
    locks: CustomerLocks, raw_engine: Engine, on_lost: object
) -> None:
    """It used to be granted: the mistake showed only when the lease was lost,
    as a TypeError on the callback thread (the asyncio API refused it)."""
    for request in (locks.lock_paths, locks.try_lock_paths):
        with pytest.raises(ArgumentTypeError, match="on_lost must be a function"):
            request("/a", on_lost=on_lost)  # type: ignore[arg-type]
    with raw_engine.connect() as connection:
        for table in (customer_locks, path_locks, path_lock_waiters):
            written = connection.execute(
                select(func.count()).where(table.c.customer_id == locks.customer_id)
            ).scalar_one()
            assert written == 0, table.name
        connection.rollback()


def test_the_settings_reach_the_renewals_too(mariadb_url: str) -> None:
    settings = Settings(call_time=3.0, set_aside=1.0)
    with PathLockManager(mariadb_url, heartbeat=False, settings=settings) as manager:
        for store in (manager._store, manager._renewals):
            assert store.settings is settings
            assert store.router.set_aside_time == 1.0


def test_settings_cannot_change_after_construction(mariadb_url: str) -> None:
    with PathLockManager(mariadb_url, heartbeat=False) as manager:
        for name, value in (
            ("ttl", -5),
            ("node_id", "x"),
            ("case_insensitive", True),
            ("settings", Settings(call_time=1.0)),
        ):
            with pytest.raises(AttributeError):
                setattr(manager, name, value)
        assert manager.ttl == 30.0
        assert manager.settings == Settings()


# -- SQLite, the embedded backend ---------------------------------------------------


@pytest.fixture
def sqlite_file(tmp_path: Path) -> Path:
    return tmp_path / "locks.sqlite3"


def _hold_write_lock(path: Path) -> sqlite3.Connection:
    """Another process's writer, as SQLite sees it: a connection inside BEGIN
    IMMEDIATE holds the database's write lock until it ends."""
    connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    connection.execute("BEGIN IMMEDIATE")
    return connection


def test_sqlite_busy_database_is_retried_with_a_warning(
    sqlite_file: Path, customer_id: int, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"sqlite:///{sqlite_file}"
    impatient = PathLockManager(url, engine_options={"connect_args": {"timeout": 0.2}})
    with impatient:
        locks = impatient.for_customer(customer_id)
        locks.lock_paths("/create/the/sentinel").release()
        writer = _hold_write_lock(sqlite_file)
        timer = threading.Timer(0.5, writer.rollback)
        timer.start()
        try:
            with caplog.at_level(logging.WARNING, logger="pathlock"):
                locks.lock_paths("/x", timeout=10).release()
        finally:
            timer.join()
            writer.close()
    assert any("database is locked" in record.getMessage() for record in caplog.records)


def test_sqlite_persistently_busy_database_becomes_backend_error(
    sqlite_file: Path, customer_id: int
) -> None:
    url = f"sqlite:///{sqlite_file}"
    impatient = PathLockManager(
        url, max_attempts=2, engine_options={"connect_args": {"timeout": 0.05}}
    )
    with impatient:
        locks = impatient.for_customer(customer_id)
        writer = _hold_write_lock(sqlite_file)
        try:
            with pytest.raises(BackendError, match="2 attempts"):
                locks.lock_paths("/x", timeout=10)
        finally:
            writer.rollback()
            writer.close()
        assert locks.list_locks() == []


def _open_new_file(url: str) -> None:
    with PathLockManager(url, heartbeat=False) as manager:
        manager.for_customer(1).try_lock_paths(f"/{os.getpid()}")


def test_processes_opening_a_new_sqlite_file_at_once_create_it_once(sqlite_file: Path) -> None:
    url = f"sqlite:///{sqlite_file}"
    context = multiprocessing.get_context("spawn")
    with context.Pool(4) as pool:
        pool.map(_open_new_file, [url] * 4)
    with sqlite3.connect(sqlite_file) as connection:
        versions = connection.execute("SELECT version_num FROM pathlock_alembic_version").fetchall()
        tables = {
            name
            for (name,) in connection.execute("SELECT name FROM sqlite_master WHERE type='table'")
        }
    connection.close()
    assert versions == [(REVISION,)]
    assert {"customer_locks", "path_locks", "path_lock_waiters"} <= tables


def test_sqlite_engine_passed_in_is_reopened_and_left_alone(sqlite_file: Path) -> None:
    engine = create_engine(f"sqlite:///{sqlite_file}")
    with PathLockManager(engine) as manager:
        assert manager.engine is not engine
        with manager.for_customer(7).lock_paths("/a") as lease:
            assert lease.fencing_token == 1
    with engine.connect() as connection:  # the caller's engine still works
        assert connection.execute(text("SELECT 1")).scalar_one() == 1
    engine.dispose()


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:"])
def test_in_memory_sqlite_is_refused(url: str) -> None:
    with pytest.raises(InvalidArgument, match="in-memory"):
        PathLockManager(url)


def test_default_database_is_an_embedded_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(URL_ENV_VAR, raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    with PathLockManager(heartbeat=False) as manager:
        assert manager.engine.url.database == str(tmp_path / "state/pathlock/locks.sqlite3")
        manager.for_customer(1).lock_paths("/a").release()
    assert (tmp_path / "state/pathlock/locks.sqlite3").is_file()
    # The environment variable wins over the default file.
    monkeypatch.setenv(URL_ENV_VAR, f"sqlite:///{tmp_path / 'elsewhere.sqlite3'}")
    with PathLockManager(heartbeat=False) as manager:
        assert manager.engine.url.database == str(tmp_path / "elsewhere.sqlite3")


def test_the_configuration_file_names_the_default_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Processes of several users find one database through the system-wide
    # file, which $PATHLOCK_CONFIG can move, and an empty one turns off.
    monkeypatch.delenv(URL_ENV_VAR, raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    system = tmp_path / "etc-pathlock.toml"
    system.write_text(f'database_url = "sqlite:///{tmp_path / "system.sqlite3"}"\n')
    monkeypatch.setattr(backends, "SYSTEM_CONFIG", system)
    moved = tmp_path / "moved.toml"
    moved.write_text(f'database_url = "sqlite:///{tmp_path / "moved.sqlite3"}"\n')
    for setting, expected in (
        (None, tmp_path / "system.sqlite3"),
        (str(moved), tmp_path / "moved.sqlite3"),
        ("", tmp_path / "state/pathlock/locks.sqlite3"),
    ):
        if setting is None:
            monkeypatch.delenv(CONFIG_ENV_VAR)
        else:
            monkeypatch.setenv(CONFIG_ENV_VAR, setting)
        with PathLockManager(heartbeat=False) as manager:
            assert manager.engine.url.database == str(expected)
    monkeypatch.setenv(URL_ENV_VAR, f"sqlite:///{tmp_path / 'variable.sqlite3'}")
    monkeypatch.setenv(CONFIG_ENV_VAR, str(moved))
    with PathLockManager(heartbeat=False) as manager:
        assert manager.engine.url.database == str(tmp_path / "variable.sqlite3")


def test_a_customer_row_created_twice_warns_nobody(
    mariadb_url: str, customer_id: int, caplog: pytest.LogCaptureFixture
) -> None:
    # Two clients that use a customer for the first time at once both create
    # its sentinel row; the second finds it there. With INSERT IGNORE the
    # server answered that with a "Duplicate entry" warning, which asyncmy
    # fetches in a round trip of its own and logs as a WARNING of the app's.
    engine = create_engine(mariadb_url)
    try:
        with engine.connect() as connection:
            for _ in range(2):
                connection.execute(CREATE_SENTINEL, {"c_id": customer_id})
                warnings = connection.exec_driver_sql("SHOW WARNINGS").all()
                assert warnings == []
            connection.commit()
            rows = connection.execute(
                select(func.count()).where(customer_locks.c.customer_id == customer_id)
            ).scalar_one()
            assert rows == 1
    finally:
        engine.dispose()

    async def twice_through_asyncmy() -> None:
        from sqlalchemy.ext.asyncio import create_async_engine  # noqa: PLC0415

        url = make_url(mariadb_url).set(drivername="mysql+asyncmy")
        engine = create_async_engine(url)
        try:
            async with engine.connect() as connection:
                for _ in range(2):
                    await connection.execute(CREATE_SENTINEL, {"c_id": customer_id + 1})
                await connection.commit()
        finally:
            await engine.dispose()

    with caplog.at_level(logging.WARNING):
        asyncio.run(twice_through_asyncmy())
    assert [record.getMessage() for record in caplog.records] == []


def test_a_request_on_a_database_without_the_tables_leaves_nothing_in_doubt(
    empty_database: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Nothing can be granted without the tables: the request's error says to
    # run the migrations, and the manager does not go on trying to release a
    # lease "left in doubt" (and warn twice, with the same error, at close).
    with caplog.at_level(logging.WARNING), PathLockManager(empty_database) as manager:
        with pytest.raises(BackendError, match="the pathlock tables are missing"):
            manager.for_customer(1).lock_paths("/a")
        assert not manager._in_doubt
    assert [record.getMessage() for record in caplog.records] == []


def test_sqlite_reads_the_version_from_the_sentinel_write(
    sqlite_file: Path, customer_id: int
) -> None:
    """SQLite's UPDATE returns the new version (RETURNING, SQLite 3.35 and
    newer): an acquire and a release each write the customer's row once and
    never read the version in a SELECT of its own; the tokens still grow."""
    if sqlite3.sqlite_version_info < (3, 35):
        pytest.skip("this SQLite's UPDATE cannot return rows")
    with PathLockManager(f"sqlite:///{sqlite_file}", heartbeat=False) as manager:
        locks = manager.for_customer(customer_id)
        first = locks.lock_paths("/warm")
        first.release()
        sent: list[str] = []
        event.listen(
            manager.engine,
            "before_cursor_execute",
            lambda _c, _cursor, statement, *_rest: sent.append(" ".join(statement.split())),
        )
        lease = locks.lock_paths("/a")
        lease.release()
        writes = [sql for sql in sent if sql.startswith("UPDATE customer_locks SET version")]
        assert len(writes) == 2, sent
        assert all(sql.endswith("RETURNING version") for sql in writes), sent
        assert not [sql for sql in sent if sql.startswith("SELECT customer_locks.version")], sent
        assert lease.fencing_token > first.fencing_token
        assert locks.list_locks() == []
