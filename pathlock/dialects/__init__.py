"""What differs between the databases pathlock runs on: one module per family
of databases, behind one small interface (:class:`Dialect`), found by the
name SQLAlchemy gives the engine's dialect.

- :mod:`pathlock.dialects.mysql`: MySQL and MariaDB, Galera clusters included;
- :mod:`pathlock.dialects.sqlite`: the embedded SQLite file.

A dialect says how the database spells "now" and "now + n microseconds",
whether the sentinel write's reply carries the fencing token, how an INSERT
skips an existing key, which errors mean "try again", "lost a race", "this
node is gone" or "no tables", whether its driver can send several statements
in one round trip, how an engine is opened and set up (connect hooks, session
settings, timeouts), and whether several databases can be one cluster's
nodes, and what its tables need: engine and collation options, the path
index's prefix, its own column types. The tables are written once
(:mod:`pathlock.schema`), with the options of every family; a migration
revision spells its own (migrations never change once shipped).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Insert, Select, Table, insert
from sqlalchemy.types import TypeEngine

from pathlock.dialects.base import ISOLATION_LEVEL, READ_ONLY, Dialect, Fenced, Now, NowPlus
from pathlock.dialects.mysql import MySQL
from pathlock.dialects.sqlite import SQLite
from pathlock.errors import InvalidArgument

_FAMILIES: tuple[Dialect, ...] = (MySQL(), SQLite())
_BY_NAME = {name: family for family in _FAMILIES for name in family.names}
SUPPORTED = tuple(_BY_NAME)
"""SQLAlchemy dialect names pathlock runs on."""


def insert_if_absent(table: Table) -> Insert:
    """An INSERT into ``table`` that skips a row whose key exists, spelled for
    every family."""
    statement = insert(table)
    for family in _FAMILIES:
        for name in family.names:
            statement = statement.prefix_with(family.insert_if_absent, dialect=name)
    return statement


def table_options() -> dict[str, Any]:
    """Keyword arguments of every pathlock table, for every family."""
    return {key: value for family in _FAMILIES for key, value in family.table_options.items()}


def path_index_options() -> dict[str, Any]:
    """Keyword arguments of the path index, for every family."""
    return {key: value for family in _FAMILIES for key, value in family.path_index_options.items()}


def never_reused_options() -> dict[str, Any]:
    """Keyword arguments of a table whose keys are never handed out twice."""
    return {
        key: value for family in _FAMILIES for key, value in family.never_reused_options.items()
    }


def column_type(kind: str, portable: TypeEngine[Any]) -> TypeEngine[Any]:
    """``portable``, with each family's own type for columns of ``kind``."""
    for family in _FAMILIES:
        own = family.column_types.get(kind)
        if own is not None:
            portable = portable.with_variant(own, *family.names)
    return portable


def force_index(statement: Select[Any], table: Table, index: str) -> Select[Any]:
    """``statement`` made to use ``index`` of ``table``, on every family that
    can be told (:attr:`Dialect.index_hint`)."""
    for family in _FAMILIES:
        if family.index_hint is not None:
            hint = family.index_hint.format(index=index)
            for name in family.names:
                statement = statement.with_hint(table, hint, name)
    return statement


def for_name(name: str) -> Dialect:
    """The dialect of SQLAlchemy's dialect ``name``; :class:`InvalidArgument`
    for a database pathlock has no SQL for."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise InvalidArgument(
            f"unsupported database {name!r}: pathlock runs on MySQL, MariaDB and SQLite"
        ) from None


__all__ = [
    "ISOLATION_LEVEL",
    "READ_ONLY",
    "SUPPORTED",
    "Dialect",
    "Fenced",
    "MySQL",
    "Now",
    "NowPlus",
    "SQLite",
    "column_type",
    "for_name",
    "force_index",
    "insert_if_absent",
    "never_reused_options",
    "path_index_options",
    "table_options",
]
