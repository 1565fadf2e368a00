"""What pathlock does besides granting and releasing: listings for operators
and the command line, operators' releases, and the reaper."""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Delete, Select, select
from sqlalchemy.exc import DBAPIError

from pathlock._core.records import as_utc, given_data, lock_info, waiter_info
from pathlock._statements.common import LOCK_COLUMNS, now
from pathlock._statements.conflicts import NO_PATH
from pathlock._statements.grants import LOCKS_REMOVED, WAITERS_REMOVED
from pathlock._statements.lookups import LEASE_CUSTOMER, LEASE_ROWS, locks_on
from pathlock._statements.queue import WAITER_COLUMNS
from pathlock._statements.upkeep import (
    HOLD_SENTINELS,
    NODE_CUSTOMERS,
    REAP_LOCKS,
    REAP_WAITERS,
    RECOUNT,
    RELEASE_NODE,
    RELEASE_NODE_WAITERS,
    UNCOUNTED,
    counted_down,
)
from pathlock._transactions import Transactions, delete_counted
from pathlock.paths import ancestors as ancestors_of
from pathlock.paths import descendants_range
from pathlock.schema import customer_locks, path_lock_waiters, path_locks, version_table
from pathlock.types import LockInfo, WaiterInfo


@dataclass(frozen=True, slots=True)
class LeaseRows:
    """The rows of one lease, as :meth:`Upkeep.lease_rows` read them."""

    rows: list[tuple[LockInfo, bool]]
    """By path, each with whether it is live."""
    database_now: datetime | None
    """The database's time (``None`` without rows)."""
    data: bytes | str | None
    """The lease's data, as given."""


