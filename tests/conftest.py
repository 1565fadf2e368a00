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
from sqlalchemy import Engine, create_engine, make_url
from sqlalchemy.pool import NullPool

from pathlock import CustomerLocks, PathLockManager, migrate
from pathlock._backends import CONFIG_ENV_VAR
from tests.row_counts import counted_rows, miscounted

# The machine's /etc/pathlock.toml, if it has one, is not the tests' business:
# no test (nor any process a test starts) reads it unless the test says so.
os.environ[CONFIG_ENV_VAR] = ""

MYSQL_URL = os.environ.get("PATHLOCK_TEST_MYSQL_URL", "mysql+pymysql://root@127.0.0.1:3306/test")

POSTGRESQL_URL = os.environ.get(
    "PATHLOCK_TEST_POSTGRESQL_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)

BACKENDS = ("mariadb", "sqlite", "postgresql")
# The backends that are database servers (every backend but the embedded SQLite).
SERVER_BACKENDS = ("mariadb", "postgresql")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--soak",
        action="store_true",
        help="run the stress tests at soak size (100,000 operations) instead of the CI size",
    )


SOAK_TIMEOUT = 3600  # seconds per stress test at soak size


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--soak"):
        for item in items:
            if item.get_closest_marker("stress"):
                item.add_marker(pytest.mark.timeout(SOAK_TIMEOUT))


@pytest.fixture(scope="session")
def mariadb_url() -> Iterator[str]:
    """The URL of a database of this test session on the MariaDB/MySQL server,
    migrated to the newest revision (the schema production runs), for every
    test that needs a server; dropped at the end. Its own database, so that
    sessions running at once, and tables left by older versions, never meet."""
    server_url = make_url(MYSQL_URL)
    name = f"pathlock_test_{secrets.token_hex(4)}"
    server = create_engine(server_url, poolclass=NullPool)
    with server.begin() as connection:
        connection.exec_driver_sql(f"CREATE DATABASE `{name}`")
    url = server_url.set(database=name).render_as_string(hide_password=False)
    try:
        migrate.upgrade(url)
        yield url
        _counts_exact(url)
    finally:
        with server.begin() as connection:
            connection.exec_driver_sql(f"DROP DATABASE IF EXISTS `{name}`")
        server.dispose()


@pytest.fixture(scope="session")
def postgresql_url() -> Iterator[str]:
    """The URL of a database of this test session on the PostgreSQL server,
    migrated to the newest revision; dropped at the end."""
    server_url = make_url(POSTGRESQL_URL)
    name = f"pathlock_test_{secrets.token_hex(4)}"
    # CREATE and DROP DATABASE cannot run inside a transaction.
    server = create_engine(server_url, poolclass=NullPool, isolation_level="AUTOCOMMIT")
    with server.connect() as connection:
        connection.exec_driver_sql(f'CREATE DATABASE "{name}"')
    url = server_url.set(database=name).render_as_string(hide_password=False)
    try:
        migrate.upgrade(url)
        yield url
        _counts_exact(url)
    finally:
        with server.connect() as connection:
            connection.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        server.dispose()


@pytest.fixture(scope="session")
def sqlite_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A SQLite file of the test session, upgraded by pathlock itself."""
    url = f"sqlite:///{tmp_path_factory.mktemp('sqlite') / 'pathlock.sqlite3'}"
    PathLockManager(url, heartbeat=False).close()  # creates the schema
    yield url
    _counts_exact(url)


def _counts_exact(url: str, customer_ids: list[int] | None = None) -> None:
    """Fail if a customer's trusted row counts are wrong (every customer of
    the session's database, at its end; or ``customer_ids``)."""
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as connection:
            wrong = miscounted(connection, customer_ids)
            rows = [] if not wrong else counted_rows(connection, wrong[:5])
    finally:
        engine.dispose()
    assert not wrong, "row counts wrong:\n" + "\n".join(wrong[:20] + rows)


# The fixtures that give a test the URL of a backend.
_BACKEND_FIXTURES = ("database_url", "server_url", "mariadb_url", "postgresql_url")


@pytest.fixture(autouse=True)
def _exact_counts_of_the_tests_customer(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a test that locked in the ``customer_id`` of a backend, that
    customer's counts are exact (see ``customer_locks`` in pathlock.schema),
    in each backend the test took."""
    names = request.fixturenames
    backends = [name for name in _BACKEND_FIXTURES if name in names]
    if "customer_id" not in names or not backends:
        yield
        return
    urls = {str(request.getfixturevalue(name)) for name in backends}
    customer = request.getfixturevalue("customer_id")
    yield
    for url in sorted(urls):
        _counts_exact(url, [customer])


@pytest.fixture(scope="session", params=BACKENDS)
def database_url(request: pytest.FixtureRequest) -> str:
    """The URL of one backend, with the pathlock tables created: every test
    that uses it runs once per backend."""
    return str(request.getfixturevalue(f"{request.param}_url"))


@pytest.fixture(scope="session", params=SERVER_BACKENDS)
def server_url(request: pytest.FixtureRequest) -> str:
    """The URL of one database server's backend, migrated (every backend but
    the embedded SQLite): every test that uses it runs once per server."""
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
