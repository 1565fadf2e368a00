"""The operator's side of a manager: what is locked and queued, the
database's clock, the reaper, and the escape hatches that release a lease or
a dead node's locks by force."""

from __future__ import annotations

import logging
import time
from datetime import datetime
from typing import TYPE_CHECKING

from pathlock import _reaper as reaper
from pathlock import events
from pathlock._core import validation
from pathlock._opening import Opening
from pathlock.types import LockInfo, WaiterInfo

if TYPE_CHECKING:
    from apscheduler.job import Job
    from apscheduler.schedulers.base import BaseScheduler

# The manager's logger, as before these moved here: operators filter on it.
log = logging.getLogger("pathlock.manager")


def _requester(requested_by: object) -> str:
    """``, requested by X`` for the audit line of an operator action."""
    checked = validation.reason(requested_by, "requested_by")
    return f", requested by {checked}" if checked else ""


def _paths(count: int) -> str:
    return f"{count} path" if count == 1 else f"{count} paths"


class Operating(Opening):
    """A manager's operator API (see :class:`~pathlock.PathLockManager`)."""

    def list_locks(
        self, customer_id: int | None = None, *, include_expired: bool = False
    ) -> list[LockInfo]:
        """Locked paths of one customer (or of all), sorted by customer and path.

        Expired rows that the reaper has not deleted yet are left out unless
        ``include_expired``.
        """
        if customer_id is not None:
            customer_id = validation.customer_id(customer_id)
        with self._call("list locks"):
            return self._upkeep.list_locks(customer_id, include_expired=include_expired)

    def database_time(self) -> datetime:
        """The database's clock (UTC), by which every lease expires: compare
        :attr:`LockInfo.expires_at` with this, not with the local clock."""
        with self._call("read the database's clock"):
            return self._upkeep.database_time()

    def list_waiters(self, customer_id: int | None = None) -> list[WaiterInfo]:
        """Queued requests of one customer (or of all) that are still alive,
        oldest first."""
        if customer_id is not None:
            customer_id = validation.customer_id(customer_id)
        with self._call("list waiters"):
            return self._upkeep.list_waiters(customer_id)

    def reap_expired(self, *, batch_size: int = reaper.BATCH_SIZE) -> int:
        """Delete expired lock rows and dead waiter rows; return how many.

        Expired rows already block nobody; deleting them keeps the table small.
        Rows go in transactions of ``batch_size`` rows (never one long DELETE
        that would stall acquirers), picked along the ``expires_at`` index and
        judged by the database's clock. Any number of nodes may reap at once.
        Each run also counts the rows of the customers whose counts are not
        trusted (customers locked before revision 0008, or by an older
        pathlock during a rolling upgrade; see docs/MIGRATIONS.md), and of
        those without rows whose counts say otherwise (left too high by an
        interrupted grant or release), so that their grants can skip the
        conflict search again.
        """
        batch_size = validation.positive_int("batch_size", batch_size)
        started = time.monotonic()
        with self._call("reap expired locks"):
            # close() stops a run between batches.
            locks, waiters = self._upkeep.reap(batch_size, lambda: self._closed)
        self._events.reaped(events.Reaped(locks, waiters, time.monotonic() - started))
        return locks + waiters

    def start_reaper(
        self, interval: float = reaper.INTERVAL, *, batch_size: int = reaper.BATCH_SIZE
    ) -> None:
        """Run :meth:`reap_expired` every ``interval`` seconds (first run now)
        on an APScheduler background scheduler that this manager owns and
        shuts down in :meth:`close`."""
        self._check_open("start the reaper")
        self._reaper.start(interval, batch_size)

    def add_reaper_job(
        self,
        scheduler: BaseScheduler,
        *,
        interval: float = reaper.INTERVAL,
        batch_size: int = reaper.BATCH_SIZE,
        job_id: str = reaper.JOB_ID,
    ) -> Job:
        """Add the reaper to an application's own APScheduler 3 scheduler: every
        ``interval`` seconds (with 10 % jitter, so many nodes spread out; the
        first run as soon as the scheduler runs), one run at a time, missed runs
        coalesced. An existing job ``job_id`` is replaced. Failures are logged
        as WARNINGs, never raised into the scheduler. :meth:`close` removes the
        job. The job calls this manager, so it needs the scheduler's in-memory
        job store (it cannot be pickled into a persistent one).
        """
        self._check_open("add a reaper job")
        return self._reaper.add(scheduler, interval, batch_size, job_id)

    def release_lease(self, lease_id: str, *, requested_by: str = "") -> int:
        """Delete the rows of any lease, by its id: the operator's escape hatch
        for a holder that hangs. Returns the number of paths released (0 if the
        lease does not exist). Logged as a WARNING naming ``requested_by`` (who
        asked). The holder finds out at its next renewal (its lease is lost) and
        must not rely on the lock after."""
        lease_id = validation.lease_id(lease_id)
        who = _requester(requested_by)
        with self._call("release a lease"):
            customer_id = self._upkeep.lease_customer(lease_id)
            if customer_id is None:
                log.warning("nothing released: no lease %s%s", lease_id, who)
                return 0
            try:
                deleted = self._store.releases.release(customer_id, lease_id)
            finally:
                self._wakeups.notify(customer_id)
        if deleted is None:  # a retry found the rows gone: the first attempt took them
            log.warning(
                "released lease %s (customer %d; how many paths was lost with the connection)%s",
                lease_id,
                customer_id,
                who,
            )
            return 0
        log.warning(
            "released %s of lease %s (customer %d)%s", _paths(deleted), lease_id, customer_id, who
        )
        return deleted

    def release_node(self, node_id: str, *, requested_by: str = "") -> int:
        """Delete every lock and waiter row of ``node_id``: clean-up after a
        node that died. Returns the number of paths released; logged as a
        WARNING naming ``requested_by``. Live holders on that node lose their
        leases. Detached leases that the node granted stay: no process of
        the node holds them (see :meth:`CustomerLocks.lock_detached`)."""
        node_id = validation.node_id(node_id)
        who = _requester(requested_by)
        with self._call("release a node's locks"):
            deleted = self._release_node(node_id)
        log.warning("released %s of node %r%s", _paths(deleted), node_id, who)
        return deleted
