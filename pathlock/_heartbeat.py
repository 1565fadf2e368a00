"""The renewal thread: keeps a manager's leases alive, or says they are lost.

One scheduler thread per manager keeps its held leases in a heap ordered by
the time each one next needs attention: its renewal (a third of its ttl after
its last renewal began) or, while a renewal is under way or failing, the
moment it must be presumed lost. Registering a lease is a push onto that heap
(O(log n)); the thread wakes only when the earliest entry falls due, never
rescans every lease.

Renewals run on a separate short-lived thread, one round at a time, so a
database call stuck in the network never stops the scheduler from declaring a
lease lost in time: a lease that could not be renewed is reported lost
``margin`` seconds before its conservative deadline, i.e. before the database
could grant its paths to anyone else.

``on_lost`` callbacks run on a third thread of their own (:class:`Callbacks`),
so a callback that blocks, raises, calls ``sys.exit()`` or raises
``KeyboardInterrupt`` can neither stop renewals nor delay another lease's
loss being declared.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

from pathlock import _interrupts as interrupts
from pathlock.clock import SYSTEM, Clock
from pathlock.errors import PathLockError
from pathlock.lease import Lease, LostCallback

log = logging.getLogger("pathlock.heartbeat")


class Heartbeat:
    """Renews the leases given to :meth:`add` until they are released or lost.

    Constructing one starts nothing: the threads start with the first lease
    (or the first lost callback) and end with :meth:`stop`.
    """

    def __init__(
        self,
        renew: Callable[[list[Lease]], None],
        *,
        retry_after: float = 1.0,
        name: str = "pathlock-heartbeat",
        clock: Clock = SYSTEM,
    ) -> None:
        self._renew = renew
        self._clock = clock
        # After a failed round, try again this soon (at most a tenth of ttl).
        self._retry_after = retry_after
        self._name = name
        self._condition = threading.Condition()
        # (when, sequence, lease): the sequence breaks ties, and an entry is
        # current only while it is the lease's latest (``_current``); older
        # ones are skipped when they come up, so rescheduling is a push.
        self._heap: list[tuple[float, int, Lease]] = []
        self._current: dict[Lease, int] = {}
        self._sequence = itertools.count()
        self._pending: list[Lease] = []  # due, waiting for the round in flight
        self._busy: set[Lease] = set()  # pending or in the round in flight
        self._thread: threading.Thread | None = None
        self._in_flight: threading.Thread | None = None
        self._stopping = False
        # Set by add() and by a finished round: look again before sleeping (a
        # notify that arrives while the thread is busy would otherwise be lost).
        self._woken = False
        self.callbacks = Callbacks(name=f"{name}-callbacks")

    def add(self, lease: Lease) -> None:
        """Renew ``lease`` from now on: O(log n) in the leases held."""
        # Called by a granted request, maybe in the main thread: an interrupt
        # must not leave the condition's lock held (see pathlock._interrupts).
        with interrupts.held_back(), self._condition:
            if self._stopping:
                return
            self._schedule(lease, lease.renew_due)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            elif self._heap[0][2] is lease:  # earlier than anything the thread sleeps for
                self._woken = True
                self._condition.notify()

    def run_callbacks(self, lease: Lease, callbacks: Sequence[LostCallback]) -> None:
        """Call ``callbacks`` with ``lease`` on the callback thread."""
        self.callbacks.submit(lease, callbacks)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the threads and wait up to ``timeout`` seconds, in all, for
        them and for a renewal in flight (one stuck in the network is left
        behind: it is a daemon thread and its engine is about to be
        disposed). Callbacks already submitted still run."""
        deadline = time.monotonic() + timeout
        with self._condition:
            self._stopping = True
            self._condition.notify()
            thread = self._thread
        for waited in (thread, self._in_flight):
            if waited is not None and waited is not threading.current_thread():
                waited.join(max(0.0, deadline - time.monotonic()))
        self.callbacks.stop(max(0.0, deadline - time.monotonic()))

    def _schedule(self, lease: Lease, when: float) -> None:
        sequence = next(self._sequence)
        self._current[lease] = sequence
        heapq.heappush(self._heap, (when, sequence, lease))

    def _run(self) -> None:
        while True:
            with self._condition:
                if self._stopping:
                    return
                self._woken = False
                lost = self._pop_due(self._clock.now())
                renewal = self._claim_round()
            for lease in lost:
                _declare_lost(lease)
            if renewal is not None:
                renewal.start()
            with self._condition:
                if self._stopping:
                    return
                if self._woken:
                    continue
                timeout = None
                if self._heap:
                    timeout = max(0.0, self._heap[0][0] - self._clock.now())
                self._condition.wait(timeout)

    def _pop_due(self, now: float) -> list[Lease]:
        """Take the entries due by ``now``: due renewals go to the pending
        round, and the leases to declare lost are returned."""
        lost: list[Lease] = []
        while self._heap and self._heap[0][0] <= now:
            _, sequence, lease = heapq.heappop(self._heap)
            if self._current.get(lease) != sequence:
                continue  # rescheduled since
            if lease.released:
                del self._current[lease]
            elif lease.lost:
                del self._current[lease]
                lost.append(lease)  # marking it again, if it was, does nothing
            elif lease in self._busy:
                # Renewed meanwhile (Lease.renew()): watch its new deadline.
                self._schedule(lease, lease.lost_at)
            elif now >= lease.renew_due:
                self._pending.append(lease)
                self._busy.add(lease)
                # Until its round is back, it only needs watching for loss.
                self._schedule(lease, lease.lost_at)
            else:
                self._schedule(lease, min(lease.renew_due, lease.lost_at))
        return lost

    def _claim_round(self) -> threading.Thread | None:
        """The thread of the next round (to start outside the lock), if one
        is pending and none is in flight."""
        if self._in_flight is not None or not self._pending:
            return None
        batch, self._pending = self._pending, []
        self._in_flight = threading.Thread(
            target=self._round, args=(batch,), name=f"{self._name}-renew", daemon=True
        )
        return self._in_flight

    def _round(self, batch: list[Lease]) -> None:
        try:
            self._renew(batch)
        except Exception as error:  # the heartbeat must survive anything
            if isinstance(error, PathLockError):
                log.warning("renewing %d lease(s) failed, retrying soon: %s", len(batch), error)
            else:
                log.exception("renewing %d lease(s) failed unexpectedly", len(batch))
            retry_at = self._clock.now()
            for lease in batch:
                lease.renew_due = retry_at + min(self._retry_after, lease.ttl / 10)
        finally:
            with self._condition:
                self._in_flight = None
                for lease in batch:
                    self._busy.discard(lease)
                    if lease in self._current:  # not declared lost meanwhile
                        self._schedule(lease, min(lease.renew_due, lease.lost_at))
                self._woken = True
                self._condition.notify()


