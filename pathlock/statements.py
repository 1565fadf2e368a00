"""The SQL statements of pathlock, built once with SQLAlchemy Core.

Pure construction, no execution: :mod:`pathlock.store` runs these in its
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
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    ColumnElement,
    DateTime,
    Delete,
    Insert,
    Integer,
    Select,
    String,
    Table,
    and_,
    bindparam,
    delete,
    exists,
    insert,
    or_,
    select,
    union_all,
    update,
)
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement

from pathlock.paths import LIKE_ESCAPE, ancestors, descendants_pattern
from pathlock.schema import customer_locks, path_lock_waiters, path_locks
from pathlock.types import EXCLUSIVE, PathMode

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
    path_locks.c.reason,
    path_locks.c.fencing_token,
    path_locks.c.created_at,
    path_locks.c.expires_at,
)


class _Now(FunctionElement[datetime]):
    """The database's current UTC time, to the microsecond."""

    type = DateTime()
    inherit_cache = True


class _NowPlus(FunctionElement[datetime]):
    """The database's current UTC time plus a number of microseconds."""

    type = DateTime()
    inherit_cache = True


class _Fenced(FunctionElement[int]):
    """An expression whose value the UPDATE hands back to the client."""

    type = BigInteger()
    inherit_cache = True


# SQLite keeps time as text ('YYYY-MM-DD HH:MM:SS.SSS', milliseconds); three
# more digits give the six of SQLAlchemy's format, so stored and generated
# values compare as strings in time order.
_SQLITE_NOW = "strftime('%Y-%m-%d %H:%M:%f', 'now'{}) || '000'"
_MYSQL_NOW = "UTC_TIMESTAMP(6)"


@compiles(_Now)
def _now_mysql(_element: _Now, _compiler: SQLCompiler, **_kw: Any) -> str:
    return _MYSQL_NOW


@compiles(_Now, "sqlite")
def _now_sqlite(_element: _Now, _compiler: SQLCompiler, **_kw: Any) -> str:
    return "(" + _SQLITE_NOW.format("") + ")"


@compiles(_NowPlus)
def _now_plus_mysql(element: _NowPlus, compiler: SQLCompiler, **kw: Any) -> str:
    return f"TIMESTAMPADD(MICROSECOND, {compiler.process(element.clauses, **kw)}, {_MYSQL_NOW})"


@compiles(_NowPlus, "sqlite")
def _now_plus_sqlite(element: _NowPlus, compiler: SQLCompiler, **kw: Any) -> str:
    shift = f", printf('%+.6f seconds', ({compiler.process(element.clauses, **kw)}) / 1000000.0)"
    return "(" + _SQLITE_NOW.format(shift) + ")"


@compiles(_Fenced)
def _fenced_mysql(element: _Fenced, compiler: SQLCompiler, **kw: Any) -> str:
    # LAST_INSERT_ID(expr) returns the value in the statement's own reply
    # (cursor.lastrowid), saving a SELECT on the hot path.
    return f"LAST_INSERT_ID({compiler.process(element.clauses, **kw)})"


@compiles(_Fenced, "sqlite")
def _fenced_sqlite(element: _Fenced, compiler: SQLCompiler, **kw: Any) -> str:
    # The store reads it back with a SELECT (in-process, under the write lock).
    return str(compiler.process(element.clauses, **kw))


def now() -> ColumnElement[datetime]:
    return _Now()


def now_plus(microseconds: ColumnElement[int]) -> ColumnElement[datetime]:
    return _NowPlus(microseconds)


def overlapping(group: str, count: int) -> ColumnElement[bool]:
    """Rows on any of ``count`` paths of one mode, their ancestors (the
    expanding list ``{group}_exact``) or their descendants (``{group}_like_N``)."""
    clauses: list[ColumnElement[bool]] = [
        path_locks.c.path.in_(bindparam(f"{group}_exact", expanding=True))
    ]
    clauses.extend(
        path_locks.c.path.like(bindparam(f"{group}_like_{n}"), escape=LIKE_ESCAPE)
        for n in range(count)
    )
    return or_(*clauses)


def conflict_condition(exclusive: int, shared: int) -> ColumnElement[bool]:
    """Rows that conflict with a request of ``exclusive`` + ``shared`` paths:
    any mode overlapping its exclusive paths, exclusive rows overlapping its
    shared ones. Live rows of the customer only."""
    clauses = []
    if exclusive:
        clauses.append(overlapping("x", exclusive))
    if shared:
        clauses.append(and_(path_locks.c.mode == EXCLUSIVE, overlapping("s", shared)))
    return and_(
        path_locks.c.customer_id == bindparam("c_id"),
        path_locks.c.expires_at > now(),
        or_(*clauses),
    )


