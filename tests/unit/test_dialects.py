"""The dialect seam: each database family registered by defining it and found
by name, its errors sorted into the kinds the retry loop acts on, and its
spelling of the shared SQL."""

from __future__ import annotations

import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pymysql
import pytest
from sqlalchemy import select
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.engine.default import DefaultDialect
from sqlalchemy.exc import CompileError, DBAPIError, OperationalError
from sqlalchemy.schema import CreateIndex

from pathlock import InvalidArgument, dialects
from pathlock._statements.common import now, now_plus
from pathlock._statements.grants import BUMP, CREATE_SENTINEL, LOCKS_REMOVED
from pathlock._statements.lookups import locks_on
from pathlock.cli.arguments import build_parser
from pathlock.dialects import _pg_batches, base
from pathlock.dialects.base import ASYNC_DRIVERS, CHANGED_ROWS, Dialect
from pathlock.schema import customer_locks, path_lock_waiter_paths, path_locks

# A name no family claims, nor ever will.
UNKNOWN = "nosuchdb"


def _mysql_error(code: int) -> DBAPIError:
    return OperationalError("statement", {}, pymysql.err.OperationalError(code, "message"))


def _sqlite_error(code: int, message: str = "database is locked") -> DBAPIError:
    orig = sqlite3.OperationalError(message)
    orig.sqlite_errorcode = code  # type: ignore[attr-defined]
    return OperationalError("statement", {}, orig)


@pytest.mark.parametrize(
    ("name", "family"),
    [("mysql", "MySQL"), ("mariadb", "MySQL"), ("postgresql", "PostgreSQL"), ("sqlite", "SQLite")],
)
def test_families_are_found_by_sqlalchemys_dialect_name(name: str, family: str) -> None:
    assert type(dialects.for_name(name)).__name__ == family


def _listed(names: tuple[str, ...], last: str) -> str:
    """``names`` as a sentence lists them: "a, b and c"."""
    return f"{', '.join(names[:-1])} {last} {names[-1]}"


def test_a_database_without_a_dialect_is_refused() -> None:
    # The families are listed from the registry: mysql, mariadb and sqlite, and any added since.
    listed = _listed(dialects.names(), "and")
    assert {"mysql", "mariadb", "sqlite"} <= set(dialects.names())
    with pytest.raises(
        InvalidArgument, match=f"^unsupported database '{UNKNOWN}': pathlock runs on {listed}$"
    ):
        dialects.for_name(UNKNOWN)


@pytest.mark.parametrize(
    ("code", "transient", "lost_race", "node_failure", "missing_table"),
    [
        (1213, True, True, False, False),  # deadlock, certification failure
        (1205, True, False, False, False),  # lock wait timeout
        (2013, True, False, True, False),  # lost connection
        (1047, True, False, True, False),  # a Galera node outside the primary component
        (1146, False, False, False, True),  # no such table
        (1064, False, False, False, False),  # a syntax error: fatal
    ],
)
def test_mysql_errors_are_sorted_by_their_codes(
    code: int, transient: bool, lost_race: bool, node_failure: bool, missing_table: bool
) -> None:
    dialect, error = dialects.for_name("mariadb"), _mysql_error(code)
    assert dialect.is_transient(error) is transient
    assert dialect.is_lost_race(error) is lost_race
    assert dialect.is_node_failure(error) is node_failure
    assert dialect.is_missing_table(error) is missing_table


def test_sqlite_errors() -> None:
    dialect = dialects.for_name("sqlite")
    busy, locked = _sqlite_error(5), _sqlite_error(6 | 0x100)  # extended codes keep the low byte
    assert dialect.is_transient(busy)
    assert dialect.is_transient(locked)
    assert not dialect.is_node_failure(busy)
    assert not dialect.is_lost_race(busy)
    missing = _sqlite_error(1, "no such table: customer_locks")
    assert dialect.is_missing_table(missing)
    assert not dialect.is_transient(missing)


def test_each_family_spells_the_shared_sql() -> None:
    my, lite = mysql.dialect(), sqlite.dialect()
    # MySQL: no INSERT IGNORE, whose existing key is a warning (asyncmy logs it).
    created = str(CREATE_SENTINEL.compile(dialect=my))
    assert created.startswith("INSERT INTO customer_locks (customer_id, version, lock_rows,")
    assert created.endswith(" ON DUPLICATE KEY UPDATE customer_id = customer_id")
    assert str(CREATE_SENTINEL.compile(dialect=lite)).startswith(
        "INSERT OR IGNORE INTO customer_locks (customer_id, version, lock_rows,"
    )
    # The row count of the statement before, in a statement of the same connection.
    assert "ROW_COUNT()" in str(LOCKS_REMOVED.compile(dialect=my))
    assert "changes()" in str(LOCKS_REMOVED.compile(dialect=lite))
    # The token travels in the sentinel write's reply on MySQL only.
    assert "LAST_INSERT_ID(" in str(BUMP.compile(dialect=my))
    assert "LAST_INSERT_ID" not in str(BUMP.compile(dialect=lite))
    assert dialects.for_name("mysql").token_from_reply
    assert not dialects.for_name("sqlite").token_from_reply
    assert str(now().compile(dialect=my)) == "UTC_TIMESTAMP(6)"
    assert "strftime" in str(now().compile(dialect=lite))
    shifted = now_plus(customer_locks.c.version)
    assert str(shifted.compile(dialect=my)).startswith("TIMESTAMPADD(MICROSECOND,")
    assert "printf('%+.6f seconds'" in str(shifted.compile(dialect=lite))


