"""The loop of one request: attempt; if denied, wait until another attempt can
succeed; repeat until granted, timed out or deadlocked.

Waiting holds no connection and no transaction. A denied request is queued (a
row in ``path_lock_waiters``, written with its denial) and, between attempts,
only watches: it sleeps as its wait policy says, and then reads the customer's
sentinel ``version`` with a plain read. The version moves on every grant,
release and give-up, so an unchanged version means nothing to retry.
A release in this process wakes the waiter at once. When the version moved,
the next in line attempts at once; the others first judge with plain reads (no
sentinel) whether an attempt would succeed, and make one only then: they do
not queue up on the sentinel row at every hand-off. Two things move no version: a
lock that expires and a waiter that dies; the same check every
:data:`RECHECK` seconds notices those.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

from pathlock import clock, deadlines
from pathlock.errors import (
    ContentionTimeout,
    DatabaseTimeout,
    DeadlockDetected,
    LockTimeout,
    ManagerClosed,
    PathLockError,
)
from pathlock.records import WAITER_TTL, Blocked, Deadlocked, Granted, GrantRequest
from pathlock.store import Store
from pathlock.transactions import GRACE
from pathlock.types import WaiterInfo
from pathlock.waiting import Delays, LocalWakeups, WaitPolicy, Watch

log = logging.getLogger(__name__)

RECHECK = 1.0
"""Seconds between checks of a waiter whose version watch sees nothing."""
REFRESH = WAITER_TTL / 3
"""Seconds between refreshes of a waiter's queue row (it lapses after
:data:`~pathlock.records.WAITER_TTL` without one)."""
TRY_PATIENCE = 1.0
"""Seconds a try-lock keeps retrying attempts that lose races (error 1213: on a
cluster, certification failures against writes through other nodes) before
:class:`ContentionTimeout`. A blocking request retries them until its timeout."""
TRY_TIME = 10.0
"""Seconds a try-lock may take (connecting, its attempt, retries), plus
:data:`~pathlock.transactions.GRACE` to find out whether a grant whose COMMIT
got no reply took effect: a try-lock returns or raises within 10.5 s. It does
not wait for conflicting locks at all; this bounds only the database's own
waits, which under load include the write lock of a busy SQLite file and, on
a cluster, the seconds it takes to evict a dead node (1.5 s made try-locks
fail with DatabaseTimeout under such ordinary load)."""


def acquire(
    store: Store,
    wakeups: LocalWakeups,
    policy: WaitPolicy,
    request: GrantRequest,
    *,
    blocking: bool,
    wait_limit: float | None,
    closed: Callable[[], bool] = lambda: False,
) -> tuple[int, float] | None:
    """Attempt until ``request`` is granted: return its fencing token and the
    time (:func:`pathlock.clock.now`) its granting attempt started. ``None`` if ``blocking`` is
    false and the one attempt was denied. Raises :class:`LockTimeout` after
    ``wait_limit`` seconds (``None``: no limit), :class:`DeadlockDetected`
    when waiting could never succeed, and :class:`ContentionTimeout` when a
    try-lock's attempt kept losing races for :data:`TRY_PATIENCE` seconds.
    Once ``closed()`` is true (the manager closed; its close wakes local
    waiters), no further attempt is made: :class:`ManagerClosed`. Whatever
    happens, the request leaves the queue.

    Everything, the database's waits included, ends within ``wait_limit`` +
    :data:`~pathlock.transactions.GRACE` seconds (a try-lock: :data:`TRY_TIME`
    + GRACE): a blocking request whose time ran out while the database did
    not answer raises :class:`LockTimeout` with ``unanswered`` set, a try-lock
    :class:`DatabaseTimeout`. Without a ``wait_limit``, each database call has
    its own bound (:class:`DatabaseTimeout` after ``CALL_TIME``)."""
    store.prepare(request)  # client CPU, not the database's time
    began = time.monotonic()
    deadline = math.inf if wait_limit is None else began + wait_limit
    ends = deadline if blocking else began + TRY_TIME
    watch = wakeups.watch(request.customer_id)
    try:
        with deadlines.limit(ends + GRACE), watch:
            place = _Place(store, request, watch, policy.start())
            try:
                return _loop(
                    store,
                    place,
                    request,
                    blocking=blocking,
                    wait_limit=wait_limit,
                    deadline=deadline,
                    ends=ends,
                    closed=closed,
                )
            finally:
                place.leave()
    finally:
        watch.close()  # again, if an interrupt cut the with block's exit short


def _loop(
    store: Store,
    place: _Place,
    request: GrantRequest,
    *,
    blocking: bool,
    wait_limit: float | None,
    deadline: float,
    ends: float,
    closed: Callable[[], bool],
) -> tuple[int, float] | None:
    last: Blocked | None = None
    try:
        while True:
            if closed():
                raise ManagerClosed("lock paths")
            started = time.monotonic()
            # The lease's clock, for its deadline (it counts suspend).
            lease_clock = clock.now()
            # Queue only a request that will wait: one attempt that is
            # denied costs no queue row.
            queue = blocking and started < deadline
            patience = deadline if blocking else started + TRY_PATIENCE
            try:
                outcome = store.try_grant(
                    request, place.ticket, queue=queue, patience=patience, deadline=_by(ends)
                )
            except ContentionTimeout:
                if not blocking:
                    raise
                raise LockTimeout(
                    request.paths,
                    wait_limit or 0.0,
                    last.blockers if last else (),
                    last.ahead if last else (),
                    contended=True,
                ) from None
            if isinstance(outcome, Granted):
                place.ticket = None  # the grant removed the queue row
                return outcome.fencing_token, lease_clock
            if not blocking:
                return None  # a try-lock only reports the conflict
            if isinstance(outcome, Deadlocked):
                raise DeadlockDetected(request.paths, outcome.held_by, outcome.party)
            last = outcome
            place.queued(outcome.ticket, started, outcome.ahead)
            if time.monotonic() >= deadline:
                raise LockTimeout(request.paths, wait_limit or 0.0, outcome.blockers, outcome.ahead)
            place.wait(outcome.version, started, deadline)
    except DatabaseTimeout as error:
        if not blocking or wait_limit is None:
            raise
        raise LockTimeout(
            request.paths,
            wait_limit,
            last.blockers if last else (),
            last.ahead if last else (),
            unanswered=True,
        ) from error


def _by(ends: float) -> float | None:
    """The deadline of a database call made now: the request's own while it
    lasts; afterwards (the last attempt, leaving the queue) or without one,
    the call's default, which the limit around the request cuts short."""
    return ends if time.monotonic() < ends < math.inf else None


