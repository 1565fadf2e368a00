"""How long a blocked request sleeps before its next attempt.

A wait policy is any object with ``start() -> Delays``; ``Delays.next()`` returns
the seconds to sleep before the next attempt of one request. The manager never
holds a connection or a transaction while sleeping, and a release in the same
process cuts the sleep short (:class:`LocalWakeups`).
"""

from __future__ import annotations

import math
import random
import threading
from typing import Protocol

from pathlock.errors import InvalidArgument

_MIN_FIRST = 0.001


class Delays(Protocol):
    """The sleeps of one request, one per failed attempt."""

    def next(self) -> float:
        """Seconds to sleep after the latest failed attempt."""
        ...


class WaitPolicy(Protocol):
    """Creates the sleep schedule of each new request."""

    def start(self) -> Delays:
        """A fresh schedule for one request."""
        ...


class ReverseExponentialBackoff:
    """The seed's reverse exponential backoff: waits shrink as retries grow.

    After failed attempt ``n`` (1, 2, ...) the wait is ``first ** (1 / k)``
    milliseconds with ``k = n mod cycle``, never under ``floor``: a request that
    has been waiting longer polls more eagerly than a newcomer, which gives
    early arrivals the better chance. The seed divided by ``n mod 15``, which is
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
        return _Schedule(self)


class _Schedule:
    def __init__(self, policy: ReverseExponentialBackoff) -> None:
        self._policy = policy
        self._retry = 0

    def next(self) -> float:
        self._retry += 1
        delay = self._policy.delay(self._retry)
        spread = self._policy.jitter
        return delay * random.uniform(1 - spread, 1 + spread)  # noqa: S311


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

    def wait(self, timeout: float) -> None:
        """Sleep up to ``timeout`` seconds; return at once if a release was
        notified since the previous wait (or since watching began)."""
        entry = self._entry
        if entry is None:
            raise RuntimeError("Watch.wait() outside its with block")
        with self._wakeups._lock:
            if entry.generation == self._seen:
                entry.condition.wait(timeout)
            self._seen = entry.generation
