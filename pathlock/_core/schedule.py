"""The renewal schedule of a manager's held leases, without I/O (see
:mod:`pathlock._heartbeat`, which carries it out)."""

from __future__ import annotations

import heapq
import itertools

from pathlock.lease import Lease


class Schedule:
    """When each of a manager's leases next needs attention, without I/O,
    threads or sleeping: the renewal schedule, which a driver carries out
    (:class:`pathlock._heartbeat.Heartbeat` on a thread; :class:`pathlock._aio.TaskHeartbeat` as a
    task of the asyncio API's loop). The driver serializes the calls.

    Each lease is in a heap by the time it next needs attention: its renewal
    (a third of its ttl after its last renewal began) or, while a renewal is
    under way or failing, the moment it must be presumed lost. Adding a lease
    is a push (O(log n)); nothing ever rescans every lease. At most one round
    of renewals is in flight; the leases that fall due meanwhile wait for the
    next one.
    """

    def __init__(self, *, retry_after: float = 1.0) -> None:
        # After a failed round, try again this soon (at most a tenth of ttl).
        self._retry_after = retry_after
        # (when, sequence, lease): the sequence breaks ties, and an entry is
        # current only while it is the lease's latest (``_current``); older
        # ones are skipped when they come up, so rescheduling is a push.
        self._heap: list[tuple[float, int, Lease]] = []
        self._current: dict[Lease, int] = {}
        self._sequence = itertools.count()
        self._pending: list[Lease] = []  # due, waiting for the round in flight
        self._busy: set[Lease] = set()  # pending or in the round in flight
        self._in_flight = False

    def add(self, lease: Lease) -> bool:
        """Renew ``lease`` from now on; whether it is now the earliest entry
        (the driver, asleep until a later one, must look again)."""
        lease.renewals.scheduled = True
        self._push(lease, lease.renew_due)
        return self._heap[0][2] is lease

    def next_at(self) -> float | None:
        """The lease clock's time when the earliest entry falls due, if any."""
        return self._heap[0][0] if self._heap else None

    def due(self, now: float) -> tuple[list[Lease], list[Lease]]:
        """Take the entries due by ``now``: the leases to declare lost, and the
        round of renewals to start now (empty while one is in flight); the
        driver reports the round's end to :meth:`round_over`."""
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
                self._push(lease, lease.lost_at)
            elif now >= lease.renew_due:
                lease.renewals.wanted_at = now
                self._pending.append(lease)
                self._busy.add(lease)
                # Until its round is back, it only needs watching for loss.
                self._push(lease, lease.lost_at)
            else:
                self._push(lease, min(lease.renew_due, lease.lost_at))
        if self._in_flight or not self._pending:
            return lost, []
        batch, self._pending = self._pending, []
        self._in_flight = True
        for lease in batch:
            lease.renewals.handed_at = now
        return lost, batch

    def round_over(self, batch: list[Lease], failed_at: float | None) -> None:
        """The round of ``batch`` ended; ``failed_at``: the lease clock's time
        when it failed (its leases are tried again soon), ``None`` if it did
        not."""
        self._in_flight = False
        for lease in batch:
            if failed_at is not None:
                lease.renew_due = failed_at + min(self._retry_after, lease.ttl / 10)
            self._busy.discard(lease)
            if lease in self._current:  # not declared lost meanwhile
                self._push(lease, min(lease.renew_due, lease.lost_at))

    def _push(self, lease: Lease, when: float) -> None:
        sequence = next(self._sequence)
        self._current[lease] = sequence
        heapq.heappush(self._heap, (when, sequence, lease))
