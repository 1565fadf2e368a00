"""The grant without searches and the release without a read of the queue
(MySQL, MariaDB), for a customer whose row says it holds nothing and has
nobody queued: one round trip each, their COMMITs included.
"""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import (
    BigInteger,
    Insert,
    String,
    bindparam,
    case,
    func,
    insert,
    literal_column,
    or_,
    select,
    update,
)

from pathlock._statements.common import OWNER_VALUES, now, now_plus, requested_rows
from pathlock._statements.grants import (
    CASE_GIVEN,
    GRANTED_COLUMNS,
    LEASE_DATA,
    case_rule_holds,
    first_requested,
    on_first_path,
    requested_columns,
    version_moved,
)
from pathlock.dialects import (
    Changed,
    Fenced,
    InsertedId,
    WaitedInTime,
)
from pathlock.schema import customer_locks, path_locks

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
        case_rule_holds(),
        _WAITED_IN_TIME,
    )
    .values(
        **version_moved(1),
        case_insensitive=CASE_GIVEN,
        lock_rows=bindparam("rows", type_=BigInteger),
    )
)


@functools.lru_cache(maxsize=64)
def lean_grant(count: int, shallow: bool = False) -> Insert:
    """The rows of a request of ``count`` paths (``shallow``: some of them
    at depth 0), inserted only if the statement before (:data:`LEAN_CLAIM`)
    wrote the sentinel; the fencing token is the version it wrote
    (``LAST_INSERT_ID()``)."""
    data: Any = LEASE_DATA
    if count == 1:
        source: Any = None
        path, mode, depth = first_requested(shallow)
    else:
        requested = requested_rows(count, "requested", shallow)
        source = requested
        path, mode, depth = requested_columns(requested, shallow)
        data = on_first_path(requested, data)
    values = select(
        bindparam("c_id", type_=BigInteger),
        bindparam("l_id", type_=String),
        path,
        mode,
        *OWNER_VALUES,
        InsertedId(),
        now(),
        now_plus(bindparam("ttl_us", type_=BigInteger)),
        data,
        depth,
    ).where(Changed() > literal_column("0"))
    if source is not None:
        values = values.select_from(source)
    return insert(path_locks).from_select(GRANTED_COLUMNS, values)


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
