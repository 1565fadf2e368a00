"""All SQL of pathlock: one operation is one short transaction.

The acquire attempt follows DESIGN.md:

1. write the customer's sentinel row (``version = version + 1``): every two
   grants or releases of one customer now conflict, on one server and on a
   multi-master cluster alike; the new version is the fencing token;
2. one query finds live conflicting rows for all requested paths at once;
3. no conflict: insert every row and commit; conflict: roll back (the version
   bump goes with it). Nothing is held between attempts.

Transactions run in READ COMMITTED: under REPEATABLE READ a read before the
sentinel write would fix the snapshot and the conflict query would read the past.
Every time is the database's clock (``UTC_TIMESTAMP(6)``, independent of the
session time zone): app servers' clocks drift, the database is the one clock
they share.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    Row,
    and_,
    delete,
    func,
    insert,
    literal_column,
    or_,
    select,
    update,
)
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from pathlock.errors import BackendError, InvalidArgument
from pathlock.paths import LIKE_ESCAPE, ancestors, descendants_pattern
from pathlock.schema import customer_locks, path_locks
from pathlock.types import EXCLUSIVE, LockInfo, Mode, Owner, PathMode

log = logging.getLogger(__name__)

T = TypeVar("T")

SUPPORTED_DIALECTS = ("mysql", "mariadb")

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

# How many conflicting rows one attempt reads back, for the caller's error
# message and the own-owner check. The conflict itself needs only one row.
MAX_BLOCKERS = 20

_LOCK_COLUMNS = (
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


def _now() -> ColumnElement[datetime]:
    return func.utc_timestamp(6)


def _now_plus(seconds: float) -> ColumnElement[datetime]:
    microseconds = round(seconds * 1_000_000)
    return func.timestampadd(literal_column("MICROSECOND"), microseconds, _now())


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


def _overlapping(paths: Sequence[str]) -> ColumnElement[bool]:
    """Rows on any of ``paths``, their ancestors or their descendants."""
    exact = set(paths)
    for path in paths:
        exact.update(ancestors(path))
    clauses: list[ColumnElement[bool]] = [path_locks.c.path.in_(sorted(exact))]
    clauses.extend(
        path_locks.c.path.like(descendants_pattern(path), escape=LIKE_ESCAPE) for path in paths
    )
    return or_(*clauses)


def conflict_condition(paths: Iterable[PathMode]) -> ColumnElement[bool]:
    """Rows that conflict with a request: any mode overlapping its exclusive
    paths, exclusive rows overlapping its shared paths."""
    exclusive = [path for path, mode in paths if mode == EXCLUSIVE]
    shared = [path for path, mode in paths if mode != EXCLUSIVE]
    clauses = []
    if exclusive:
        clauses.append(_overlapping(exclusive))
    if shared:
        clauses.append(and_(path_locks.c.mode == EXCLUSIVE, _overlapping(shared)))
    return or_(*clauses)


def check_dialect(name: str) -> None:
    """Refuse databases pathlock has no SQL for, before connecting to them."""
    if name not in SUPPORTED_DIALECTS:
        raise InvalidArgument(
            f"unsupported database {name!r}: pathlock runs on {' and '.join(SUPPORTED_DIALECTS)}"
        )


def _error_code(error: DBAPIError) -> int | None:
    args = getattr(error.orig, "args", ())
    if args and isinstance(args[0], int):
        return args[0]
    return None


def is_transient(error: DBAPIError) -> bool:
    """Deadlocks, lock-wait timeouts and lost connections: worth another try."""
    return error.connection_invalidated or _error_code(error) in TRANSIENT_ERRORS


class Store:
    """The SQL operations of pathlock on one engine.

    Every public method is one transaction (or a bounded series of retries of
    one), retried on transient errors with a WARNING each time, and raises
    :class:`BackendError` for anything else.
    """

    def __init__(self, engine: Engine, *, max_attempts: int = 5, retry_delay: float = 0.05) -> None:
        check_dialect(engine.dialect.name)
        self.engine = engine
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

    @staticmethod
    def _bump(connection: Connection, customer_id: int) -> int:
        """Write the customer's sentinel row and return its new version.

        ``LAST_INSERT_ID(expr)`` hands the new value back in the statement's own
        reply, saving a SELECT on the hot path.
        """
        bump = (
            update(customer_locks)
            .where(customer_locks.c.customer_id == customer_id)
            .values(version=func.last_insert_id(customer_locks.c.version + 1))
        )
        result = connection.execute(bump)
        if result.rowcount == 0:
            # First use of this customer. IGNORE: a concurrent first use may
            # insert it too; the UPDATE below then waits for that transaction.
            connection.execute(
                insert(customer_locks)
                .prefix_with("IGNORE")
                .values(customer_id=customer_id, version=0)
            )
            result = connection.execute(bump)
        token = result.lastrowid
        if not token:
            raise BackendError(
                "reading the fencing token",
                RuntimeError("the server did not return LAST_INSERT_ID() for the sentinel"),
            )
        return int(token)

    # -- operations -----------------------------------------------------------

    def try_grant(self, request: GrantRequest) -> Granted | Blocked:
        """One attempt to grant every path of ``request`` at once."""

        def attempt(connection: Connection, number: int) -> Granted | Blocked:
            token = self._bump(connection, request.customer_id)
            if number > 1:
                # The previous attempt may have failed after its COMMIT landed
                # (connection lost during COMMIT): then our rows exist, and
                # granting again would block on ourselves or insert twice.
                landed = connection.execute(
                    select(path_locks.c.fencing_token)
                    .where(path_locks.c.lease_id == request.lease_id)
                    .limit(1)
                ).scalar()
                if landed is not None:
                    connection.rollback()
                    return Granted(int(landed))
            blockers = connection.execute(
                select(*_LOCK_COLUMNS)
                .where(
                    path_locks.c.customer_id == request.customer_id,
                    path_locks.c.expires_at > _now(),
                    conflict_condition(request.paths),
                )
                .limit(MAX_BLOCKERS)
            ).all()
            if blockers:
                connection.rollback()
                return Blocked(tuple(_lock_info(row) for row in blockers))
            connection.execute(insert(path_locks).values(_rows(request, token)))
            connection.commit()
            return Granted(token)

        return self._run("acquiring locks", attempt)

    def release(self, customer_id: int, lease_id: str) -> int:
        """Delete the rows of one lease; return how many there were."""

        def attempt(connection: Connection, _number: int) -> int:
            self._bump(connection, customer_id)
            deleted = connection.execute(
                delete(path_locks).where(
                    path_locks.c.customer_id == customer_id,
                    path_locks.c.lease_id == lease_id,
                )
            ).rowcount
            connection.commit()
            return deleted

        return self._run("releasing a lease", attempt)

    def release_owner(self, customer_id: int, owner: Owner) -> int:
        """Delete every row ``owner`` holds for ``customer_id``."""

        def attempt(connection: Connection, _number: int) -> int:
            self._bump(connection, customer_id)
            deleted = connection.execute(
                delete(path_locks).where(
                    path_locks.c.customer_id == customer_id,
                    path_locks.c.node_id == owner.node_id,
                    path_locks.c.pid == owner.pid,
                    path_locks.c.thread == owner.thread,
                )
            ).rowcount
            connection.commit()
            return deleted

        return self._run("releasing an owner's locks", attempt)

    def list_locks(self, customer_id: int | None, *, include_expired: bool) -> list[LockInfo]:
        """Rows of one customer (or all), by customer and path."""
        query = select(*_LOCK_COLUMNS).order_by(
            path_locks.c.customer_id, path_locks.c.path, path_locks.c.lease_id
        )
        if customer_id is not None:
            query = query.where(path_locks.c.customer_id == customer_id)
        if not include_expired:
            query = query.where(path_locks.c.expires_at > _now())

        def attempt(connection: Connection, _number: int) -> list[LockInfo]:
            rows = connection.execute(query).all()
            connection.rollback()
            return [_lock_info(row) for row in rows]

        return self._run("listing locks", attempt)


def _rows(request: GrantRequest, token: int) -> list[dict[str, Any]]:
    expires_at = _now_plus(request.ttl)
    return [
        {
            "customer_id": request.customer_id,
            "lease_id": request.lease_id,
            "path": path,
            "mode": mode,
            "node_id": request.owner.node_id,
            "pid": request.owner.pid,
            "thread": request.owner.thread,
            "reason": request.reason,
            "fencing_token": token,
            "created_at": _now(),
            "expires_at": expires_at,
        }
        for path, mode in request.paths
    ]


_NO_SUCH_TABLE = 1146


def _hint(error: DBAPIError) -> str:
    if _error_code(error) == _NO_SUCH_TABLE:
        return "the pathlock tables are missing: run the migrations or manager.create_schema()"
    return ""
