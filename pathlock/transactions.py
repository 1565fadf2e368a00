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

from pathlock import deadlines, interrupts
from pathlock.backends import READ_ONLY, bound_busy_wait, check_dialect
from pathlock.errors import BackendError, ContentionTimeout, DatabaseTimeout
from pathlock.routing import Node, Router
from pathlock.statements import BUMP, CREATE_SENTINEL, VERSION
from pathlock.transient import CONTENTION, error_code, hint, is_node_failure, is_transient

# Retries are logged under the name they always had, which operators may filter on.
log = logging.getLogger("pathlock.store")

T = TypeVar("T")


CALL_TIME = 10.0
"""Seconds an operation may take when its caller gives no time of its own
(listings, releases, the reaper's batches, renewals, a lock request without
a timeout): connecting, every statement, retries and sleeps. Lost races
(error 1213) are retried for as long, then :class:`ContentionTimeout`; an
operation that got no answer in time raises :class:`DatabaseTimeout`."""
GRACE = 0.5
"""Seconds past its time that an operation may still spend finding out whether
a COMMIT that got no reply took effect: one more attempt, which looks for its
own rows first (see ``Store.try_grant``). Never past a limit set around the
call (:func:`pathlock.deadlines.limit`)."""
CONTENTION_DELAY = 0.005
"""The first retry after a lost race sleeps up to this long (full jitter), and
each further one up to twice as long as the one before, to at most
:data:`CONTENTION_DELAY_CAP`: short, because on a cluster the winner's
transaction is already over when the loser hears of it."""
CONTENTION_DELAY_CAP = 0.1
PING_TIME = 1.0
"""Seconds a node that let an attempt time out has to answer ``SELECT 1`` on
another connection (at most half the time left): one that answers was only
slow, one that does not is passed over."""
SHORTEST_PING = 0.1
"""With less time than this for the ping, a node that let an attempt time out
is kept for the rest of the operation: too little time is left to tell a hung
node from a slow one, or to make use of another node."""


