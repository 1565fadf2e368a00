"""The heartbeat: keeps a manager's leases alive, or says they are lost.

:class:`~pathlock._core.schedule.Schedule` keeps the held leases in a heap ordered by the time each
one next needs attention: its renewal (a third of its ttl after its last
renewal began) or, while a renewal is under way or failing, the moment it
must be presumed lost. It does no I/O; two drivers carry it out. The
synchronous API's is :class:`Heartbeat`: one scheduler thread per manager,
which wakes only when the earliest entry falls due. The asyncio API's is a
task of its loop (:class:`pathlock._aio.TaskHeartbeat`).

Renewals run apart from the scheduler (a short-lived thread, or a task), one
round at a time, so a database call stuck in the network never stops it from
declaring a lease lost in time: a lease that could not be renewed is reported
lost ``margin`` seconds before its conservative deadline, i.e. before the
database could grant its paths to anyone else.

``on_lost`` callbacks run on a third thread of their own (:class:`Callbacks`),
so a callback that blocks, raises, calls ``sys.exit()`` or raises
``KeyboardInterrupt`` can neither stop renewals nor delay another lease's
loss being declared.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

from pathlock import _interrupts as interrupts
from pathlock._core.schedule import Schedule
from pathlock.clock import SYSTEM, Clock
from pathlock.errors import PathLockError
from pathlock.lease import Lease, LostCallback

log = logging.getLogger("pathlock.heartbeat")


def renew_round(
    renew: Callable[[list[Lease]], None], batch: list[Lease], clock: Clock
) -> float | None:
    """Run one round of renewals; the lease clock's time if it failed (logged:
    the heartbeat must survive anything), else ``None``."""
    try:
        renew(batch)
    except Exception as error:
        if isinstance(error, PathLockError):
            log.warning("renewing %d lease(s) failed, retrying soon: %s", len(batch), error)
        else:
            log.exception("renewing %d lease(s) failed unexpectedly", len(batch))
        failed_at = clock.now()
        for lease in batch:
            lease.renewals.failed(failed_at, str(error))
        return failed_at
    return None


class Heartbeat:
    """Renews the leases given to :meth:`add` until they are released or lost,
    on threads: one that keeps the :class:`Schedule` and sleeps until its next
    entry, and a short-lived one per round of renewals.

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
        self._name = name
        self._condition = threading.Condition()
        self._schedule = Schedule(retry_after=retry_after)
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
            earliest = self._schedule.add(lease)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            elif earliest:  # earlier than anything the thread sleeps for
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

    def _run(self) -> None:
        while True:
            with self._condition:
                if self._stopping:
                    return
                self._woken = False
                lost, batch = self._schedule.due(self._clock.now())
                renewal = None
                if batch:
                    renewal = threading.Thread(
                        target=self._round, args=(batch,), name=f"{self._name}-renew", daemon=True
                    )
                    self._in_flight = renewal
            for lease in lost:
                declare_lost(lease)
            if renewal is not None:
                renewal.start()
            with self._condition:
                if self._stopping:
                    return
                if self._woken:
                    continue
                next_at = self._schedule.next_at()
                timeout = None if next_at is None else max(0.0, next_at - self._clock.now())
                self._condition.wait(timeout)

    def _round(self, batch: list[Lease]) -> None:
        failed_at = None
        try:
            failed_at = renew_round(self._renew, batch, self._clock)
        finally:
            with self._condition:
                self._in_flight = None
                self._schedule.round_over(batch, failed_at)
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
            for lease in leases:
                lease.renewals.failed(lease._clock.now(), str(error))
        finally:
            with self._lock:
                del self._running[key]


def declare_lost(lease: Lease) -> None:
    # Once: later calls (and calls on released leases) do nothing. The
    # reason says what was measured: a stopped or starved process used to
    # be reported as "database unreachable?".
    lease._mark_lost(lease._unrenewed())


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
            run_callback(lease, callback)


def run_callback(lease: Lease, callback: LostCallback) -> None:
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
