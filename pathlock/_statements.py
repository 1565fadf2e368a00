"""The SQL statements of pathlock, built once with SQLAlchemy Core.

Pure construction, no execution: :mod:`pathlock._store` runs these in its
transactions. Statements whose shape depends on a request (how many exclusive
and shared paths) are cached per shape; everything that varies is a bind
parameter, so SQLAlchemy compiles each shape once.

Every time is the database's clock (``UTC_TIMESTAMP(6)``, independent of the
session time zone). The few expressions that differ between MySQL/MariaDB and
SQLite are SQLAlchemy constructs with one compilation per dialect (below), so
each statement is written once.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    ColumnElement,
    CompoundSelect,
    DateTime,
    Delete,
    Insert,
    Integer,
    Join,
    Label,
    LargeBinary,
    Select,
    String,
    Subquery,
    Table,
    and_,
    bindparam,
    case,
    column,
    delete,
    exists,
    false,
    func,
    insert,
    literal_column,
    null,
    or_,
    select,
    text,
    union,
    union_all,
    update,
)
from sqlalchemy.engine.interfaces import Dialect
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement
from sqlalchemy.types import UserDefinedType

from pathlock.dialects import (
    Bytes,
    Changed,
    Fenced,
    InGrantTime,
    InsertedId,
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
    family,
    force_index,
    insert_if_absent,
)
from pathlock.paths import ancestors, descendants_range, prefix_lengths
from pathlock.schema import customer_locks, path_lock_waiter_paths, path_lock_waiters, path_locks
from pathlock.types import DETACHED, EXCLUSIVE, PathMode

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


def _any(clauses: Sequence[ColumnElement[bool]]) -> ColumnElement[bool]:
    """``OR`` of ``clauses``, nested in blocks: as deep as :data:`_BLOCK`
    plus the number of blocks, not as deep as the number of clauses."""
    if len(clauses) <= _BLOCK:
        return or_(*clauses)
    return _Or(*(_any(clauses[n : n + _BLOCK]) for n in range(0, len(clauses), _BLOCK)))


def _table(rows: Sequence[Select[*tuple[Any, ...]]], name: str) -> Subquery:
    """The rows (one SELECT each, same columns) as one derived table, nested
    in blocks of :data:`_BLOCK` SELECTs."""
    while len(rows) > _BLOCK:
        blocks = [union_all(*rows[n : n + _BLOCK]).subquery() for n in range(0, len(rows), _BLOCK)]
        rows = [select(*block.c) for block in blocks]
    return (union_all(*rows) if len(rows) > 1 else rows[0]).subquery(name)


def _requested(count: int, name: str, shallow: bool = False) -> Subquery:
    """The requested paths (``:rq_path_N``, ``:rq_mode_N``) with their
    position ``k`` and, for a request with paths at depth 0, whether each is
    (``:rq_shallow_N``; otherwise none is)."""
    return _table(
        [
            select(
                bindparam(f"rq_path_{n}", type_=String).label("path"),
                bindparam(f"rq_mode_{n}", type_=String).label("mode"),
                literal_column(str(n), Integer).label("k"),
                *([_shallow(n).label("shallow")] if shallow else []),
            )
            for n in range(count)
        ],
        name,
    )


def _shallow(n: int) -> ColumnElement[bool]:
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


def _prefixes() -> Subquery:
    """The rows ``(k, n)`` of ``:prefixes``: requested path ``k`` meets by
    equality the path made of its first ``n`` characters. A path of depth d
    costs d short rows of numbers, where spelling out its ancestors cost the
    square of d characters."""
    rows = bindparam("prefixes", type_=_IntegerRows(), literal_execute=True)
    table = text(":prefixes").bindparams(rows).columns(column("k", Integer), column("n", Integer))
    return table.subquery("prefixes")


_ONE = literal_column("1", Integer)


def _alive() -> list[ColumnElement[bool]]:
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


def _met(form: Shape, table: Table = path_locks) -> list[ColumnElement[bool]]:
    """For a request that spells out the paths it meets by equality: rows of
    ``table`` (live locks, or queued requests' paths) on those paths, in a
    conflicting mode."""
    met: list[ColumnElement[bool]] = []
    if form.exclusive:
        met.append(_on_or_above("x", table))
    if form.shared:
        met.append(and_(table.c.mode == EXCLUSIVE, _on_or_above("s", table)))
    return met


def _on_or_above(group: str, table: Table) -> ColumnElement[bool]:
    """Rows of ``table`` on the paths of ``:{group}_on`` (the requested
    paths), or on those of ``:{group}_above`` (their other ancestors) and
    covering their subtree: a lock at depth 0 on an ancestor does not reach
    the requested path."""
    return or_(
        PathIn(table.c.path, bindparam(f"{group}_on", expanding=True)),
        and_(
            PathIn(table.c.path, bindparam(f"{group}_above", expanding=True)),
            table.c.shallow == false(),
        ),
    )


def equal_conflicts(form: Shape, *columns: Any) -> Select[Any]:
    """Live rows of the customer on a requested path or one of its ancestors,
    in a mode that conflicts with the request's: one index lookup of
    ``(customer_id, path)`` per path met by equality.

    A request of the usual size names those paths in two lists (``:x_eq``:
    met by the exclusive paths, any row there conflicts; ``:s_eq``: met by
    the shared ones, only exclusive rows conflict), a plain ``IN`` the server
    parses and plans at the least cost. A larger one sends, instead of every
    ancestor spelled out (the square of a path's depth in characters), the
    lengths the database cuts them at (``SUBSTRING(path, 1, n)``): see
    :func:`shape`."""
    if form.spelled:
        statement = select(*columns).where(*_alive(), or_(*_met(form)))
    else:
        met, conflicting = _met_by_prefixes(form, path_locks)
        statement = (
            select(*columns).select_from(met).where(path_locks.c.expires_at > now(), conflicting)
        )
    # The lookups are by values MySQL/MariaDB cost from the index statistics
    # alone (computed per row, or a list). While those are stale (a
    # customer's rows grew fast after the last ANALYZE), they guessed half
    # the table per lookup and scanned all of the customer's rows instead
    # (EXPLAIN, 100,000 rows), or took the expires_at index: the index is
    # the plan whatever the statistics say.
    return force_index(statement, path_locks, PATH_INDEX)


def _met_by_prefixes(form: Shape, table: Table) -> tuple[Join, ColumnElement[bool]]:
    """For a request that sends the lengths its paths are cut at (see
    :func:`equal_conflicts`): its paths and prefixes joined to the customer's
    rows of ``table`` on them, and the condition that a row's mode conflicts."""
    requested = _requested(form.paths, "requested_paths")
    prefix = _prefixes()
    met = requested.join(prefix, prefix.c.k == requested.c.k).join(
        table,
        and_(
            table.c.customer_id == bindparam("c_id"),
            PathIs(table.c.path, func.substr(requested.c.path, _ONE, prefix.c.n)),
        ),
    )
    # A row on an ancestor meets the requested path if it covers its subtree.
    reaches = or_(table.c.shallow == false(), table.c.path == requested.c.path)
    return met, and_(or_(requested.c.mode == EXCLUSIVE, table.c.mode == EXCLUSIVE), reaches)


def _descendants(group: str, count: int, table: Table = path_locks) -> ColumnElement[bool]:
    return _any(
        [
            PathWithin(table.c.path, bindparam(f"{group}_low_{n}"), bindparam(f"{group}_high_{n}"))
            for n in range(count)
        ]
    )


def _below(exclusive: int, shared: int, table: Table = path_locks) -> list[ColumnElement[bool]]:
    """Rows of ``table`` inside the requested paths that cover their
    subtree (``exclusive`` and ``shared`` of them: the ranges
    ``:x_low_N``..``:x_high_N`` and ``:s_...``), in a conflicting mode."""
    clauses = []
    if exclusive:
        clauses.append(_descendants("x", exclusive, table))
    if shared:
        clauses.append(and_(table.c.mode == EXCLUSIVE, _descendants("s", shared, table)))
    return clauses


def below_conflicts(exclusive: int, shared: int, *columns: Any) -> Select[Any]:
    """Live rows of the customer inside a requested path (from
    ``:x_low_N`` up to ``:x_high_N``, likewise ``s_`` for the shared ones:
    index ranges), in a conflicting mode; none if no requested path covers
    its subtree."""
    return select(*columns).where(*_alive(), or_(*_below(exclusive, shared), false()))


def _no_conflict(form: Shape) -> list[ColumnElement[bool]]:
    """The grant's conditions that no live row conflicts with the request.
    A request that spells out the paths it meets by equality asks in one
    subquery: the lists and the ranges of its descendants are ranges of one
    index, which the server reads as one union of ranges, and it parses and
    plans one subquery instead of two."""
    if form.spelled:
        found = select(path_locks.c.id).where(*_alive(), or_(*_met(form), *_below(*form.subtrees)))
        return [~force_index(found, path_locks, PATH_INDEX).exists()]
    conditions = [~equal_conflicts(form, path_locks.c.id).exists()]
    if any(form.subtrees):
        conditions.append(~below_conflicts(*form.subtrees, path_locks.c.id).exists())
    return conditions


def _queued_conflicts(form: Shape, *columns: Any) -> list[Select[Any]]:
    """Live queued requests of the customer, older than ``:w_ticket``, with a
    path that conflicts with the request's (one row per such path): the
    conflict query of :func:`_no_conflict` on the queue's paths (revision
    0007), along the same kind of index, joined to their requests for
    whether they are alive. One query for a request that spells out the
    paths it meets by equality, two otherwise."""
    paths, waiters = path_lock_waiter_paths, path_lock_waiters
    alive = [
        paths.c.customer_id == bindparam("c_id"),
        paths.c.ticket < bindparam("w_ticket", type_=BigInteger),
        waiters.c.expires_at > now(),
    ]
    with_request = paths.join(waiters, waiters.c.ticket == paths.c.ticket)
    if form.spelled:
        found = (
            select(*columns)
            .select_from(with_request)
            .where(*alive, or_(*_met(form, paths), *_below(*form.subtrees, paths)))
        )
        return [force_index(found, paths, WAITER_PATH_INDEX)]
    met, conflicting = _met_by_prefixes(form, paths)
    equal = (
        select(*columns)
        .select_from(met.join(waiters, waiters.c.ticket == paths.c.ticket))
        .where(*alive, conflicting)
    )
    if not any(form.subtrees):
        return [force_index(equal, paths, WAITER_PATH_INDEX)]
    below = (
        select(*columns)
        .select_from(with_request)
        .where(*alive, or_(*_below(*form.subtrees, paths)))
    )
    return [force_index(equal, paths, WAITER_PATH_INDEX), below]


def _queue_clear(form: Shape) -> ColumnElement[bool]:
    """The grant's condition on the queue. A request of the usual size asks
    whether an older request in its way is queued
    (:func:`_nobody_queued_in_the_way`); a very large or very deep one, whose
    conflict query is large, whether any older request is queued at all, so
    that it is sent once per statement, not twice (the store then judges the
    queue, read whole, as it did before revision 0007)."""
    if form.spelled:
        return _nobody_queued_in_the_way(form)
    return ~exists().where(queue_condition())


def _owner_holds() -> ColumnElement[bool]:
    """Whether the requesting owner (``:o_key``) holds a live lock of the
    customer."""
    return exists().where(
        path_locks.c.customer_id == bindparam("c_id"),
        path_locks.c.owner_key == bindparam("o_key"),
        path_locks.c.expires_at > now(),
    )


def _nobody_queued_in_the_way(form: Shape) -> ColumnElement[bool]:
    """The grant's condition that no older live queued request conflicts
    with the request: first whether any older request is queued at all (one
    index probe, the usual answer: none), and only if one is, whether one in
    the way is (:func:`_queued_conflicts`)."""
    return or_(
        ~exists().where(queue_condition()),
        and_(*(~found.exists() for found in _queued_conflicts(form, path_lock_waiter_paths.c.id))),
    )


# A request names the paths it meets by equality (its paths and their
# ancestors) in lists while they add up to at most this many characters and
# entries: every request of the usual size. A path of 2,000 components alone
# has 2,000 ancestors of up to 4,000 characters each (4 MB spelled out); such
# requests send the lengths to cut them at instead (see equal_conflicts).
SPELLED_CHARACTERS = 16_384
SPELLED_ENTRIES = 512


class Shape(NamedTuple):
    """What the statements of a request are built for: how many exclusive and
    how many shared paths, whether the paths they meet by equality are
    spelled out (see :func:`equal_conflicts`), and how many of each mode are
    locked at depth 0 (shallow)."""

    exclusive: int
    shared: int
    spelled: bool
    shallow_exclusive: int = 0
    shallow_shared: int = 0

    @property
    def paths(self) -> int:
        return self.exclusive + self.shared

    @property
    def shallow(self) -> bool:
        """Whether any path is locked at depth 0."""
        return bool(self.shallow_exclusive or self.shallow_shared)

    @property
    def subtrees(self) -> tuple[int, int]:
        """How many exclusive and how many shared paths cover their subtree:
        the ranges of descendants the conflict query reads."""
        return self.exclusive - self.shallow_exclusive, self.shared - self.shallow_shared


def shape(paths: Sequence[PathMode], shallow: AbstractSet[str] = frozenset()) -> Shape:
    """The :class:`Shape` of a request of ``paths`` (``shallow``: those of
    them locked at depth 0)."""
    exclusive = sum(1 for _, mode in paths if mode == EXCLUSIVE)
    entries = characters = 0
    for path, _ in paths:
        lengths = prefix_lengths(path)
        entries += len(lengths)
        characters += sum(lengths)
    spelled = entries <= SPELLED_ENTRIES and characters <= SPELLED_CHARACTERS
    if not shallow:
        return Shape(exclusive, len(paths) - exclusive, spelled)
    shallow_exclusive = sum(1 for path, mode in paths if mode == EXCLUSIVE and path in shallow)
    shallow_shared = sum(1 for path, mode in paths if mode != EXCLUSIVE and path in shallow)
    return Shape(exclusive, len(paths) - exclusive, spelled, shallow_exclusive, shallow_shared)


# Stands in an empty list of paths a statement compares with: no path is ''
# (an empty IN list is spelled as a subquery the server plans apart).
NO_PATH = ""


def conflict_parameters(
    paths: Sequence[PathMode], form: Shape | None = None, shallow: AbstractSet[str] = frozenset()
) -> dict[str, Any]:
    """The bind parameters of the conflict queries for ``paths`` (``shallow``:
    those of them locked at depth 0), in their :func:`shape`'s form unless
    ``form`` says which."""
    form = shape(paths, shallow) if form is None else form
    parameters: dict[str, Any] = {}
    if form.spelled:
        on: dict[bool, dict[str, None]] = {True: {}, False: {}}  # ordered sets
        above: dict[bool, dict[str, None]] = {True: {}, False: {}}
        for path, mode in paths:
            on[mode == EXCLUSIVE][path] = None
            listed = above[mode == EXCLUSIVE]
            for ancestor in ancestors(path):
                listed[ancestor] = None
        for group, exclusive in (("x", True), ("s", False)):
            parameters[f"{group}_on"] = list(on[exclusive]) or [NO_PATH]
            parameters[f"{group}_above"] = [
                path for path in above[exclusive] if path not in on[exclusive]
            ] or [NO_PATH]
    else:
        prefixes: list[tuple[int, int]] = []
        for k, (path, mode) in enumerate(paths):
            parameters[f"rq_path_{k}"] = path
            parameters[f"rq_mode_{k}"] = mode
            prefixes.extend((k, n) for n in prefix_lengths(path))
        parameters["prefixes"] = prefixes
    for group, wanted in (("x", True), ("s", False)):
        chosen = [
            path for path, mode in paths if (mode == EXCLUSIVE) == wanted and path not in shallow
        ]
        for n, path in enumerate(chosen):
            low, high = descendants_range(path)
            parameters[f"{group}_low_{n}"] = low
            parameters[f"{group}_high_{n}"] = high
    return parameters


def items(columns: Sequence[ColumnElement[Any]]) -> Label[Any]:
    """``columns`` as one JSON array (MySQL, MariaDB), labelled ``item``: for
    reads whose rows the client parses (see :func:`pathlock._core.records.item_row`).
    PyMySQL parses a description of every column in every reply, rows or
    none, which costs it more than the rows of a short read: a denied
    attempt's reads described 26 columns."""
    return JsonArray(*columns).label("item")


@functools.lru_cache(maxsize=128)
def blockers_query(form: Shape) -> CompoundSelect[Any]:
    """Up to :data:`MAX_BLOCKERS` live rows that conflict with a request of
    this :class:`Shape`, each once."""
    return _blockers(form, *LOCK_COLUMNS)


@functools.lru_cache(maxsize=128)
def blocker_items(form: Shape) -> CompoundSelect[Any]:
    """:func:`blockers_query` with each row as one JSON array, in
    :data:`LOCK_ITEM`'s order (see :func:`items`)."""
    return _blockers(form, items(LOCK_COLUMNS))


def _blockers(form: Shape, *columns: Any) -> CompoundSelect[Any]:
    return union(
        equal_conflicts(form, *columns),
        below_conflicts(*form.subtrees, *columns),
    ).limit(bindparam("blockers_limit", MAX_BLOCKERS, type_=Integer))


# Stands for "no ticket yet" in the queue condition: every queued ticket is lower.
NO_TICKET = 2**63 - 1


def queue_condition() -> ColumnElement[bool]:
    """Live queued requests of the customer with a ticket older than
    ``:ticket`` (any queued request, for a request that has no ticket yet)."""
    return and_(
        path_lock_waiters.c.customer_id == bindparam("c_id"),
        path_lock_waiters.c.ticket < bindparam("w_ticket", type_=BigInteger),
        path_lock_waiters.c.expires_at > now(),
    )


# The columns a grant's INSERT ... SELECT fills, in the order of its values.
_GRANTED_COLUMNS = (
    "customer_id",
    "lease_id",
    "path",
    "mode",
    "node_id",
    "pid",
    "thread",
    "owner_key",
    "reason",
    "fencing_token",
    "created_at",
    "expires_at",
    "data",
    "shallow",
)
# The lease's data (pathlock._core.records.lease_data; NULL: none), given by the
# request, or copied from its queue row by a release that hands it its paths.
_DATA = Bytes(bindparam("l_data", type_=LargeBinary))
_WAITER_DATA = (
    select(path_lock_waiters.c.data)
    .where(path_lock_waiters.c.ticket == bindparam("w_ticket", type_=BigInteger))
    .scalar_subquery()
)


def _on_first_path(requested: Subquery, data: Any) -> Any:
    """``data`` on the row of a request's first path, NULL on the others:
    kept once per lease."""
    return case((requested.c.k == 0, data), else_=null())


@functools.lru_cache(maxsize=256)
def grant_statement(
    form: Shape,
    *,
    queued: bool,
    sentinel_after: bool = False,
    handed: bool = False,
    fresh: bool = False,
    after_lock: bool = False,
) -> Insert:
    """``INSERT INTO path_locks (...) SELECT ... FROM (the requested paths)
    WHERE NOT EXISTS (a live conflicting row)``: check and insert in one round
    trip. Built once per request :class:`Shape`; the paths are bind
    parameters, and the statement grows linearly with them. A request of one
    path selects its row's values from the sentinel row alone, with no table
    of requested paths to build: the server parses and plans less.

    ``queued=True`` also requires that no older live queued request conflicts
    with this one (:func:`_nobody_queued_in_the_way`): an empty queue costs
    one index probe, a crowd of requests one indexed query, whatever its
    size. A request denied by the queue is judged by the store
    (:mod:`pathlock._core.fairness`: an owner's own locks let it pass requests that
    wait for them) before inserting with ``queued=False``.

    ``sentinel_after=True``: for a grant in one round trip (see
    :data:`LOCK_SENTINEL`), where the sentinel row
    is only locked before this statement and written after it, if it
    inserted: the token is the version plus one, the customer's case rule
    is checked here (as ``CLAIM`` checks it), and nothing is inserted once
    the client has stopped waiting (:data:`SET_GRANT_UNTIL`).

    ``handed=True``: a release grants the request queued as ``:w_ticket``
    (see ``Releases.release``), which must still be queued and alive: one granted
    or gone since the release read the queue gets nothing.

    ``fresh=True``: the request's first transaction, so no row of its lease
    can exist yet (a lease id is new to every request, and only a queued
    request is handed rows): the statement does not look for them, which
    saves the server a subquery on every uncontended grant.

    ``after_lock=True``: the statement just before locked the sentinel row
    (``LOCK_SENTINEL``), and nothing is inserted unless it matched the row.
    On a customer's first use the row may be made by another client between
    the two statements: the grant would then see it, and insert, without
    holding its lock (two such grants, each blind to the other's rows, took
    one path). ROW_COUNT() at -1 (see :func:`_rows_granted`) inserts nothing
    either."""
    # The lease's data: the request's own, or for a release that hands the
    # request its paths, the one on its queue row (never through the client).
    data: Any = _WAITER_DATA if handed else _DATA
    if form.paths == 1:
        source: Any = customer_locks
        path, mode, shallow = _first_requested(form.shallow)
    else:
        requested = _requested(form.paths, "requested", form.shallow)
        source = requested.join(customer_locks, customer_locks.c.customer_id == bindparam("c_id"))
        path, mode, shallow = _requested_columns(requested, form.shallow)
        data = _on_first_path(requested, data)
    values = (
        select(
            bindparam("c_id", type_=BigInteger),
            bindparam("l_id", type_=String),
            path,
            mode,
            bindparam("o_node", type_=String),
            bindparam("o_pid", type_=Integer),
            bindparam("o_thread", type_=String),
            bindparam("o_key", type_=String),
            bindparam("why", type_=String),
            # The fencing token: the sentinel's version as this transaction's own
            # write left it, so the statement needs no value from the client and
            # can be sent together with that write (pathlock._batch). Selecting
            # from the sentinel row also means no row goes in if it does not
            # exist: then nothing serialized this grant.
            customer_locks.c.version + 1 if sentinel_after else customer_locks.c.version,
            now(),
            now_plus(bindparam("ttl_us", type_=BigInteger)),
            data,
            shallow,
        )
        .select_from(source)
        .where(
            customer_locks.c.customer_id == bindparam("c_id"),
            *_no_conflict(form),
        )
    )
    if not fresh:
        # Never twice for one lease: rows a release handed to the request
        # (Releases.release) are taken up, not granted anew beside them (shared
        # ones would not count as a conflict).
        values = values.where(~exists().where(*_own_live_rows()))
    if queued:
        values = values.where(_queue_clear(form))
    if sentinel_after:
        values = values.where(_case_rule_holds(), InGrantTime())
    if after_lock:
        values = values.where(Changed() > literal_column("0"))
    if handed:
        values = values.where(
            exists().where(
                path_lock_waiters.c.ticket == bindparam("w_ticket", type_=BigInteger),
                path_lock_waiters.c.lease_id == bindparam("l_id", type_=String),
                path_lock_waiters.c.expires_at > now(),
            )
        )
    return insert(path_locks).from_select(_GRANTED_COLUMNS, values)


def _first_requested(shallow: bool) -> tuple[Any, Any, Any]:
    """The path, mode and depth of a request of one path, from its bind
    parameters (not shallow, unless the request has shallow paths)."""
    return (
        bindparam("rq_path_0", type_=String),
        bindparam("rq_mode_0", type_=String),
        _shallow(0) if shallow else false(),
    )


def _requested_columns(requested: Subquery, shallow: bool) -> tuple[Any, Any, Any]:
    """The path, mode and depth columns of a table of requested paths."""
    return requested.c.path, requested.c.mode, requested.c.shallow if shallow else false()


# The fixed statements, built once.


def _moved(by: int, *, fenced: bool = True) -> dict[str, Any]:
    """The SET clause of a sentinel write that moves the version by ``by``:
    the counts' version moves with it (see ``customer_locks`` in
    :mod:`pathlock.schema`), so counts that were exact stay trusted and
    counts that were not stay untrusted. ``fenced``: the new version comes
    back in the reply (the fencing token)."""
    version = customer_locks.c.version + by
    return {
        "version": Fenced(version) if fenced else version,
        "counted_version": customer_locks.c.counted_version + by,
    }


BUMP = (
    update(customer_locks)
    .where(customer_locks.c.customer_id == bindparam("c_id"))
    .values(**_moved(1))
)
# BUMP for a grant: it also records the customer's case rule, and writes nothing
# (no row) when the customer's first grant recorded the other one.
_CASE = bindparam("c_case", type_=Boolean)


def _case_rule_holds() -> ColumnElement[bool]:
    return or_(
        customer_locks.c.case_insensitive == _CASE,
        customer_locks.c.case_insensitive.is_(None),
    )


CLAIM = (
    update(customer_locks)
    .where(customer_locks.c.customer_id == bindparam("c_id"), _case_rule_holds())
    .values(**_moved(1), case_insensitive=_CASE)
)
# A grant in one round trip, its COMMIT included (pathlock._batch): the
# sentinel row locked but not written (LOCK_SENTINEL: an UPDATE that changes
# nothing takes the row lock, writes no log, and unlike SELECT ... FOR UPDATE
# returns no rows to read), the grant
# (grant_statement(..., sentinel_after=True)), then the sentinel written
# (CLAIM_IF_GRANTED) and a waiter's queue row removed (DEQUEUE_IF_GRANTED) only
# if the statement before changed rows (ROW_COUNT(), MySQL's and MariaDB's):
# a denied attempt commits no write, so on a cluster it aborts nobody. The
# lock comes in a statement of its own: the grant's reads (READ COMMITTED)
# see what was committed when their statement began, so that must be after the
# wait for the previous holder of the sentinel.
LOCK_SENTINEL = (
    update(customer_locks)
    .where(customer_locks.c.customer_id == bindparam("c_id"))
    .values(version=customer_locks.c.version)
)
# The same, for a release (MySQL, MariaDB): its reply also carries the
# version, as the id LAST_INSERT_ID() was given (where the row exists: it
# matched one row). One SELECT less in the round trip.
LOCK_AND_READ_SENTINEL = (
    update(customer_locks)
    .where(customer_locks.c.customer_id == bindparam("c_id"))
    .values(version=Fenced(customer_locks.c.version))
)
_GRANTED = Changed() > literal_column("0")
# The first statement of a grant in one round trip (MySQL, MariaDB): until
# when, in the server's time, the client waits for its reply. The lock may
# wait long (a frozen client holds the sentinel row), and the server runs the
# rest of the query, its COMMIT included, even after the client gave up: a
# grant that begins later inserts nothing, so it cannot land unseen.
SET_GRANT_UNTIL = SetGrantUntil()


def _of_lease(
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


def _rows_granted() -> Any:
    """How many rows the grant just before inserted for the lease ``:l_id``:
    its rows whose token is the version plus one (see
    :func:`grant_statement`), read from the table, not from ROW_COUNT().
    MariaDB may run the rest of a batch whose session is killed in the middle
    (as a manager kills the sessions of its dropped connections), its COMMIT
    included, with ROW_COUNT() at -1 for the statement after the one the
    kill struck: a write conditioned on ROW_COUNT() would then be skipped
    while the grant's rows commit (the tokens of a later grant would repeat,
    and the rows would go uncounted)."""
    return (
        select(func.count())
        .select_from(path_locks)
        .where(
            *_of_lease(path_locks, typed=True),
            path_locks.c.fencing_token == customer_locks.c.version + 1,
        )
        .scalar_subquery()
    )


# The sentinel written only if the grant before it inserted, and its rows
# counted. The count is assigned first: MySQL's UPDATE assigns left to right,
# each assignment seeing those before it, and it must see the version as the
# grant saw it.
CLAIM_IF_GRANTED = (
    update(customer_locks)
    .where(
        customer_locks.c.customer_id == bindparam("c_id"),
        _case_rule_holds(),
        _rows_granted() > literal_column("0"),
    )
    .ordered_values(
        (customer_locks.c.lock_rows, customer_locks.c.lock_rows + _rows_granted()),
        (customer_locks.c.counted_version, customer_locks.c.counted_version + 1),
        (customer_locks.c.version, Fenced(customer_locks.c.version + 1)),
        (customer_locks.c.case_insensitive, _CASE),
    )
)
CASE_RULE = select(customer_locks.c.case_insensitive).where(
    customer_locks.c.customer_id == bindparam("c_id")
)
# After a release handed its paths to the head of the queue, or tried to: the
# version moves if the hand-over did not move it, so the waiters still queued
# try for themselves.
BUMP_IF_UNMOVED = BUMP.where(customer_locks.c.version == bindparam("seen", type_=BigInteger))
# The same, in the query that grants the paths to the request the release
# expects to be next (Releases.release): after DEQUEUE_IF_GRANTED, the version
# moves unless that statement deleted the request's queue row.
BUMP_UNLESS_HANDED = BUMP.where(Changed() == literal_column("0"))
# Undoes BUMP within its transaction: the sentinel is still written (the lock
# and, on a cluster, the write conflict stay), but the version does not move.
UNBUMP = (
    update(customer_locks)
    .where(customer_locks.c.customer_id == bindparam("c_id"))
    .values(**_moved(-1, fenced=False))
)


def _counted(column: Column[Any], sign: int) -> Any:
    """A sentinel write that adds (``sign`` 1) or takes away (-1) the rows
    the statement just before it inserted or deleted (``Changed()``: that
    statement's row count, on the same connection and in the same
    transaction) to the customer's ``column`` count; it matches no row when
    that statement changed none, so its own row count says the same as the
    statement's (0 or not) to a statement after it."""
    changed = Changed()
    value = column + changed if sign > 0 else column - changed
    return (
        update(customer_locks)
        .where(customer_locks.c.customer_id == bindparam("c_id"), changed > literal_column("0"))
        .values({column: value})
    )


# Every statement that inserts or deletes rows of path_locks or
# path_lock_waiters is followed by one of these in its transaction (or, for a
# grant's rows, by CLAIM_IF_GRANTED; for a queue row, by WAITER_QUEUED), so the
# sentinel's counts stay exact. A waiter's path rows go with its queue row and
# are not counted. Where a batch's session was killed in the middle,
# ROW_COUNT() may answer -1 (see _rows_granted): these then skip a count that
# goes down (a count too high: harmless), and nothing that goes up relies on
# them in a batch that carries its COMMIT.
LOCKS_ADDED = _counted(customer_locks.c.lock_rows, 1)
LOCKS_REMOVED = _counted(customer_locks.c.lock_rows, -1)
# The queue row the statement before inserted for the lease ``:l_id`` (its
# ticket is the id it generated, which the server keeps whatever became of
# the reply), counted.
WAITER_QUEUED = (
    update(customer_locks)
    .where(
        customer_locks.c.customer_id == bindparam("c_id"),
        exists().where(
            path_lock_waiters.c.ticket == InsertedId(),
            path_lock_waiters.c.customer_id == bindparam("c_id"),
            path_lock_waiters.c.lease_id == bindparam("l_id", type_=String),
        ),
    )
    .values(waiter_rows=customer_locks.c.waiter_rows + 1)
)
WAITERS_REMOVED = _counted(customer_locks.c.waiter_rows, -1)
# After WAITERS_REMOVED in a release's hand-over: tells the process of the
# request granted (its queue row deleted) at once, where the database has
# notices (Dialect.notices); a SELECT, so it leaves ROW_COUNT() as it was.
WAKE_HEIR = select(Notice(bindparam("notice", type_=String))).where(Changed() > literal_column("0"))
VERSION = select(customer_locks.c.version).where(customer_locks.c.customer_id == bindparam("c_id"))
# BUMP and CLAIM whose reply carries the new version, where the database's
# UPDATE can return rows and its sentinel write's reply does not carry the
# version otherwise (SQLite 3.35 and newer): one statement instead of two.
BUMP_RETURNING = BUMP.returning(customer_locks.c.version)
CLAIM_RETURNING = CLAIM.returning(customer_locks.c.version)


# -- the grant without searches (MySQL, MariaDB) -----------------------------
# A customer with no lock row and no queue row (its counts say so, and are
# trusted: see customer_locks in pathlock.schema) is granted without the
# conflict and queue searches: in one round trip, LEAN_CLAIM writes the
# sentinel (and counts the rows) only if the customer has none, and
# lean_grant(n) inserts the rows only if it did (ROW_COUNT()). The WHERE of an
# UPDATE is judged on the row's newest version once its lock is granted, so a
# grant that waited for another one's commit sees that one's rows counted.
# Until when the client waits, in the server's time: SYSDATE(6) is read when
# the row is judged, after any wait for its lock, and NOW(6) when the
# statement began (both in the session's time zone).
_WAITED_IN_TIME = WaitedInTime(bindparam("until_us", type_=BigInteger))
LEAN_CLAIM = (
    update(customer_locks)
    .where(
        customer_locks.c.customer_id == bindparam("c_id"),
        customer_locks.c.lock_rows == literal_column("0"),
        customer_locks.c.waiter_rows == literal_column("0"),
        customer_locks.c.counted_version == customer_locks.c.version,
        _case_rule_holds(),
        _WAITED_IN_TIME,
    )
    .values(
        **_moved(1),
        case_insensitive=_CASE,
        lock_rows=bindparam("rows", type_=BigInteger),
    )
)


@functools.lru_cache(maxsize=64)
def lean_grant(count: int, shallow: bool = False) -> Insert:
    """The rows of a request of ``count`` paths (``shallow``: some of them
    at depth 0), inserted only if the statement before (:data:`LEAN_CLAIM`)
    wrote the sentinel; the fencing token is the version it wrote
    (``LAST_INSERT_ID()``)."""
    data: Any = _DATA
    if count == 1:
        source: Any = None
        path, mode, depth = _first_requested(shallow)
    else:
        requested = _requested(count, "requested", shallow)
        source = requested
        path, mode, depth = _requested_columns(requested, shallow)
        data = _on_first_path(requested, data)
    values = select(
        bindparam("c_id", type_=BigInteger),
        bindparam("l_id", type_=String),
        path,
        mode,
        bindparam("o_node", type_=String),
        bindparam("o_pid", type_=Integer),
        bindparam("o_thread", type_=String),
        bindparam("o_key", type_=String),
        bindparam("why", type_=String),
        InsertedId(),
        now(),
        now_plus(bindparam("ttl_us", type_=BigInteger)),
        data,
        depth,
    ).where(Changed() > literal_column("0"))
    if source is not None:
        values = values.select_from(source)
    return insert(path_locks).from_select(_GRANTED_COLUMNS, values)


# A release without a read of the queue, for a customer not seen with one
# (MySQL, MariaDB): after RELEASE, one statement counts the rows down and says
# in its reply, as the id LAST_INSERT_ID() was given, what the release needs
# to know: where requests may be queued (their count is not zero, or not
# trusted), the version, as 2 * version + 1 (odd: the release then reads the
# queue to hand its paths over); elsewhere the count left, as 2 * count (even;
# 0: the customer holds nothing now, and its next grant needs no search).
# It matches the row where it counts rows down or requests may be queued, so
# its row count says whether it did either. One statement where two were: a
# ninth of the server's CPU for an acquire + release. A count left below zero
# (by a pathlock without the counts) comes back as 0: LAST_INSERT_ID() takes
# no value below zero. (Versions stay below 2⁶² for as long as anyone will
# run a server: a grant moves them by one.)
_MAY_BE_QUEUED = or_(
    customer_locks.c.waiter_rows != literal_column("0"),
    customer_locks.c.waiter_rows.is_(None),
    customer_locks.c.counted_version.is_(None),
    customer_locks.c.counted_version != customer_locks.c.version,
)
_DELETED = func.greatest(Changed(), literal_column("0"))
COUNTED_DOWN_OR_QUEUED = (
    update(customer_locks)
    .where(
        customer_locks.c.customer_id == bindparam("c_id"),
        or_(Changed() > literal_column("0"), _MAY_BE_QUEUED),
    )
    # In this order, each expression reads the row as it was (MySQL assigns
    # from left to right, later ones seeing the new values).
    .ordered_values(
        (
            customer_locks.c.version,
            customer_locks.c.version
            + literal_column("0")
            * Fenced(
                case(
                    (
                        _MAY_BE_QUEUED,
                        customer_locks.c.version * literal_column("2") + literal_column("1"),
                    ),
                    else_=func.greatest(customer_locks.c.lock_rows - _DELETED, literal_column("0"))
                    * literal_column("2"),
                )
            ),
        ),
        (customer_locks.c.lock_rows, customer_locks.c.lock_rows - _DELETED),
    )
)


def release_said(said: int) -> tuple[int | None, int | None]:
    """What :data:`COUNTED_DOWN_OR_QUEUED` said in its reply's id (where it
    matched the row): the customer's version if requests may be queued (else
    ``None``), and the count of lock rows left if not (else ``None``)."""
    if said & 1:
        return said >> 1, None
    return None, said >> 1


def _own_live_rows() -> list[ColumnElement[bool]]:
    """The live rows of the request's own lease (``:l_id``): rows a release
    handed to it (Releases.release)."""
    return [
        *_of_lease(path_locks, typed=True),
        path_locks.c.expires_at > now(),
    ]


# The fencing token of those rows, which the request's attempt takes up.
OWN_ROWS = select(path_locks.c.fencing_token).where(*_own_live_rows()).limit(1)
# How long they have left, in microseconds of the database's clock.
_LEFT_US = MicrosecondsLeft(path_locks.c.expires_at)
_HANDED_FOR = select(_LEFT_US).where(*_own_live_rows()).limit(1).scalar_subquery()
# Both, for a waiter's judgement of its chances (MySQL, MariaDB: where
# releases hand paths over): rows handed to it are taken up at once.
OWN_ROWS_LEFT = select(path_locks.c.fencing_token, _LEFT_US).where(*_own_live_rows()).limit(1)
# Those rows taken up by the request under the sentinel row (locked first, as
# a renewal does): they expire after the term its queue row recorded unless
# taken up, and are never extended once expired.
TAKE_UP = (
    update(path_locks)
    .where(*_own_live_rows())
    .values(expires_at=now_plus(bindparam("ttl_us", type_=BigInteger)))
)
# If absent: a concurrent first use may insert the row too.
# Counted as it is made: a customer's rows outlive its sentinel row when an
# operator deletes that by hand, and no grant inserts rows without one (a
# release that deletes rows meanwhile leaves the count too high: harmless).
CREATE_SENTINEL = insert_if_absent(customer_locks).from_select(
    ["customer_id", "version", "lock_rows", "waiter_rows", "counted_version"],
    select(
        bindparam("c_id", type_=BigInteger),
        literal_column("0", BigInteger),
        select(func.count())
        .select_from(path_locks)
        .where(path_locks.c.customer_id == bindparam("c_id"))
        .scalar_subquery(),
        select(func.count())
        .select_from(path_lock_waiters)
        .where(path_lock_waiters.c.customer_id == bindparam("c_id"))
        .scalar_subquery(),
        literal_column("0", BigInteger),
    ),
)
RELEASE = delete(path_locks).where(*_of_lease(path_locks))
# The same, in a batch that also grants another lease (:l_id) its paths.
RELEASE_BEFORE_HAND_OVER = delete(path_locks).where(
    *_of_lease(path_locks, "released_l_id", typed=True)
)
# By the owner's key only: node, pid and thread repeat across containers and
# thread pools (see pathlock._owners).
RELEASE_OWNER = delete(path_locks).where(
    path_locks.c.customer_id == bindparam("c_id"),
    path_locks.c.owner_key == bindparam("o_key"),
)

# Renewal: the sentinels first (in key order, as one statement), so no grant of
# these customers runs between the renewal's check of expires_at and its commit:
# a renewal that saw a lease alive must not commit after a grant that saw it
# expired (the row would come back to life under someone else's lock).
LOCK_SENTINELS = (
    update(customer_locks)
    .where(customer_locks.c.customer_id.in_(bindparam("c_ids", expanding=True)))
    .values(**_moved(1, fenced=False))
)
# The heartbeat's first statement on servers that can skip locked rows: it
# locks the sentinels that are free and passes over those another transaction
# holds (a grant in progress, or a client frozen in the middle of one), so one
# customer's stall never holds up the renewal of the others. LOCK_SENTINELS
# then writes the ones it got (a write, not only a lock: on a cluster the
# renewal must conflict with grants at certification).
CLAIM_SENTINELS = (
    select(customer_locks.c.customer_id)
    .where(customer_locks.c.customer_id.in_(bindparam("c_ids", expanding=True)))
    .order_by(customer_locks.c.customer_id)
    .with_for_update(skip_locked=True)
)
# Never resurrects: a row whose expiry already passed stays expired.
RENEW = (
    update(path_locks)
    .where(
        path_locks.c.lease_id.in_(bindparam("l_ids", expanding=True)),
        path_locks.c.expires_at > now(),
    )
    .values(expires_at=now_plus(bindparam("ttl_us", type_=BigInteger)))
)
HELD = (
    select(path_locks.c.lease_id)
    .where(
        path_locks.c.lease_id.in_(bindparam("l_ids", expanding=True)),
        path_locks.c.expires_at > now(),
    )
    .distinct()
)

# How many of a lease's rows are alive by the database's clock: a holder about
# to do something irreversible asks (Lease.ensure_held(verify=True)).
LEASE_ALIVE = select(func.count()).where(
    *_of_lease(path_locks),
    path_locks.c.expires_at > now(),
)

# The queue of blocked requests (see pathlock._core.fairness for who waits for whom).
ENQUEUE = insert(path_lock_waiters).values(
    customer_id=bindparam("c_id"),
    lease_id=bindparam("l_id"),
    paths=bindparam("w_paths"),
    node_id=bindparam("o_node"),
    pid=bindparam("o_pid"),
    thread=bindparam("o_thread"),
    owner_key=bindparam("o_key"),
    reason=bindparam("why"),
    created_at=now(),
    expires_at=now_plus(bindparam("w_ttl_us", type_=BigInteger)),
    hand_over_us=bindparam("w_hand_over_us", type_=BigInteger),
    data=_DATA,
)


@functools.lru_cache(maxsize=128)
def enqueue_if_blocked(form: Shape) -> Insert:
    """ENQUEUE's row, in the batch of a grant in one round trip (see
    ``Grants.try_grant``), only if that grant was refused because a live row
    of another lease is in the request's way: right after
    ``CLAIM_IF_GRANTED`` (by ``ROW_COUNT()``: it wrote nothing), under the
    customer's case rule, and while the client still waits for the reply
    (:data:`SET_GRANT_UNTIL`). A grant refused only by an older queued
    request queues here too where the requesting owner holds no live lock of
    the customer; otherwise who goes first is judged request by request (the
    owner may pass requests that wait for its locks)."""
    blocked = or_(*(~condition for condition in _no_conflict(form)))
    if form.spelled:  # the grant asked about the requests in its way only
        blocked = or_(blocked, ~_owner_holds())
    values = select(
        bindparam("c_id", type_=BigInteger),
        bindparam("l_id", type_=String),
        bindparam("w_paths", type_=String),
        bindparam("o_node", type_=String),
        bindparam("o_pid", type_=Integer),
        bindparam("o_thread", type_=String),
        bindparam("o_key", type_=String),
        bindparam("why", type_=String),
        now(),
        now_plus(bindparam("w_ttl_us", type_=BigInteger)),
        bindparam("w_hand_over_us", type_=BigInteger),
        _DATA,
    ).where(
        customer_locks.c.customer_id == bindparam("c_id"),
        Changed() == literal_column("0"),
        _case_rule_holds(),
        InGrantTime(),
        blocked,
    )
    columns = [
        "customer_id",
        "lease_id",
        "paths",
        "node_id",
        "pid",
        "thread",
        "owner_key",
        "reason",
        "created_at",
        "expires_at",
        "hand_over_us",
        "data",
    ]
    return insert(path_lock_waiters).from_select(columns, values)


@functools.lru_cache(maxsize=128)
def enqueue_paths(count: int, shallow: bool = False) -> Insert:
    """The rows of a request's ``count`` paths (``:rq_path_N``,
    ``:rq_mode_N``) in ``path_lock_waiter_paths``, for its newest queue row
    (the one ``ENQUEUE`` or :func:`enqueue_if_blocked` has just written in
    the same transaction, under the sentinel row); nothing where it has none
    (a request that was not queued after all)."""
    waiters = path_lock_waiters
    newest = (
        select(func.max(waiters.c.ticket))
        .where(waiters.c.lease_id == bindparam("l_id", type_=String))
        .scalar_subquery()
    )
    if count == 1:
        source: Any = waiters
        path, mode, depth = _first_requested(shallow)
    else:
        requested = _requested(count, "requested", shallow)
        source = requested.join(waiters, waiters.c.ticket == newest)
        path, mode, depth = _requested_columns(requested, shallow)
    values = (
        select(waiters.c.ticket, waiters.c.customer_id, path, mode, depth)
        .select_from(source)
        .where(waiters.c.ticket == newest, waiters.c.customer_id == bindparam("c_id"))
    )
    return insert(path_lock_waiter_paths).from_select(
        ["ticket", "customer_id", "path", "mode", "shallow"], values
    )


# A retried attempt whose enqueue may have committed finds its own row by lease.
ENQUEUED = (
    select(path_lock_waiters.c.ticket)
    .where(path_lock_waiters.c.lease_id == bindparam("l_id"))
    .order_by(path_lock_waiters.c.ticket)
    .limit(1)
)
# By ticket and lease: a request only ever touches its own row.
DEQUEUE = delete(path_lock_waiters).where(
    path_lock_waiters.c.customer_id == bindparam("c_id"),
    path_lock_waiters.c.ticket == bindparam("w_ticket"),
    path_lock_waiters.c.lease_id == bindparam("l_id"),
)
DEQUEUE_IF_GRANTED = DEQUEUE.where(_GRANTED)
# A request whose outcome is in doubt (interrupted) leaves the queue by its
# lease id: the ticket may never have reached the client.
FORGET_REQUEST = delete(path_lock_waiters).where(*_of_lease(path_lock_waiters))
# The queued requests of one process and customer, kept alive together (see
# Queue.refresh_waiters): by ticket, which is never handed out twice. A row
# that lapsed is never revived (others may have gone ahead of it meanwhile:
# its request queues again with a new ticket). Then which of them are alive.
REFRESH_WAITERS = (
    update(path_lock_waiters)
    .where(
        path_lock_waiters.c.customer_id == bindparam("c_id"),
        path_lock_waiters.c.ticket.in_(bindparam("w_tickets", expanding=True)),
        path_lock_waiters.c.expires_at > now(),
    )
    .values(expires_at=now_plus(bindparam("w_ttl_us", type_=BigInteger)))
)
WAITERS_ALIVE = select(path_lock_waiters.c.ticket).where(
    path_lock_waiters.c.customer_id == bindparam("c_id"),
    path_lock_waiters.c.ticket.in_(bindparam("w_tickets", expanding=True)),
    path_lock_waiters.c.expires_at > now(),
)
# The requesting owner's live locks: the queue passes over waiters that wait
# for them, and a cycle through another owner's queued request is a deadlock.


def _owner_locks(*columns: Any) -> Select[Any]:
    return select(*columns).where(
        path_locks.c.customer_id == bindparam("c_id"),
        path_locks.c.owner_key == bindparam("o_key"),
        path_locks.c.expires_at > now(),
    )


_OWNER_LOCK_COLUMNS = (
    path_locks.c.path,
    path_locks.c.mode,
    path_locks.c.lease_id,
    path_locks.c.shallow,
)
OWNER_LOCKS = _owner_locks(*_OWNER_LOCK_COLUMNS)
# The same as one JSON array per row (see items()), for a denied attempt's reads.
OWNER_LOCK_ITEMS = _owner_locks(items(_OWNER_LOCK_COLUMNS))

# The rows of one lease, by its id (the lease_id index), live or not, and the
# database's time.
LEASE_ROWS = (
    select(
        *LOCK_COLUMNS,
        (path_locks.c.expires_at > now()).label("live"),
        now().label("database_now"),
        path_locks.c.data,
    )
    .where(*_of_lease(path_locks))
    .order_by(path_locks.c.path)
)


@functools.lru_cache(maxsize=8)
def locks_on(*, descendants: bool, include_expired: bool) -> Select[Any]:
    """Rows of the customer ``c_id`` on the path ``on_path``, on the paths
    ``above_paths`` (its ancestors, if asked for: ``['']`` if not) that
    cover their subtree, and with ``descendants`` on the paths from
    ``below_low`` up to ``below_high`` (see :func:`descendants_range`): the
    (customer, path) index, by path."""
    where: list[ColumnElement[bool]] = [
        PathIs(path_locks.c.path, bindparam("on_path")),
        and_(
            PathIn(path_locks.c.path, bindparam("above_paths", expanding=True)),
            path_locks.c.shallow == false(),
        ),
    ]
    if descendants:
        where.append(PathWithin(path_locks.c.path, bindparam("below_low"), bindparam("below_high")))
    query = select(*LOCK_COLUMNS).where(path_locks.c.customer_id == bindparam("c_id"), or_(*where))
    if not include_expired:
        query = query.where(path_locks.c.expires_at > now())
    return query.order_by(path_locks.c.path, path_locks.c.lease_id)


# Operator clean-up.
LEASE_CUSTOMER = (
    select(path_locks.c.customer_id).where(path_locks.c.lease_id == bindparam("l_id")).limit(1)
)
# A node's clean-up spares the rows of detached leases (owner key
# 'detached.<lease id>'), which no process holds: the node only granted them.
_NOT_DETACHED = path_locks.c.owner_key.not_like(DETACHED + "%")
NODE_CUSTOMERS = (
    select(path_locks.c.customer_id)
    .where(path_locks.c.node_id == bindparam("o_node"), _NOT_DETACHED)
    .union(
        select(path_lock_waiters.c.customer_id).where(
            path_lock_waiters.c.node_id == bindparam("o_node")
        )
    )
)
RELEASE_NODE = delete(path_locks).where(
    path_locks.c.customer_id == bindparam("c_id"),
    path_locks.c.node_id == bindparam("o_node"),
    _NOT_DETACHED,
)
RELEASE_NODE_WAITERS = delete(path_lock_waiters).where(
    path_lock_waiters.c.customer_id == bindparam("c_id"),
    path_lock_waiters.c.node_id == bindparam("o_node"),
)


def expired_batch(table: Table, key: Column[int]) -> tuple[Select[Any], Select[Any], Delete]:
    """The reaper's statements for ``table``: pick the ids of up to ``batch``
    rows that expired by ``cutoff`` (the database's time when the run began,
    so a run ends even while rows keep expiring), oldest expiry first along
    the expires_at index; once their customers' sentinel rows are held, lock
    those of them still there and still expired, with their customers; then
    delete the rows locked (and count them down, see :func:`counted_down`).
    Renewal never extends an expired row, so a picked row stays expired.
    Several reapers at once are harmless: the later one finds nothing."""
    pick = (
        select(key, table.c.customer_id)
        .where(table.c.expires_at <= bindparam("cutoff", type_=DateTime()))
        .order_by(table.c.expires_at)
        .limit(bindparam("batch", type_=BigInteger))
    )
    hold = (
        select(key, table.c.customer_id)
        .where(key.in_(bindparam("ids", expanding=True)), table.c.expires_at <= now())
        .with_for_update()
    )
    remove = delete(table).where(key.in_(bindparam("ids", expanding=True)))
    return pick, hold, remove


_COUNTED_DOWN = {
    column.name: update(customer_locks)
    .where(customer_locks.c.customer_id.in_(bindparam("c_ids", expanding=True)))
    .values({column: column - bindparam("gone", type_=BigInteger)})
    for column in (customer_locks.c.lock_rows, customer_locks.c.waiter_rows)
}


def counted_down(column: Column[Any], gone: dict[int, int]) -> list[tuple[Any, dict[str, Any]]]:
    """The counts of ``column`` taken down by the rows ``gone`` (customer id
    -> rows deleted), for every customer of a reaper's batch: one statement
    per number of rows deleted, for all the customers that lost that many.
    Those numbers add up to the batch's size, so there are few of them (at
    most about the square root of twice the batch), and each statement is
    compiled once: a ``CASE`` of one branch per customer, built anew for
    every batch, cost the client more than the reap's own work."""
    by_count: dict[int, list[int]] = {}
    for customer_id, rows in gone.items():
        by_count.setdefault(rows, []).append(customer_id)
    statement = _COUNTED_DOWN[column.name]
    return [
        (statement, {"gone": rows, "c_ids": sorted(customers)})
        for rows, customers in sorted(by_count.items())
    ]


REAP_LOCKS = expired_batch(path_locks, path_locks.c.id)
REAP_WAITERS = expired_batch(path_lock_waiters, path_lock_waiters.c.ticket)
# The sentinel rows of customers whose rows the reaper deletes or counts,
# locked in key order (as renewal locks them) before their rows, as every
# release does; the version stays: nothing becomes free that was not already.
HOLD_SENTINELS = (
    update(customer_locks)
    .where(customer_locks.c.customer_id.in_(bindparam("c_ids", expanding=True)))
    .values(version=customer_locks.c.version)
)


def _has_none(table: Table) -> Any:
    """Whether the customer of the sentinel row has no row in ``table``: a
    probe of its index per customer (MariaDB plans ``NOT EXISTS`` here as
    one scan of the whole index, materialized; a scalar subquery with
    ``LIMIT`` stays a probe)."""
    return (
        select(literal_column("1", Integer))
        .where(table.c.customer_id == customer_locks.c.customer_id)
        .limit(1)
        .scalar_subquery()
        .is_(None)
    )


# Customers whose counts are not to be trusted (see customer_locks in
# pathlock.schema): never counted, counts left behind by a write of a
# pathlock without them, or counts below zero (rows such a pathlock queued,
# deleted by this one); and customers whose counts are too high, seen where
# the customer has no row at all (a session killed between a grant's claim
# and its INSERT, or after a release's DELETE): those counts are safe, but
# keep the customer's grants searching until they are made again. A probe of
# one index entry per customer whose counts are not zero. By customer id,
# from ``after``.
UNCOUNTED = (
    select(customer_locks.c.customer_id)
    .where(
        customer_locks.c.customer_id > bindparam("after", type_=BigInteger),
        or_(
            customer_locks.c.counted_version.is_(None),
            customer_locks.c.counted_version != customer_locks.c.version,
            customer_locks.c.lock_rows < 0,
            customer_locks.c.waiter_rows < 0,
            and_(customer_locks.c.lock_rows > 0, _has_none(path_locks)),
            and_(customer_locks.c.waiter_rows > 0, _has_none(path_lock_waiters)),
        ),
    )
    .order_by(customer_locks.c.customer_id)
    .limit(bindparam("batch", type_=BigInteger))
)


def _rows_of(table: Table) -> Any:
    return (
        select(func.count())
        .select_from(table)
        .where(table.c.customer_id == customer_locks.c.customer_id)
        .scalar_subquery()
    )


# Their rows counted afresh, under their sentinel rows (HOLD_SENTINELS in a
# statement before: this one's reads then see every row committed before the
# locks were taken, and nothing can be inserted until the commit).
RECOUNT = (
    update(customer_locks)
    .where(customer_locks.c.customer_id.in_(bindparam("c_ids", expanding=True)))
    .values(
        lock_rows=_rows_of(path_locks),
        waiter_rows=_rows_of(path_lock_waiters),
        counted_version=customer_locks.c.version,
    )
)

WAITER_COLUMNS = (
    path_lock_waiters.c.customer_id,
    path_lock_waiters.c.ticket,
    path_lock_waiters.c.lease_id,
    path_lock_waiters.c.paths,
    path_lock_waiters.c.node_id,
    path_lock_waiters.c.pid,
    path_lock_waiters.c.thread,
    path_lock_waiters.c.owner_key,
    path_lock_waiters.c.reason,
    path_lock_waiters.c.created_at,
    path_lock_waiters.c.expires_at,
)
# How many queued requests one denied attempt reads; per customer the queue is
# short (a few requests a second), this only bounds a pathological one.
MAX_WAITERS = 1000


def _live_waiters(*columns: Any) -> Select[Any]:
    return (
        select(*columns)
        .where(
            path_lock_waiters.c.customer_id == bindparam("c_id"),
            path_lock_waiters.c.expires_at > now(),
        )
        .order_by(path_lock_waiters.c.ticket)
        .limit(bindparam("waiters_limit", MAX_WAITERS, type_=Integer))
    )


LIVE_WAITERS = _live_waiters(*WAITER_COLUMNS)
# How many queued requests a release reads: the head of the queue, to hand its
# paths to, and whether anyone behind it waited for them.
HAND_OVER_WAITERS = 16
# What a release reads of them (see Releases.release): a queue row's columns in
# this order, as one JSON array per row (see items()): one column is what an
# uncontended release reads.
_QUEUE_COLUMNS = (*WAITER_COLUMNS, path_lock_waiters.c.hand_over_us)
QUEUE_ITEM = tuple(column.name for column in _QUEUE_COLUMNS)
# LIVE_WAITERS with each row as one JSON array, in QUEUE_ITEM's order (see
# items()): a waiter that finds paths handed to it learns who is next in line.
LIVE_WAITER_ITEMS = _live_waiters(items(_QUEUE_COLUMNS))
# The whole queue is needed to judge a request only where its owner holds
# live locks of the customer (pathlock._core.fairness: requests that wait for them
# are passed over, and may close a cycle); otherwise it reads nothing.
LIVE_WAITER_ITEMS_IF_OWNER_HOLDS = LIVE_WAITER_ITEMS.where(_owner_holds())
# How many of the older queued requests in a request's way one read returns:
# the youngest of them, those just ahead of it, which leave last (first come,
# first served among conflicting requests). A request behind more judges its
# place anew once these have left, which is once all have; and a waiter of a
# process is behind those of them that wait in the same process (the oldest
# ones left first, and every waiter behind them took itself for the next).
MAX_AHEAD = 16


@functools.lru_cache(maxsize=256)
def queued_in_the_way(form: Shape, *, as_items: bool = True) -> Select[Any]:
    """The youngest live queued requests older than ``:w_ticket`` that
    conflict with a request of this :class:`Shape` (up to :data:`MAX_AHEAD`,
    youngest first), found through the index of their paths, whatever the
    queue's length. Each as one JSON array in ``QUEUE_ITEM``'s order (see
    :func:`items`), or with ``as_items=False`` as ``LIVE_WAITERS``' columns."""
    tickets = _queued_conflicts(form, path_lock_waiter_paths.c.ticket)
    found = tickets[0] if len(tickets) == 1 else union(*tickets)
    listed = LIVE_WAITER_ITEMS if as_items else LIVE_WAITERS
    return (
        listed.where(
            path_lock_waiters.c.ticket < bindparam("w_ticket", type_=BigInteger),
            path_lock_waiters.c.ticket.in_(found),
        )
        .order_by(None)
        .order_by(path_lock_waiters.c.ticket.desc())
        .limit(bindparam("ahead_limit", MAX_AHEAD, type_=Integer))
    )


QUEUE_HEAD = (
    select(items(_QUEUE_COLUMNS))
    .where(
        path_lock_waiters.c.customer_id == bindparam("c_id"),
        path_lock_waiters.c.expires_at > now(),
    )
    .order_by(path_lock_waiters.c.ticket)
    .limit(HAND_OVER_WAITERS)
)

# A queued request's check (where a release hands paths over, see
# HAND_OVER_WAITERS): the version, and the fencing token of the rows a
# release handed to it, if any, and how long they have left; and, if it was
# handed rows, the head of the queue as a release reads it (QUEUE_HEAD's
# first row, or null): the request this one hands the paths to when it
# releases them, without a round trip to read the queue first (Releases.release).
# As one JSON array (see items()): every waiter polls this.
_OWN_TOKEN = OWN_ROWS.scalar_subquery()
_NEXT_IN_LINE = case(
    (_OWN_TOKEN.is_not(None), QUEUE_HEAD.limit(1).scalar_subquery()),
    else_=null(),
)
_WATCHED = (customer_locks.c.version, _OWN_TOKEN, _HANDED_FOR, _NEXT_IN_LINE)
WATCH = select(items(_WATCHED)).where(customer_locks.c.customer_id == bindparam("c_id"))
# The same, for a request with older ones ahead of it: also how many of those
# are still queued (by primary key), so that it judges its place anew only
# once they have all left.
_AHEAD_LEFT = (
    select(func.count())
    .where(
        path_lock_waiters.c.ticket.in_(bindparam("ahead", expanding=True)),
        path_lock_waiters.c.customer_id == bindparam("c_id"),
        path_lock_waiters.c.expires_at > now(),
    )
    .scalar_subquery()
)
WATCH_AHEAD = select(items((*_WATCHED, _AHEAD_LEFT))).where(
    customer_locks.c.customer_id == bindparam("c_id")
)
# The version and how many of those are still queued, where releases do not
# hand paths over (a Galera node, SQLite): the requests behind them sleep
# through the version's moves that are theirs instead of judging each one.
VERSION_AHEAD = select(customer_locks.c.version, _AHEAD_LEFT).where(
    customer_locks.c.customer_id == bindparam("c_id")
)
# Whether a lease that blocked a request's last attempt (``:held``, lease ids)
# still has a live row: then another attempt is denied for certain, whatever
# else moved the version (1 or 0).
_HELD_LEFT = case(
    (
        exists().where(
            path_locks.c.lease_id.in_(bindparam("held", expanding=True)),
            path_locks.c.customer_id == bindparam("c_id"),
            path_locks.c.expires_at > now(),
        ),
        literal_column("1", Integer),
    ),
    else_=literal_column("0", Integer),
)


@functools.lru_cache(maxsize=8)
def watch_statement(*, handed: bool, ahead: bool, held: bool) -> Select[Any]:
    """A waiting request's check: ``WATCH`` (``handed``: where releases hand
    over) or ``VERSION``, then how many of the ``:ahead`` tickets are still
    queued (``ahead``; else null), then whether a ``:held`` lease still has a
    live row (``held``; else null)."""
    left = _AHEAD_LEFT if ahead else null()
    still = _HELD_LEFT if held else null()
    if handed:
        return select(items((*_WATCHED, left, still))).where(
            customer_locks.c.customer_id == bindparam("c_id")
        )
    return select(customer_locks.c.version, left, still).where(
        customer_locks.c.customer_id == bindparam("c_id")
    )


# The checks of several waiting requests of one process, in one read
# (Queue.watch, pathlock._polls): the version, and where a release handed rows
# to one of the leases ``:own``, the head of the queue (as WATCH reads it);
# the live leases among ``:leases`` (their own, and those in their way), each
# with the fencing token of its rows and how long they have left; the
# tickets among ``:tickets`` (those ahead of them) still queued.
WATCHED_HEAD = select(
    customer_locks.c.version,
    case(
        (
            exists().where(
                path_locks.c.customer_id == bindparam("c_id"),
                path_locks.c.lease_id.in_(bindparam("own", expanding=True)),
                path_locks.c.expires_at > now(),
            ),
            QUEUE_HEAD.limit(1).scalar_subquery(),
        ),
        else_=null(),
    ),
).where(customer_locks.c.customer_id == bindparam("c_id"))
WATCHED_LEASES = (
    select(path_locks.c.lease_id, func.min(path_locks.c.fencing_token), null())
    .where(
        path_locks.c.customer_id == bindparam("c_id"),
        path_locks.c.lease_id.in_(bindparam("leases", expanding=True)),
        path_locks.c.expires_at > now(),
    )
    .group_by(path_locks.c.lease_id)
)
# The same with how long their rows have left, where releases hand over (one
# MySQL or MariaDB server: the only ones whose clock functions count it).
WATCHED_LEASES_LEFT = WATCHED_LEASES.with_only_columns(
    path_locks.c.lease_id, func.min(path_locks.c.fencing_token), func.min(_LEFT_US)
)
WATCHED_TICKETS = select(path_lock_waiters.c.ticket).where(
    path_lock_waiters.c.customer_id == bindparam("c_id"),
    path_lock_waiters.c.ticket.in_(bindparam("tickets", expanding=True)),
    path_lock_waiters.c.expires_at > now(),
)
