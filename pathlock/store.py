"""Where pathlock talks to the database: one operation is one short transaction
(the statements themselves are built in :mod:`pathlock.statements`).

The acquire attempt follows the design page:

1. write the customer's sentinel row (``version = LAST_INSERT_ID(version + 1)``):
   every two grants or releases of one customer now conflict, on one server and
   on a multi-master cluster alike; the new version, returned in the UPDATE's
   own reply, is the fencing token;
2. one ``INSERT ... SELECT ... WHERE NOT EXISTS`` inserts a row for every
   requested path only if no live conflicting row exists (one consistent read
   covers all paths, so it inserts all rows or none);
3. all inserted: commit; none: read the blockers (for the caller), roll back
   (the version bump goes with it). Nothing is held between attempts.

Transactions run in READ COMMITTED: under REPEATABLE READ a read before the
sentinel write would fix the snapshot and the conflict query would read the past.
Every time is the database's clock (``UTC_TIMESTAMP(6)``, independent of the
session time zone): app servers' clocks drift, the database is the one clock
they share.
"""

from __future__ import annotations

import functools
import json
import logging
import random
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from sqlalchemy import (
    Connection,
    Delete,
    Engine,
    Row,
    Select,
    select,
)
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from pathlock.backends import check_dialect
from pathlock.errors import BackendError
from pathlock.schema import path_lock_waiters, path_locks
from pathlock.statements import (
    BUMP,
    CREATE_SENTINEL,
    HELD,
    LANDED,
    LEASE_CUSTOMER,
    LOCK_COLUMNS,
    LOCK_SENTINELS,
    NODE_CUSTOMERS,
    REAP_LOCKS,
    REAP_WAITERS,
    RELEASE,
    RELEASE_NODE,
    RELEASE_NODE_WAITERS,
    RELEASE_OWNER,
    RENEW,
    VERSION,
    WAITER_COLUMNS,
    blockers_query,
    conflict_parameters,
    grant_statement,
    now,
    shape,
)
from pathlock.types import EXCLUSIVE, LockInfo, Mode, Owner, PathMode, WaiterInfo

log = logging.getLogger(__name__)

T = TypeVar("T")

# Error codes after which the same attempt can simply run again: the failed
# transaction was rolled back (or its outcome is checked, see try_grant).
TRANSIENT_ERRORS = frozenset(
    {
        1205,  # lock wait timeout
        1213,  # deadlock (and a cluster's certification failure)
        1053,  # server shutdown in progress
        1927,  # connection killed (MariaDB)
        2003,  # cannot connect (server restarting)
        2006,  # server has gone away
        2013,  # lost connection during query
        2014,  # commands out of sync (a broken connection)
        4031,  # disconnected by the server for inactivity (MySQL 8)
    }
)


@dataclass(frozen=True, slots=True)
class GrantRequest:
    """Everything one attempt needs; the lease id is chosen by the client, so an
    attempt whose commit outcome is unknown can find out whether it landed."""

    customer_id: int
    lease_id: str
    paths: tuple[PathMode, ...]
    owner: Owner
    reason: str
    ttl: float


@dataclass(frozen=True, slots=True)
class Granted:
    fencing_token: int


@dataclass(frozen=True, slots=True)
class Blocked:
    """The attempt found live conflicting rows (at most :data:`MAX_BLOCKERS`)."""

    blockers: tuple[LockInfo, ...]


def _as_utc(value: datetime) -> datetime:
    # DATETIME columns come back naive; they hold UTC by construction.
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


def _lock_info(row: Row[*tuple[Any, ...]]) -> LockInfo:
    mode: Mode = row.mode
    return LockInfo(
        customer_id=row.customer_id,
        path=row.path,
        mode=mode,
        lease_id=row.lease_id,
        owner=Owner(row.node_id, row.pid, row.thread),
        reason=row.reason,
        fencing_token=row.fencing_token,
        created_at=_as_utc(row.created_at),
        expires_at=_as_utc(row.expires_at),
    )


