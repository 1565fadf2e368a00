"""The decisions of one lock request, without I/O: attempt; if denied, queue
and wait until another attempt can succeed; repeat until granted, timed out
or deadlocked.

:class:`AcquireFlow` is a generator of *steps*: each one names a thing to do
(an attempt, a sleep, a plain read of the customer's version, ...) and
receives its outcome. It never touches the database, never sleeps and never
takes a lock; it reads the time through the settings' clock. A driver runs the
steps: :func:`pathlock._acquire.acquire` against the store, on the caller's
thread. A driver that fails a step throws the error into the generator
(``generator.throw``), which decides what it means: a lost race on a try-lock,
a request whose time ran out while the database did not answer. (httpx's
``auth_flow``, driven by both its sync and its async client, is the model.)

The flow, step by step:

- **Attempt** (:class:`Attempt`): one transaction that grants the request or
  reports what blocks it. A request that will wait is queued by its denied
  attempt (its ticket is its place); a try-lock, or a last attempt at the
  deadline, is not.
- **Place** (:class:`Place`): the denied request's ticket and the older
  requests ahead of it, for the in-process wake-ups.
- **Wait**: waiting holds no connection and no transaction. The flow sleeps
  (:class:`Sleep`) as its wait policy says, and then reads the customer's
  sentinel ``version`` (:class:`ReadVersion`). The version moves on every grant,
  release and give-up, so an unchanged version means nothing to retry. A
  release in this process ends the sleep at once. When the version moved, the
  next in line attempts at once; the others first judge with plain reads
  (:class:`Judge`) whether an attempt would succeed, and make one only then:
  they do not queue up on the sentinel row at every hand-off. Two things move
  no version: a lock that expires and a waiter that dies; the same check every
  ``recheck`` seconds notices those. A waiter behind another waiter of this
  process (:class:`Behind`) does not poll at all: that one goes first.
- **Refresh** (:class:`Refresh`): the queue row is kept alive every
  ``waiter_refresh`` seconds; one that lapsed is queued anew.
- **Leave**: whatever ends the request, a queued one leaves the queue
  (:meth:`AcquireFlow.leave`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, TypeVar

from pathlock._core.records import Blocked, Deadlocked, Granted, GrantRequest, Outlook, Watched
from pathlock.errors import (
    ContentionTimeout,
    DatabaseTimeout,
    DeadlockDetected,
    LockTimeout,
    PathLockError,
)
from pathlock.settings import Settings
from pathlock.types import WaiterInfo
from pathlock.waiting import Delays

S = TypeVar("S")
R = TypeVar("R")


def drive(
    steps: Generator[S, Any, R],
    run: Callable[[S], Any],
    thrown: type[BaseException] | tuple[type[BaseException], ...],
) -> R:
    """Run a generator of steps to its end on this thread: each step's reply
    is what ``run(step)`` returns; an error of a ``thrown`` kind that it raises
    goes back into the generator, which decides what it means. Anything else
    ends the run (an interrupt, say). Returns the generator's value."""
    reply: Any = None
    error: BaseException | None = None
    while True:
        try:
            step = steps.throw(error) if error is not None else steps.send(reply)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        reply, error = None, None
        try:
            reply = run(step)
        except thrown as failed:
            error = failed


# -- the steps ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Attempt:
    """Try to grant the request: reply with :class:`Granted`, :class:`Blocked`
    or :class:`Deadlocked`. ``queue``: a denied attempt queues the request
    (``ticket``: its place already, if any); lost races are retried until the
    monotonic time ``patience``; the database's waits end by ``deadline``
    (``None``: the call's default). ``first``: the request's first attempt,
    before which nothing can have been written for its lease."""

    ticket: int | None
    queue: bool
    patience: float
    deadline: float | None
    first: bool = False


@dataclass(frozen=True, slots=True)
class Place:
    """The request's place in the queue (``ticket``; ``None``: not queued) and
    the tickets of the older requests ahead of it; ``new``: a place it did
    not have before. Reply: nothing."""

    ticket: int | None
    ahead: tuple[int, ...]
    new: bool


@dataclass(frozen=True, slots=True)
class Sleep:
    """Sleep up to ``seconds``, or up to ``idle`` seconds while a request of
    this process is ahead of this one; a release in this process ends it.
    Reply: True when a release (or the manager's close) ended it."""

    seconds: float
    idle: float


@dataclass(frozen=True, slots=True)
class Refresh:
    """Keep the queue row ``ticket`` alive. Reply: False when it was gone
    (lapsed, or deleted by an operator)."""

    ticket: int
    deadline: float | None


