"""Shared fixtures: every test that touches SQL runs against a real server.

The backend fixture is parametrized so each backend-independent test runs on
every supported database; each test works in a fresh random customer id, so
tests never share state even on a shared database.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, create_engine

from pathlock import CustomerLocks, PathLockManager
from pathlock.schema import metadata

MYSQL_URL = os.environ.get("PATHLOCK_TEST_MYSQL_URL", "mysql+pymysql://root@127.0.0.1:3306/test")

BACKENDS = ("mariadb", "sqlite")


@pytest.fixture(scope="session")
def mariadb_url() -> str:
    """The MariaDB/MySQL server's URL, with the pathlock tables created, for
    tests of what only a server does (killed connections, lock-wait timeouts,
    migrations to a server)."""
    engine = create_engine(MYSQL_URL)
    try:
        metadata.create_all(engine)
    finally:
        engine.dispose()
    return MYSQL_URL


@pytest.fixture(scope="session")
def sqlite_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A SQLite file of the test session, upgraded by pathlock itself."""
    url = f"sqlite:///{tmp_path_factory.mktemp('sqlite') / 'pathlock.sqlite3'}"
    PathLockManager(url, heartbeat=False).close()  # creates the schema
    return url


@pytest.fixture(scope="session", params=BACKENDS)
def database_url(request: pytest.FixtureRequest) -> str:
    """The URL of one backend, with the pathlock tables created: every test
    that uses it runs once per backend."""
    return str(request.getfixturevalue(f"{request.param}_url"))


@pytest.fixture
def raw_engine(database_url: str) -> Iterator[Engine]:
    """A plain engine for independent checks (not pathlock's own queries)."""
    engine = create_engine(database_url)
    yield engine
    engine.dispose()


@pytest.fixture
def manager(database_url: str) -> Iterator[PathLockManager]:
    with PathLockManager(database_url, node_id="test-node", ttl=30.0) as manager:
        yield manager


@pytest.fixture
def customer_id() -> int:
    return secrets.randbelow(2**62) + 1


@pytest.fixture
def locks(manager: PathLockManager, customer_id: int) -> CustomerLocks:
    return manager.for_customer(customer_id)
