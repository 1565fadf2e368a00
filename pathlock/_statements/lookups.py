"""What callers and operators look up: an owner's locks, a lease's rows, the
locks on a path, the customer of a lease.
"""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Select,
    and_,
    bindparam,
    false,
    or_,
    select,
)

from pathlock._statements.common import LOCK_COLUMNS, items, now, of_lease
from pathlock.dialects import (
    PathIn,
    PathIs,
    PathWithin,
)
from pathlock.schema import path_locks


def _owner_locks(*columns: Any) -> Select[Any]:
    """The requesting owner's live locks: the queue passes over waiters that
    wait for them, and a cycle through another owner's queued request is a
    deadlock."""
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
    .where(*of_lease(path_locks))
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