class _Tries:
    """The time and the failures of one operation's attempts so far."""

    def __init__(self, action: str, deadline: float | None, patience: float | None) -> None:
        self.action = action
        self.began = time.monotonic()
        cap = deadlines.ceiling()
        self.ends = min(self.began + CALL_TIME if deadline is None else deadline, cap)
        self.resolve_by = min(self.ends + GRACE, cap)
        self.patience = self.ends if patience is None else min(patience, self.ends)
        self.failed: list[Node] = []
        self.kept: list[Node] = []  # nodes kept after a timeout (see _failed_over)
        self.failures = self.contention = 0
        self.unanswered = False  # the last attempt's COMMIT got no reply
        self.last: DBAPIError | None = None

    def next_ends(self) -> float:
        """When the next attempt must be over; raises :class:`DatabaseTimeout`
        when none may start: the time is up, unless a COMMIT is to be resolved."""
        now = time.monotonic()
        if now < self.ends:
            return self.ends
        if self.unanswered and now < self.resolve_by:
            return self.resolve_by
        raise self.out_of_time() from self.last

    def out_of_time(self) -> DatabaseTimeout:
        cause: BaseException = self.last or TimeoutError("no time left for a database call")
        seconds = max(self.ends - self.began, 0.0)
        return DatabaseTimeout(self.action, cause, f"no answer within {seconds:.3g} s")

    def fit(self, delay: float) -> float:
        """``delay``, or less to resolve an unanswered COMMIT in time; raises
        :class:`DatabaseTimeout` if the next attempt could not start in time."""
        now = time.monotonic()
        if now + delay < self.ends:
            return delay
        if self.unanswered and now < self.resolve_by:
            return 0.0
        raise self.out_of_time() from self.last


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
        deadline: float | None = None,
        patience: float | None = None,
    ) -> T:
        """Run ``operation(connection, attempt)`` in a transaction on the best
        node for ``customer_id`` (see :mod:`pathlock.routing`) and retry it
        after transient failures, all by the monotonic time ``deadline``
        (default: :data:`CALL_TIME` from now; never past a limit set around
        the call), waits on the network and for locks included:

        - a node failure (lost connection, no answer in time, a node outside
          its cluster) moves to the next node at once, the first time each
          node fails; while another node is left to try, an attempt gets half
          the time left. A node that let an attempt time out is asked whether
          it is alive first (see :meth:`_failed_over`), and kept if it is;
        - other transient errors are retried up to ``max_attempts`` times,
          with exponential backoff, then :class:`BackendError`;
        - lost races (1213) are retried with short jittered sleeps until the
          monotonic time ``patience`` (default: the deadline), then
          :class:`ContentionTimeout`;
        - past the deadline, :class:`DatabaseTimeout`; except that an attempt
          whose COMMIT got no reply is followed by one more, for up to
          :data:`GRACE` seconds, to find out whether it took effect.

        ``attempt`` counts from 1 over every try. A ``read_only`` transaction on
        SQLite does not take the write lock (see :mod:`pathlock.backends`)."""
        tries = _Tries(action, deadline, patience)
        attempt = 0
        while True:
            ends = tries.next_ends()
            attempt += 1
            node = self.router.pick(customer_id, tries.failed)
            if len(tries.failed) < len(self.router.nodes) - 1 and node not in tries.kept:
                # Another node is left to try: this one gets half the time
                # left, so that a node that hangs is passed over in time.
                now = time.monotonic()
                ends = now + (ends - now) / 2
            try:
                with deadlines.limit(ends) as limit:
                    try:
                        result = _attempt(node, operation, attempt, read_only=read_only)
                    finally:
                        tries.unanswered = limit.commit_unanswered
            except DBAPIError as error:
                if not is_transient(error):
                    raise BackendError(action, error, hint(error)) from error
                tries.last = error
                if self._failed_over(tries, node, error):
                    continue  # the next node, at once
                time.sleep(self._retry_delay(tries, error))
            except SQLAlchemyError as error:
                raise BackendError(action, error) from error
            else:
                if tries.contention > self.max_attempts:
                    log.warning("%s: done after %d lost races", action, tries.contention)
                return result

    def once(
        self, operation: Callable[[Connection, int], T], *, seconds: float
    ) -> tuple[bool, T | None]:
        """Run ``operation`` on the first node that answers, one attempt per
        node, within ``seconds`` in all: ``(True, result)``, or ``(False,
        None)`` if no node answered. No retries, no warnings, no node set
        aside: for checks that are skipped when the database is away."""
        with deadlines.limit(time.monotonic() + seconds):
            for node in self.router.order(None):
                try:
                    return True, _attempt(node, operation, 1, read_only=True)
                except DBAPIError as error:
                    if not is_transient(error):
                        raise BackendError("checking the database", error) from error
        return False, None

    def _failed_over(self, tries: _Tries, node: Node, error: DBAPIError) -> bool:
        """Set ``node`` aside if ``error`` says it failed; whether to try again
        at once (on another node, or on this one when it turned out to be only
        slow)."""
        if not is_node_failure(error) or node in tries.failed:
            return False
        if len(self.router.nodes) > 1 and _timed_out(error):
            # No answer in time: a hung node, or a statement that waited for a
            # row lock behind busy (or frozen) clients of the same customer.
            # Failing over would not help the second (the rows are the same on
            # every node) and would send the customer's writes through several
            # nodes of a cluster, where they abort each other. Ask the node,
            # if there is time to; the next attempt on a kept node gets all the
            # time left (or resolves an unanswered COMMIT there).
            if node in tries.kept:
                return True  # its time is up, unless a COMMIT is to be resolved
            budget = min(PING_TIME, (tries.ends - time.monotonic()) / 2)
            if budget < SHORTEST_PING or self._answers(node, budget):
                tries.kept.append(node)
                return True
        self.router.set_aside(node, error)
        tries.failed.append(node)
        return len(tries.failed) < len(self.router.nodes)

    @staticmethod
    def _answers(node: Node, budget: float) -> bool:
        """Whether ``node`` answers ``SELECT 1`` within ``budget`` seconds."""

        def ping(connection: Connection, _attempt_number: int) -> None:
            connection.exec_driver_sql("SELECT 1").scalar()
            connection.rollback()

        try:
            with deadlines.limit(time.monotonic() + budget):
                _attempt(node, ping, 1, read_only=True)
        except DBAPIError:
            return False
        return True

    def _retry_delay(self, tries: _Tries, error: DBAPIError) -> float:
        # Time first: a retry that cannot start in time is not logged as one.
        tries.fit(0.0)
        if error_code(error) == CONTENTION:
            tries.contention += 1
            delay = self._contention_delay(tries.action, error, tries.contention, tries.patience)
        else:
            tries.failures += 1
            delay = self._failure_delay(tries.action, error, tries.failures)
        return tries.fit(delay)

    def _failure_delay(self, action: str, error: DBAPIError, failures: int) -> float:
        if failures >= self.max_attempts:
            raise BackendError(
                action,
                error,
                f"transient error persisted through {failures} "
                + ("attempt" if failures == 1 else "attempts"),
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
    # Whether the connection may go back to the pool: only when the operation
    # ended its transaction itself, or failed with a database error that left
    # the protocol in step. Anything else (an interrupt such as Ctrl-C or an
    # exception from a signal handler, possibly in the middle of reading a
    # reply, of a batch, or of the clean-up below) discards it: a connection
    # interrupted mid-protocol answers the next query with the previous one's
    # reply ("Packet sequence number wrong").
    reusable = False
    connection: Connection | None = None
    try:
        # In the main thread, a signal handler that raises (Ctrl-C) while the
        # pool's lock is held would leave it held for good: held back there
        # (opening a connection stays interruptible: see backends.py).
        with interrupts.held_back():
            connection = node.engine.connect()
        bound_busy_wait(connection, deadlines.ceiling())
        if read_only:
            connection.execution_options(**{READ_ONLY: True})
        try:
            result = operation(connection, attempt)
        except DBAPIError:
            _end_transaction(connection)
            reusable = True
            raise
        except Exception as error:
            interrupt = _interrupt_behind(error)
            if interrupt is not None:
                raise interrupt from None
            raise
        reusable = True
        return result
    finally:
        if connection is not None:
            with interrupts.held_back():
                if not reusable:
                    _discard(connection)
                connection.close()


def _timed_out(error: DBAPIError) -> bool:
    """A socket timeout (PyMySQL says "timed out" in a lost-connection error)."""
    return "timed out" in str(error.orig)


def _interrupt_behind(error: BaseException) -> BaseException | None:
    """The interrupt (KeyboardInterrupt, SystemExit, ...) that ``error`` was
    raised while handling, if any. SQLAlchemy's commit asserts its state in a
    ``finally`` clause: a Ctrl-C in the middle of a COMMIT surfaces as an
    AssertionError, and the caller must see the Ctrl-C."""
    seen: set[int] = set()
    context = error.__context__
    while context is not None and id(context) not in seen:
        if not isinstance(context, Exception):
            return context
        seen.add(id(context))
        context = context.__context__
    return None


def _discard(connection: Connection) -> None:
    """Close the connection's socket and drop it from the pool; the server
    rolls back whatever transaction it had open."""
    try:
        connection.invalidate()
    except Exception:  # it is being thrown away anyway
        log.debug("discarding an interrupted connection failed", exc_info=True)


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
