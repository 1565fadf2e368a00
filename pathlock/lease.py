"""A granted request: its paths are held until it is released or expires."""

from __future__ import annotations

import logging
import threading
import time
from types import TracebackType
from typing import Protocol

from pathlock.errors import BackendError, LeaseLost
from pathlock.types import Owner, PathMode

log = logging.getLogger(__name__)


class _Releaser(Protocol):
    def _release(self, lease: Lease) -> int: ...


class Lease:
    """One granted request: a set of (path, mode) pairs held together.

    Use it as a context manager (``with locks.lock_paths(...) as lease:``) or call
    :meth:`release`. The lease lasts ``ttl`` seconds from its grant, measured in
    database time. Once a lease expires its holder may still be running while
    another process is granted the same paths: code that writes shared storage
    must pass :attr:`fencing_token` along so the storage can reject writes from a
    holder whose token is older than one it has already seen.
    """

    def __init__(
        self,
        releaser: _Releaser,
        *,
        customer_id: int,
        lease_id: str,
        paths: tuple[PathMode, ...],
        fencing_token: int,
        owner: Owner,
        reason: str,
        ttl: float,
        attempt_started: float,
    ) -> None:
        self._releaser = releaser
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
        # The database computed the expiry from a moment after the attempt
        # started, so this client-side deadline is never later than the real one.
        self._deadline = attempt_started + ttl
        self._lock = threading.Lock()
        self._released = False
        self._lost_reason: str | None = None

    @property
    def released(self) -> bool:
        """True once :meth:`release` was called (or the owner released it)."""
        return self._released

    @property
    def lost(self) -> bool:
        """True when the lease is known or presumed to be no longer held, for a
        reason other than this process releasing it: its ttl ran out, or its rows
        were gone when it was released."""
        return self._lost_reason is not None or (
            not self._released and time.monotonic() >= self._deadline
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

        Call it before an action that must only happen under the lock; it judges
        expiry by this process's monotonic clock with the grant's start as
        origin, which errs on the early side.
        """
        if self._lost_reason is not None:
            raise LeaseLost(self.lease_id, self._lost_reason)
        if self._released:
            raise LeaseLost(self.lease_id, "it was released")
        if time.monotonic() >= self._deadline:
            raise LeaseLost(self.lease_id, f"its ttl of {self.ttl:g} s ran out")

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
            deleted = self._releaser._release(self)
        except BackendError as error:
            log.warning(
                "could not release lease %s (%s); its locks expire within %.1f s: %s",
                self.lease_id,
                ", ".join(path for path, _ in self.paths),
                max(0.0, self._deadline - time.monotonic()),
                error,
            )
            return
        if deleted == 0:
            self._lost_reason = (
                "its rows were gone when it was released (expired and reaped, "
                "or deleted by an operator)"
            )
            log.warning("lease %s: %s", self.lease_id, self._lost_reason)

    def _mark_released(self) -> None:
        """The rows were deleted by a bulk release of this lease's owner."""
        self._released = True

    def __enter__(self) -> Lease:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.release()

    def __repr__(self) -> str:
        state = "released" if self._released else "lost" if self.lost else "held"
        paths = ", ".join(f"{path} ({mode})" for path, mode in self.paths)
        return (
            f"<Lease {self.lease_id} customer={self.customer_id} {state} "
            f"token={self.fencing_token} paths=[{paths}]>"
        )
