"""How long a blocked request sleeps between checks.

A wait policy is any object with ``start() -> Delays``; ``Delays.next()`` returns
the seconds to sleep before the next check of one request. A check is a plain
read of the customer's version, and a full attempt when it moved (see
:mod:`pathlock._core.flow`). The manager never holds a connection or a transaction
while sleeping, and a release in the same process cuts the sleep short
(:class:`LocalWakeups`). Fairness does not depend on the policy: the queue
orders conflicting requests, however eagerly each one polls.

- :class:`ExponentialBackoff` (the default): short checks at first, growing to
  a cap, so a hand-off is noticed within a few milliseconds and a long wait
  costs a bounded number of cheap reads per second.
- :class:`ReverseExponentialBackoff`: the original blog post's policy, kept
  for comparison.
"""

from __future__ import annotations

import contextlib
import math
import random
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from pathlock.errors import InvalidArgument
from pathlock.paths import conflicts
from pathlock.types import PathMode

_MIN_FIRST = 0.001


class Delays(Protocol):
    """The sleeps of one request, one per check."""

    def next(self) -> float:
        """Seconds to sleep before the next check."""
        ...

    def reset(self) -> None:
        """The customer's version moved (a grant, release or give-up): the
        queue is moving, so a policy may start over with short sleeps."""
        ...


class WaitPolicy(Protocol):
    """Creates the sleep schedule of each new request."""

    def start(self) -> Delays:
        """A fresh schedule for one request."""
        ...


class ExponentialBackoff:
    """Checks ``first`` seconds apart at first, each gap ``factor`` times the
    previous, up to ``maximum``, starting over whenever the customer's version
    moves (the queue is moving: the next hand-off may come soon); ``jitter``
    spreads each gap by up to that fraction so waiters do not poll in lockstep.

    With the defaults: 2, 4, 8, then 10 ms: a hand-off is seen within a few
    milliseconds, and a waiter reads its customer's version at most about 100
    times a second (a primary-key read that takes no lock).
    """

    def __init__(
        self,
        *,
        first: float = 0.002,
        maximum: float = 0.010,
        factor: float = 2.0,
        jitter: float = 0.2,
    ) -> None:
        if not (math.isfinite(first) and math.isfinite(maximum) and 0 < first <= maximum):
            raise InvalidArgument(
                f"need 0 < first <= maximum, got first={first!r}, maximum={maximum!r}"
            )
        if not (math.isfinite(factor) and factor >= 1):
            raise InvalidArgument(f"factor must be at least 1, got {factor!r}")
        if not 0 <= jitter < 1:
            raise InvalidArgument(f"jitter must be in [0, 1), got {jitter!r}")
        self.first = first
        self.maximum = maximum
        self.factor = factor
        self.jitter = jitter

    def delay(self, check: int) -> float:
        """The gap before check ``check`` (1-based), before jitter."""
        # Compare exponents, not powers: factor ** check overflows for long waits.
        if (check - 1) * math.log(self.factor) >= math.log(self.maximum / self.first):
            return self.maximum
        return float(self.first * self.factor ** (check - 1))

    def start(self) -> Delays:
        """A fresh schedule for one request; it starts over from ``first``
        whenever the customer's version moves (``reset()``)."""
        return _Schedule(self.delay, self.jitter, restarts=True)


class ReverseExponentialBackoff:
    """The reverse exponential backoff of the original blog post's algorithm:
    waits shrink as retries grow.

    Before check ``n`` (1, 2, ...) the wait is ``first ** (1 / k)``
    milliseconds, where ``k`` runs 1, 2, ..., ``cycle`` and then starts over,
    never under ``floor``: a request that has been waiting longer polls more
    eagerly than a newcomer, which was that algorithm's only means of giving
    early arrivals the better chance (pathlock's queue now does that). The
    original divided by ``n mod 15``, which is zero on every 15th retry and
    crashed; here the cycle's last step is its shortest wait.
    ``jitter`` spreads waits by up to that fraction so waiters do not poll in
    lockstep.

    With the defaults: 250 ms, 15.8 ms, then the 10 ms floor.
    """

    def __init__(
        self,
        *,
        first: float = 0.250,
        floor: float = 0.010,
        cycle: int = 15,
        jitter: float = 0.2,
    ) -> None:
        # The formula works in milliseconds and shrinks only from 1 ms up.
        if not (math.isfinite(first) and math.isfinite(floor) and 0 < floor <= first):
            raise InvalidArgument(f"need 0 < floor <= first, got floor={floor!r}, first={first!r}")
        if first < _MIN_FIRST:
            raise InvalidArgument(f"first must be at least {_MIN_FIRST} s, got {first!r}")
        if cycle < 1:
            raise InvalidArgument(f"cycle must be at least 1, got {cycle!r}")
        if not 0 <= jitter < 1:
            raise InvalidArgument(f"jitter must be in [0, 1), got {jitter!r}")
        self.first = first
        self.floor = floor
        self.cycle = cycle
        self.jitter = jitter

    def delay(self, retry: int) -> float:
        """The wait after failed attempt ``retry`` (1-based), before jitter."""
        k = (retry - 1) % self.cycle + 1
        milliseconds = float((self.first * 1000) ** (1 / k))
        return max(self.floor, milliseconds / 1000)

    def start(self) -> Delays:
        """A fresh schedule for one request; it never starts over."""
        # The original counted retries per request and never started over.
        return _Schedule(self.delay, self.jitter, restarts=False)


