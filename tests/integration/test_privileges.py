"""pathlock runs with the privileges docs/MIGRATIONS.md lists, and no more:
the migrations as an account that may create, alter and drop tables in its
database; the library as an account that may read and write pathlock's
tables (SELECT, INSERT, UPDATE and DELETE; on PostgreSQL, USAGE on their
sequences too), on its database only.

On MariaDB the accounts get the privileges the documentation's GRANTs list.
On PostgreSQL the test runs the documentation's SQL itself, in a database
where PUBLIC may do nothing; then that SQL without each one privilege in
turn, to show that each is needed."""

from __future__ import annotations

import re
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from typing import NamedTuple

import pytest
from sqlalchemy import URL, Engine, create_engine
from sqlalchemy.pool import NullPool

from pathlock import Lease, LockTimeout, PathLockError, PathLockManager, Settings, cli, dialects
from pathlock.dialects.base import SERVER_SESSION, ServerSession
from pathlock.schema import REVISION
from tests.conftest import SERVER_BACKENDS
from tests.integration.test_migrations import (
    PG_SERVER_URL,
    ROOT,
    SERVER_URL,
    _url_text,
    _versions,
    new_database,  # noqa: F401 - a fixture
    pg_server,  # noqa: F401 - a fixture
    server,  # noqa: F401 - a fixture
)

MIGRATION_PRIVILEGES = "CREATE, ALTER, INDEX, DROP, SELECT, INSERT, UPDATE, DELETE"
RUNTIME_PRIVILEGES = "SELECT, INSERT, UPDATE, DELETE"
DOCUMENTATION = ROOT / "docs" / "MIGRATIONS.md"


class Accounts(NamedTuple):
    """A database's two accounts: the migrations' and the library's."""

    migrations: URL
    library: URL


def _documented_sql(server_family: str) -> str:
    """The SQL of the documentation's "Privileges" section for
    ``server_family`` ("MySQL and MariaDB", or "PostgreSQL")."""
    text = DOCUMENTATION.read_text()
    section = text.split("\n## Privileges\n", 1)[1].split("\n## ", 1)[0]
    found = re.search(rf"\nOn {server_family}\b.*?```sql\n(.*?)```", section, re.DOTALL)
    assert found is not None, f"no SQL for {server_family} under Privileges in {DOCUMENTATION}"
    return found.group(1)


def _statements(sql: str) -> list[str]:
    """The statements of ``sql``, each on one line, without comments."""
    lines = [line for line in sql.splitlines() if not line.lstrip().startswith("--")]
    statements = (" ".join(each.split()) for each in "\n".join(lines).split(";"))
    return [statement for statement in statements if statement]


POSTGRESQL_SQL = _statements(_documented_sql("PostgreSQL"))
_GRANT = re.compile(r"\bGRANT (?P<privileges>[A-Z]+(?:, [A-Z]+)*) ON (?P<on>.+) TO (?P<role>\w+)$")


class Grant(NamedTuple):
    """One privilege that one of the documented statements grants."""

    statement: int  # its index in POSTGRESQL_SQL
    privilege: str
    on: str  # as the statement says: "DATABASE app", "SCHEMA public", "TABLES"
    role: str

    def __str__(self) -> str:
        return f"{self.privilege} ON {self.on} TO {self.role}"

    def left_out(self) -> list[str]:
        """The documented statements, without this privilege."""
        statements = list(POSTGRESQL_SQL)
        statement = statements[self.statement]
        found = _GRANT.search(statement)
        assert found is not None
        others = [each for each in found["privileges"].split(", ") if each != self.privilege]
        if others:
            start, end = found.span("privileges")
            statements[self.statement] = statement[:start] + ", ".join(others) + statement[end:]
        else:
            del statements[self.statement]
        return statements