@dataclass(frozen=True, slots=True)
class Behind:
    """Reply: whether a request found ahead of this one is still waiting in
    this process."""


@dataclass(frozen=True, slots=True)
class ReadVersion:
    """Reply: a :class:`Watched`: the customer's sentinel version (a plain
    read), how many of the tickets ``ahead`` (those of a queued request) are
    still queued, and, where ``handed`` (the request is queued where releases
    hand over), the fencing token of the rows a release handed to the
    request, if any."""

    deadline: float | None
    handed: bool = False
    ahead: tuple[int, ...] = ()
    held: tuple[str, ...] = ()
    """Leases whose live rows were in the request's way: the reply says
    whether one still has any (:attr:`Watched.held_left`)."""


@dataclass(frozen=True, slots=True)
class TakeUp:
    """Take up the rows a release handed to the request. Reply: True when
    they were extended to the request's ttl; ``None`` when that is left to
    the lease's first renewal (allowed when ``later``, and the manager
    renews its leases); False when they expired before that (the request is
    no longer queued)."""

    deadline: float | None
    later: bool = False


@dataclass(frozen=True, slots=True)
class Judge:
    """Reply: the :class:`Outlook` of an attempt now, by plain reads."""

    ticket: int | None
    deadline: float | None


@dataclass(frozen=True, slots=True)
class Stop:
    """Reply: why the request must end before its next attempt (the manager
    closed, the caller cancelled it), as the error to raise; ``None``: go on."""


Step = Attempt | Place | Sleep | Refresh | Behind | ReadVersion | TakeUp | Judge | Stop

Result = tuple[int, float, float | None] | None
"""A grant's fencing token; the lease clock's time when its granting attempt
started; and, for paths a release handed over and nobody has taken up yet,
how long their rows last from then (``None``: the request's ttl). ``None``:
a try-lock that was denied."""


_SLEEP, _ATTEMPT, _JUDGE = "sleep", "attempt", "judge"

LATER_TAKE_UP = 1.0
"""Handed rows with at least this many seconds left may wait for the lease's
first renewal (a third of the way through them); fewer are taken up at
once, so that a lease is never returned nearly lost."""