class _Place:
    """A request's place in the queue and its watch between attempts."""

    def __init__(self, store: Store, request: GrantRequest, watch: Watch, delays: Delays) -> None:
        self._store = store
        self._request = request
        self._customer_id = request.customer_id
        self._lease_id = request.lease_id
        self._watch = watch
        self._delays = delays
        self.ticket: int | None = None
        self._refresh_due = math.inf
        self._version: int | None = None
        self._next_in_line = False

    def queued(
        self, ticket: int | None, attempt_started: float, ahead: tuple[WaiterInfo, ...]
    ) -> None:
        """The outcome of a denied attempt: the request's ticket and the
        older requests that go first."""
        if ticket is not None and ticket != self.ticket:
            # The row was written by the attempt, which started at this time.
            self._refresh_due = attempt_started + REFRESH
        self.ticket = ticket
        self._next_in_line = not ahead
        self._watch.queued(ticket, (info.ticket for info in ahead))

    def wait(self, version: int, last_attempt: float, deadline: float) -> None:
        """Return when another attempt can succeed (a plain-read check says
        so after the version moved, or at the recheck), when a local release
        happened, or when the deadline passed. Keeps the queue row alive
        meanwhile."""
        self._moved_to(version)
        recheck_at = last_attempt + RECHECK
        while True:
            now = time.monotonic()
            # Behind another waiter of this process, there is nothing to poll
            # or recheck for: that one goes first, and its leaving (or its
            # place changing) wakes this one. 200 threads polling and
            # rechecking kept the database too busy to keep their rows alive.
            idle_until = deadline if self.ticket is None else min(deadline, self._refresh_due)
            wake_at = min(now + self._delays.next(), recheck_at, idle_until)
            if self._watch.wait(max(0.0, wake_at - now), max(0.0, idle_until - now)):
                return  # a release in this process (or the manager closed)
            now = time.monotonic()
            if now >= deadline:
                return  # one last attempt, for its answer
            if self.ticket is not None and now >= self._refresh_due:
                if not self._store.refresh_waiter(
                    self._customer_id, self._lease_id, self.ticket, deadline=_by(deadline)
                ):
                    # Lapsed (this process stalled) or deleted by an operator:
                    # queue again, behind whoever queued meanwhile.
                    self.ticket = None
                    self._watch.queued(None, ())
                    return
                self._refresh_due = now + REFRESH
            if self._watch.behind():
                continue
            current = self._store.version(self._customer_id, deadline=_by(deadline))
            moved = current != self._version
            if not moved and now < recheck_at:
                continue
            self._moved_to(current)
            if moved and self._next_in_line:
                return  # the likely next grant: straight to the attempt
            recheck_at = now + RECHECK
            outlook = self._store.could_grant(self._request, self.ticket, deadline=_by(deadline))
            if outlook.free:
                return
            self._next_in_line = outlook.next_in_line

    def _moved_to(self, version: int) -> None:
        if version != self._version:
            if self._version is not None:
                self._delays.reset()  # the queue is moving
            self._version = version

    def leave(self) -> None:
        """Give up the place (timeout, deadlock, error, interrupt)."""
        if self.ticket is None:
            return
        ticket, self.ticket = self.ticket, None
        try:
            self._store.leave_queue(self._customer_id, self._lease_id, ticket)
        except PathLockError as error:
            log.warning(
                "could not leave the queue (customer %d, ticket %d); the row stops "
                "counting within %g s: %s",
                self._customer_id,
                ticket,
                WAITER_TTL,
                error,
            )