GRANTS = [
    Grant(index, privilege, found["on"], found["role"])
    for index, statement in enumerate(POSTGRESQL_SQL)
    if (found := _GRANT.search(statement)) is not None
    for privilege in found["privileges"].split(", ")
]
# What a role is told without the privilege, by what the privilege is on. A
# schema without USAGE is left out of the search path: nothing in it is
# found, and there is nowhere to create anything.
REFUSALS = {
    "DATABASE": r'permission denied for database "\w+"',
    "SCHEMA": r"permission denied for schema public|no schema has been selected to create in"
    r'|relation "\w+" does not exist',
    "TABLES": r"permission denied for table \w+",
    "SEQUENCES": r"permission denied for sequence \w+",
}


# -- MariaDB --------------------------------------------------------------------------


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


def _mariadb_accounts(request: pytest.FixtureRequest) -> Accounts:
    """Two users with the privileges the documentation grants."""
    documented = _documented_sql("MySQL and MariaDB")
    for privileges, user in ((MIGRATION_PRIVILEGES, "admin"), (RUNTIME_PRIVILEGES, "app")):
        assert f"GRANT {privileges} ON app.* TO 'pathlock_{user}'@'%';" in documented
    mariadb, users = request.getfixturevalue("server"), request.getfixturevalue("users")
    database = str(request.getfixturevalue("new_database")().database)
    return Accounts(
        _user(mariadb, users, database, MIGRATION_PRIVILEGES),
        _user(mariadb, users, database, RUNTIME_PRIVILEGES),
    )


# -- PostgreSQL -----------------------------------------------------------------------

PostgreSQLAccounts = Callable[[list[str]], Accounts]