def _waiter_info(row: Row[*tuple[Any, ...]]) -> WaiterInfo:
    try:
        paths = tuple((str(path), mode) for path, mode in json.loads(row.paths))
    except (ValueError, TypeError):  # not pathlock's JSON: show it as it is
        paths = ((str(row.paths), EXCLUSIVE),)
    return WaiterInfo(
        customer_id=row.customer_id,
        ticket=row.ticket,
        paths=paths,
        lease_id=row.lease_id,
        owner=Owner(row.node_id, row.pid, row.thread),
        reason=row.reason,
        created_at=_as_utc(row.created_at),
        expires_at=_as_utc(row.expires_at),
    )


def _grant_parameters(request: GrantRequest, token: int) -> dict[str, Any]:
    parameters = conflict_parameters(request.paths)
    for n, (path, mode) in enumerate(request.paths):
        parameters[f"rq_path_{n}"] = path
        parameters[f"rq_mode_{n}"] = mode
    parameters.update(
        c_id=request.customer_id,
        l_id=request.lease_id,
        o_node=request.owner.node_id,
        o_pid=request.owner.pid,
        o_thread=request.owner.thread,
        why=request.reason,
        token=token,
        ttl_us=round(request.ttl * 1_000_000),
    )
    return parameters


def _error_code(error: DBAPIError) -> int | None:
    args = getattr(error.orig, "args", ())
    if args and isinstance(args[0], int):
        return args[0]
    return None


# SQLite's primary result codes (the low byte of the extended code) when the
# database is locked by another connection for longer than the busy timeout.
_SQLITE_BUSY = 5
_SQLITE_LOCKED = 6


def is_transient(error: DBAPIError) -> bool:
    """Deadlocks, lock-wait timeouts and lost connections: worth another try."""
    if error.connection_invalidated or _error_code(error) in TRANSIENT_ERRORS:
        return True
    sqlite_code = getattr(error.orig, "sqlite_errorcode", None)
    return isinstance(sqlite_code, int) and sqlite_code & 0xFF in (_SQLITE_BUSY, _SQLITE_LOCKED)


