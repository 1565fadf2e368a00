"""A granted request: its paths are held until it is released or expires."""

from __future__ import annotations

import functools
import logging
import operator
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Protocol

from pathlock import events
from pathlock.errors import BackendError, LeaseLost
from pathlock.types import Owner, PathMode

if TYPE_CHECKING:
    from pathlock.settings import Settings

log = logging.getLogger(__name__)

LostCallback = Callable[["Lease"], None]
"""Called once when a lease is lost, on the manager's callback thread: one at a
time, in the order the losses were found. A slow callback delays only the
callbacks after it, never renewals; whatever it raises (``SystemExit`` and
``KeyboardInterrupt`` included) is logged and ignored."""


class Keeper(Protocol):
    """What a lease needs from the manager that granted it (the manager
    gives each lease one; nothing else implements it)."""

    @property
    def settings(self) -> Settings:
        """The manager's timing and clock."""
        ...

    def release(self, lease: Lease) -> int | None:
        """Delete the lease's rows: how many (``None``: a retry found them
        gone, which its first try deleted). Raises ``BackendError``."""
        ...

    def renew(self, leases: list[Lease]) -> None:
        """Renew ``leases`` now; mark the ones found gone as lost."""
        ...

    def release_interrupted(self, lease: Lease) -> None:
        """Something (an interrupt) stopped :meth:`release` midway: the rows
        may or may not be gone. Finish the release soon; until then they must
        not count as held by the owner."""
        ...

    def run_callbacks(self, lease: Lease, callbacks: tuple[LostCallback, ...]) -> None:
        """Run ``on_lost`` callbacks, on the manager's callback thread."""
        ...

    def verify(self, lease: Lease) -> bool:
        """Whether the database still holds every row of the lease."""
        ...


class Renewals:
    """What became of a lease's renewal since the lease was last renewed, as
    measured (times of the lease clock): what its loss is explained by. The
    heartbeat records each step; a renewal resets them.

    Plain attributes, written by the heartbeat's threads and read by any:
    whatever mix a reader sees, each fact was true when it was recorded."""

    def __init__(self) -> None:
        self.scheduled = False
        """Whether a heartbeat renews the lease (not so with ``heartbeat=False``)."""
        self.renewed_at = 0.0
        """When the last renewal (or the grant) began."""
        self.wanted_at: float | None = None
        """When the heartbeat found a renewal due and queued it."""
        self.handed_at: float | None = None
        """When it handed the renewal to a round of renewals (a thread, a task)."""
        self.sent_at: float | None = None
        """When that round began its database call."""
        self.failure: tuple[float, str] | None = None
        """When and why the last renewal that ended did not renew the lease."""

    def renewed(self, started: float) -> None:
        self.renewed_at = started
        self.wanted_at = self.handed_at = self.sent_at = self.failure = None

    def failed(self, now: float, why: str) -> None:
        self.failure = (now, why)
        self.wanted_at = self.handed_at = self.sent_at = None

    def story(self, now: float, due: float) -> str:
        """Why the lease was not renewed by ``now`` (its renewal was ``due``):
        the last renewal that ended without renewing it, if any, first."""
        said = []
        if self.failure is not None:
            when, why = self.failure
            said.append(f"its last renewal, {now - when:.1f} s ago, did not renew it: {why}")
        if self.sent_at is not None:
            said.append(
                f"the database has not answered its renewal sent {now - self.sent_at:.1f} s ago"
            )
        elif self.handed_at is not None:
            said.append(
                f"its renewal, started {now - self.handed_at:.1f} s ago, has not reached the "
                "database: the process did not run it in time (stopped, suspended or "
                "starved of CPU?)"
            )
        elif self.wanted_at is not None:
            said.append(
                f"its renewal has waited {now - self.wanted_at:.1f} s for an earlier round "
                "of renewals, which the database has not answered"
            )
        elif self.failure is None:
            said.append(
                f"its renewal, due {now - due:.1f} s ago, never ran: pathlock's heartbeat did "
                "not run in time (the process was stopped, suspended or starved of CPU?)"
            )
        return "; then ".join(said)


