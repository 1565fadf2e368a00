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

BACKENDS = {"mariadb": MYSQL_URL}


@pytest.fixture(scope="session", params=sorted(BACKENDS))
def database_url(request: pytest.FixtureRequest) -> str:
    """The URL of one backend, with the pathlock tables created."""
    url = BACKENDS[request.param]
    engine = create_engine(url)
    try:
        metadata.create_all(engine)
    finally:
        engine.dispose()
    return url


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
