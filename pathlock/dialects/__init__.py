"""What differs between the databases pathlock runs on: one module per family
of databases, behind one small interface (:class:`Dialect`), found by the
name SQLAlchemy gives the engine's dialect.

- :mod:`pathlock.dialects.mysql`: MySQL and MariaDB, Galera clusters included;
- :mod:`pathlock.dialects.postgresql`: PostgreSQL;
- :mod:`pathlock.dialects.sqlite`: the embedded SQLite file.

A family is a module of this package whose :class:`Dialect` subclass sets its
``names``: defining the class registers it, and importing this package imports
every module of it. Everything here (:func:`for_name`, :data:`SUPPORTED`, the
merged table options, the command line's ``--dialect`` choices) reads that
registry; no list of families is kept anywhere else.

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

import importlib
import pkgutil
from typing import TYPE_CHECKING, Any

from sqlalchemy import Insert, Select, Table
from sqlalchemy.types import TypeEngine

from pathlock.dialects.base import (
    ISOLATION_LEVEL,
    READ_ONLY,
    Bytes,
    Changed,
    Dialect,
    Fenced,
    InGrantTime,
    InsertedId,
    InsertIfAbsent,
    JsonArray,
    MicrosecondsLeft,
    Notice,
    Now,
    NowPlus,
    PathIn,
    PathIs,
    PathWithin,
    SetGrantUntil,
    WaitedInTime,
    families,
    family,
)
from pathlock.errors import InvalidArgument
from pathlock.waiting import Hearing


def _import_families() -> None:
    """Import every public module of this package: the families they define
    register themselves (:class:`Dialect`), so a new family is a new module
    here, and nothing in this file names it. Before any table is defined
    (:mod:`pathlock.schema` merges every family's options), so a family's
    module must import nothing that is not installed with pathlock (its
    driver is imported when an engine is created)."""
    for module in pkgutil.iter_modules(__path__):
        if not module.name.startswith("_"):
            importlib.import_module(f"{__name__}.{module.name}")


_import_families()

# The package's families by their class names, as before they registered
# themselves; a new family need not be added here.
from pathlock.dialects.mysql import MySQL  # noqa: E402
from pathlock.dialects.postgresql import PostgreSQL  # noqa: E402
from pathlock.dialects.sqlite import SQLite  # noqa: E402


def names() -> tuple[str, ...]:
    """SQLAlchemy dialect names pathlock runs on: every registered family's."""
    return tuple(name for each in families() for name in each.names)


if TYPE_CHECKING:
    SUPPORTED: tuple[str, ...]
    """SQLAlchemy dialect names pathlock runs on (:func:`names`, read when
    asked: a family registered later is in it)."""
else:

    def __getattr__(name: str) -> Any:
        if name == "SUPPORTED":
            return names()
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def insert_if_absent(table: Table) -> Insert:
    """An INSERT into ``table`` that skips a row whose key exists, spelled for
    every family (its prefix here, its clause after the values when compiled:
    :class:`~pathlock.dialects.base.InsertIfAbsent`)."""
    statement: Insert = InsertIfAbsent(table)
    for each in families():
        if each.insert_if_absent:
            for name in each.names:
                statement = statement.prefix_with(each.insert_if_absent, dialect=name)
    return statement


def table_options() -> dict[str, Any]:
    """Keyword arguments of every pathlock table, for every family."""
    return {key: value for each in families() for key, value in each.table_options.items()}


def path_index_options() -> dict[str, Any]:
    """Keyword arguments of the path index, for every family."""
    return {key: value for each in families() for key, value in each.path_index_options.items()}


def never_reused_options() -> dict[str, Any]:
    """Keyword arguments of a table whose keys are never handed out twice."""
    return {key: value for each in families() for key, value in each.never_reused_options.items()}


def column_type(kind: str, portable: TypeEngine[Any]) -> TypeEngine[Any]:
    """``portable``, with each family's own type for columns of ``kind``."""
    for each in families():
        own = each.column_types.get(kind)
        if own is not None:
            portable = portable.with_variant(own, *each.names)
    return portable


def force_index(statement: Select[Any], table: Table, index: str) -> Select[Any]:
    """``statement`` made to use ``index`` of ``table``, on every family that
    can be told (:attr:`Dialect.index_hint`)."""
    for each in families():
        if each.index_hint is not None:
            hint = each.index_hint.format(index=index)
            for name in each.names:
                statement = statement.with_hint(table, hint, name)
    return statement


def for_name(name: str) -> Dialect:
    """The dialect of SQLAlchemy's dialect ``name``; :class:`InvalidArgument`
    for a database pathlock has no SQL for."""
    found = family(name)
    if found is None:
        known = names()
        runs_on = ", ".join(known[:-1]) + " and " + known[-1] if len(known) > 1 else known[0]
        raise InvalidArgument(f"unsupported database {name!r}: pathlock runs on {runs_on}")
    return found


def sql_header(name: str) -> str:
    """The first lines of the SQL printed for SQLAlchemy's dialect ``name``
    (``pathlock db upgrade --sql``): its family's :meth:`Dialect.sql_header`,
    or the base class's for a database no family claims (the migrations print
    portable SQL for it)."""
    return (family(name) or Dialect()).sql_header(name)


__all__ = [
    "ISOLATION_LEVEL",
    "READ_ONLY",
    "SUPPORTED",
    "Bytes",
    "Changed",
    "Dialect",
    "Fenced",
    "Hearing",
    "InGrantTime",
    "InsertedId",
    "JsonArray",
    "MicrosecondsLeft",
    "MySQL",
    "Notice",
    "Now",
    "NowPlus",
    "PathIn",
    "PathIs",
    "PathWithin",
    "PostgreSQL",
    "SQLite",
    "SetGrantUntil",
    "WaitedInTime",
    "column_type",
    "families",
    "family",
    "for_name",
    "force_index",
    "insert_if_absent",
    "names",
    "never_reused_options",
    "path_index_options",
    "sql_header",
    "table_options",
]
