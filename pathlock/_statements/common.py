"""The pieces every statement of pathlock is built from: the database's
clock, a request's paths as rows, long lists of conditions, the columns of a
lock as read back, and a lease's own rows.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    ColumnElement,
    Integer,
    Label,
    String,
    Subquery,
    Table,
    bindparam,
    column,
    literal_column,
    or_,
    text,
)
from sqlalchemy.engine.interfaces import Dialect
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement
from sqlalchemy.types import UserDefinedType

from pathlock.dialects import (
    JsonArray,
    Now,
    NowPlus,
    family,
)
from pathlock.schema import path_lock_waiter_paths, path_locks

# How many conflicting rows one attempt reads back, for the caller's error
# message and the own-owner check. The conflict itself needs only one row.
MAX_BLOCKERS = 20


LOCK_COLUMNS = (
    path_locks.c.customer_id,
    path_locks.c.path,
    path_locks.c.mode,
    path_locks.c.lease_id,
    path_locks.c.node_id,
    path_locks.c.pid,
    path_locks.c.thread,
    path_locks.c.owner_key,
    path_locks.c.reason,
    path_locks.c.fencing_token,
    path_locks.c.created_at,
    path_locks.c.expires_at,
    path_locks.c.shallow,
)


LOCK_ITEM = tuple(column.name for column in LOCK_COLUMNS)


def now() -> ColumnElement[datetime]:
    """The database's current UTC time (spelled by each dialect)."""
    return Now()


def now_plus(microseconds: ColumnElement[int]) -> ColumnElement[datetime]:
    """The database's current UTC time plus ``microseconds``."""
    return NowPlus(microseconds)


# SQLite refuses a compound SELECT of more than 500 terms (its default
# SQLITE_MAX_COMPOUND_SELECT) and an expression nested more than 1000 deep (a
# flat chain of n ORs is n deep): longer lists nest in blocks of this many.
_BLOCK = 256


class _Or(FunctionElement[bool]):
    """``(a) OR (b) OR ...``, each operand in parentheses of its own:
    SQLAlchemy merges nested ``or_()`` into one flat chain."""

    type = Boolean()
    inherit_cache = True


@compiles(_Or)
def _or(element: _Or, compiler: SQLCompiler, **kw: Any) -> str:
    operands = (compiler.process(clause, **kw) for clause in element.clauses)
    return "(" + " OR ".join(f"({operand})" for operand in operands) + ")"


def any_of(clauses: Sequence[ColumnElement[bool]]) -> ColumnElement[bool]:
    """``OR`` of ``clauses``, nested in blocks: as deep as :data:`_BLOCK`
    plus the number of blocks, not as deep as the number of clauses."""
    if len(clauses) <= _BLOCK:
        return or_(*clauses)
    return _Or(*(any_of(clauses[n : n + _BLOCK]) for n in range(0, len(clauses), _BLOCK)))


def requested_rows(count: int, name: str, shallow: bool = False) -> Subquery:
    """The requested paths (``:rq_path_N``, ``:rq_mode_N``) with their
    position ``k`` and, for a request with paths at depth 0, whether each is
    (``:rq_shallow_N``; otherwise none is).

    One SELECT per path, joined by UNION ALL and nested in blocks of
    :data:`_BLOCK`, written as SQL text: built of SQLAlchemy's SELECTs, a
    request of a thousand paths spent seconds compiling its statements (the
    first request of each size in a process)."""
    binds: list[Any] = []
    rows = []
    for n in range(count):
        columns = [f":rq_path_{n} AS path", f":rq_mode_{n} AS mode", f"{n} AS k"]
        binds += [bindparam(f"rq_path_{n}", type_=String), bindparam(f"rq_mode_{n}", type_=String)]
        if shallow:
            columns.append(f":rq_shallow_{n} AS shallow")
            binds.append(depth_0_param(n))
        rows.append("SELECT " + ", ".join(columns))
    names = "path, mode, k" + (", shallow" if shallow else "")
    level = 0
    while len(rows) > _BLOCK:
        rows = [
            f"SELECT {names} FROM ({' UNION ALL '.join(rows[n : n + _BLOCK])})"
            f" AS {name}_{level}_{n // _BLOCK}"
            for n in range(0, len(rows), _BLOCK)
        ]
        level += 1
    table = text(" UNION ALL ".join(rows)).bindparams(*binds)
    return table.columns(
        column("path", String),
        column("mode", String),
        column("k", Integer),
        *([column("shallow", Boolean)] if shallow else []),
    ).subquery(name)


def depth_0_param(n: int) -> ColumnElement[bool]:
    """Whether requested path ``n`` is locked at depth 0."""
    return bindparam(f"rq_shallow_{n}", type_=Boolean)


