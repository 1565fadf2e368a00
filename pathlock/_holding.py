"""A manager's leases held in this process, and those in doubt: a lease
registered when granted, released (its rows deleted, this process's waiters
woken), or, when a grant or release failed or was interrupted, its rows
deleted by lease id now or soon from the background; ``release_locks()`` of
an owner."""

from __future__ import annotations

import time

from pathlock import _deadlines as deadlines
from pathlock._core.records import GrantRequest
from pathlock._manager_state import ManagerState
from pathlock.errors import (
    BackendError,
    ManagerClosed,
)
from pathlock.lease import Lease, LostCallback
from pathlock.types import (
    Owner,
)

RELEASED_BY_OWNER = "release_locks() of its owner released it while it was held"


class Holding(ManagerState):
    """The leases a manager holds, and those in doubt."""

    def _undelivered(self, request: GrantRequest) -> None:
        """``request`` ended with an exception: if its lease is registered,
        nobody has it, and it goes as a lease in doubt does."""
        with self._leases_lock:
            registered = request.lease_id in self._leases
        if registered:
            self._resolve(request.customer_id, request.lease_id, request.ttl)

    def _register(
        self,
        request: GrantRequest,
        token: int,
        started: float,
        on_lost: tuple[LostCallback, ...],
        term: float | None = None,
    ) -> Lease:
        lease = Lease(
            self._keeper,
            customer_id=request.customer_id,
            lease_id=request.lease_id,
            paths=request.paths,
            fencing_token=token,
            owner=request.owner,
            reason=request.reason,
            ttl=request.ttl,
            attempt_started=started,
            first_term=term,
            on_lost=(*on_lost, *self._on_lost),
            emitter=self._events,
            shallow=request.shallow,
        )
        with self._leases_lock:
            closed = self._closed
            if not closed:
                self._leases[lease.lease_id] = lease
        if closed:
            # close() ran while this grant was on its way: it must not hold.
            self._resolve(request.customer_id, request.lease_id, request.ttl)
            raise ManagerClosed("lock paths")
        if self._renews:
            self._heartbeat.add(lease)
        return lease

    def _resolve(self, customer_id: int, lease_id: str, ttl: float) -> None:
        """Delete whatever rows ``lease_id`` may have, now if possible, else
        soon after from a background thread (and at close)."""
        # Until they are gone, its rows make this owner wait, not fail as a
        # request that waits for itself.
        self._abandon(lease_id, ttl)
        self._in_doubt.add(customer_id, lease_id, ttl)
        with self._leases_lock:
            lease = self._leases.pop(lease_id, None)
        if lease is not None:
            lease._mark_released()
        settled = False
        try:
            # Briefly: the caller is on its way out (an interrupt, a close).
            settled = deadlines.within(
                time.monotonic() + self._settings.resolve_time,
                lambda _limit: self._in_doubt.settle(first=lease_id),
            )
        finally:
            if not settled:
                self._in_doubt.settle_soon()

    def _leave_later(self, customer_id: int, lease_id: str) -> None:
        """A request gave up but could not delete its queue row in time: it is
        deleted from the background, with the leases in doubt, rather than
        make the requests behind it wait until it lapses."""
        # Dropped after waiter_ttl: by then the row has lapsed anyway.
        self._in_doubt.add(customer_id, lease_id, self._settings.waiter_ttl / 2)
        self._in_doubt.settle_soon()

    def _settle_release(self, customer_id: int, lease_id: str) -> None:
        try:
            self._store.queue.forget(customer_id, lease_id)
        finally:
            self._wakeups.notify(customer_id)

    def _release(self, lease: Lease) -> int | None:
        with self._calls.running():
            with self._leases_lock:
                self._leases.pop(lease.lease_id, None)
            try:
                return self._store.releases.release(
                    lease.customer_id, lease.lease_id, paths=lease.paths
                )
            except BackendError:
                # Its rows stay until they expire. A request of the same owner
                # that they block waits for that instead of failing as a
                # request that waits for itself.
                self._abandon(lease.lease_id, lease.ttl)
                raise
            finally:
                # Only requests that conflict with its paths can follow it.
                self._wakeups.notify(lease.customer_id, lease.paths)

    def _release_interrupted(self, lease: Lease) -> None:
        """An interrupt stopped ``lease``'s release (see :meth:`Lease.release`):
        the DELETE may or may not have happened. (Not recorded before the
        release: settling it from another thread while the release runs
        would make the release find nothing.)"""
        # Until the rows are gone they make the owner wait, not fail as a
        # request that waits for itself.
        self._abandon(lease.lease_id, lease.ttl)
        self._in_doubt.add(lease.customer_id, lease.lease_id, lease.ttl)
        with self._leases_lock:
            self._leases.pop(lease.lease_id, None)
        self._in_doubt.settle_soon()

    def _abandon(self, lease_id: str, ttl: float) -> None:
        # Its rows, if any, expire within a ttl of now (nobody renews them);
        # the entry is kept twice that long to be sure.
        self._abandoned.add(lease_id, 2 * ttl)

    def _abandoned_leases(self) -> frozenset[str]:
        """Leases whose release failed and whose rows may not have expired yet."""
        return frozenset(self._abandoned.current())

    def _release_owner(self, customer_id: int, name: object, holder: Owner | None = None) -> int:
        owner = self._owner(name) if holder is None else holder
        mine: list[Lease] = []
        with self._call("release locks"):
            try:
                with self._leases_lock:
                    mine.extend(
                        lease
                        for lease in self._leases.values()
                        if lease.customer_id == customer_id and lease.owner.key == owner.key
                    )
                    for lease in mine:
                        del self._leases[lease.lease_id]
                for lease in mine:
                    _take_away(lease)
                released = self._store.releases.release_owner(customer_id, owner)
            except BaseException:
                # Failed or interrupted: the rows may stay. They make the
                # owner wait, and are deleted by lease id, soon.
                for lease in mine:
                    _take_away(lease)
                    self._release_interrupted(lease)
                raise
            finally:
                self._wakeups.notify(customer_id)
        for lease in mine:
            lease._tell_released()
        return released


def _take_away(lease: Lease) -> None:
    """``release_locks()`` releases ``lease``: its holder may still be in its
    ``with`` block (another task whose calls ran on the same pool thread, the
    holder itself), and must hear that the lock is gone, as after close()."""
    lease._end(RELEASED_BY_OWNER)
    lease._mark_released()
