"""Renewals of a manager's held leases: one transaction per ttl and home
node, a customer whose row another transaction holds renewed apart from the
rest (:class:`~pathlock._heartbeat.Stragglers`), leases found gone marked
lost, the hooks told."""

from __future__ import annotations

import time
from collections.abc import Collection

from pathlock import events
from pathlock._manager_state import ManagerState
from pathlock.lease import Lease

_BUSY_CUSTOMER = (
    "the database answered, but another transaction held its customer's row, and every "
    "renewal that waits for such a row was busy"
)


class Renewing(ManagerState):
    """A manager's renewals."""

    def _renew_leases(self, leases: list[Lease], *, heartbeat: bool = False) -> None:
        """Renew ``leases`` (one transaction per distinct ttl and home node);
        mark the ones found gone as lost. Raises :class:`BackendError` if the
        database cannot be reached.

        The heartbeat's renewals (``heartbeat``) use connections of their own
        and, on servers that can skip locked rows, pass over a customer whose
        sentinel another transaction holds: that customer's leases are renewed
        by a transaction of their own that waits for its row (see
        :class:`~pathlock._heartbeat.Stragglers`), so a client frozen in the
        middle of a grant endangers its own customer's leases only."""
        store = self._renewals if heartbeat else self._store
        sent = self._settings.clock.now()
        for lease in leases:
            lease.renewals.sent_at = sent
        # One transaction per ttl and home node: with customer affinity on a
        # cluster, each customer's renewals go where its grants go.
        groups: dict[tuple[float, str], list[Lease]] = {}
        for lease in leases:
            key = (lease.ttl, store.home(lease.customer_id))
            groups.setdefault(key, []).append(lease)
        for (ttl, _home), group in groups.items():
            started = self._settings.clock.now()
            held, skipped = store.renewals.renew(_renewal_rows(group), ttl, wait=not heartbeat)
            self._tell_renewed(
                group, held, skipped, self._settings.clock.now() - started, heartbeat
            )
            skipped_leases: dict[int, list[Lease]] = {}
            for lease in group:
                if lease.customer_id in skipped:
                    skipped_leases.setdefault(lease.customer_id, []).append(lease)
                else:
                    _renewed(lease, lease.lease_id in held, started)
            for customer_id, waiting in skipped_leases.items():
                if self._stragglers.start((customer_id, ttl), waiting):
                    # Watched for loss only, until that renewal is back.
                    for lease in waiting:
                        lease.renew_due = lease.lost_at
                else:
                    for lease in waiting:
                        now = self._settings.clock.now()
                        lease.renewals.failed(now, _BUSY_CUSTOMER)
                        lease.renew_due = now + min(self._settings.skipped_retry, ttl / 20)

    def _tell_renewed(
        self,
        leases: list[Lease],
        held: Collection[str],
        skipped: Collection[int],
        seconds: float,
        background: bool,
    ) -> None:
        renewed = sum(1 for lease in leases if lease.lease_id in held)
        gone = sum(
            1 for lease in leases if lease.lease_id not in held and lease.customer_id not in skipped
        )
        if renewed or gone:
            self._events.renewed(events.Renewed(renewed, gone, seconds, background))

    def _renew_stragglers(self, leases: list[Lease]) -> None:
        """Renew one customer's ``leases`` (of one ttl), waiting for its row
        until they must be presumed lost."""
        started = self._settings.clock.now()
        for lease in leases:
            lease.renewals.sent_at = started
        deadline = time.monotonic() + max(0.0, min(lease.lost_at for lease in leases) - started)
        held, _ = self._renewals.renewals.renew(
            _renewal_rows(leases), leases[0].ttl, wait=True, deadline=deadline
        )
        self._tell_renewed(leases, held, (), self._settings.clock.now() - started, True)
        for lease in leases:
            _renewed(lease, lease.lease_id in held, started)
            if lease.lease_id in held:
                self._heartbeat.add(lease)  # its next renewal, not its old deadline

    def _verify(self, lease: Lease) -> bool:
        with self._call("verify a lease"):
            return self._store.renewals.lease_alive(
                lease.customer_id, lease.lease_id, len(lease.paths)
            )


def _renewal_rows(leases: list[Lease]) -> list[tuple[int, str, int]]:
    return [(lease.customer_id, lease.lease_id, len(lease.paths)) for lease in leases]


def _renewed(lease: Lease, held: bool, started: float) -> None:
    """Record the outcome of a renewal that began at ``started`` (the lease clock)."""
    if held:
        lease._extend(started)
    else:
        lease._mark_lost(
            "its rows were gone when it was renewed (expired, reaped, or deleted by an operator)"
        )
