"""The retry loop around one transaction, and the sentinel write that
serializes a customer's grants and releases: what every operation of
:mod:`pathlock._store` and :mod:`pathlock._upkeep` is built on."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Generator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from pathlock import _deadlines as deadlines
from pathlock import _interrupts as interrupts
from pathlock import events
from pathlock._core.flow import drive
from pathlock._polls import THREADS, Waits
from pathlock._routing import Node, Router
from pathlock._statements.grants import (
    BUMP,
    BUMP_RETURNING,
    CASE_RULE,
    CLAIM,
    CLAIM_RETURNING,
    CREATE_SENTINEL,
    VERSION,
)
from pathlock.dialects import READ_ONLY
from pathlock.dialects.base import CHANGED_ROWS, SERVER_SESSION, ServerSession
from pathlock.errors import BackendError, CaseRuleMismatch, ContentionTimeout, DatabaseTimeout
from pathlock.settings import DEFAULT, Settings

# Retries are logged under the name they always had, which operators may filter on.
log = logging.getLogger("pathlock.store")

T = TypeVar("T")


class _Tries:
    """The time and the failures of one operation's attempts so far."""

    def __init__(
        self, action: str, deadline: float | None, patience: float | None, settings: Settings
    ) -> None:
        self.action = action
        self.began = began = time.monotonic()
        cap = deadlines.ceiling()
        # As min() each, without the calls: in every grant and release.
        ends = began + settings.call_time if deadline is None else deadline
        self.ends = ends = ends if ends < cap else cap  # noqa: FURB136
        resolve_by = ends + settings.grace
        self.resolve_by = resolve_by if resolve_by < cap else cap  # noqa: FURB136
        self.patience = ends if patience is None or patience > ends else patience
        self.failed: list[Node] = []
        self.kept: list[Node] = []  # nodes kept after a timeout (see _failed_over)
        self.failures = self.contention = 0
        self.number = 0  # tries so far
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


@dataclass(frozen=True, slots=True)
class Try:
    """Run the operation once, in a transaction on ``node``, by the monotonic
    time ``ends``; ``number`` counts the tries from 1. Reply: its result and
    whether its COMMIT went unanswered; or throw :class:`AttemptFailed`."""

    node: Node
    number: int
    ends: float


@dataclass(frozen=True, slots=True)
class Ping:
    """Reply: whether ``node`` answers its dialect's ping within ``budget`` seconds."""

    node: Node
    budget: float


@dataclass(frozen=True, slots=True)
class SetAside:
    """Set ``node`` aside after ``error`` (see :meth:`Router.set_aside`). Reply: nothing."""

    node: Node
    error: DBAPIError


@dataclass(frozen=True, slots=True)
class Pause:
    """Wait ``seconds`` before the next try. Reply: nothing."""

    seconds: float


RetryStep = Try | Ping | SetAside | Pause


class AttemptFailed(Exception):
    """What a driver throws into :meth:`Transactions.retries` when a
    :class:`Try` failed with a database error: the error, and whether the
    try's COMMIT went unanswered."""

    def __init__(self, error: SQLAlchemyError, unanswered: bool) -> None:
        super().__init__(error)
        self.error = error
        self.unanswered = unanswered


class NoAnswerInTime(Exception):
    """The driver-level error (``DBAPIError.orig``) of an attempt whose time
    ran out where the driver itself keeps no time (the asyncio API's timer):
    a node that did not answer in time, whatever the database, as a socket
    timeout is to a dialect (:meth:`~pathlock.dialects.Dialect.is_timeout`)."""


def _no_answer(error: DBAPIError) -> bool:
    """Whether ``error`` is an attempt's that ran out of time (see
    :class:`NoAnswerInTime`): a node failure and a timeout on every database."""
    return isinstance(error.orig, NoAnswerInTime)