class Upkeep:
    """Listings, operators' releases and the reaper, run through
    ``transactions`` (the same nodes, retries and settings as the grants)."""

    def __init__(self, transactions: Transactions) -> None:
        self._tx = transactions

    def list_locks(self, customer_id: int | None, *, include_expired: bool) -> list[LockInfo]:
        """Rows of one customer (or all), by customer and path."""
        query = select(*LOCK_COLUMNS).order_by(
            path_locks.c.customer_id, path_locks.c.path, path_locks.c.lease_id
        )
        if customer_id is not None:
            query = query.where(path_locks.c.customer_id == customer_id)
        if not include_expired:
            query = query.where(path_locks.c.expires_at > now())

        def attempt(connection: Connection, _number: int) -> list[LockInfo]:
            rows = connection.execute(query).all()
            connection.rollback()
            return [lock_info(row) for row in rows]

        return self._tx.run("listing locks", attempt, read_only=True, customer_id=customer_id)

    def lease_rows(self, customer_id: int, lease_id: str) -> LeaseRows:
        """The rows of one lease of ``customer_id``: one indexed read."""
        parameters = {"c_id": customer_id, "l_id": lease_id}

        def attempt(connection: Connection, _number: int) -> LeaseRows:
            rows = connection.execute(LEASE_ROWS, parameters).all()
            connection.rollback()
            stored = next((row.data for row in rows if row.data is not None), None)
            return LeaseRows(
                [(lock_info(row), bool(row.live)) for row in rows],
                as_utc(rows[0].database_now) if rows else None,
                given_data(stored),
            )

        return self._tx.run("looking up a lease", attempt, read_only=True, customer_id=customer_id)

    def locks_on(
        self,
        customer_id: int,
        path: str,
        *,
        ancestors: bool,
        descendants: bool,
        include_expired: bool,
    ) -> list[LockInfo]:
        """Rows of ``customer_id`` on the normalized ``path``, on its
        ``ancestors`` (those that cover their subtree) and on its
        ``descendants`` (as asked), by path: one indexed read."""
        parameters: dict[str, Any] = {
            "c_id": customer_id,
            "on_path": path,
            "above_paths": (ancestors_of(path) if ancestors else []) or [NO_PATH],
        }
        if descendants:
            parameters["below_low"], parameters["below_high"] = descendants_range(path)
        query = locks_on(descendants=descendants, include_expired=include_expired)

        def attempt(connection: Connection, _number: int) -> list[LockInfo]:
            rows = connection.execute(query, parameters).all()
            connection.rollback()
            return [lock_info(row) for row in rows]

        return self._tx.run("looking up locks", attempt, read_only=True, customer_id=customer_id)

    def database_time(self) -> datetime:
        """The database's clock, in UTC: the clock every expiry is judged by."""

        def attempt(connection: Connection, _number: int) -> datetime:
            value = connection.execute(select(now())).scalar_one()
            connection.rollback()
            return as_utc(value)

        return self._tx.run("reading the database's clock", attempt, read_only=True)

    def list_waiters(self, customer_id: int | None) -> list[WaiterInfo]:
        """Queued requests of one customer (or all), oldest ticket first."""
        query = select(*WAITER_COLUMNS).order_by(
            path_lock_waiters.c.customer_id, path_lock_waiters.c.ticket
        )
        if customer_id is not None:
            query = query.where(path_lock_waiters.c.customer_id == customer_id)
        query = query.where(path_lock_waiters.c.expires_at > now())

        def attempt(connection: Connection, _number: int) -> list[WaiterInfo]:
            rows = connection.execute(query).all()
            connection.rollback()
            return [waiter_info(row) for row in rows]

        return self._tx.run("listing waiters", attempt, read_only=True, customer_id=customer_id)

    # -- operators and the reaper ------------------------------------------------

    def recorded_revision(self, seconds: float) -> tuple[bool, str | None]:
        """Whether a node answered within ``seconds``, and the revision of
        pathlock's tables it records (``None``: none, or no version table)."""

        def attempt(connection: Connection, _number: int) -> str | None:
            try:
                revision = connection.execute(select(version_table.c.version_num)).scalar()
            except DBAPIError as error:
                if not self._tx.dialect.is_missing_table(error):
                    raise
                revision = None
            connection.rollback()
            return revision

        return self._tx.once(attempt, seconds=seconds)

    def lease_customer(self, lease_id: str) -> int | None:
        """The customer whose rows carry ``lease_id``, or ``None``."""

        def attempt(connection: Connection, _number: int) -> int | None:
            customer_id = connection.execute(LEASE_CUSTOMER, {"l_id": lease_id}).scalar()
            connection.rollback()
            return None if customer_id is None else int(customer_id)

        return self._tx.run("looking up a lease", attempt, read_only=True)

    def release_node(self, node_id: str) -> dict[int, int]:
        """Delete every lock and waiter row of ``node_id``, one customer per
        transaction (each writes its sentinel, like any release); return the
        number of lock rows deleted per customer touched."""

        def customers(connection: Connection, _number: int) -> list[int]:
            found = connection.execute(NODE_CUSTOMERS, {"o_node": node_id}).scalars().all()
            connection.rollback()
            return sorted(int(customer_id) for customer_id in found)

        return {
            customer_id: self._tx.run(
                "releasing a node's locks",
                functools.partial(self._release_node_of, customer_id, node_id),
                customer_id=customer_id,
            )
            for customer_id in self._tx.run("finding a node's locks", customers, read_only=True)
        }

    def _release_node_of(
        self, customer_id: int, node_id: str, connection: Connection, _number: int
    ) -> int:
        self._tx.bump(connection, customer_id)
        parameters = {"c_id": customer_id, "o_node": node_id}
        deleted = delete_counted(connection, RELEASE_NODE, parameters, LOCKS_REMOVED)
        delete_counted(connection, RELEASE_NODE_WAITERS, parameters, WAITERS_REMOVED)
        connection.commit()
        return deleted

    def reap(self, batch_size: int, stop: Callable[[], bool]) -> tuple[int, int]:
        """Delete the lock rows and waiter rows that had expired when the run
        began, ``batch_size`` rows per transaction, until none are left or
        ``stop()`` says so; then count the rows of customers whose counts
        are not trusted (see :meth:`count_rows`). Return (locks, waiters)
        deleted.

        The version does not move: an expired row already blocks nobody, so
        deleting it changes no grant; short batches never hold many row locks
        at a time. Each customer's count goes down with its rows, under its
        sentinel row, locked first as a release locks it."""
        cutoff = self.database_time().replace(tzinfo=None)  # DATETIME columns are naive UTC
        reaped = (
            self._reap_table(
                "reaping expired locks",
                REAP_LOCKS,
                customer_locks.c.lock_rows,
                batch_size,
                cutoff,
                stop,
            ),
            self._reap_table(
                "reaping dead waiters",
                REAP_WAITERS,
                customer_locks.c.waiter_rows,
                batch_size,
                cutoff,
                stop,
            ),
        )
        self.count_rows(batch_size, stop)
        return reaped

    def _reap_table(  # noqa: PLR0917 - private, called twice just above
        self,
        action: str,
        statements: tuple[Select[Any], Select[Any], Delete],
        column: Any,
        batch_size: int,
        cutoff: datetime,
        stop: Callable[[], bool],
    ) -> int:
        pick, hold, remove = statements
        parameters = {"batch": batch_size, "cutoff": cutoff}

        def batch(connection: Connection, _number: int) -> tuple[int, int]:
            picked = connection.execute(pick, parameters).all()
            if not picked:
                connection.rollback()
                return 0, 0
            customers = sorted({int(customer_id) for _key, customer_id in picked})
            # The sentinel rows first, in key order, as a release takes them;
            # then the rows, locked, so none goes between the count and the
            # DELETE.
            connection.execute(HOLD_SENTINELS, {"c_ids": customers})
            held = connection.execute(hold, {"ids": sorted(key for key, _ in picked)}).all()
            gone = Counter(int(customer_id) for _key, customer_id in held)
            if held:
                connection.execute(remove, {"ids": sorted(int(key) for key, _ in held)})
                for statement, counts in counted_down(column, gone):
                    connection.execute(statement, counts)
            connection.commit()
            return len(picked), len(held)

        total = 0
        while not stop():
            picked, deleted = self._tx.run(action, batch)
            total += deleted
            if picked < batch_size:
                break
        return total

    def count_rows(self, batch_size: int, stop: Callable[[], bool]) -> int:
        """Count afresh the lock and queue rows of every customer whose
        counts are not trusted (never counted: customers locked before
        revision 0008; or moved past by a pathlock without the counts during
        a rolling upgrade) or are too high for a customer with no rows (see
        ``UNCOUNTED``), ``batch_size`` customers per transaction, until
        none are left or ``stop()`` says so; the customers counted. A
        customer's grants skip the conflict and queue searches only while
        its counts are trusted and say it has no rows."""

        def batch(after: int, connection: Connection, _number: int) -> tuple[int, int]:
            found = connection.execute(UNCOUNTED, {"after": after, "batch": batch_size})
            customers = sorted(int(customer_id) for customer_id in found.scalars())
            if not customers:
                connection.rollback()
                return 0, after
            connection.execute(HOLD_SENTINELS, {"c_ids": customers})
            connection.execute(RECOUNT, {"c_ids": customers})
            connection.commit()
            return len(customers), customers[-1]

        total, after = 0, -(2**63)
        while not stop():
            counted, after = self._tx.run(
                "counting customers' rows", functools.partial(batch, after)
            )
            total += counted
            if counted < batch_size:
                break
        return total