def test_only_servers_can_be_the_nodes_of_a_cluster() -> None:
    assert dialects.for_name("mariadb").several_nodes
    assert not dialects.for_name("sqlite").several_nodes


def test_a_database_no_family_spells_gets_no_sql_rather_than_mysqls() -> None:
    unclaimed = DefaultDialect()
    unclaimed.name = UNKNOWN
    with pytest.raises(CompileError, match=f"no SQL for Now on {UNKNOWN}"):
        select(now()).compile(dialect=unclaimed)
    assert "UTC_TIMESTAMP(6)" in str(select(now()).compile(dialect=mysql.dialect()))


def test_timeouts_duplicates_and_pings_are_the_dialects_to_tell() -> None:
    family = dialects.for_name("mysql")
    timed_out = OperationalError(
        "statement", {}, pymysql.err.OperationalError(2013, "Lost connection (timed out)")
    )
    assert family.is_timeout(timed_out)
    assert not family.is_timeout(_mysql_error(2013))
    assert family.is_duplicate(_mysql_error(1050))
    assert family.is_duplicate(_mysql_error(1062))
    assert not family.is_duplicate(_mysql_error(1146))
    embedded = dialects.for_name("sqlite")
    assert not embedded.is_timeout(_sqlite_error(5))
    exists = _sqlite_error(1, "table customer_locks already exists")
    assert embedded.is_duplicate(exists)


