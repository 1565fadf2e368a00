"""A lease's own rows: taken up after a release handed them over, released,
renewed with the customers' rows locked first, and checked alive.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    bindparam,
    delete,
    func,
    select,
    update,
)

from pathlock._statements.common import now, now_plus, of_lease, own_live_rows
from pathlock._statements.grants import version_moved
from pathlock.dialects import (
    MicrosecondsLeft,
)
from pathlock.schema import customer_locks, path_locks

# The fencing token of those rows, which the request's attempt takes up.
OWN_ROWS = select(path_locks.c.fencing_token).where(*own_live_rows()).limit(1)


# How long they have left, in microseconds of the database's clock.
LEFT_US = MicrosecondsLeft(path_locks.c.expires_at)


HANDED_FOR = select(LEFT_US).where(*own_live_rows()).limit(1).scalar_subquery()


# Both, for a waiter's judgement of its chances (MySQL, MariaDB: where
# releases hand paths over): rows handed to it are taken up at once.
OWN_ROWS_LEFT = select(path_locks.c.fencing_token, LEFT_US).where(*own_live_rows()).limit(1)


# Those rows taken up by the request under the sentinel row (locked first, as
# a renewal does): they expire after the term its queue row recorded unless
# taken up, and are never extended once expired.
TAKE_UP = (
    update(path_locks)
    .where(*own_live_rows())
    .values(expires_at=now_plus(bindparam("ttl_us", type_=BigInteger)))
)


RELEASE = delete(path_locks).where(*of_lease(path_locks))


# The same, in a batch that also grants another lease (:l_id) its paths.
RELEASE_BEFORE_HAND_OVER = delete(path_locks).where(
    *of_lease(path_locks, "released_l_id", typed=True)
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
    .values(**version_moved(1, fenced=False))
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
    *of_lease(path_locks),
    path_locks.c.expires_at > now(),
)
