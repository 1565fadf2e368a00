"""pathlock runs with the privileges docs/MIGRATIONS.md lists, and no more:
the migrations as a user with CREATE, ALTER, INDEX and DROP besides the data
privileges; the library as a user with SELECT, INSERT, UPDATE and DELETE on
its database only."""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Iterator

import pytest
from sqlalchemy import URL, Engine

from pathlock import Lease, LockTimeout, PathLockManager, cli
from pathlock.schema import REVISION
from tests.integration.test_migrations import (
    SERVER_URL,
    NewDatabase,
    _url_text,
    _versions,
    new_database,  # noqa: F401 - a fixture
    server,  # noqa: F401 - a fixture
)

MIGRATION_PRIVILEGES = "CREATE, ALTER, INDEX, DROP, SELECT, INSERT, UPDATE, DELETE"
RUNTIME_PRIVILEGES = "SELECT, INSERT, UPDATE, DELETE"


@pytest.fixture
def users(server: Engine) -> Iterator[list[str]]:  # noqa: F811 - the fixture above
    """Create users (named by the test) on the test server; drop them afterwards."""
    created: list[str] = []
    yield created
    with server.begin() as connection:
        for name in created:
            connection.exec_driver_sql(f"DROP USER IF EXISTS '{name}'@'127.0.0.1'")


def _user(server: Engine, users: list[str], database: str, privileges: str) -> URL:  # noqa: F811
    name = f"pl_{secrets.token_hex(4)}"
    password = secrets.token_hex(8)
    with server.begin() as connection:
        connection.exec_driver_sql(f"CREATE USER '{name}'@'127.0.0.1' IDENTIFIED BY '{password}'")
        users.append(name)
        connection.exec_driver_sql(f"GRANT {privileges} ON `{database}`.* TO '{name}'@'127.0.0.1'")
    return SERVER_URL.set(username=name, password=password, database=database)


def test_migrations_and_the_library_need_only_the_documented_privileges(
    server: Engine,  # noqa: F811
    new_database: NewDatabase,  # noqa: F811
    users: list[str],
    customer_id: int,
) -> None:
    database = str(new_database().database)
    migrator = _user(server, users, database, MIGRATION_PRIVILEGES)
    app = _user(server, users, database, RUNTIME_PRIVILEGES)

    assert cli.main(["db", "upgrade", "--database-url", _url_text(migrator)]) == 0
    assert _versions(migrator) == [REVISION]
    assert cli.main(["db", "check", "--database-url", _url_text(app)]) == 0

    lost: list[Lease] = []
    with PathLockManager(_url_text(app), node_id="least", ttl=1.5, on_lost=lost.append) as manager:
        manager.create_schema()  # the tables exist: nothing to create, no CREATE needed
        locks = manager.for_customer(customer_id)
        held = locks.lock_paths("/Shared/a", shared=["/Shared/b"], reason="least privilege")
        assert locks.try_lock_paths("/Shared/a/x") is None
        with pytest.raises(LockTimeout):  # queued, then left the queue
            locks.lock_paths("/Shared/a/x", timeout=0.3, owner="other")
        # A waiter that is granted when the holder releases.
        granted = threading.Event()

        def wait() -> None:
            with locks.lock_paths("/Shared", timeout=10, owner="waiter"):
                granted.set()

        waiter = threading.Thread(target=wait)
        waiter.start()
        time.sleep(2.5)  # longer than the ttl: renewed by the heartbeat meanwhile
        held.ensure_held(verify=True)
        assert [info.path for info in manager.list_locks(customer_id)] == [
            "/Shared/a",
            "/Shared/b",
        ]
        assert len(manager.list_waiters(customer_id)) == 1
        held.release()
        waiter.join(10)
        assert granted.is_set()
        manager.reap_expired()
        assert manager.release_node("least") == 0
        assert not lost