# -- the registry ---------------------------------------------------------------------


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Families defined by the test register into a copy of the registry,
    which the original replaces again afterwards: nothing leaks into other
    tests."""
    monkeypatch.setattr(base, "_by_name", dict(base._by_name))
    yield
    monkeypatch.undo()
    assert UNKNOWN not in dialects.SUPPORTED


def _help(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """The help of ``pathlock ARGS``, its lines joined."""
    with pytest.raises(SystemExit):
        build_parser().parse_args([*args, "--help"])
    return " ".join(capsys.readouterr().out.split())


@pytest.mark.usefixtures("registry")
def test_a_new_family_registers_by_being_defined(capsys: pytest.CaptureFixture[str]) -> None:
    assert UNKNOWN not in dialects.SUPPORTED
    before = dialects.families()

    class TestDB(Dialect):
        names = (UNKNOWN,)
        token_from_reply = False
        insert_if_absent = "OR IGNORE"
        async_driver = "aiotestdb"
        async_drivers = frozenset({"aiotestdb"})
        table_options: ClassVar[dict[str, Any]] = {f"{UNKNOWN}_engine": "fast"}

    family = dialects.for_name(UNKNOWN)
    assert type(family) is TestDB
    assert dialects.family(UNKNOWN) is family
    assert dialects.families() == (*before, family)
    assert dialects.SUPPORTED == (*(dialects.names()[:-1]), UNKNOWN) == dialects.names()
    assert "aiotestdb" in ASYNC_DRIVERS
    # Its options are merged with every other family's (a module of the
    # package registers before pathlock.schema defines the tables with them).
    assert {f"{UNKNOWN}_engine", "mysql_engine"} <= set(dialects.table_options())
    # What a family need not say: the defaults.
    assert family.offline_url(UNKNOWN) == f"{UNKNOWN}://"
    assert dialects.sql_header(UNKNOWN) == f"-- pathlock's tables, for {UNKNOWN}."
    assert not family.transactional_ddl
    assert not family.several_nodes
    # The command line offers it, and its help names it.
    args = build_parser().parse_args(["db", "upgrade", "--sql", "--dialect", UNKNOWN])
    assert args.dialect == UNKNOWN
    for command in (["db"], ["db", "upgrade"]):
        listed = _listed(dialects.names(), "or")
        assert listed.endswith(f" or {UNKNOWN}")
        assert f"--dialect ({listed})" in _help(capsys, *command)
    with pytest.raises(InvalidArgument, match=f"runs on mysql, .* and {UNKNOWN}$"):
        dialects.for_name("another")


def test_the_registry_is_restored_after_a_test() -> None:
    # The fixture's promise, checked from a test that does not use it.
    assert UNKNOWN not in dialects.SUPPORTED
    assert "aiotestdb" not in ASYNC_DRIVERS
    with pytest.raises(SystemExit):
        build_parser().parse_args(["db", "upgrade", "--sql", "--dialect", UNKNOWN])


@pytest.mark.usefixtures("registry")
def test_a_base_for_families_registers_nothing() -> None:
    before = dialects.families()

    class Servers(Dialect):
        several_nodes = True

    assert dialects.families() == before

    class TestDB(Servers):
        names = (UNKNOWN,)
        token_from_reply = True
        insert_if_absent = "IGNORE"

    assert type(dialects.for_name(UNKNOWN)) is TestDB
    assert dialects.for_name(UNKNOWN).several_nodes


@pytest.mark.usefixtures("registry")
def test_an_incomplete_or_clashing_family_is_refused_when_defined() -> None:
    with pytest.raises(TypeError, match="must set token_from_reply and insert_if_absent"):

        class Incomplete(Dialect):
            names = (UNKNOWN,)

    with pytest.raises(TypeError, match="names must be SQLAlchemy dialect names"):

        class Unnamed(Dialect):
            names = ()
            token_from_reply = False
            insert_if_absent = ""

    with pytest.raises(TypeError, match="async_drivers must hold its async_driver"):

        class Unlisted(Dialect):
            names = (UNKNOWN,)
            token_from_reply = False
            insert_if_absent = ""
            async_driver = "aiotestdb"

    with pytest.raises(ValueError, match="claims 'mariadb', which MySQL has registered already"):

        class Clash(Dialect):
            names = (UNKNOWN, "mariadb")
            token_from_reply = False
            insert_if_absent = ""

    assert UNKNOWN not in dialects.SUPPORTED  # none of them registered, even in part
    assert type(dialects.for_name("mariadb")).__name__ == "MySQL"


def test_every_module_of_the_package_is_imported() -> None:
    """A new family is found without being named in pathlock/dialects/__init__.py."""
    package = Path(dialects.__file__).parent
    modules = {path.stem for path in package.glob("*.py") if not path.stem.startswith("_")}
    assert {"base", "mysql", "sqlite"} <= modules
    assert [name for name in modules if f"pathlock.dialects.{name}" not in sys.modules] == []
    found = {type(family).__module__ for family in dialects.families()}
    assert {"pathlock.dialects.mysql", "pathlock.dialects.sqlite"} <= found


def test_each_family_says_what_the_command_line_and_the_migrations_need() -> None:
    assert dialects.for_name("mariadb").offline_url("mariadb") == "mariadb+pymysql://"
    assert dialects.for_name("sqlite").offline_url("sqlite") == "sqlite://"
    assert dialects.sql_header("mysql").startswith("-- pathlock's tables, for MySQL 8.0")
    assert dialects.sql_header("sqlite") == "-- pathlock's tables, for SQLite."
    assert dialects.sql_header("postgresql").startswith("-- pathlock's tables, for PostgreSQL.")
    assert dialects.for_name("postgresql").offline_url("postgresql") == "postgresql+psycopg://"
    assert dialects.for_name("sqlite").transactional_ddl
    assert not dialects.for_name("mysql").transactional_ddl
    assert {"asyncmy", "aiomysql", "aiosqlite"} <= set(ASYNC_DRIVERS)
    assert "pymysql" not in ASYNC_DRIVERS


class _PgError(Exception):
    """Stands for a psycopg error: its SQLSTATE in ``sqlstate``."""

    def __init__(self, sqlstate: str) -> None:
        super().__init__(f"SQLSTATE {sqlstate}")
        self.sqlstate = sqlstate


def _postgresql_error(sqlstate: str) -> DBAPIError:
    return OperationalError("statement", {}, _PgError(sqlstate))


@pytest.mark.parametrize(
    ("sqlstate", "transient", "lost_race", "node_failure", "missing_table", "duplicate"),
    [
        ("40P01", True, True, False, False, False),  # deadlock
        ("40001", True, True, False, False, False),  # serialization failure
        ("55P03", True, False, False, False, False),  # lock_timeout ran out
        ("57014", True, False, False, False, False),  # statement_timeout, a cancel
        ("57P01", True, False, True, False, False),  # the server shuts down
        ("08006", False, False, True, False, False),  # connection failure
        ("42P01", False, False, False, True, False),  # no such table
        ("42P07", False, False, False, False, True),  # the table exists
        ("23505", False, False, False, False, True),  # a unique violation
        ("42601", False, False, False, False, False),  # a syntax error: fatal
    ],
)
def test_postgresql_errors_are_sorted_by_their_sqlstate(
    sqlstate: str,
    transient: bool,
    lost_race: bool,
    node_failure: bool,
    missing_table: bool,
    duplicate: bool,
) -> None:
    dialect, error = dialects.for_name("postgresql"), _postgresql_error(sqlstate)
    assert dialect.is_transient(error) is transient
    assert dialect.is_lost_race(error) is lost_race
    assert dialect.is_node_failure(error) is node_failure
    assert dialect.is_missing_table(error) is missing_table
    assert dialect.is_duplicate(error) is duplicate


def test_postgresql_spells_the_shared_sql() -> None:
    pg = postgresql.dialect()
    assert str(CREATE_SENTINEL.compile(dialect=pg)).endswith(
        " ON CONFLICT (customer_id) DO NOTHING"
    )
    assert str(now().compile(dialect=pg)) == "(statement_timestamp() AT TIME ZONE 'UTC')"
    assert "make_interval(secs =>" in str(now_plus(customer_locks.c.version).compile(dialect=pg))
    # No row count of the statement before: a parameter the store fills in.
    assert f"%({CHANGED_ROWS})s" in str(LOCKS_REMOVED.compile(dialect=pg))
    # Every lookup of a path names the index's expression beside the full comparison.
    lookup = str(locks_on(descendants=True, include_expired=False).compile(dialect=pg))
    assert "left(path_locks.path, 600) = left(%(on_path)s, 600)" in lookup
    assert "left(path_locks.path, 600) >= left(%(below_low)s, 600)" in lookup
    assert "left(path_locks.path, 600) <= left(%(below_high)s, 600)" in lookup
    assert "path_locks.path < %(below_high)s" in lookup
    # ... and on the others, the plain comparison alone.
    assert "left(" not in str(
        locks_on(descendants=True, include_expired=False).compile(dialect=mysql.dialect())
    )


def test_postgresql_batches_chain_statements_through_settings_of_the_transaction() -> None:
    """In a batch, what one statement tells the next is a setting of the
    transaction, each write replies with its count and id, and each statement
    is executed prepared; everywhere else, the parameters the store passes."""
    pg = postgresql.psycopg.dialect()
    family = dialects.for_name("postgresql")
    compiled = LOCKS_REMOVED.compile(dialect=pg, compile_kwargs={base.BATCHED: True})
    sql = str(compiled)
    assert CHANGED_ROWS not in sql
    assert "current_setting('pathlock.changed', true)" in sql
    executed = family.in_batch(sql, compiled)  # type: ignore[arg-type]
    name, arguments = executed.removeprefix("EXECUTE ").split("(", 1)
    assert arguments == "%(c_id)s)"
    prepared = _pg_batches.PREPARED[name]
    # Wrapped: the write keeps and replies with its row count.
    assert prepared.startswith(f"PREPARE {name} (BIGINT) AS WITH t AS (UPDATE customer_locks SET")
    assert "customer_locks.customer_id = $1::BIGINT" in prepared
    assert prepared.endswith(
        " SELECT count(*) AS pathlock_changed, 0 AS pathlock_id,"
        " set_config('pathlock.changed', CAST(count(*) AS TEXT), true) FROM t"
    )
    # The same statement, the same prepared statement; a read is not wrapped.
    assert family.in_batch(sql, compiled) == executed  # type: ignore[arg-type]
    read = select(customer_locks.c.version).where(customer_locks.c.customer_id == 1)
    read_compiled = read.compile(dialect=pg, compile_kwargs={base.BATCHED: True})
    name = family.in_batch(str(read_compiled), read_compiled).split("(")[0].split()[1]  # type: ignore[arg-type]
    assert _pg_batches.PREPARED[name] == (
        f"PREPARE {name} (BIGINT) AS SELECT customer_locks.version \nFROM customer_locks \n"
        "WHERE customer_locks.customer_id = $1::BIGINT"
    )


def test_postgresql_makes_its_path_index_on_the_paths_first_characters() -> None:
    created = {
        str(CreateIndex(index).compile(dialect=postgresql.dialect()))
        for table in (path_locks, path_lock_waiter_paths)
        for index in table.indexes
    }
    assert (
        "CREATE INDEX ix_path_locks_customer_id_path ON path_locks (customer_id, left(path, 600))"
        in created
    )
    assert "CREATE INDEX ix_path_locks_lease_id ON path_locks (lease_id)" in created


def test_a_postgresql_connection_that_failed_is_tried_again_elsewhere() -> None:
    """psycopg says nothing but a message when it cannot connect, loses the
    connection or runs out of time connecting: no SQLSTATE."""
    dialect = dialects.for_name("postgresql")
    for message in ("connection timeout expired", "connection failed: Connection refused"):
        error = OperationalError("statement", {}, Exception(message))
        assert dialect.is_transient(error)
        assert dialect.is_node_failure(error)
    timed_out = OperationalError("statement", {}, Exception("connection timeout expired"))
    assert dialect.is_timeout(timed_out)
    assert not dialect.is_lost_race(timed_out)