def conflict_parameters(paths: Sequence[PathMode]) -> dict[str, Any]:
    parameters: dict[str, Any] = {}
    for group, wanted in (("x", True), ("s", False)):
        chosen = [path for path, mode in paths if (mode == EXCLUSIVE) == wanted]
        exact = set(chosen)
        for path in chosen:
            exact.update(ancestors(path))
        parameters[f"{group}_exact"] = sorted(exact)
        for n, path in enumerate(chosen):
            parameters[f"{group}_like_{n}"] = descendants_pattern(path)
    return parameters


def shape(paths: Sequence[PathMode]) -> tuple[int, int]:
    exclusive = sum(1 for _, mode in paths if mode == EXCLUSIVE)
    return exclusive, len(paths) - exclusive


@functools.lru_cache(maxsize=128)
def blockers_query(exclusive: int, shared: int) -> Select[Any]:
    return select(*LOCK_COLUMNS).where(conflict_condition(exclusive, shared)).limit(MAX_BLOCKERS)


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


@functools.lru_cache(maxsize=256)
def grant_statement(exclusive: int, shared: int, *, queued: bool) -> Insert:
    """``INSERT INTO path_locks (...) SELECT ... FROM (the requested paths)
    WHERE NOT EXISTS (a live conflicting row)``: check and insert in one round
    trip. Built once per request shape; the paths are bind parameters.

    ``queued=True`` also requires that no older request is queued at all: the
    common case (an empty queue) stays one statement, and the store judges a
    non-empty queue request by request (:mod:`pathlock.fairness`) before
    inserting with ``queued=False``."""
    requested = union_all(
        *(
            select(
                bindparam(f"rq_path_{n}", type_=String).label("path"),
                bindparam(f"rq_mode_{n}", type_=String).label("mode"),
            )
            for n in range(exclusive + shared)
        )
    ).subquery("requested")
    values = (
        select(
            bindparam("c_id", type_=BigInteger),
            bindparam("l_id", type_=String),
            requested.c.path,
            requested.c.mode,
            bindparam("o_node", type_=String),
            bindparam("o_pid", type_=Integer),
            bindparam("o_thread", type_=String),
            bindparam("why", type_=String),
            # The fencing token: the sentinel's version as this transaction's own
            # write left it, so the statement needs no value from the client and
            # can be sent together with that write (pathlock.batch). Joining the
            # sentinel row also means no row goes in if it does not exist: then
            # nothing serialized this grant.
            customer_locks.c.version,
            now(),
            now_plus(bindparam("ttl_us", type_=BigInteger)),
        )
        .select_from(
            requested.join(customer_locks, customer_locks.c.customer_id == bindparam("c_id"))
        )
        .where(~exists().where(conflict_condition(exclusive, shared)))
    )
    if queued:
        values = values.where(~exists().where(queue_condition()))
    columns = [
        "customer_id",
        "lease_id",
        "path",
        "mode",
        "node_id",
        "pid",
        "thread",
        "reason",
        "fencing_token",
        "created_at",
        "expires_at",
    ]
    return insert(path_locks).from_select(columns, values)


# The fixed statements, built once.
BUMP = (
    update(customer_locks)
    .where(customer_locks.c.customer_id == bindparam("c_id"))
    .values(version=_Fenced(customer_locks.c.version + 1))
)
# Undoes BUMP within its transaction: the sentinel is still written (the lock
# and, on a cluster, the write conflict stay), but the version does not move.
UNBUMP = (
    update(customer_locks)
    .where(customer_locks.c.customer_id == bindparam("c_id"))
    .values(version=customer_locks.c.version - 1)
)
VERSION = select(customer_locks.c.version).where(customer_locks.c.customer_id == bindparam("c_id"))
# IGNORE: a concurrent first use may insert the row too.
CREATE_SENTINEL = (
    insert(customer_locks)
    .prefix_with("IGNORE", dialect="mysql")
    .prefix_with("IGNORE", dialect="mariadb")
    .prefix_with("OR IGNORE", dialect="sqlite")
    .values(customer_id=bindparam("c_id"), version=0)
)
# A retried grant's own rows, if its earlier attempt's COMMIT landed: alive
# (still before their expiry) or not.
LANDED = (
    select(path_locks.c.fencing_token, (path_locks.c.expires_at > now()).label("alive"))
    .where(
        path_locks.c.customer_id == bindparam("c_id"), path_locks.c.lease_id == bindparam("l_id")
    )
    .limit(1)
)
DROP_EXPIRED_LEASE = delete(path_locks).where(
    path_locks.c.customer_id == bindparam("c_id"),
    path_locks.c.lease_id == bindparam("l_id"),
    path_locks.c.expires_at <= now(),
)
RELEASE = delete(path_locks).where(
    path_locks.c.customer_id == bindparam("c_id"),
    path_locks.c.lease_id == bindparam("l_id"),
)
RELEASE_OWNER = delete(path_locks).where(
    path_locks.c.customer_id == bindparam("c_id"),
    path_locks.c.node_id == bindparam("o_node"),
    path_locks.c.pid == bindparam("o_pid"),
    path_locks.c.thread == bindparam("o_thread"),
)

