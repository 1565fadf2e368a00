"""A grant's rows and the customer's row written with them: the INSERT of
the lock rows (after the searches, or in the same statement), the moves of
the customer's version, and the row counts kept on it.
"""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    ColumnElement,
    Insert,
    LargeBinary,
    String,
    Subquery,
    bindparam,
    case,
    exists,
    false,
    func,
    insert,
    literal_column,
    null,
    or_,
    select,
    update,
)

from pathlock._statements.common import (
    OWNER_VALUES,
    depth_0_param,
    now,
    now_plus,
    of_lease,
    own_live_rows,
    requested_rows,
)
from pathlock._statements.conflicts import Shape, no_conflict, queue_clear
from pathlock.dialects import (
    Bytes,
    Changed,
    Fenced,
    InGrantTime,
    InsertedId,
    Notice,
    SetGrantUntil,
    insert_if_absent,
)
from pathlock.schema import customer_locks, path_lock_waiters, path_locks

# The columns a grant's INSERT ... SELECT fills, in the order of its values.
GRANTED_COLUMNS = (
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
LEASE_DATA = Bytes(bindparam("l_data", type_=LargeBinary))


_WAITER_DATA = (
    select(path_lock_waiters.c.data)
    .where(path_lock_waiters.c.ticket == bindparam("w_ticket", type_=BigInteger))
    .scalar_subquery()
)


def on_first_path(requested: Subquery, data: Any) -> Any:
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
    data: Any = _WAITER_DATA if handed else LEASE_DATA
    if form.paths == 1:
        source: Any = customer_locks
        path, mode, shallow = first_requested(form.shallow)
    else:
        requested = requested_rows(form.paths, "requested", form.shallow)
        source = requested.join(customer_locks, customer_locks.c.customer_id == bindparam("c_id"))
        path, mode, shallow = requested_columns(requested, form.shallow)
        data = on_first_path(requested, data)
    values = (
        select(
            bindparam("c_id", type_=BigInteger),
            bindparam("l_id", type_=String),
            path,
            mode,
            *OWNER_VALUES,
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
            *no_conflict(form),
        )
    )
    if not fresh:
        # Never twice for one lease: rows a release handed to the request
        # (Releases.release) are taken up, not granted anew beside them (shared
        # ones would not count as a conflict).
        values = values.where(~exists().where(*own_live_rows()))
    if queued:
        values = values.where(queue_clear(form))
    if sentinel_after:
        values = values.where(case_rule_holds(), InGrantTime())
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
    return insert(path_locks).from_select(GRANTED_COLUMNS, values)


def first_requested(shallow: bool) -> tuple[Any, Any, Any]:
    """The path, mode and depth of a request of one path, from its bind
    parameters (not shallow, unless the request has shallow paths)."""
    return (
        bindparam("rq_path_0", type_=String),
        bindparam("rq_mode_0", type_=String),
        depth_0_param(0) if shallow else false(),
    )


def requested_columns(requested: Subquery, shallow: bool) -> tuple[Any, Any, Any]:
    """The path, mode and depth columns of a table of requested paths."""
    return requested.c.path, requested.c.mode, requested.c.shallow if shallow else false()


def version_moved(by: int, *, fenced: bool = True) -> dict[str, Any]:
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
    .values(**version_moved(1))
)


# BUMP for a grant: it also records the customer's case rule, and writes nothing
# (no row) when the customer's first grant recorded the other one.
CASE_GIVEN = bindparam("c_case", type_=Boolean)


def case_rule_holds() -> ColumnElement[bool]:
    return or_(
        customer_locks.c.case_insensitive == CASE_GIVEN,
        customer_locks.c.case_insensitive.is_(None),
    )


CLAIM = (
    update(customer_locks)
    .where(customer_locks.c.customer_id == bindparam("c_id"), case_rule_holds())
    .values(**version_moved(1), case_insensitive=CASE_GIVEN)
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


GRANTED = Changed() > literal_column("0")


# The first statement of a grant in one round trip (MySQL, MariaDB): until
# when, in the server's time, the client waits for its reply. The lock may
# wait long (a frozen client holds the sentinel row), and the server runs the
# rest of the query, its COMMIT included, even after the client gave up: a
# grant that begins later inserts nothing, so it cannot land unseen.
SET_GRANT_UNTIL = SetGrantUntil()


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
            *of_lease(path_locks, typed=True),
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
        case_rule_holds(),
        _rows_granted() > literal_column("0"),
    )
    .ordered_values(
        (customer_locks.c.lock_rows, customer_locks.c.lock_rows + _rows_granted()),
        (customer_locks.c.counted_version, customer_locks.c.counted_version + 1),
        (customer_locks.c.version, Fenced(customer_locks.c.version + 1)),
        (customer_locks.c.case_insensitive, CASE_GIVEN),
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
    .values(**version_moved(-1, fenced=False))
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