@pytest.fixture
def postgresql_accounts(pg_server: Engine) -> Iterator[PostgreSQLAccounts]:  # noqa: F811
    """Make a database where PUBLIC may do nothing, on the PostgreSQL test
    server, and run the given statements in it as a superuser (the
    documentation's, or fewer), with names of the test's own: its two
    accounts. Drop the databases, then the roles, afterwards, whatever the
    test did."""
    databases: list[str] = []
    roles: list[str] = []

    def make(statements: list[str]) -> Accounts:
        database = f"pathlock_mig_{secrets.token_hex(6)}"
        token = secrets.token_hex(4)
        admin, app = f"pl_{token}_admin", f"pl_{token}_app"
        roles.extend((admin, app))
        password = secrets.token_hex(8)
        names = {"app": database, "pathlock_admin": admin, "pathlock_app": app}
        with pg_server.connect() as connection:
            connection.exec_driver_sql(f'CREATE DATABASE "{database}"')
            databases.append(database)
            connection.exec_driver_sql(f'REVOKE ALL ON DATABASE "{database}" FROM PUBLIC')
        inside = create_engine(
            PG_SERVER_URL.set(database=database), poolclass=NullPool, isolation_level="AUTOCOMMIT"
        )
        try:
            with inside.connect() as connection:
                connection.exec_driver_sql("REVOKE ALL ON SCHEMA public FROM PUBLIC")
                for statement in statements:
                    ours = re.sub(r"PASSWORD '[^']*'", f"PASSWORD '{password}'", statement)
                    ours = re.sub(
                        r"\b(app|pathlock_admin|pathlock_app)\b", lambda m: names[m[0]], ours
                    )
                    connection.exec_driver_sql(ours)
        finally:
            inside.dispose()
        return Accounts(
            *(
                PG_SERVER_URL.set(username=role, password=password, database=database)
                for role in (admin, app)
            )
        )

    yield make
    with pg_server.connect() as connection:
        try:
            for database in databases:
                connection.exec_driver_sql(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        finally:
            for role in roles:
                connection.exec_driver_sql(f'DROP ROLE IF EXISTS "{role}"')


# -- both -----------------------------------------------------------------------------


@pytest.fixture(params=SERVER_BACKENDS)
def accounts(request: pytest.FixtureRequest) -> Accounts:
    """The documented accounts of a new database, on each server."""
    if request.param == "mariadb":
        return _mariadb_accounts(request)
    make: PostgreSQLAccounts = request.getfixturevalue("postgresql_accounts")
    return make(POSTGRESQL_SQL)


def test_migrations_and_the_library_need_only_the_documented_privileges(
    accounts: Accounts, customer_id: int
) -> None:
    migrations, library = (_url_text(url) for url in accounts)

    assert cli.main(["db", "upgrade", "--database-url", migrations]) == 0
    # Every revision's downgrade, and the upgrade again: the migrations'
    # account drops and alters what it made, and the tables it makes later
    # are the library's too.
    assert cli.main(["db", "downgrade", "base", "--database-url", migrations]) == 0
    assert cli.main(["db", "upgrade", "--database-url", migrations]) == 0
    assert _versions(accounts.migrations) == [REVISION]
    assert cli.main(["db", "check", "--database-url", library]) == 0

    lost: list[Lease] = []
    with PathLockManager(library, node_id="least", ttl=1.5, on_lost=lost.append) as manager:
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
        # A connection dropped in the middle of an operation: its session is
        # known, and ended through another connection of the same account.
        dialect = dialects.for_name(manager.engine.dialect.name)
        with manager.engine.connect() as dropped, manager.engine.connect() as other:
            session = dropped.connection._connection_record.info.get(SERVER_SESSION)
            assert isinstance(session, ServerSession)
            assert dialect.end_sessions(other, [session], time.monotonic() + 10) == set()
            dropped.invalidate()


# The library, briefly: a grant, a listing, a release, the reaper (shorter waits).
BRIEF = Settings(try_time=2.0, call_time=2.0, close_time=2.5, schema_check_time=0.5)


def _lock_and_release(url: str, customer_id: int) -> None:
    with PathLockManager(url, node_id="less", heartbeat=False, settings=BRIEF) as manager:
        locks = manager.for_customer(customer_id)
        locks.lock_paths("/Shared/a", timeout=5)
        assert [info.path for info in locks.list_locks()] == ["/Shared/a"]
        assert locks.release_locks() == 1  # raises where Lease.release() would only log
        manager.reap_expired()


def test_on_postgresql_the_documented_sql_lets_the_brief_use_through(
    postgresql_accounts: PostgreSQLAccounts, customer_id: int
) -> None:
    """What the test below tries with one privilege fewer succeeds with all
    of them: there, the privilege left out is what fails."""
    accounts = postgresql_accounts(POSTGRESQL_SQL)
    assert cli.main(["db", "upgrade", "--database-url", _url_text(accounts.migrations)]) == 0
    _lock_and_release(_url_text(accounts.library), customer_id)


@pytest.mark.parametrize("grant", GRANTS, ids=str)
def test_on_postgresql_a_role_without_any_one_documented_privilege_fails(
    grant: Grant,
    postgresql_accounts: PostgreSQLAccounts,
    customer_id: int,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Without a privilege of the migrations' role, ``db upgrade`` fails;
    without one of the library's, its first use does, each saying why."""
    accounts = postgresql_accounts(grant.left_out())
    refused = REFUSALS[grant.on.split()[0]]
    upgraded = cli.main(["db", "upgrade", "--database-url", _url_text(accounts.migrations)])
    if grant.role == "pathlock_admin":  # the migrations'
        assert upgraded == 1
        assert re.search(refused, capsys.readouterr().err)
        return
    assert upgraded == 0
    with pytest.raises(PathLockError, match=refused) as raised:
        _lock_and_release(_url_text(accounts.library), customer_id)
    if "does not exist" in str(raised.value):
        # Without USAGE on the schema the tables look missing: said so.
        assert "GRANT USAGE ON SCHEMA" in str(raised.value)


def test_every_documented_statement_for_postgresql_is_left_out_in_turn() -> None:
    """Each statement of the documentation's SQL for PostgreSQL creates a
    role or grants privileges that the test above leaves out one at a time:
    none escapes it."""
    for statement in POSTGRESQL_SQL:
        assert statement.startswith("CREATE ROLE ") or _GRANT.search(statement), statement
    assert {grant.role for grant in GRANTS} == {"pathlock_admin", "pathlock_app"}
    assert {grant.on.split()[0] for grant in GRANTS} == set(REFUSALS)
