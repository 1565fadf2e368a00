"""The retry loop around one transaction, and the sentinel write that
serializes a customer's grants and releases: what every operation of
:mod:`pathlock.store` and :mod:`pathlock.upkeep` is built on."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from pathlock.backends import READ_ONLY, check_dialect
from pathlock.errors import BackendError, ContentionTimeout
from pathlock.routing import Node, Router
from pathlock.statements import BUMP, CREATE_SENTINEL, VERSION
from pathlock.transient import CONTENTION, error_code, hint, is_node_failure, is_transient

# Retries are logged under the name they always had, which operators may filter on.
log = logging.getLogger("pathlock.store")

T = TypeVar("T")


CONTENTION_BUDGET = 10.0
"""Seconds an operation other than an acquire keeps retrying when it loses
races (error 1213) before :class:`ContentionTimeout`. An acquire retries them
until its caller's timeout."""
CONTENTION_DELAY = 0.005
"""The first retry after a lost race sleeps up to this long (full jitter), and
each further one up to twice as long as the one before, to at most
:data:`CONTENTION_DELAY_CAP`: short, because on a cluster the winner's
transaction is already over when the loser hears of it."""
CONTENTION_DELAY_CAP = 0.1


class Transactions:
    """The database nodes (one server, or the nodes of a cluster) and the two
    things every operation of pathlock needs: the retry loop around one
    transaction, with failover between nodes, and the customer's sentinel
    write."""

    def __init__(self, router: Router, *, max_attempts: int = 5, retry_delay: float = 0.05) -> None:
        self.router = router
        dialect = router.nodes[0].engine.dialect.name
        check_dialect(dialect)
        # MySQL hands the fencing token back in the UPDATE's reply; SQLite
        # needs a SELECT (cheap: in-process, under the write lock).
        self._token_from_reply = dialect != "sqlite"
        self.max_attempts = max_attempts
        self.retry_delay = retry_delay

    def home(self, customer_id: int) -> str:
        """The name of the node ``customer_id``'s operations go to first."""
        return self.router.order(customer_id)[0].name

    # -- the retry loop -------------------------------------------------------

    def _run(
        self,
        action: str,
        operation: Callable[[Connection, int], T],
        *,
        read_only: bool = False,
        customer_id: int | None = None,
        patience: float | None = None,
    ) -> T:
        """Run ``operation(connection, attempt)`` in a transaction on the best
        node for ``customer_id`` (see :mod:`pathlock.routing`) and retry it
        after transient failures:

        - a node failure (lost connection, a node outside its cluster) moves
          to the next node at once, the first time each node fails;
        - other transient errors are retried up to ``max_attempts`` times,
          with exponential backoff, then :class:`BackendError`;
        - lost races (1213) are retried with short jittered sleeps until the
          monotonic time ``patience`` (default: :data:`CONTENTION_BUDGET` from
          now), then :class:`ContentionTimeout`.

        ``attempt`` counts from 1 over every try. A ``read_only`` transaction on
        SQLite does not take the write lock (see :mod:`pathlock.backends`)."""
        if patience is None:
            patience = time.monotonic() + CONTENTION_BUDGET
        failed: list[Node] = []
        failures = contention = 0
        attempt = 0
        while True:
            attempt += 1
            node = self.router.pick(customer_id, failed)
            try:
                result = _attempt(node, operation, attempt, read_only=read_only)
            except DBAPIError as error:
                if not is_transient(error):
                    raise BackendError(action, error, hint(error)) from error
                if is_node_failure(error) and node not in failed:
                    self.router.set_aside(node, error)
                    failed.append(node)
                    if len(failed) < len(self.router.nodes):
                        continue  # the next node, at once
                if error_code(error) == CONTENTION:
                    contention += 1
                    delay = self._contention_delay(action, error, contention, patience)
                else:
                    failures += 1
                    delay = self._failure_delay(action, error, failures)
                time.sleep(delay)
            except SQLAlchemyError as error:
                raise BackendError(action, error) from error
            else:
                if contention > self.max_attempts:
                    log.warning("%s: done after %d lost races", action, contention)
                return result

    def _failure_delay(self, action: str, error: DBAPIError, failures: int) -> float:
        if failures >= self.max_attempts:
            raise BackendError(
                action, error, f"transient error persisted through {failures} attempts"
            ) from error
        delay: float = self.retry_delay * 2 ** (failures - 1) * random.uniform(0.5, 1.5)  # noqa: S311
        log.warning(
            "%s: transient database error (attempt %d of %d, retrying in %.0f ms): %s",
            action,
            failures,
            self.max_attempts,
            delay * 1000,
            error.orig,
        )
        return delay

    def _contention_delay(
        self, action: str, error: DBAPIError, contention: int, patience: float
    ) -> float:
        ceiling = min(CONTENTION_DELAY_CAP, CONTENTION_DELAY * 2 ** min(contention - 1, 16))
        delay = random.uniform(0, ceiling)  # noqa: S311
        if time.monotonic() + delay >= patience:
            raise ContentionTimeout(
                action, error, f"lost {contention} races with concurrent writes"
            ) from error
        # The first max_attempts retries of an operation are logged, then only
        # the 8th, 16th, 32nd...: on a cluster without affinity a hot customer
        # loses many races, and one line per race would drown the log.
        if contention <= self.max_attempts or contention & (contention - 1) == 0:
            log.warning(
                "%s: lost a race with a concurrent write (%d so far, retrying in %.0f ms): %s",
                action,
                contention,
                delay * 1000,
                error.orig,
            )
        return delay

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


def _attempt(
    node: Node, operation: Callable[[Connection, int], T], attempt: int, *, read_only: bool
) -> T:
    with node.engine.connect() as connection:
        if read_only:
            connection.execution_options(**{READ_ONLY: True})
        try:
            return operation(connection, attempt)
        except DBAPIError:
            _end_transaction(connection)
            raise


def _end_transaction(connection: Connection) -> None:
    """After a failed statement or COMMIT, make sure the server holds no
    transaction of this connection when it goes back to the pool (which does
    not roll back: see backends.py). A COMMIT refused without a disconnect
    (1047 on a Galera node that just left the primary component) leaves the
    transaction open on the server while SQLAlchemy counts it as ended; the
    next attempt on that connection would run inside it, see its own
    uncommitted rows as "landed", and report a grant that never committed."""
    if connection.invalidated:
        return  # the connection is gone, and the server rolled back with it
    try:
        connection.rollback()
        driver = connection.connection.driver_connection
        if driver is not None:
            driver.rollback()
    except Exception:  # noqa: BLE001 - any failure here: do not reuse the connection
        connection.invalidate()