class AcquireFlow:
    """One lock request's decisions (see the module's docstring).

    ``steps()`` is the generator a driver runs. Before it, the driver puts a
    limit of :attr:`limit` (monotonic time) around every database call of the
    request; after it, whatever happened, it leaves the queue with
    :attr:`ticket` if that is set (:meth:`leave` says so).

    Raises, out of the generator: :class:`LockTimeout` after ``wait_limit``
    seconds (``None``: no limit; with ``unanswered`` set when the time ran out
    while the database did not answer, or ``contended`` when attempts kept
    losing races); :class:`DeadlockDetected` when waiting could never succeed;
    :class:`ContentionTimeout` when a try-lock's attempt kept losing races for
    ``try_patience`` seconds; whatever the driver replies to :class:`Stop`
    (:class:`ManagerClosed`, :class:`LockCancelled`) before the next attempt.
    """

    def __init__(
        self,
        request: GrantRequest,
        settings: Settings,
        delays: Delays,
        *,
        blocking: bool,
        wait_limit: float | None,
        handed_over: bool = False,
        owner_busy: bool = False,
        told: Callable[[], bool] = lambda: False,
    ) -> None:
        self.request = request
        # Whether the request's owner takes no lock while it waits (a thread
        # or a task, busy in this call; not an owner= name). Then an older
        # request found ahead of it and still queued is enough to know that
        # an attempt would be denied: the fairness rule passes over only
        # requests that wait for the owner's locks, and those can only
        # become fewer (see _after).
        self._owner_busy = owner_busy
        # Whether a release may grant this request's paths to it while it is
        # queued (Releases.release): then its checks look for that too.
        self._handed_over = handed_over
        # Whether a release that hands this request its paths wakes it at
        # once (the database's notice, heard by this process): then it need
        # not look often for them.
        self._told = told
        self._settings = settings
        self._clock = settings.clock
        self._delays = delays
        self._blocking = blocking
        self._wait_limit = wait_limit
        began = self._clock.monotonic()
        self.deadline = math.inf if wait_limit is None else began + wait_limit
        # When the database's waits must be over: a try-lock's own bound.
        self.ends = self.deadline if blocking else began + settings.try_time
        self.limit = self.ends + settings.grace
        """Everything, the database's waits included, ends by then."""
        self.ticket: int | None = None
        """The request's place in the queue, while it has one."""
        # When the last attempt started, by the monotonic and lease clocks.
        self._started = self._lease_clock = 0.0
        self._last: Blocked | None = None
        self._attempted = False  # set once an attempt has gone out
        self._refresh_due = math.inf
        self._version: int | None = None
        self._next_in_line = False
        # Until when the next in line checks every hand_over_check.
        self._look_often_until = 0.0
        self._checked_at = 0.0  # the lease clock's time before the last check
        # The tickets of the older requests that go first, as last seen, their
        # leases, and whether they are all of them (not the youngest only).
        self._ahead: tuple[int, ...] = ()
        self._ahead_leases: tuple[str, ...] = ()
        self._ahead_complete = False
        # The leases of the live locks in the way, as last seen.
        self._held: tuple[str, ...] = ()

    def leave(self) -> int | None:
        """The ticket to give up when the request ends (timeout, deadlock,
        error, interrupt), if it holds a place; the place is forgotten."""
        ticket, self.ticket = self.ticket, None
        return ticket

    def steps(self, first: Any = None) -> Generator[Step, Any, Result]:
        """The request's steps; returns its :data:`Result`. ``first``: the
        outcome of an attempt made already (:meth:`attempt`, after a
        :class:`Stop` that said go on), or the error it failed with: the
        steps go on from there."""
        try:
            return (yield from self._attempts(first))
        except DatabaseTimeout as error:
            if not self._blocking or self._wait_limit is None:
                raise
            raise self._timeout(unanswered=True) from error

    def attempt(self) -> Attempt:
        """The next attempt, to make now (the steps make theirs with it). A
        driver may make the first one before it runs :meth:`steps`, and skip
        them when it is granted (:meth:`granted`): a generator driven step by
        step costs a grant that succeeds at once more than its decisions."""
        clock = self._clock
        started = self._started = clock.monotonic()
        # The lease's clock, for its deadline (it counts suspend).
        self._lease_clock = clock.now()
        # Queue only a request that will wait: one attempt that is
        # denied costs no queue row.
        queue = self._blocking and started < self.deadline
        try_patience = started + self._settings.try_patience
        patience = self.deadline if self._blocking else try_patience
        attempt = Attempt(
            self.ticket, queue, patience, self._by(self.ends), first=not self._attempted
        )
        self._attempted = True
        return attempt

    def granted(self, outcome: Granted) -> Result:
        """The request's :data:`Result` when the attempt just made granted it."""
        self.ticket = None  # the grant removed the queue row
        return outcome.fencing_token, self._lease_clock, None

    def _attempts(self, first: Any) -> Generator[Step, Any, Result]:
        clock = self._clock
        while True:
            if first is None:
                outcome = yield from self._attempt()
            else:
                outcome, first = self._made(first), None
            started = self._started
            if isinstance(outcome, Granted):
                return self.granted(outcome)
            if not self._blocking:
                return None  # a try-lock only reports the conflict
            if isinstance(outcome, Deadlocked):
                raise DeadlockDetected(
                    self.request.paths, outcome.held_by, outcome.party, self.request.shallow
                )
            self._last = outcome
            self._held = tuple({info.lease_id: None for info in outcome.blockers})
            yield self._queued(outcome.ticket, started, outcome.ahead, outcome.ahead_complete)
            if clock.monotonic() >= self.deadline:
                raise self._timeout()
            handed = yield from self._wait(outcome.version, started)
            if handed is not None:
                return handed

    def _attempt(self) -> Generator[Step, Any, Granted | Blocked | Deadlocked]:
        """The next attempt, unless the request must stop first; its outcome."""
        stop: PathLockError | None = yield Stop()
        if stop is not None:
            raise stop
        try:
            outcome: Granted | Blocked | Deadlocked = yield self.attempt()
        except ContentionTimeout:
            if not self._blocking:
                raise
            raise self._timeout(contended=True) from None
        return outcome

    def _made(self, first: Any) -> Granted | Blocked | Deadlocked:
        """The outcome of an attempt the driver made before the steps (see
        :meth:`steps`): an error it failed with is raised as :meth:`_attempt`
        would."""
        if isinstance(first, ContentionTimeout) and self._blocking:
            raise self._timeout(contended=True) from None
        if isinstance(first, BaseException):
            raise first
        outcome: Granted | Blocked | Deadlocked = first
        return outcome

    def _timeout(self, *, unanswered: bool = False, contended: bool = False) -> LockTimeout:
        last = self._last
        return LockTimeout(
            self.request.paths,
            self._wait_limit or 0.0,
            last.blockers if last else (),
            last.ahead if last else (),
            unanswered=unanswered,
            contended=contended,
            shallow=self.request.shallow,
        )

    def _by(self, ends: float) -> float | None:
        """The deadline of a database call made now: the request's own while it
        lasts; afterwards (the last attempt, leaving the queue) or without one,
        the call's default, which the limit around the request cuts short."""
        return ends if self._clock.monotonic() < ends < math.inf else None

    def _queued(
        self,
        ticket: int | None,
        attempt_started: float,
        ahead: tuple[WaiterInfo, ...],
        complete: bool,
    ) -> Place:
        """The outcome of a denied attempt: the request's ticket and the older
        requests that go first (``complete``: all of them)."""
        new = ticket is not None and ticket != self.ticket
        if new:
            # The row was written by the attempt, which started at this time.
            self._refresh_due = attempt_started + self._settings.waiter_refresh
        self.ticket = ticket
        self._next_in_line = not ahead
        self._look_often_until = self._clock.monotonic() + self._settings.hand_over_window
        self._ahead = tuple(info.ticket for info in ahead)
        self._ahead_leases = tuple(info.lease_id for info in ahead)
        self._ahead_complete = complete
        return Place(ticket, self._ahead, new)

    def _wait(  # noqa: PLR0911, PLR0912 - one return per way a wait ends
        self, version: int, last_attempt: float
    ) -> Generator[Step, Any, Result]:
        """Return when another attempt can succeed (a plain-read check says
        so after the version moved, or at the recheck), when a local release
        happened, or when the deadline passed; or, with the request's
        :data:`Result`, when a release handed its paths to it and it took them
        up. Keeps the queue row alive meanwhile."""
        clock, settings, deadline = self._clock, self._settings, self.deadline
        self._moved_to(version)
        recheck_at = last_attempt + settings.recheck
        while True:
            now = clock.monotonic()
            # Behind another waiter of this process, there is nothing to poll
            # or recheck for: that one goes first, and its leaving (or its
            # place changing) wakes this one. 200 threads polling and
            # rechecking kept the database too busy to keep their rows alive.
            idle_until = deadline if self.ticket is None else min(deadline, self._refresh_due)
            wake_at = min(now + self._delay(), recheck_at, idle_until)
            woken = yield Sleep(max(0.0, wake_at - now), max(0.0, idle_until - now))
            if woken:
                # A release in this process (or the manager closed, or the
                # request was cancelled: that, first).
                stop: PathLockError | None = yield Stop()
                if stop is not None:
                    raise stop
                if not self._queued_for_hand_over():
                    return None
                # It may have handed its paths to this request; otherwise the
                # check says, as any check does, whether an attempt can
                # succeed. Attempting at once, the first local waiter of each
                # folder was denied at most releases: the paths went to a
                # request of another process ahead of it.
            now = clock.monotonic()
            if now >= deadline:
                return None  # one last attempt, for its answer
            try:
                if self.ticket is not None and now >= self._refresh_due:
                    if not (yield Refresh(self.ticket, self._by(deadline))):
                        # Lapsed (this process stalled) or deleted by an operator:
                        # queue again, behind whoever queued meanwhile.
                        self.ticket = None
                        yield Place(None, (), False)
                        return None
                    self._refresh_due = now + settings.waiter_refresh
                if not woken and (yield Behind()):
                    continue
                watched = yield from self._check()
                if watched.handed is not None:
                    return (yield from self._take_up(watched.handed, watched.handed_for))
                then = self._after(watched, now < recheck_at)
                if then is _SLEEP:
                    if now >= recheck_at:
                        recheck_at = now + settings.recheck
                    continue
                if then is _ATTEMPT:
                    return None  # the likely next grant: straight to the attempt
                recheck_at = now + settings.recheck
                self._checked_at = clock.now()
                outlook: Outlook = yield Judge(self.ticket, self._by(deadline))
            except DatabaseTimeout:
                if clock.monotonic() < deadline:
                    raise
                # The request's time ran out during a read: the last attempt
                # (which has ``grace`` more) says whether the database answers.
                return None
            if outlook.handed is not None:
                # A release handed the paths to this request since its check.
                return (yield from self._take_up(outlook.handed, outlook.handed_for))
            if outlook.free:
                return None
            if outlook.next_in_line and not self._next_in_line:
                now = clock.monotonic()
                self._look_often_until = now + settings.hand_over_window
            self._next_in_line = outlook.next_in_line
            self._ahead = outlook.ahead
            self._ahead_leases = outlook.ahead_leases
            self._ahead_complete = outlook.ahead_complete
            self._held = outlook.held

    def _delay(self) -> float:
        """The sleep before the next check."""
        delay = self._delays.next()
        if (
            self._next_in_line
            and self._queued_for_hand_over()
            and self._clock.monotonic() < self._look_often_until
            and not self._told()
        ):
            # A release will likely hand its paths to this request: look
            # often, without the policy's growing gaps, for a while (on a
            # busy path the lock in its way is held briefly), unless that
            # release tells it.
            delay = min(delay, self._settings.hand_over_check)
        return delay

    def _after(self, watched: Watched, before_recheck: bool) -> str:
        """What a waiting request does after a check that found nothing
        handed to it: sleep on, attempt, or judge its chances (at a move of
        the version, at the recheck, or when the requests found ahead of it
        have all left: then it is likely next)."""
        left = watched.ahead_left
        moved = watched.version != self._version
        # Two or more older requests still queued: the move is one of theirs
        # (releases hand the paths to them), and this request's turn is no
        # nearer than one hand-over away: no reason to look sooner.
        self._moved_to(watched.version, soon=left is None or left <= 1)
        if left == 0:
            return self._all_ahead_left(watched)
        if not moved and before_recheck:
            return _SLEEP
        if moved and self._next_in_line:
            if watched.held_left and before_recheck:
                # A lease in its way still holds: the move was someone
                # else's (another folder's, with many requests waiting), and
                # an attempt would be denied for certain.
                return _SLEEP
            return _ATTEMPT
        if left and (before_recheck or self._owner_busy):
            # Older requests that go first are still queued: the move is
            # theirs (they are the ones a release hands the paths to). Nor
            # is there anything to recheck while they are, unless the owner
            # may take locks meanwhile and so pass them: with a hundred
            # requests waiting in a process, the rechecks of those far back
            # were most of its judgements.
            return _SLEEP
        return _JUDGE

    def _all_ahead_left(self, watched: Watched) -> str:
        """After a check that found every request seen ahead gone from the
        queue: if the list was whole and one of them holds its paths now (it
        was granted them), this request is next in line, behind that lease
        (and the locks in its way before, if they still hold), and needs no
        reads to know it (on a busy path, that is every turn); otherwise it
        judges its place anew."""
        if not (self._ahead_complete and watched.held_left):
            return _JUDGE
        self._next_in_line = True
        self._look_often_until = self._clock.monotonic() + self._settings.hand_over_window
        self._held = (*self._held, *self._ahead_leases)
        self._ahead = self._ahead_leases = ()
        return _SLEEP

    def _check(self) -> Generator[Step, Any, Watched]:
        """The check of a waiting request."""
        handed = self._queued_for_hand_over()
        self._checked_at = self._clock.now()
        queued = self.ticket is not None
        held: tuple[str, ...] = ()
        if queued and self._next_in_line:
            held = self._held
        elif queued and self._ahead_complete:
            # Whether one of those ahead holds its paths once they have all
            # left (see _after).
            held = self._ahead_leases
        watched: Watched = yield ReadVersion(
            self._by(self.deadline), handed, self._ahead if queued else (), held
        )
        if handed and not watched.looked:
            # This database's releases do not hand paths over (a Galera
            # node's): check as without hand-overs from now on.
            self._handed_over = False
        return watched

    def _queued_for_hand_over(self) -> bool:
        return self._handed_over and self.ticket is not None

    def _take_up(self, token: int, handed_for: float) -> Generator[Step, Any, Result]:
        """A release granted the request's paths (``token``), for
        ``handed_for`` seconds from the check that found them: take them up
        for the request's ttl, now or at the lease's first renewal. ``None``
        if they expired first (this process stalled): the request is no
        longer queued, and queues again."""
        lease_clock = self._clock.now()
        taken = yield TakeUp(self._by(self.ends), later=handed_for >= LATER_TAKE_UP)
        self.ticket = None  # the hand-over removed the queue row
        if taken is None:
            # The lease lasts as long as the rows, from before the check
            # that found them, until its first renewal extends them.
            return token, self._checked_at, handed_for
        if taken:
            return token, lease_clock, None
        yield Place(None, (), False)
        return None

    def _moved_to(self, version: int, *, soon: bool = True) -> None:
        if version != self._version:
            if self._version is not None and soon:
                self._delays.reset()  # the queue is moving
            self._version = version
