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
from sqlalchemy.dialects import mysql, sqlite
from sqlalchemy.engine.default import DefaultDialect
from sqlalchemy.exc import CompileError, DBAPIError, OperationalError

from pathlock import InvalidArgument, dialects
from pathlock._statements import BUMP, CREATE_SENTINEL, LOCKS_REMOVED, now, now_plus
from pathlock.cli.arguments import build_parser
from pathlock.dialects import base
from pathlock.dialects.base import ASYNC_DRIVERS, Dialect
from pathlock.schema import customer_locks

# A name no family claims, nor ever will: "postgresql" would be a family one day.
UNKNOWN = "nosuchdb"


def _mysql_error(code: int) -> DBAPIError:
    return OperationalError("statement", {}, pymysql.err.OperationalError(code, "message"))


def _sqlite_error(code: int, message: str = "database is locked") -> DBAPIError:
    orig = sqlite3.OperationalError(message)
    orig.sqlite_errorcode = code  # type: ignore[attr-defined]
    return OperationalError("statement", {}, orig)


@pytest.mark.parametrize(
    ("name", "family"), [("mysql", "MySQL"), ("mariadb", "MySQL"), ("sqlite", "SQLite")]
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
    assert dialects.for_name("sqlite").transactional_ddl
    assert not dialects.for_name("mysql").transactional_ddl
    assert {"asyncmy", "aiomysql", "aiosqlite"} <= set(ASYNC_DRIVERS)
    assert "pymysql" not in ASYNC_DRIVERS