class _Schedule:
    def __init__(self, delay: Callable[[int], float], jitter: float, *, restarts: bool) -> None:
        self._delay = delay
        self._jitter = jitter
        self._restarts = restarts
        self._count = 0

    def reset(self) -> None:
        if self._restarts:
            self._count = 0

    def next(self) -> float:
        self._count += 1
        spread = self._jitter
        return self._delay(self._count) * random.uniform(1 - spread, 1 + spread)  # noqa: S311


class Waker(Protocol):
    """One sleep of a waiting request, which another thread (or task) may
    cut short. Made armed, under the wake-ups' lock."""

    def wake(self) -> None:
        """End the sleep (now, or before it begins); any thread may call it."""
        ...

    def sleep(self, seconds: float) -> None:
        """Sleep up to ``seconds``, or until woken."""
        ...


class ThreadWaker:
    """Sleeps on the calling thread: a lock held while it sleeps, released
    by :meth:`wake`. Not a threading.Condition: its wait() is Python code,
    and an interrupt (Ctrl-C) between its steps could leave the shared lock
    released while the with block that took it still counts it as held."""

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()

    def wake(self) -> None:
        with contextlib.suppress(RuntimeError):  # woken twice
            self._lock.release()

    def sleep(self, seconds: float) -> None:
        self._lock.acquire(True, seconds)


class Hearing(Protocol):
    """A subscription to the database's notices of hand-overs."""

    @property
    def live(self) -> bool:
        """Whether notices are heard now."""
        ...

    def stop(self) -> None:
        """Stop hearing them; idempotent."""
        ...


Listen = Callable[[Callable[[int, int], None]], "Hearing | None"]
"""Starts hearing the notices of hand-overs, each passed as ``(customer_id,
ticket)`` to the function given; ``None`` where the database has none."""


class LocalWakeups:
    """Lets a release in this process wake this process's waiters of the same
    customer at once, instead of at their next poll: one waiter per place in
    the queue, not every waiter.

    A waiter tells its :class:`Watch` its queue ticket and the tickets its last
    attempt found ahead of it (older conflicting requests, which go first).
    A waiter with one of those still waiting in this process is *behind* it:
    it cannot be granted before that one is, so a release does not wake it
    and it skips its quick polls; it is woken when the waiters ahead of it
    here have left (granted or given up). A release wakes only the waiters
    that are behind nobody here: with any number of local threads waiting for
    one path, one of them attempts per release, the next in line.

    A waiter registers with :meth:`watch` *before* its attempt, so a release that
    lands between the attempt and the sleep is not missed.
    """

    def __init__(
        self, wakers: Callable[[], Waker] | None = None, listen: Listen | None = None
    ) -> None:
        self._lock = threading.Lock()
        self._entries: dict[int, _Entry] = {}
        self._closed = False
        # How a waiter sleeps until it is woken: a lock on its own thread, or
        # an event of the asyncio API's loop.
        self._wakers: Callable[[], Waker] = ThreadWaker if wakers is None else wakers
        # Hears the database's notices of hand-overs, once a request of this
        # process is next in line (see told()).
        self._listen = listen
        self._hearing: Hearing | None = None

    def watch(self, customer_id: int, paths: Sequence[PathMode] | None = None) -> Watch:
        """Start watching ``customer_id`` for a request of ``paths`` (``None``:
        woken by every release of the customer); use as a context manager."""
        return Watch(self, customer_id, paths)

    def notify(self, customer_id: int, paths: Sequence[PathMode] | None = None) -> None:
        """A release of ``paths`` of ``customer_id`` (``None``: unknown, or
        any): wake its local waiters that are behind no other local waiter
        and whose requests conflict with those paths. A release of other
        paths cannot let them in: with many requests waiting in several
        folders, waking them all made each release send an attempt of every
        folder's first waiter, nearly all of them denied."""
        with self._lock:
            entry = self._entries.get(customer_id)
            if entry is not None:
                for watch in entry.watches:
                    if not watch._behind(entry) and watch._may_follow(paths):
                        watch._signal(released=True)

    def handed(self, customer_id: int, ticket: int) -> None:
        """The database said a release handed paths to the queued request
        ``ticket`` of ``customer_id``: wake that request, if it waits in this
        process (any thread may call this)."""
        with self._lock:
            entry = self._entries.get(customer_id)
            watch = None if entry is None else entry.tickets.get(ticket)
            if watch is not None:
                watch._signal(released=True)

    def told(self) -> bool:
        """Whether a release that hands paths to a request of this process
        wakes it at once (:meth:`handed`, called as the database's notices
        are heard): where the database has notices, this process listens
        from the first call on, and this is true while the listening
        connection is up."""
        if self._listen is None:
            return False
        hearing = self._hearing
        if hearing is None:
            with self._lock:
                if self._closed:
                    return False
                if self._hearing is None:
                    self._hearing = self._listen(self.handed)
                    if self._hearing is None:
                        self._listen = None  # none on this database
                        return False
                hearing = self._hearing
        return hearing.live

    def queued(self) -> int:
        """How many requests of this process hold a place in a queue now."""
        with self._lock:
            return sum(len(entry.tickets) for entry in self._entries.values())

    def close(self) -> None:
        """The manager closes: wake every local waiter, now and from now on,
        so each sees the manager closed before its next attempt."""
        with self._lock:
            self._closed = True
            hearing, self._hearing = self._hearing, None
            for entry in self._entries.values():
                for watch in entry.watches:
                    watch._signal(released=True)
        if hearing is not None:
            hearing.stop()


