"""The check that no customer's counts on its sentinel row are too low (see
``customer_locks`` in pathlock.schema): a count below the real number of rows
would let a grant skip a conflict search it needed. A count too high only
costs speed, and tests that delete rows by hand (as an operator may) leave
one; :func:`miscounted` with ``exact=True`` finds those too."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import Connection, Engine, Table, and_, func, select

from pathlock.schema import customer_locks, path_lock_waiters, path_locks


def rows_of(engine: Engine, customer_id: int) -> tuple[int, int]:
    """(lock rows, waiter rows) of a customer, live or not."""
    with engine.connect() as connection:

        def count(table: Table) -> int:
            query = select(func.count()).where(table.c.customer_id == customer_id)
            return int(connection.execute(query).scalar_one())

        return count(path_locks), count(path_lock_waiters)


def _rows(table: Table) -> Any:
    return (
        select(func.count())
        .select_from(table)
        .where(table.c.customer_id == customer_locks.c.customer_id)
        .scalar_subquery()
    )


def miscounted(
    connection: Connection, customer_ids: Iterable[int] | None = None, *, exact: bool = False
) -> list[str]:
    """The customers (all, or ``customer_ids``) whose counts are trusted but
    too low (``exact``: or too high), each as a line that says how."""
    locks, waiters = _rows(path_locks), _rows(path_lock_waiters)
    wrong = (
        (customer_locks.c.lock_rows != locks) | (customer_locks.c.waiter_rows != waiters)
        if exact
        else (customer_locks.c.lock_rows < locks) | (customer_locks.c.waiter_rows < waiters)
    )
    query = select(
        customer_locks.c.customer_id,
        customer_locks.c.lock_rows,
        locks,
        customer_locks.c.waiter_rows,
        waiters,
    ).where(customer_locks.c.counted_version == customer_locks.c.version, wrong)
    if customer_ids is not None:
        query = query.where(customer_locks.c.customer_id.in_(list(customer_ids)))
    return [
        f"customer {customer}: lock_rows {counted} for {locks} rows,"
        f" waiter_rows {counted_waiters} for {waiters} rows"
        for customer, counted, locks, counted_waiters, waiters in connection.execute(query)
    ]


def uncounted(connection: Connection, customer_ids: Iterable[int]) -> list[int]:
    """Those of ``customer_ids`` whose counts are not trusted."""
    query = select(customer_locks.c.customer_id).where(
        customer_locks.c.customer_id.in_(list(customer_ids)),
        ~and_(
            customer_locks.c.counted_version == customer_locks.c.version,
            customer_locks.c.counted_version.is_not(None),
        ),
    )
    return list(connection.execute(query).scalars())


def count_added(connection: Connection, table: Table, rows: Iterable[dict[str, Any]]) -> None:
    """Count ``rows``, just inserted by hand into ``table`` (path_locks or
    path_lock_waiters), on their customers' sentinel rows, as pathlock counts
    the rows it inserts."""
    column = customer_locks.c.lock_rows if table is path_locks else customer_locks.c.waiter_rows
    added: dict[int, int] = {}
    for row in rows:
        customer = int(row["customer_id"])
        added[customer] = added.get(customer, 0) + 1
    for customer, count in added.items():
        connection.execute(
            customer_locks.update()
            .where(customer_locks.c.customer_id == customer)
            .values({column: column + count})
        )


def counted_rows(connection: Connection, lines: list[str]) -> list[str]:
    """The rows of the customers ``lines`` of :func:`miscounted` name, each
    as a line: who wrote them, for a failure's message."""
    customers = [int(line.split()[1].rstrip(":")) for line in lines]
    found = connection.execute(
        select(
            path_locks.c.customer_id,
            path_locks.c.lease_id,
            path_locks.c.path,
            path_locks.c.node_id,
            path_locks.c.owner_key,
            path_locks.c.reason,
            path_locks.c.fencing_token,
            path_locks.c.created_at,
            path_locks.c.expires_at,
        ).where(path_locks.c.customer_id.in_(customers))
    )
    return ["  row " + ", ".join(str(value) for value in row) for row in found]
