"""The queue of waiting requests: a request queued (with its paths), taken
out, refreshed and read back, and what a waiting request watches to know
when to look again.
"""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import (
    BigInteger,
    Insert,
    Integer,
    Select,
    String,
    bindparam,
    case,
    delete,
    exists,
    func,
    insert,
    literal_column,
    null,
    or_,
    select,
    union,
    update,
)

from pathlock._statements.common import OWNER_VALUES, items, now, now_plus, of_lease, requested_rows
from pathlock._statements.conflicts import Shape, no_conflict, owner_holds, queued_conflicts
from pathlock._statements.grants import (
    GRANTED,
    LEASE_DATA,
    case_rule_holds,
    first_requested,
    requested_columns,
)
from pathlock._statements.leases import HANDED_FOR, LEFT_US, OWN_ROWS
from pathlock.dialects import (
    Changed,
    InGrantTime,
)
from pathlock.schema import customer_locks, path_lock_waiter_paths, path_lock_waiters, path_locks

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
    data=LEASE_DATA,
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
    blocked = or_(*(~condition for condition in no_conflict(form)))
    if form.spelled:  # the grant asked about the requests in its way only
        blocked = or_(blocked, ~owner_holds())
    values = select(
        bindparam("c_id", type_=BigInteger),
        bindparam("l_id", type_=String),
        bindparam("w_paths", type_=String),
        *OWNER_VALUES,
        now(),
        now_plus(bindparam("w_ttl_us", type_=BigInteger)),
        bindparam("w_hand_over_us", type_=BigInteger),
        LEASE_DATA,
    ).where(
        customer_locks.c.customer_id == bindparam("c_id"),
        Changed() == literal_column("0"),
        case_rule_holds(),
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
        path, mode, depth = first_requested(shallow)
    else:
        requested = requested_rows(count, "requested", shallow)
        source = requested.join(waiters, waiters.c.ticket == newest)
        path, mode, depth = requested_columns(requested, shallow)
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


DEQUEUE_IF_GRANTED = DEQUEUE.where(GRANTED)


# A request whose outcome is in doubt (interrupted) leaves the queue by its
# lease id: the ticket may never have reached the client.
FORGET_REQUEST = delete(path_lock_waiters).where(*of_lease(path_lock_waiters))


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
LIVE_WAITER_ITEMS_IF_OWNER_HOLDS = LIVE_WAITER_ITEMS.where(owner_holds())


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
    tickets = queued_conflicts(form, path_lock_waiter_paths.c.ticket)
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


_WATCHED = (customer_locks.c.version, _OWN_TOKEN, HANDED_FOR, _NEXT_IN_LINE)


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
    path_locks.c.lease_id, func.min(path_locks.c.fencing_token), func.min(LEFT_US)
)


WATCHED_TICKETS = select(path_lock_waiters.c.ticket).where(
    path_lock_waiters.c.customer_id == bindparam("c_id"),
    path_lock_waiters.c.ticket.in_(bindparam("tickets", expanding=True)),
    path_lock_waiters.c.expires_at > now(),
)