class Stragglers:
    """Renewals that wait for a customer's row, each on a thread of its own.

    A renewal round skips the customers whose sentinel row another transaction
    holds (a grant in progress, or a client frozen in the middle of one), so
    that one customer's stall never holds up the renewal of the others. Each
    skipped customer's leases are handed here and renewed by a transaction
    that waits for that customer's row for as long as its leases can wait:
    behind a busy customer's grants a moment, behind a frozen client until the
    leases must be presumed lost. At most ``limit`` run at once; a customer
    that finds no free slot is skipped again by the next round."""

    def __init__(
        self, renew: Callable[[list[Lease]], None], *, limit: int, name: str = "pathlock-renew"
    ) -> None:
        self._renew = renew
        self._limit = limit
        self._name = name
        self._lock = threading.Lock()
        self._running: dict[object, threading.Thread] = {}
        self._stopping = False

    def start(self, key: object, leases: list[Lease]) -> bool:
        """Renew ``leases`` on a thread of their own, unless a renewal for
        ``key`` (their customer) is running already or no slot is free;
        whether it started."""
        with self._lock:
            if self._stopping or key in self._running or len(self._running) >= self._limit:
                return False
            thread = threading.Thread(
                target=self._run, args=(key, leases), name=f"{self._name}-{key}", daemon=True
            )
            self._running[key] = thread
        thread.start()
        return True

    def stop(self, timeout: float) -> None:
        """Start no more, and wait up to ``timeout`` seconds for those running
        (each ends by the time its leases must be presumed lost)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            self._stopping = True
            running = list(self._running.values())
        for thread in running:
            if thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))

    def _run(self, key: object, leases: list[Lease]) -> None:
        try:
            self._renew(leases)
        except Exception as error:  # the next round tries again, or the loss is declared
            if isinstance(error, PathLockError):
                log.warning("renewing %d lease(s) failed, retrying soon: %s", len(leases), error)
            else:
                log.exception("renewing %d lease(s) failed unexpectedly", len(leases))
        finally:
            with self._lock:
                del self._running[key]


def _declare_lost(lease: Lease) -> None:
    lease._mark_lost(  # once: later calls (and calls on released leases) do nothing
        f"not renewed for {lease.ttl - lease.margin:.1f} s (database unreachable?); "
        f"it may have expired, so it counts as lost"
    )


class Callbacks:
    """Runs ``on_lost`` callbacks one at a time, in the order their losses
    were declared, on a thread that nothing they do can end: an exception of
    any kind (``SystemExit`` and ``KeyboardInterrupt`` included) is logged
    and the next callback runs. A slow callback delays only the callbacks
    after it."""

    def __init__(self, *, name: str = "pathlock-callbacks") -> None:
        self._name = name
        self._condition = threading.Condition()
        self._queue: deque[tuple[Lease, LostCallback]] = deque()
        self._thread: threading.Thread | None = None
        self._stopping = False

    def submit(self, lease: Lease, callbacks: Sequence[LostCallback]) -> None:
        """Queue ``callback(lease)`` for each callback; after :meth:`stop`,
        a thread still runs them and then ends."""
        with self._condition:
            self._queue.extend((lease, callback) for callback in callbacks)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._condition.notify()

    def stop(self, timeout: float) -> None:
        """Let the thread end once the queue is empty; wait up to ``timeout``."""
        with self._condition:
            self._stopping = True
            self._condition.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._condition:
                while not self._queue and not self._stopping:
                    self._condition.wait()
                if not self._queue:
                    self._thread = None
                    return
                lease, callback = self._queue.popleft()
            _call(lease, callback)


def _call(lease: Lease, callback: LostCallback) -> None:
    try:
        callback(lease)
    except Exception:
        log.exception("on_lost callback %r failed for lease %s", callback, lease.lease_id)
    except BaseException as error:
        # sys.exit() or KeyboardInterrupt in a thread other than the main one
        # never ends the program; here it would only have ended renewals.
        log.exception(
            "on_lost callback %r raised %s for lease %s; it was ignored: a callback "
            "runs on pathlock's thread, which cannot end the program",
            callback,
            type(error).__name__,
            lease.lease_id,
        )