class Runner(Protocol):
    """How a transaction's attempts and the pauses between them are carried
    out: :data:`THREAD`, on the calling thread; :class:`pathlock._aio.LoopRunner`,
    on an event loop (the asyncio API). The retry loop itself is the same."""

    waits: Waits
    """How waiting requests wait for one another's reads of their customer
    (see :mod:`pathlock._polls`)."""

    def attempt(
        self,
        node: Node,
        operation: Callable[[Connection, int], T],
        number: int,
        ends: float,
        *,
        read_only: bool,
    ) -> tuple[T, bool]:
        """Run ``operation`` once in a transaction on ``node``, by the
        monotonic time ``ends``: its result and whether its COMMIT went
        unanswered; or raise :class:`AttemptFailed`."""
        ...

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` before the next attempt."""
        ...


class _ThreadRunner:
    """Attempts on the calling thread, bounded by the socket timeouts of the
    connections (:mod:`pathlock._deadlines`)."""

    waits = THREADS

    def attempt(
        self,
        node: Node,
        operation: Callable[[Connection, int], T],
        number: int,
        ends: float,
        *,
        read_only: bool,
        guard: Callable[[], AbstractContextManager[object]] = interrupts.held_back,
        cut_off: Callable[[BaseException], SQLAlchemyError | None] | None = None,
        connected: Callable[[], None] | None = None,
    ) -> tuple[T, bool]:
        """``guard`` and ``connected``: see :func:`attempt_once`. ``cut_off``:
        for an exception that is no database error, the error of an attempt
        that ran out of time if that is what it means (the asyncio API's
        timer), else ``None``."""

        def bounded(limit: deadlines.Limit) -> tuple[T, bool]:
            try:
                result = attempt_once(
                    node, operation, number, read_only=read_only, guard=guard, connected=connected
                )
            except SQLAlchemyError as error:
                raise AttemptFailed(error, limit.commit_unanswered) from error
            except BaseException as error:
                failed = None if cut_off is None else cut_off(error)
                if failed is None:
                    raise
                raise AttemptFailed(failed, limit.commit_unanswered) from error
            return result, limit.commit_unanswered

        return deadlines.within(ends, bounded)

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


THREAD = _ThreadRunner()


class Transactions:
    """The database nodes (one server, or the nodes of a cluster) and the two
    things every operation of pathlock needs: the retry loop around one
    transaction, with failover between nodes, and the customer's sentinel
    write."""

    def __init__(
        self,
        router: Router,
        *,
        max_attempts: int = 5,
        retry_delay: float = 0.05,
        case_insensitive: bool = False,
        settings: Settings = DEFAULT,
        emitter: events.Emitter = events.SILENT,
        runner: Runner = THREAD,
    ) -> None:
        self.router = router
        self.runner = runner
        self.events = emitter
        self.case_insensitive = case_insensitive
        self.settings = settings
        self.dialect = router.nodes[0].dialect
        self.max_attempts = max_attempts
        self.retry_delay = retry_delay

    def home(self, customer_id: int) -> str:
        """The name of the node ``customer_id``'s operations go to first."""
        return self.router.order(customer_id)[0].name

    # -- the retry loop -------------------------------------------------------

    def run(
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
        node for ``customer_id`` (see :mod:`pathlock._routing`) and retry it
        after transient failures, all by the monotonic time ``deadline``
        (default: ``settings.call_time`` from now; never past a limit set around
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
          ``settings.grace`` seconds, to find out whether it took effect.

        ``attempt`` counts from 1 over every try. A ``read_only`` transaction on
        SQLite does not take the write lock (see :mod:`pathlock.dialects.sqlite`)."""

        runner = self.runner
        tries = _Tries(action, deadline, patience, self.settings)
        # The first try without the generator of retries(): most operations
        # succeed at once, and a generator driven step by step costs them
        # more than the decisions it makes. A failure goes on in it, at the
        # point where retries() would be (one algorithm, two entries).
        first = self._next_try(tries, customer_id)
        try:
            result: T
            result, tries.unanswered = runner.attempt(
                first.node, operation, first.number, first.ends, read_only=read_only
            )
        except AttemptFailed as error:
            failure = error
        else:
            return result

        def run(step: RetryStep) -> Any:
            if isinstance(step, Try):
                return runner.attempt(
                    step.node, operation, step.number, step.ends, read_only=read_only
                )
            if isinstance(step, Pause):
                runner.sleep(step.seconds)
            elif isinstance(step, Ping):
                return self._answers(step.node, step.budget)
            else:
                self.router.set_aside(step.node, step.error)
            return None

        steps = self._retrying(tries, customer_id, (first, failure))
        result = drive(steps, run, AttemptFailed)
        return result

    def retries(
        self,
        action: str,
        *,
        customer_id: int | None = None,
        deadline: float | None = None,
        patience: float | None = None,
    ) -> Generator[RetryStep, Any, Any]:
        """The decisions of :meth:`run`, without I/O: which node to try and by
        when (:class:`Try`, replied with the operation's result and whether
        its COMMIT went unanswered, or failed with :class:`AttemptFailed`
        thrown in), whether a node that timed out is alive (:class:`Ping`),
        when a node is set aside (:class:`SetAside`) and how long to wait
        before the next try (:class:`Pause`). Returns the result of the try
        that succeeded; raises what :meth:`run` raises. A driver (the sync one
        is :meth:`run`) carries the steps out."""
        tries = _Tries(action, deadline, patience, self.settings)
        return (yield from self._retrying(tries, customer_id, None))

    def _next_try(self, tries: _Tries, customer_id: int | None) -> Try:
        """The next try: which node, by when; raises :class:`DatabaseTimeout`
        when none may start."""
        ends = tries.next_ends()
        tries.number += 1
        router = self.router
        node = router.pick(customer_id, tries.failed)
        if router.spares and len(tries.failed) < router.spares and node not in tries.kept:
            # Another node is left to try: this one gets half the time
            # left, so that a node that hangs is passed over in time.
            now = time.monotonic()
            ends = now + (ends - now) / 2
        return Try(node, tries.number, ends)

    def _retrying(
        self,
        tries: _Tries,
        customer_id: int | None,
        failed_try: tuple[Try, AttemptFailed] | None,
    ) -> Generator[RetryStep, Any, Any]:
        """:meth:`retries` from ``tries`` on; ``failed_try``: a try made
        already, and how it failed."""
        while True:
            if failed_try is None:
                step = self._next_try(tries, customer_id)
                try:
                    result, tries.unanswered = yield step
                except AttemptFailed as error:
                    failed_try = (step, error)
                else:
                    if tries.contention > self.max_attempts:
                        log.warning("%s: done after %d lost races", tries.action, tries.contention)
                    return result
            if failed_try is not None:
                tried, failure = failed_try
                failed_try = None
                yield from self._after_failure(tries, tried.node, failure)

    def _after_failure(
        self, tries: _Tries, node: Node, failed: AttemptFailed
    ) -> Generator[RetryStep, Any, None]:
        """What follows a try on ``node`` that failed: raises if it is not
        to be retried; returns when the next try may start."""
        action = tries.action
        tries.unanswered = failed.unanswered
        error = failed.error
        if isinstance(error, PoolTimeout):
            # The wait for a connection ends with the call's time
            # (pathlock._deadlines.bounded_pool), or the pool's own.
            raise DatabaseTimeout(
                action,
                error,
                "every connection of the pool was in use: other calls wait for the"
                " database; a bigger pool (engine_options pool_size, max_overflow)"
                " helps if they are many and the database keeps up",
            ) from error
        if not isinstance(error, DBAPIError):
            raise BackendError(action, error) from error
        if not self.dialect.is_transient(error):
            raise BackendError(action, error, self._hint(error)) from error
        tries.last = error
        if (yield from self._failed_over(tries, node, error)):
            return  # the next node, at once
        yield Pause(self._retry_delay(tries, node, error))

    def once(
        self, operation: Callable[[Connection, int], T], *, seconds: float
    ) -> tuple[bool, T | None]:
        """Run ``operation`` on the first node that answers, one attempt per
        node, within ``seconds`` in all: ``(True, result)``, or ``(False,
        None)`` if no node answered. No retries, no warnings, no node set
        aside: for checks that are skipped when the database is away."""
        ends = min(time.monotonic() + seconds, deadlines.ceiling())
        for node in self.router.order(None):
            try:
                result, _ = self.runner.attempt(node, operation, 1, ends, read_only=True)
            except AttemptFailed as failed:
                error = failed.error
                if not isinstance(error, DBAPIError) or not self.dialect.is_transient(error):
                    raise BackendError("checking the database", error) from error
            else:
                return True, result
        return False, None

    def _failed_over(
        self, tries: _Tries, node: Node, error: DBAPIError
    ) -> Generator[RetryStep, Any, bool]:
        """Set ``node`` aside if ``error`` says it failed; whether to try again
        at once (on another node, or on this one when it turned out to be only
        slow)."""
        no_answer = _no_answer(error)
        if not (no_answer or self.dialect.is_node_failure(error)) or node in tries.failed:
            return False
        if len(self.router.nodes) > 1 and (no_answer or self.dialect.is_timeout(error)):
            # No answer in time: a hung node, or a statement that waited for a
            # row lock behind busy (or frozen) clients of the same customer.
            # Failing over would not help the second (the rows are the same on
            # every node) and would send the customer's writes through several
            # nodes of a cluster, where they abort each other. Ask the node,
            # if there is time to; the next attempt on a kept node gets all the
            # time left (or resolves an unanswered COMMIT there).
            if node in tries.kept:
                return True  # its time is up, unless a COMMIT is to be resolved
            budget = min(self.settings.ping_time, (tries.ends - time.monotonic()) / 2)
            if budget < self.settings.shortest_ping or (yield Ping(node, budget)):
                tries.kept.append(node)
                return True
        yield SetAside(node, error)
        tries.failed.append(node)
        return len(tries.failed) < len(self.router.nodes)

    def _answers(self, node: Node, budget: float) -> bool:
        """Whether ``node`` answers its dialect's ping within ``budget``
        seconds (on MySQL and MariaDB ``DO 1``, which reads nothing)."""

        def ping(connection: Connection, _attempt_number: int) -> None:
            node.dialect.ping(connection)
            connection.rollback()

        ends = min(time.monotonic() + budget, deadlines.ceiling())
        try:
            self.runner.attempt(node, ping, 1, ends, read_only=True)
        except AttemptFailed as failed:
            if isinstance(failed.error, DBAPIError):
                return False
            raise failed.error from failed
        return True

    def _hint(self, error: DBAPIError) -> str:
        """What to do about an error that is not retried, if pathlock knows."""
        if self.dialect.is_missing_table(error):
            return (
                "the pathlock tables are missing: run `pathlock db upgrade` (or the Alembic "
                "migrations, or manager.create_schema())" + self.dialect.unseen_tables
            )
        return self.dialect.hint(error)

    def _retry_delay(self, tries: _Tries, node: Node, error: DBAPIError) -> float:
        # Time first: a retry that cannot start in time is not told as one.
        tries.fit(0.0)
        reason: events.Reason
        if self.dialect.is_lost_race(error):
            tries.contention += 1
            reason, count = "lost race", tries.contention
            delay = self._contention_delay(tries.action, error, count, tries.patience)
        else:
            tries.failures += 1
            reason, count = "transient", tries.failures
            delay = self._failure_delay(tries.action, error, count)
        delay = tries.fit(delay)
        self.events.retried(
            events.Retried(tries.action, reason, count, delay, node.name, str(error.orig))
        )
        return delay

    def _failure_delay(self, action: str, error: DBAPIError, failures: int) -> float:
        if failures >= self.max_attempts:
            raise BackendError(
                action,
                error,
                f"transient error persisted through {failures} "
                + ("attempt" if failures == 1 else "attempts"),
            ) from error
        delay: float = self.retry_delay * 2 ** (failures - 1) * random.uniform(0.5, 1.5)  # noqa: S311
        return delay

    def _contention_delay(
        self, action: str, error: DBAPIError, contention: int, patience: float
    ) -> float:
        first, cap = self.settings.contention_delay, self.settings.contention_delay_cap
        ceiling = min(cap, first * 2 ** min(contention - 1, 16))
        delay = random.uniform(0, ceiling)  # noqa: S311
        if time.monotonic() + delay >= patience:
            raise ContentionTimeout(
                action, error, f"lost {contention} races with concurrent writes"
            ) from error
        return delay

    # -- the sentinel ---------------------------------------------------------

    def claim_parameters(self, customer_id: int) -> dict[str, Any]:
        """The parameters of ``CLAIM``, a grant's sentinel write."""
        return {"c_id": customer_id, "c_case": self.case_insensitive}

    def bump(self, connection: Connection, customer_id: int, *, grant: bool = False) -> int:
        """Write the customer's sentinel row and return its new version. A
        ``grant`` also records the manager's case rule, and raises
        :class:`CaseRuleMismatch` if the customer's first grant recorded the
        other one."""
        statement, parameters = (
            (CLAIM, self.claim_parameters(customer_id)) if grant else (BUMP, {"c_id": customer_id})
        )
        # Where the reply does not carry the version, an UPDATE that returns
        # it saves the SELECT after it (SQLite 3.35 and newer).
        returning = not self.dialect.token_from_reply and connection.dialect.update_returning
        if returning:
            statement = CLAIM_RETURNING if grant else BUMP_RETURNING
        written, token = _sentinel_written(connection, statement, parameters, returning=returning)
        if not written:
            # First use of this customer: create the row in a transaction of
            # its own. Inserting and then updating it in one transaction
            # deadlocks when several clients start at once (each waits on the
            # others' shared lock on the new key). Nothing is held yet here.
            connection.rollback()
            connection.execute(CREATE_SENTINEL, {"c_id": customer_id})
            connection.commit()
            written, token = _sentinel_written(
                connection, statement, parameters, returning=returning
            )
            if not written and grant:
                recorded = connection.execute(CASE_RULE, {"c_id": customer_id}).scalar()
                connection.rollback()
                raise CaseRuleMismatch(customer_id, bool(recorded))
        if not returning and not self.dialect.token_from_reply:
            token = connection.execute(VERSION, {"c_id": customer_id}).scalar()
        if not token:
            raise BackendError(
                "reading the fencing token",
                RuntimeError("the database returned no version for the sentinel"),
            )
        return int(token)


def _sentinel_written(
    connection: Connection, statement: Any, parameters: dict[str, Any], *, returning: bool
) -> tuple[bool, Any]:
    """Run a sentinel write; whether it wrote the row, and the version its
    reply carries (``returning``: the row it returned; else the id
    ``LAST_INSERT_ID()`` was given, where the dialect says so)."""
    result = connection.execute(statement, parameters)
    if returning:
        row = result.first()
        return row is not None, None if row is None else row[0]
    return result.rowcount != 0, result.lastrowid


def delete_counted(
    connection: Connection, statement: Any, parameters: dict[str, Any], count: Any
) -> int:
    """Run ``statement`` (a DELETE of lock or queue rows of the customer
    ``parameters["c_id"]``, in a transaction that holds its sentinel row),
    then ``count`` (``LOCKS_REMOVED`` or ``WAITERS_REMOVED``) if it deleted
    rows, so the sentinel's count stays exact; the rows deleted."""
    deleted: int = connection.execute(statement, parameters).rowcount
    if deleted:
        connection.execute(count, {"c_id": parameters["c_id"], CHANGED_ROWS: deleted})
    return deleted


def attempt_once(
    node: Node,
    operation: Callable[[Connection, int], T],
    attempt: int,
    *,
    read_only: bool,
    guard: Callable[[], AbstractContextManager[object]] = interrupts.held_back,
    connected: Callable[[], None] | None = None,
) -> T:
    """Run ``operation(connection, attempt)`` on a connection of ``node``'s
    pool; ``guard`` is held around taking and returning the connection (see
    :mod:`pathlock._interrupts`; the asyncio API, whose tasks interleave on
    one thread, holds nothing); ``connected`` is called once the pool gave a
    connection."""
    # Whether the connection may go back to the pool: only when the operation
    # ended its transaction itself, or failed with a database error that left
    # the protocol in step. Anything else (an interrupt such as Ctrl-C or an
    # exception from a signal handler, possibly in the middle of reading a
    # reply, of a batch, or of the clean-up below) discards it: a connection
    # interrupted mid-protocol answers the next query with the previous one's
    # reply ("Packet sequence number wrong").
    reusable = False
    connection: Connection | None = None
    # The connection's server session, once the operation is under way: if
    # the connection is dropped, the server may still run what was sent.
    session: ServerSession | None = None
    try:
        # In the main thread, a signal handler that raises (Ctrl-C) while the
        # pool's lock is held would leave it held for good: held back there
        # (opening a connection stays interruptible: see dialects/mysql.py).
        with guard():
            connection = node.engine.connect()
        deadlines.note_connected()
        if connected is not None:
            connected()
        node.dialect.before_transaction(connection, deadlines.wait_ceiling())
        if node.dropped and not read_only:
            _end_dropped(node, connection)
        if read_only:
            connection.execution_options(**{READ_ONLY: True})
        try:
            session = connection.info.get(SERVER_SESSION)
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
            with guard():
                if not reusable:
                    _discard(connection)
                if session is not None and (not reusable or connection.invalidated):
                    node.dropped.add(session, DROPPED_KEEP)
                connection.close()


DROPPED_WAIT = 2.0
"""Seconds a write waits at most for the sessions of dropped connections to
end (see :func:`_end_dropped`); a killed session ends within milliseconds."""

DROPPED_KEEP = 60.0
"""Seconds a dropped connection's session is looked for at most: by then
whatever it ran has long ended."""


def _end_dropped(node: Node, connection: Connection) -> None:
    """End the server sessions of ``node``'s connections that were dropped in
    the middle of an operation, and wait until they are gone, before this
    write: what such a session was sent (a grant, say, whose request has
    since been retried, or given up and its rows deleted) must not land
    after it. One that does not end in time is looked at again before the
    next write."""
    sessions = node.dropped.current()
    ends = min(deadlines.ceiling(), time.monotonic() + DROPPED_WAIT)
    left = node.dialect.end_sessions(connection, sessions, ends)
    node.dropped.discard(session for session in sessions if session not in left)
    if left:
        log.warning(
            "%d session(s) of connections dropped on %s did not end within %.3g s",
            len(left),
            node.name,
            DROPPED_WAIT,
        )


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
        # The DB-API connection: the asyncio drivers' own rollback() is a
        # coroutine, which SQLAlchemy's adapter awaits.
        dbapi = connection.connection.dbapi_connection
        if dbapi is not None:
            dbapi.rollback()
    except Exception:  # noqa: BLE001 - any failure here: do not reuse the connection
        connection.invalidate()
