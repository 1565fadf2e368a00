"""Work on the whole table: a node's locks released, expired rows reaped in
batches (their customers' counts kept), and the counts of customers
recounted.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Delete,
    Integer,
    Select,
    Table,
    and_,
    bindparam,
    delete,
    func,
    literal_column,
    or_,
    select,
    update,
)

from pathlock._statements.common import now
from pathlock.schema import customer_locks, path_lock_waiters, path_locks
from pathlock.types import DETACHED

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