class _IntegerRows(UserDefinedType[list[tuple[int, int]]]):
    """A list of ``(k, n)`` pairs of integers, written into the statement at
    execution as a derived table of numbers (``SELECT 0 AS k, 1 AS n UNION
    ALL SELECT 0, 3 ...``): a compact table whose size does not change the
    compiled statement. Only integers are ever written (``%d``)."""

    cache_ok = True

    def get_col_spec(self, **_kw: Any) -> str:  # pragma: no cover - never a column
        return "INTEGER"

    def literal_processor(self, dialect: Dialect) -> Callable[[Any], str]:
        # A family may spell the table its own way (PostgreSQL plans
        # thousands of UNION ALL branches in seconds: an array, instead).
        each = family(dialect.name)
        if each is None:
            return _integer_rows

        def spelled(rows: Sequence[tuple[int, int]]) -> str:
            return each.integer_rows(rows) or _integer_rows(rows)

        return spelled


def _integer_rows(rows: Sequence[tuple[int, int]]) -> str:
    # SQLAlchemy compiles a statement of thousands of SELECTs in seconds (the
    # time grows faster than their number); this text costs microseconds a row.
    numbers = [(operator.index(k), operator.index(n)) for k, n in rows]
    blocks = [_numbers(numbers[i : i + _BLOCK]) for i in range(0, len(numbers), _BLOCK)]
    while len(blocks) > 1:
        blocks = [
            " UNION ALL ".join(
                f"SELECT k, n FROM ({block}) AS b{j}"
                for j, block in enumerate(blocks[i : i + _BLOCK])
            )
            for i in range(0, len(blocks), _BLOCK)
        ]
    return blocks[0]


def _numbers(rows: Sequence[tuple[int, int]]) -> str:
    (k, n), *rest = rows
    return " UNION ALL ".join(
        [f"SELECT {k:d} AS k, {n:d} AS n", *(f"SELECT {k:d}, {n:d}" for k, n in rest)]
    )


def prefix_rows() -> Subquery:
    """The rows ``(k, n)`` of ``:prefixes``: requested path ``k`` meets by
    equality the path made of its first ``n`` characters. A path of depth d
    costs d short rows of numbers, where spelling out its ancestors cost the
    square of d characters."""
    rows = bindparam("prefixes", type_=_IntegerRows(), literal_execute=True)
    table = text(":prefixes").bindparams(rows).columns(column("k", Integer), column("n", Integer))
    return table.subquery("prefixes")


ONE = literal_column("1", Integer)

# The requesting owner's columns of a lock row or a queue row (node, process,
# thread, owner's key, reason), in the order both tables list them.
OWNER_VALUES = (
    bindparam("o_node", type_=String),
    bindparam("o_pid", type_=Integer),
    bindparam("o_thread", type_=String),
    bindparam("o_key", type_=String),
    bindparam("why", type_=String),
)


def alive_conditions() -> list[ColumnElement[bool]]:
    return [path_locks.c.customer_id == bindparam("c_id"), path_locks.c.expires_at > now()]


# The index of the conflict check, named for MySQL/MariaDB below.
PATH_INDEX = next(
    str(index.name)
    for index in path_locks.indexes
    if [column.name for column in index.columns] == ["customer_id", "path"]
)


# The same index of the queue's paths (revision 0007).
WAITER_PATH_INDEX = next(
    str(index.name)
    for index in path_lock_waiter_paths.indexes
    if [column.name for column in index.columns] == ["customer_id", "path"]
)


def items(columns: Sequence[ColumnElement[Any]]) -> Label[Any]:
    """``columns`` as one JSON array (MySQL, MariaDB), labelled ``item``: for
    reads whose rows the client parses (see :func:`pathlock._core.records.item_row`).
    PyMySQL parses a description of every column in every reply, rows or
    none, which costs it more than the rows of a short read: a denied
    attempt's reads described 26 columns."""
    return JsonArray(*columns).label("item")


# Stands for "no ticket yet" in the queue condition: every queued ticket is lower.
NO_TICKET = 2**63 - 1


def of_lease(
    table: Table, lease: str = "l_id", *, typed: bool = False
) -> list[ColumnElement[bool]]:
    """The rows of ``table`` of one lease (``:l_id``, or ``lease``) of the
    customer, found by the lease id's index alone. The customer's condition
    is written so that no index can serve it (``customer_id + 0``): given
    it plainly, PostgreSQL with statistics older than the customer's rows
    (a customer that grew from nothing since the last ANALYZE) intersected
    the lease id's index with the customer's, reading an entry for every
    row of the customer (100,000: 2.5 ms, twice per grant)."""
    parameter = bindparam(lease, type_=String) if typed else bindparam(lease)
    return [
        table.c.lease_id == parameter,
        table.c.customer_id + literal_column("0", BigInteger) == bindparam("c_id"),
    ]


def own_live_rows() -> list[ColumnElement[bool]]:
    """The live rows of the request's own lease (``:l_id``): rows a release
    handed to it (Releases.release)."""
    return [
        *of_lease(path_locks, typed=True),
        path_locks.c.expires_at > now(),
    ]