_identity = functools.partial(functools.reduce, operator.add, ())
"""``x -> x`` in C: ``reduce(add, (), x)`` is ``x``."""


class _EnterInC(property):
    """An ``__enter__`` that returns the instance without a Python frame.

    On an instance it is a property whose getter (C) gives a call (C) that
    returns the instance; on the class, a call that returns its argument,
    so that ``Lease.__enter__(lease)`` and ``ExitStack.enter_context(lease)``
    work as with a method."""

    __call__ = staticmethod(_identity)


class Lease:
    """One granted request: a set of (path, mode) pairs held together.

    Use it as a context manager (``with locks.lock_paths(...) as lease:``) or call
    :meth:`release`. The lease lasts ``ttl`` seconds from its grant, in database
    time, and the manager's heartbeat renews it while it is held. (Paths a
    release handed to a waiting request, on a MySQL or MariaDB server, last a
    few seconds at first, the request's ``waiter_ttl`` at most: the first
    renewal, a third of the way in, extends them to the ``ttl``;
    :attr:`expires_in` counts down the shorter term until then.) If renewal
    finds it gone, or cannot reach the database before it may have expired, the
    lease is *lost*: :attr:`lost` turns true, :meth:`ensure_held` raises
    :class:`LeaseLost`, the ``on_lost`` callbacks run, and leaving its ``with``
    block raises :class:`LeaseLost` (unless the block raised already).

    Once a lease expires its holder may still be running while another process
    is granted the same paths: code that writes shared storage must pass
    :attr:`fencing_token` along so the storage can reject writes from a holder
    whose token is older than one it has already seen.
    """

    def __init__(
        self,
        keeper: Keeper,
        *,
        customer_id: int,
        lease_id: str,
        paths: tuple[PathMode, ...],
        fencing_token: int,
        owner: Owner,
        reason: str,
        ttl: float,
        attempt_started: float,
        first_term: float | None = None,
        on_lost: tuple[LostCallback, ...] = (),
        emitter: events.Emitter = events.SILENT,
        shallow: frozenset[str] = frozenset(),
    ) -> None:
        self._keeper = keeper
        self._events = emitter
        self._granted_at = time.monotonic()
        self.customer_id = customer_id
        """The customer (tenant) whose paths are held."""
        self.lease_id = lease_id
        """Random, unguessable id: the secret that authorises release and renewal."""
        self.paths = paths
        """The normalized (path, mode) pairs held, sorted by path."""
        self.shallow = shallow
        """The paths among :attr:`paths` held at depth 0 (``shallow=``): the
        path alone, not its subtree."""
        self.fencing_token = fencing_token
        """Strictly increasing per customer over grants."""
        self.owner = owner
        self.reason = reason
        self.ttl = ttl
        timing = keeper.settings
        self._clock = timing.clock
        self.margin = min(ttl * timing.lease_margin, timing.max_lease_margin)
        """Seconds before its conservative deadline at which an unrenewed lease
        is declared lost: the holder hears of it before the database can let
        anyone else in, with room for clock-rate differences and the
        callback's own latency."""
        self._on_lost = on_lost
        self._lock = threading.Lock()
        # Held while a release runs, so that two release() calls at once
        # delete once; an interrupted release lets go of it and can be retried.
        self._release_lock = threading.Lock()
        self._released = False
        # True once the rows are known deleted, or left to expire: release()
        # has nothing more to do.
        self._settled = False
        self._lost_reason: str | None = None
        self.renewals = Renewals()
        """What became of its renewals since the last one (the heartbeat's)."""
        self._extend(attempt_started, first_term)

    def _extend(self, started: float, term: float | None = None) -> None:
        """The database set the expiry from a moment after ``started`` (a
        :func:`pathlock.clock.now` time taken before the statement), so this
        client-side deadline is never later than the real one. ``term``: how
        long the rows last from ``started``, if not the ttl (paths a release
        handed over, until their first renewal takes them up)."""
        if term is None:
            term, margin = self.ttl, self.margin
        else:
            timing = self._keeper.settings
            margin = min(term * timing.lease_margin, timing.max_lease_margin)
        self._deadline = started + term
        self.renew_due = started + term / 3
        self.lost_at = self._deadline - margin
        """Time (:func:`pathlock.clock.now`) from which, unless renewed, the
        lease counts as lost."""
        self.renewals.renewed(started)

    def _unrenewed(self) -> str:
        """Why the lease counts as lost when it was not renewed in time: what
        was measured of its renewals, where a heartbeat renews it."""
        now = self._clock.now()
        if not self.renewals.scheduled:
            return f"it was not renewed within its ttl of {self.ttl:g} s"
        return (
            f"not renewed for {now - self.renewals.renewed_at:.1f} s: "
            f"{self.renewals.story(now, self.renew_due)}; it may have expired, so it counts "
            "as lost"
        )

    @property
    def released(self) -> bool:
        """True once :meth:`release` was called (or the owner released it)."""
        return self._released

    @property
    def lost(self) -> bool:
        """True when the lease is known or presumed to be no longer held, for a
        reason other than its own :meth:`release` (``close()`` and the
        owner's ``release_locks()`` take it away from its holder: lost)."""
        return self._lost_reason is not None or (
            not self._released and self._clock.now() >= self.lost_at
        )

    @property
    def expires_in(self) -> float:
        """Seconds until the lease expires, by this process's conservative clock
        (0 once expired or released)."""
        if self._released:
            return 0.0
        return max(0.0, self._deadline - self._clock.now())

    def ensure_held(self, *, verify: bool = False) -> None:
        """Raise :class:`LeaseLost` unless the lease is still held.

        Call it before an action that must only happen under the lock. Expiry
        is judged on a clock that counts time the machine spent suspended
        (Linux's CLOCK_BOOTTIME; see :mod:`pathlock.clock`), erring on the
        early side. With ``verify``, the database is asked too (one read,
        bounded like every call): the lease's rows must all be there and
        unexpired by the database's clock; a lease found gone is lost from
        then on (``on_lost`` runs). Use it before something irreversible; it
        proves the lease was held at the moment of the read, so still pass
        :attr:`fencing_token` to storage that can check it.
        """
        reason = self._why_not_held()
        if reason is None and verify:
            if not self._keeper.verify(self):
                self._mark_lost("the database no longer holds it (its rows are gone or expired)")
            reason = self._why_not_held()
        if reason is not None:
            raise LeaseLost(self.lease_id, reason)

    def _why_not_held(self) -> str | None:
        if self._lost_reason is not None:
            return self._lost_reason
        if self._released:
            return "it was released"
        if self._clock.now() >= self.lost_at:
            return self._unrenewed()
        return None

    def renew(self) -> None:
        """Renew now (the heartbeat does this on its own); raise
        :class:`LeaseLost` if the lease turned out to be gone."""
        self.ensure_held()
        self._keeper.renew([self])
        self.ensure_held()

    def release(self) -> None:
        """Release every path of the lease. Idempotent and thread-safe.

        If an interrupt (Ctrl-C, an exception from a signal handler) stops a
        release midway, calling it again finishes it; the manager also
        finishes it soon after on its own, and at ``close()``. If the
        database stays unreachable through the store's retries, the rows are
        left to expire at the end of the ttl and a WARNING is logged: the
        caller has nothing better to do with the failure.
        """
        with self._release_lock:
            if self._settled:
                return
            # An earlier call was interrupted: its DELETE may have landed.
            retry = self._released
            self._released = True
            try:
                deleted = self._keeper.release(self)
            except BackendError as error:
                self._settled = True
                log.warning(
                    "could not release lease %s (%s); its locks expire within %.1f s: %s",
                    self.lease_id,
                    ", ".join(path for path, _ in self.paths),
                    max(0.0, self._deadline - self._clock.now()),
                    error,
                )
                return
            except BaseException:
                # Wherever it struck (before or after the DELETE went out,
                # before the manager heard of the release at all).
                self._keeper.release_interrupted(self)
                raise
            self._settled = True
        # None: a retry found the rows gone, which its first try deleted.
        if deleted == 0:  # nothing to release
            if not retry and self._lost_reason is None:
                self._lost_reason = (
                    "its rows were gone when it was released (expired and reaped, "
                    "or deleted by an operator)"
                )
                self._tell_lost(self._lost_reason)
        else:
            self._tell_released()

    def _release_later(self) -> None:
        """An interrupt struck in ``__exit__`` before :meth:`release` began:
        the manager deletes the rows soon, as after an interrupted release.
        (Nothing if the release began: it saw to that itself.)"""
        with self._release_lock:
            if self._released or self._settled:
                return
            self._released = True
        self._keeper.release_interrupted(self)

    def _mark_released(self) -> None:
        """The rows were deleted (or are being deleted) by the manager: a bulk
        release of this lease's owner, or the settling of a lease in doubt."""
        self._released = True
        self._settled = True

    def _end(self, reason: str) -> None:
        """The manager takes the lease away while its holder may still be
        using it (``close()``, ``release_locks()``): the holder hears of it as of a lost lease
        (:meth:`ensure_held`, leaving its ``with`` block), but no ``on_lost``
        callback runs, since nothing went wrong."""
        with self._lock:
            if self._lost_reason is None and not self._released:
                self._lost_reason = reason

    def _disown(self, reason: str) -> None:
        """This copy of the lease lives in a forked child: the lease belongs
        to the parent, and nothing here may release or renew it."""
        self._lock = threading.Lock()
        self._release_lock = threading.Lock()
        self._lost_reason = reason
        self._released = True
        self._settled = True

    def _mark_lost(self, reason: str) -> None:
        """Record that the lease is lost and tell whoever asked, once."""
        with self._lock:
            if self._lost_reason is not None or self._released:
                return
            self._lost_reason = reason
        self._tell_lost(reason)
        if self._on_lost:
            # Not on this thread: it may be the heartbeat's, which a callback
            # must neither end (sys.exit()) nor hold up.
            self._keeper.run_callbacks(self, self._on_lost)

    def _tell_released(self) -> None:
        held = time.monotonic() - self._granted_at
        self._events.released(events.Released(self.customer_id, self.lease_id, self.paths, held))

    def _tell_lost(self, reason: str) -> None:
        held = time.monotonic() - self._granted_at
        self._events.lost(events.Lost(self.customer_id, self.lease_id, self.paths, reason, held))

    def describe_paths(self) -> str:
        return ", ".join(f"{path} ({mode})" for path, mode in self.paths)

    # A signal's Python handler (Ctrl-C's KeyboardInterrupt) may raise where
    # a Python function starts. Raised at the start of a Python __enter__,
    # it would leave the lease held, never inside its with block and so
    # never released by it. This __enter__ runs C functions only (see
    # _EnterInC), and the with statement calls it with no check for signals
    # before its block is entered. (At the start of __exit__ nothing can do
    # the same: see "Interrupts" in docs/RELIABILITY.md.)
    if TYPE_CHECKING:

        def __enter__(self) -> Lease: ...

    else:
        __enter__ = _EnterInC(functools.partial(functools.partial, _identity))

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        released = False
        try:
            lost = self._why_not_held() if self.lost else None
            self.release()
            released = True
        finally:
            if not released:
                # Interrupted before the release began (or in it): released
                # soon, from the background.
                self._release_later()
        if lost is not None and exc_type is None:
            # The block ran (at least partly) without the lock: the caller must
            # hear of it. If the block raised, that error is the one to see.
            raise LeaseLost(self.lease_id, lost)

    def __repr__(self) -> str:
        state = "lost" if self.lost else "released" if self._released else "held"
        return (
            f"<Lease {self.lease_id} customer={self.customer_id} {state} "
            f"token={self.fencing_token} paths=[{self.describe_paths()}]>"
        )