# Renewal: the sentinels first (in key order, as one statement), so no grant of
# these customers runs between the renewal's check of expires_at and its commit:
# a renewal that saw a lease alive must not commit after a grant that saw it
# expired (the row would come back to life under someone else's lock).
LOCK_SENTINELS = (
    update(customer_locks)
    .where(customer_locks.c.customer_id.in_(bindparam("c_ids", expanding=True)))
    .values(version=customer_locks.c.version + 1)
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

# The queue of blocked requests (see pathlock.fairness for who waits for whom).
ENQUEUE = insert(path_lock_waiters).values(
    customer_id=bindparam("c_id"),
    lease_id=bindparam("l_id"),
    paths=bindparam("w_paths"),
    node_id=bindparam("o_node"),
    pid=bindparam("o_pid"),
    thread=bindparam("o_thread"),
    reason=bindparam("why"),
    created_at=now(),
    expires_at=now_plus(bindparam("w_ttl_us", type_=BigInteger)),
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
# Keeps a live waiter's place; never revives a row that lapsed (others may have
# gone ahead of it meanwhile: it queues again with a new ticket).
REFRESH_WAITER = (
    update(path_lock_waiters)
    .where(
        path_lock_waiters.c.ticket == bindparam("w_ticket"),
        path_lock_waiters.c.lease_id == bindparam("l_id"),
        path_lock_waiters.c.expires_at > now(),
    )
    .values(expires_at=now_plus(bindparam("w_ttl_us", type_=BigInteger)))
)
# The requesting owner's live locks: the queue passes over waiters that wait
# for them, and a cycle through another owner's queued request is a deadlock.
OWNER_LOCKS = select(path_locks.c.path, path_locks.c.mode).where(
    path_locks.c.customer_id == bindparam("c_id"),
    path_locks.c.node_id == bindparam("o_node"),
    path_locks.c.pid == bindparam("o_pid"),
    path_locks.c.thread == bindparam("o_thread"),
    path_locks.c.expires_at > now(),
)

# Operator clean-up.
LEASE_CUSTOMER = (
    select(path_locks.c.customer_id).where(path_locks.c.lease_id == bindparam("l_id")).limit(1)
)
NODE_CUSTOMERS = (
    select(path_locks.c.customer_id)
    .where(path_locks.c.node_id == bindparam("o_node"))
    .union(
        select(path_lock_waiters.c.customer_id).where(
            path_lock_waiters.c.node_id == bindparam("o_node")
        )
    )
)
RELEASE_NODE = delete(path_locks).where(
    path_locks.c.customer_id == bindparam("c_id"),
    path_locks.c.node_id == bindparam("o_node"),
)
RELEASE_NODE_WAITERS = delete(path_lock_waiters).where(
    path_lock_waiters.c.customer_id == bindparam("c_id"),
    path_lock_waiters.c.node_id == bindparam("o_node"),
)


def expired_batch(table: Table, key: Column[int]) -> tuple[Select[Any], Delete]:
    """The reaper's two statements for ``table``: pick the ids of up to
    ``batch`` rows that expired by ``cutoff`` (the database's time when the run
    began, so a run ends even while rows keep expiring), oldest expiry first
    along the expires_at index; then delete those ids. Renewal never extends an
    expired row, so a picked row stays expired; the DELETE still checks, so it
    is correct on its own. Several reapers at once are harmless: the later one
    deletes nothing."""
    pick = (
        select(key)
        .where(table.c.expires_at <= bindparam("cutoff", type_=DateTime()))
        .order_by(table.c.expires_at)
        .limit(bindparam("batch", type_=Integer))
    )
    remove = delete(table).where(
        key.in_(bindparam("ids", expanding=True)), table.c.expires_at <= now()
    )
    return pick, remove


REAP_LOCKS = expired_batch(path_locks, path_locks.c.id)
REAP_WAITERS = expired_batch(path_lock_waiters, path_lock_waiters.c.ticket)

WAITER_COLUMNS = (
    path_lock_waiters.c.customer_id,
    path_lock_waiters.c.ticket,
    path_lock_waiters.c.lease_id,
    path_lock_waiters.c.paths,
    path_lock_waiters.c.node_id,
    path_lock_waiters.c.pid,
    path_lock_waiters.c.thread,
    path_lock_waiters.c.reason,
    path_lock_waiters.c.created_at,
    path_lock_waiters.c.expires_at,
)
# How many queued requests one denied attempt reads; per customer the queue is
# short (a few requests a second), this only bounds a pathological one.
MAX_WAITERS = 1000
LIVE_WAITERS = (
    select(*WAITER_COLUMNS)
    .where(
        path_lock_waiters.c.customer_id == bindparam("c_id"),
        path_lock_waiters.c.expires_at > now(),
    )
    .order_by(path_lock_waiters.c.ticket)
    .limit(MAX_WAITERS)
)
