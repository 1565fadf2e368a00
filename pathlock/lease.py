"""A granted request: its paths are held until it is released or expires."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Protocol

from pathlock.errors import BackendError, LeaseLost
from pathlock.types import Owner, PathMode

log = logging.getLogger(__name__)

LostCallback = Callable[["Lease"], None]
"""Called once, from pathlock's heartbeat thread (or the thread that found out),
when a lease is lost. It must not block for long; exceptions are logged."""

# How long before the conservative deadline a lease that could not be renewed
# is declared lost: the holder hears of it before the database can let anyone
# else in, with room for clock-rate differences and the callback's own latency.
_MARGIN_FRACTION = 0.1
_MAX_MARGIN = 5.0


class _Manager(Protocol):
    def _release(self, lease: Lease) -> int | None: ...
    def _renew_leases(self, leases: list[Lease]) -> None: ...


class Lease:
    """One granted request: a set of (path, mode) pairs held together.

    Use it as a context manager (``with locks.lock_paths(...) as lease:``) or call
    :meth:`release`. The lease lasts ``ttl`` seconds from its grant, in database
    time, and the manager's heartbeat renews it while it is held. If renewal
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
        manager: _Manager,
        *,
        customer_id: int,
        lease_id: str,
        paths: tuple[PathMode, ...],
        fencing_token: int,
        owner: Owner,
        reason: str,
        ttl: float,
        attempt_started: float,
        on_lost: tuple[LostCallback, ...] = (),
    ) -> None:
        self._manager = manager
        self.customer_id = customer_id
        """The customer (tenant) whose paths are held."""
        self.lease_id = lease_id
        """Random, unguessable id: the secret that authorises release and renewal."""
        self.paths = paths
        """The normalized (path, mode) pairs held, sorted by path."""
        self.fencing_token = fencing_token
        """Strictly increasing per customer over grants."""
        self.owner = owner
        self.reason = reason
        self.ttl = ttl
        self.margin = min(ttl * _MARGIN_FRACTION, _MAX_MARGIN)
        """Seconds before its conservative deadline at which an unrenewed lease
        is declared lost."""
        self._on_lost = on_lost
        self._lock = threading.Lock()
        self._released = False
        self._lost_reason: str | None = None
        self._extend(attempt_started)

    def _extend(self, started: float) -> None:
        """The database set the expiry from a moment after ``started`` (a
        monotonic time taken before the statement), so this client-side
        deadline is never later than the real one."""
        self._deadline = started + self.ttl
        self.renew_due = started + self.ttl / 3
        self.lost_at = self._deadline - self.margin
        """Monotonic time from which, unless renewed, the lease counts as lost."""

    @property
    def released(self) -> bool:
        """True once :meth:`release` was called (or the owner released it)."""
        return self._released

    @property
    def lost(self) -> bool:
        """True when the lease is known or presumed to be no longer held, for a
        reason other than this process releasing it."""
        return self._lost_reason is not None or (
            not self._released and time.monotonic() >= self.lost_at
        )

    @property
    def expires_in(self) -> float:
        """Seconds until the lease expires, by this process's conservative clock
        (0 once expired or released)."""
        if self._released:
            return 0.0
        return max(0.0, self._deadline - time.monotonic())

    def ensure_held(self) -> None:
        """Raise :class:`LeaseLost` unless the lease is still held.

        Call it before an action that must only happen under the lock. Expiry
        is judged on this process's monotonic clock, erring on the early side.
        """
        reason = self._why_not_held()
        if reason is not None:
            raise LeaseLost(self.lease_id, reason)

    def _why_not_held(self) -> str | None:
        if self._lost_reason is not None:
            return self._lost_reason
        if self._released:
            return "it was released"
        if time.monotonic() >= self.lost_at:
            return f"it was not renewed within its ttl of {self.ttl:g} s"
        return None

    def renew(self) -> None:
        """Renew now (the heartbeat does this on its own); raise
        :class:`LeaseLost` if the lease turned out to be gone."""
        self.ensure_held()
        self._manager._renew_leases([self])
        self.ensure_held()

    def release(self) -> None:
        """Release every path of the lease. Idempotent and thread-safe.

        If the database stays unreachable through the store's retries, the rows
        are left to expire at the end of the ttl and a WARNING is logged: the
        caller has nothing better to do with the failure.
        """
        with self._lock:
            if self._released:
                return
            self._released = True
        try:
            deleted = self._manager._release(self)
        except BackendError as error:
            log.warning(
                "could not release lease %s (%s); its locks expire within %.1f s: %s",
                self.lease_id,
                ", ".join(path for path, _ in self.paths),
                max(0.0, self._deadline - time.monotonic()),
                error,
            )
            return
        # None: a retry found the rows gone, which its first try deleted.
        if deleted == 0 and self._lost_reason is None:
            self._lost_reason = (
                "its rows were gone when it was released (expired and reaped, "
                "or deleted by an operator)"
            )
            log.warning("lease %s: %s", self.lease_id, self._lost_reason)

    def _mark_released(self) -> None:
        """The rows were deleted by a bulk release of this lease's owner."""
        self._released = True

    def _mark_lost(self, reason: str) -> None:
        """Record that the lease is lost and tell whoever asked, once."""
        with self._lock:
            if self._lost_reason is not None or self._released:
                return
            self._lost_reason = reason
        log.warning("lease %s (%s) lost: %s", self.lease_id, self.describe_paths(), reason)
        for callback in self._on_lost:
            try:
                callback(self)
            except Exception:
                log.exception("on_lost callback %r failed for lease %s", callback, self.lease_id)

    def describe_paths(self) -> str:
        return ", ".join(f"{path} ({mode})" for path, mode in self.paths)

    def __enter__(self) -> Lease:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        lost = self._why_not_held() if self.lost else None
        self.release()
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
