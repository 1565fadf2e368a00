"""How long a blocked request sleeps between checks.

A wait policy is any object with ``start() -> Delays``; ``Delays.next()`` returns
the seconds to sleep before the next check of one request. A check is a plain
read of the customer's version, and a full attempt when it moved (see
:mod:`pathlock.acquire`). The manager never holds a connection or a transaction
while sleeping, and a release in the same process cuts the sleep short
(:class:`LocalWakeups`). Fairness does not depend on the policy: the queue
orders conflicting requests, however eagerly each one polls.

- :class:`ExponentialBackoff` (the default): short checks at first, growing to
  a cap, so a hand-off is noticed within a few milliseconds and a long wait
  costs a bounded number of cheap reads per second.
- :class:`ReverseExponentialBackoff`: the seed's policy, kept for comparison.
"""

from __future__ import annotations

import math
import random
import threading
from collections.abc import Callable
from typing import Protocol

from pathlock.errors import InvalidArgument

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
        return _Schedule(self.delay, self.jitter, restarts=True)


class ReverseExponentialBackoff:
    """The seed's reverse exponential backoff: waits shrink as retries grow.

    Before check ``n`` (1, 2, ...) the wait is ``first ** (1 / k)``
    milliseconds with ``k = n mod cycle``, never under ``floor``: a request that
    has been waiting longer polls more eagerly than a newcomer, which was the
    seed's only means of giving early arrivals the better chance (pathlock's
    queue now does that). The seed divided by ``n mod 15``, which is
    zero on every 15th retry and crashed; here ``k`` runs 1..cycle, so the
    cycle's last step is its shortest wait and the next cycle starts over.
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
        # The seed counted retries per request and never started over.
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


class LocalWakeups:
    """Lets a release in this process wake this process's waiters of the same
    customer at once, instead of at their next poll.

    A waiter registers with :meth:`watch` *before* its attempt, so a release that
    lands between the attempt and the sleep is not missed.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[int, _Entry] = {}

    def watch(self, customer_id: int) -> Watch:
        """Start watching ``customer_id``; use as a context manager."""
        return Watch(self, customer_id)

    def notify(self, customer_id: int) -> None:
        """Wake every local waiter of ``customer_id``."""
        with self._lock:
            entry = self._entries.get(customer_id)
            if entry is not None:
                entry.generation += 1
                entry.condition.notify_all()


class _Entry:
    __slots__ = ("condition", "generation", "watchers")

    def __init__(self, lock: threading.Lock) -> None:
        self.condition = threading.Condition(lock)
        self.generation = 0
        self.watchers = 0


class Watch:
    """One request's registration with :class:`LocalWakeups`."""

    def __init__(self, wakeups: LocalWakeups, customer_id: int) -> None:
        self._wakeups = wakeups
        self._customer_id = customer_id
        self._entry: _Entry | None = None
        self._seen = 0

    def __enter__(self) -> Watch:
        wakeups = self._wakeups
        with wakeups._lock:
            entry = wakeups._entries.get(self._customer_id)
            if entry is None:
                entry = wakeups._entries[self._customer_id] = _Entry(wakeups._lock)
            entry.watchers += 1
            self._entry = entry
            self._seen = entry.generation
        return self

    def __exit__(self, *_exc: object) -> None:
        wakeups = self._wakeups
        with wakeups._lock:
            entry = self._entry
            if entry is None:
                return
            entry.watchers -= 1
            if entry.watchers == 0:
                del wakeups._entries[self._customer_id]
            self._entry = None

    def wait(self, timeout: float) -> bool:
        """Sleep up to ``timeout`` seconds; return at once if a release was
        notified since the previous wait (or since watching began). True when
        a release was notified."""
        entry = self._entry
        if entry is None:
            raise RuntimeError("Watch.wait() outside its with block")
        with self._wakeups._lock:
            if entry.generation == self._seen:
                entry.condition.wait(timeout)
            notified = entry.generation != self._seen
            self._seen = entry.generation
            return notified