class _Entry:
    __slots__ = ("behind", "refreshed", "refreshing", "tickets", "watches")

    def __init__(self) -> None:
        self.watches: set[Watch] = set()
        self.tickets: dict[int, Watch] = {}  # the queued ones, by ticket
        # Ticket -> the watches that found it ahead of them: who to look at
        # when it leaves, without going through every watch (a process with
        # hundreds of waiters did, at every hand-over).
        self.behind: dict[int, set[Watch]] = {}
        # Ticket -> when the last refresh of this process's queued requests
        # that found it alive began (the wait's monotonic clock).
        self.refreshed: dict[int, float] = {}
        # Ticket -> when a refresh that includes it began, while under way.
        self.refreshing: dict[int, float] = {}


class Watch:
    """One request's registration with :class:`LocalWakeups`."""

    def __init__(
        self, wakeups: LocalWakeups, customer_id: int, paths: Sequence[PathMode] | None = None
    ) -> None:
        self._wakeups = wakeups
        self._customer_id = customer_id
        self._paths = paths
        # Armed while this watch sleeps in wait(); a signal wakes it.
        self._waker: Waker | None = None
        self._entry: _Entry | None = None
        self._ticket: int | None = None
        self._ahead: tuple[int, ...] = ()
        self._released = False  # a release since the last wait
        self._changed = False  # a waiter ahead of this one left

    def __enter__(self) -> Watch:
        wakeups = self._wakeups
        with wakeups._lock:
            entry = wakeups._entries.get(self._customer_id)
            if entry is None:
                entry = wakeups._entries[self._customer_id] = _Entry()
            entry.watches.add(self)
            self._entry = entry
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Unregister; idempotent. An interrupt (Ctrl-C) may cut this short,
        or an update of the ticket: calling it again finishes the job. A
        ticket left registered would keep this process's later waiters idle
        behind a request that is gone, until their timeouts."""
        wakeups = self._wakeups
        with wakeups._lock:
            entry = self._entry
            if entry is None:
                return
            # Every ticket registered for this watch, not only the current
            # one: an interrupted ticket update may have left an old one.
            # (Nothing to look for, mostly: a request granted at once.)
            if entry.tickets:
                for ticket in [t for t, watch in entry.tickets.items() if watch is self]:
                    self._ticket = ticket
                    self._set_ticket(entry, None)
            self._ticket = None
            if self._ahead:
                self._follow(entry, ())
            entry.watches.discard(self)
            if not entry.watches and wakeups._entries.get(self._customer_id) is entry:
                del wakeups._entries[self._customer_id]
            self._entry = None

    def queued(self, ticket: int | None, ahead: Iterable[int]) -> None:
        """The request's ticket (``None``: not queued) and the tickets of the
        requests its last attempt found ahead of it."""
        with self._wakeups._lock:
            entry = self._entry
            if entry is None:
                raise RuntimeError("Watch.queued() outside its with block")
            self._follow(entry, tuple(sorted(ahead)))
            self._set_ticket(entry, ticket)

    def _follow(self, entry: _Entry, ahead: tuple[int, ...]) -> None:
        """Record ``ahead`` as the tickets this request waits behind."""
        for ticket in self._ahead:
            watching = entry.behind.get(ticket)
            if watching is not None:
                watching.discard(self)
                if not watching:
                    del entry.behind[ticket]
        self._ahead = ahead
        for ticket in ahead:
            entry.behind.setdefault(ticket, set()).add(self)

    def _set_ticket(self, entry: _Entry, ticket: int | None) -> None:
        old, self._ticket = self._ticket, ticket
        if old == ticket:
            return
        if ticket is not None:
            entry.tickets[ticket] = self
        if old is None:
            return
        entry.tickets.pop(old, None)  # absent if an interrupt came before it was set
        entry.refreshed.pop(old, None)
        entry.refreshing.pop(old, None)
        # The waiters that were behind this one here may be next now. A
        # release this one was woken for and did not act on goes to them.
        for watch in list(entry.behind.get(old, ())):
            if not watch._behind(entry):
                watch._signal(released=self._released)

    def to_refresh(self, ticket: int, since: float, now: float) -> list[int]:
        """The queue rows that a refresh of this request's row (``ticket``)
        keeps alive with it: this process's queued requests of the customer
        that no refresh found alive at or after ``since`` and that no refresh
        begun after ``since`` is keeping alive now; they count as under way
        from ``now`` (:meth:`kept_alive` ends that). Empty when this
        request's own row is one of those: nothing to send."""
        with self._wakeups._lock:
            entry = self._entry
            if entry is None:
                return [ticket]
            if (
                entry.refreshed.get(ticket, -math.inf) >= since
                or entry.refreshing.get(ticket, -math.inf) >= since
            ):
                return []
            due = {ticket} | {
                each
                for each in entry.tickets
                if entry.refreshed.get(each, -math.inf) < since
                and entry.refreshing.get(each, -math.inf) < since
            }
            for each in due:
                entry.refreshing[each] = now
            return sorted(due)

    def kept_alive(self, tickets: Iterable[int], alive: set[int] | None, began: float) -> None:
        """A refresh of ``tickets``, begun at ``began``, found ``alive`` alive
        (``None``: it failed)."""
        with self._wakeups._lock:
            entry = self._entry
            if entry is None:
                return
            for ticket in tickets:
                if entry.refreshing.get(ticket) == began:
                    del entry.refreshing[ticket]
                if alive is None:
                    continue
                if ticket in alive and ticket in entry.tickets:
                    entry.refreshed[ticket] = began
                else:
                    entry.refreshed.pop(ticket, None)

    def behind(self) -> bool:
        """Whether a request found ahead of this one at its last attempt is
        still waiting in this process (it goes first)."""
        with self._wakeups._lock:
            return self._entry is not None and self._behind(self._entry)

    def _behind(self, entry: _Entry) -> bool:
        # The oldest tickets first (the one ahead is usually the very first),
        # in C: with hundreds waiting, a loop of Python calls over the tickets
        # ahead at every wait cost each grant some 900 calls.
        return not entry.tickets.keys().isdisjoint(self._ahead)

    def _may_follow(self, released: Sequence[PathMode] | None) -> bool:
        """Whether a release of ``released`` (``None``: unknown) may let
        this request in: it conflicts with them."""
        mine = self._paths
        if released is None or mine is None:
            return True
        return any(conflicts(own, other) for own in mine for other in released)

    def _signal(self, *, released: bool) -> None:
        if released:
            self._released = True
        else:
            self._changed = True
        waker = self._waker
        if waker is not None:
            waker.wake()

    def wait(self, timeout: float, idle: float | None = None) -> bool:
        """Sleep up to ``timeout`` seconds, or up to ``idle`` seconds (default:
        ``timeout``) while another waiter of this process is ahead of this one.
        Return at once if a release was notified since the previous wait (or
        since watching began). True when a release was notified; False when
        the time passed or a waiter ahead of this one left."""
        entry = self._entry
        if entry is None:
            raise RuntimeError("Watch.wait() outside its with block")
        waker: Waker | None = None
        behind = False
        with self._wakeups._lock:
            if not (self._released or self._changed or self._wakeups._closed):
                behind = idle is not None and self._behind(entry)
                waker = self._waker = self._wakeups._wakers()
        if waker is not None:
            seconds = idle if behind and idle is not None else timeout
            # Interruptible (Ctrl-C), and nothing shared is held meanwhile.
            try:
                waker.sleep(min(max(seconds, 0.0), threading.TIMEOUT_MAX))
            finally:
                self._waker = None
        with self._wakeups._lock:
            notified = self._released or self._wakeups._closed
            self._released = self._changed = False
            return notified
