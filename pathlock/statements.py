"""The SQL statements of pathlock, built once with SQLAlchemy Core.

Pure construction, no execution: :mod:`pathlock.store` runs these in its
transactions. Statements whose shape depends on a request (how many exclusive
and shared paths) are cached per shape; everything that varies is a bind
parameter, so SQLAlchemy compiles each shape once.

Every time is the database's clock (``UTC_TIMESTAMP(6)``, independent of the
session time zone).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Insert,
    Integer,
    Select,
    String,
    and_,
    bindparam,
    delete,
    exists,
    func,
    insert,
    literal_column,
    or_,
    select,
    union_all,
    update,
)

from pathlock.paths import LIKE_ESCAPE, ancestors, descendants_pattern
from pathlock.schema import customer_locks, path_locks
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


def now() -> ColumnElement[datetime]:
    return func.utc_timestamp(6)


def now_plus(microseconds: ColumnElement[int]) -> ColumnElement[datetime]:
    return func.timestampadd(literal_column("MICROSECOND"), microseconds, now())


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


@functools.lru_cache(maxsize=128)
def grant_statement(exclusive: int, shared: int) -> Insert:
    """``INSERT INTO path_locks (...) SELECT ... FROM (the requested paths)
    WHERE NOT EXISTS (a live conflicting row)``: check and insert in one round
    trip. Built once per request shape; the paths are bind parameters."""
    requested = union_all(
        *(
            select(
                bindparam(f"rq_path_{n}", type_=String).label("path"),
                bindparam(f"rq_mode_{n}", type_=String).label("mode"),
            )
            for n in range(exclusive + shared)
        )
    ).subquery("requested")
    values = select(
        bindparam("c_id", type_=BigInteger),
        bindparam("l_id", type_=String),
        requested.c.path,
        requested.c.mode,
        bindparam("o_node", type_=String),
        bindparam("o_pid", type_=Integer),
        bindparam("o_thread", type_=String),
        bindparam("why", type_=String),
        bindparam("token", type_=BigInteger),
        now(),
        now_plus(bindparam("ttl_us", type_=BigInteger)),
    ).where(~exists().where(conflict_condition(exclusive, shared)))
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
    # LAST_INSERT_ID(expr) hands the new value back in the statement's own
    # reply, saving a SELECT on the hot path.
    .values(version=func.last_insert_id(customer_locks.c.version + 1))
)
# IGNORE: a concurrent first use may insert the row too.
CREATE_SENTINEL = (
    insert(customer_locks).prefix_with("IGNORE").values(customer_id=bindparam("c_id"), version=0)
)
LANDED = (
    select(path_locks.c.fencing_token).where(path_locks.c.lease_id == bindparam("l_id")).limit(1)
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
