"""The dialect seam: each database family found by name, its errors sorted
into the kinds the retry loop acts on, and its spelling of the shared SQL."""

from __future__ import annotations

import sqlite3

import pymysql
import pytest
from sqlalchemy import select
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.exc import CompileError, DBAPIError, OperationalError

from pathlock import InvalidArgument, dialects
from pathlock._statements import BUMP, CREATE_SENTINEL, now, now_plus
from pathlock.schema import customer_locks


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


def test_a_database_without_a_dialect_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="unsupported database 'postgresql'"):
        dialects.for_name("postgresql")


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
    assert str(CREATE_SENTINEL.compile(dialect=my)).startswith("INSERT IGNORE INTO")
    assert str(CREATE_SENTINEL.compile(dialect=lite)).startswith("INSERT OR IGNORE INTO")
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
    with pytest.raises(CompileError, match="no SQL for Now on postgresql"):
        select(now()).compile(dialect=postgresql.dialect())
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