class Store:
    """The SQL operations of pathlock on one engine.

    Every public method is one transaction (or a bounded series of retries of
    one), retried on transient errors with a WARNING each time, and raises
    :class:`BackendError` for anything else.
    """

    def __init__(self, engine: Engine, *, max_attempts: int = 5, retry_delay: float = 0.05) -> None:
        check_dialect(engine.dialect.name)
        self.engine = engine
        # MySQL hands the fencing token back in the UPDATE's reply; SQLite
        # needs a SELECT (cheap: in-process, under the write lock).
        self._token_from_reply = engine.dialect.name != "sqlite"
        self.max_attempts = max_attempts
        self.retry_delay = retry_delay

    # -- the retry loop -------------------------------------------------------

    def _run(self, action: str, operation: Callable[[Connection, int], T]) -> T:
        """Run ``operation(connection, attempt)`` in a transaction, retrying
        transient failures up to ``max_attempts`` times."""
        for attempt in range(1, self.max_attempts + 1):
            try:
                with self.engine.connect() as connection:
                    return operation(connection, attempt)
            except DBAPIError as error:
                if not is_transient(error):
                    raise BackendError(action, error, _hint(error)) from error
                if attempt == self.max_attempts:
                    raise BackendError(
                        action, error, f"transient error persisted through {attempt} attempts"
                    ) from error
                delay = self.retry_delay * 2 ** (attempt - 1) * random.uniform(0.5, 1.5)  # noqa: S311
                log.warning(
                    "%s: transient database error (attempt %d of %d, retrying in %.0f ms): %s",
                    action,
                    attempt,
                    self.max_attempts,
                    delay * 1000,
                    error.orig,
                )
                time.sleep(delay)
            except SQLAlchemyError as error:
                raise BackendError(action, error) from error
        raise AssertionError("unreachable")  # pragma: no cover

    # -- the sentinel ---------------------------------------------------------

    def _bump(self, connection: Connection, customer_id: int) -> int:
        """Write the customer's sentinel row and return its new version."""
        parameters = {"c_id": customer_id}
        result = connection.execute(BUMP, parameters)
        if result.rowcount == 0:
            # First use of this customer: create the row in a transaction of
            # its own. Inserting and then updating it in one transaction
            # deadlocks when several clients start at once (each waits on the
            # others' shared lock on the new key). Nothing is held yet here.
            connection.rollback()
            connection.execute(CREATE_SENTINEL, parameters)
            connection.commit()
            result = connection.execute(BUMP, parameters)
        token: Any
        if self._token_from_reply:
            token = result.lastrowid
        else:
            token = connection.execute(VERSION, parameters).scalar()
        if not token:
            raise BackendError(
                "reading the fencing token",
                RuntimeError("the database returned no version for the sentinel"),
            )
        return int(token)

    # -- operations -----------------------------------------------------------

    def try_grant(self, request: GrantRequest) -> Granted | Blocked:
        """One attempt to grant every path of ``request`` at once."""
        request_shape = shape(request.paths)

        def attempt(connection: Connection, number: int) -> Granted | Blocked:
            token = self._bump(connection, request.customer_id)
            if number > 1:
                # The previous attempt may have failed after its COMMIT landed
                # (connection lost during COMMIT): then our rows exist, and
                # granting again would block on ourselves or insert twice.
                landed = connection.execute(LANDED, {"l_id": request.lease_id}).scalar()
                if landed is not None:
                    connection.rollback()
                    return Granted(int(landed))
            # Check and insert in one statement: the rows go in only if no live
            # conflicting row exists (the subquery is one consistent read, so
            # it is all rows or none).
            parameters = _grant_parameters(request, token)
            inserted = connection.execute(grant_statement(*request_shape), parameters).rowcount
            if inserted == len(request.paths):
                connection.commit()
                return Granted(token)
            if inserted:
                connection.rollback()
                raise BackendError(
                    "acquiring locks",
                    RuntimeError(f"{inserted} of {len(request.paths)} rows inserted; rolled back"),
                )
            # Denied: read who is in the way while still holding the sentinel,
            # so the picture is the one that denied us (for the caller's error
            # and the own-owner check).
            # The grant's parameters hold the conflict query's (and more).
            blockers = connection.execute(blockers_query(*request_shape), parameters).all()
            connection.rollback()
            return Blocked(tuple(_lock_info(row) for row in blockers))

        return self._run("acquiring locks", attempt)

    def release(self, customer_id: int, lease_id: str) -> int:
        """Delete the rows of one lease; return how many there were."""

        def attempt(connection: Connection, _number: int) -> int:
            self._bump(connection, customer_id)
            parameters = {"c_id": customer_id, "l_id": lease_id}
            deleted = connection.execute(RELEASE, parameters).rowcount
            connection.commit()
            return deleted

        return self._run("releasing a lease", attempt)

    def release_owner(self, customer_id: int, owner: Owner) -> int:
        """Delete every row ``owner`` holds for ``customer_id``."""

        def attempt(connection: Connection, _number: int) -> int:
            self._bump(connection, customer_id)
            parameters = {
                "c_id": customer_id,
                "o_node": owner.node_id,
                "o_pid": owner.pid,
                "o_thread": owner.thread,
            }
            deleted = connection.execute(RELEASE_OWNER, parameters).rowcount
            connection.commit()
            return deleted

        return self._run("releasing an owner's locks", attempt)

    def renew(
        self, customer_ids: Iterable[int], leases: Sequence[tuple[str, int]], ttl: float
    ) -> set[str]:
        """Extend ``leases`` ((lease id, row count) pairs) to expire ``ttl``
        seconds from now, database time; return the ids still held. A lease
        whose rows expired or were deleted is not renewed and not returned."""
        lease_ids = [lease_id for lease_id, _ in leases]
        expected = sum(rows for _, rows in leases)

        def attempt(connection: Connection, _number: int) -> set[str]:
            connection.execute(LOCK_SENTINELS, {"c_ids": sorted(set(customer_ids))})
            renewed = connection.execute(
                RENEW, {"l_ids": lease_ids, "ttl_us": round(ttl * 1_000_000)}
            ).rowcount
            if renewed == expected:
                held = set(lease_ids)
            else:  # some lease is gone: find out which
                held = set(connection.execute(HELD, {"l_ids": lease_ids}).scalars())
            connection.commit()
            return held

        return self._run("renewing leases", attempt)

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
            return [_lock_info(row) for row in rows]

        return self._run("listing locks", attempt)

    def database_time(self) -> datetime:
        """The database's clock, in UTC: the clock every expiry is judged by."""

        def attempt(connection: Connection, _number: int) -> datetime:
            value = connection.execute(select(now())).scalar_one()
            connection.rollback()
            return _as_utc(value)

        return self._run("reading the database's clock", attempt)

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
            return [_waiter_info(row) for row in rows]

        return self._run("listing waiters", attempt)

    # -- operators and the reaper ------------------------------------------------

    def lease_customer(self, lease_id: str) -> int | None:
        """The customer whose rows carry ``lease_id``, or ``None``."""

        def attempt(connection: Connection, _number: int) -> int | None:
            customer_id = connection.execute(LEASE_CUSTOMER, {"l_id": lease_id}).scalar()
            connection.rollback()
            return None if customer_id is None else int(customer_id)

        return self._run("looking up a lease", attempt)

    def release_node(self, node_id: str) -> dict[int, int]:
        """Delete every lock and waiter row of ``node_id``, one customer per
        transaction (each writes its sentinel, like any release); return the
        number of lock rows deleted per customer touched."""

        def customers(connection: Connection, _number: int) -> list[int]:
            found = connection.execute(NODE_CUSTOMERS, {"o_node": node_id}).scalars().all()
            connection.rollback()
            return sorted(int(customer_id) for customer_id in found)

        return {
            customer_id: self._run(
                "releasing a node's locks",
                functools.partial(self._release_node_of, customer_id, node_id),
            )
            for customer_id in self._run("finding a node's locks", customers)
        }

    def _release_node_of(
        self, customer_id: int, node_id: str, connection: Connection, _number: int
    ) -> int:
        self._bump(connection, customer_id)
        parameters = {"c_id": customer_id, "o_node": node_id}
        deleted = connection.execute(RELEASE_NODE, parameters).rowcount
        connection.execute(RELEASE_NODE_WAITERS, parameters)
        connection.commit()
        return deleted

    def reap(self, batch_size: int, stop: Callable[[], bool]) -> tuple[int, int]:
        """Delete the lock rows and waiter rows that had expired when the run
        began, ``batch_size`` rows per transaction, until none are left or
        ``stop()`` says so; return (locks, waiters) deleted.

        No sentinel is written: an expired row already blocks nobody, so
        deleting it changes no grant, and short batches never hold many row
        locks at a time."""
        cutoff = self.database_time().replace(tzinfo=None)  # DATETIME columns are naive UTC
        return (
            self._reap_table("reaping expired locks", REAP_LOCKS, batch_size, cutoff, stop),
            self._reap_table("reaping dead waiters", REAP_WAITERS, batch_size, cutoff, stop),
        )

    def _reap_table(
        self,
        action: str,
        statements: tuple[Select[Any], Delete],
        batch_size: int,
        cutoff: datetime,
        stop: Callable[[], bool],
    ) -> int:
        pick, remove = statements
        parameters = {"batch": batch_size, "cutoff": cutoff}

        def batch(connection: Connection, _number: int) -> tuple[int, int]:
            ids = sorted(connection.execute(pick, parameters).scalars())
            if not ids:
                connection.rollback()
                return 0, 0
            deleted = connection.execute(remove, {"ids": ids}).rowcount
            connection.commit()
            return len(ids), deleted

        total = 0
        while not stop():
            picked, deleted = self._run(action, batch)
            total += deleted
            if picked < batch_size:
                break
        return total


_NO_SUCH_TABLE = 1146


def _hint(error: DBAPIError) -> str:
    if _error_code(error) == _NO_SUCH_TABLE or "no such table" in str(error.orig):
        return "the pathlock tables are missing: run the migrations or manager.create_schema()"
    return ""
