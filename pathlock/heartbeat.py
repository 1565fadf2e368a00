"""The renewal thread: keeps a manager's leases alive, or says they are lost.

One scheduler thread per manager wakes when a lease is due for renewal (a third
of its ttl after its last renewal began) or about to be presumed lost. Renewals
run on a separate short-lived thread, so a database call stuck in the network
never stops the scheduler from declaring a lease lost in time: a lease that
could not be renewed is reported lost ``margin`` seconds before its
conservative deadline, i.e. before the database could grant its paths to
anyone else.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from pathlock.errors import PathLockError
from pathlock.lease import Lease

log = logging.getLogger(__name__)

# After a failed renewal round, try again this soon (capped by a tenth of ttl).
_RETRY_AFTER = 1.0


class Heartbeat:
    """Schedules renewals of the leases ``leases()`` returns."""

    def __init__(
        self,
        leases: Callable[[], list[Lease]],
        renew: Callable[[list[Lease]], None],
        *,
        name: str = "pathlock-heartbeat",
    ) -> None:
        self._leases = leases
        self._renew = renew
        self._name = name
        self._condition = threading.Condition()
        self._thread: threading.Thread | None = None
        self._in_flight: threading.Thread | None = None
        self._stopping = False
        # Set by wake() and by a finished renewal: the leases changed since the
        # thread last looked, so it must look again before sleeping (a notify
        # that arrives while it is computing would otherwise be lost).
        self._changed = False

    def wake(self) -> None:
        """A lease was added or changed: start the thread, or recompute its sleep."""
        with self._condition:
            if self._stopping:
                return
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._changed = True
            self._condition.notify()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread and wait up to ``timeout`` seconds, in all, for it
        and for a renewal in flight (one stuck in the network is left behind:
        it is a daemon thread and its engine is about to be disposed)."""
        deadline = time.monotonic() + timeout
        with self._condition:
            self._stopping = True
            self._condition.notify()
            thread = self._thread
        for waited in (thread, self._in_flight):
            if waited is not None and waited is not threading.current_thread():
                waited.join(max(0.0, deadline - time.monotonic()))

    def _run(self) -> None:
        while True:
            with self._condition:
                if self._stopping:
                    return
                self._changed = False
            now = time.monotonic()
            live = [lease for lease in self._leases() if not lease.released]
            self._declare_lost(live, now)
            live = [lease for lease in live if not lease.lost]
            due = [lease for lease in live if lease.renew_due <= now]
            if due:
                self._start_renewal(due)
            # renew_due always comes before lost_at; both matter after a failed round.
            wake_at = min((min(lease.renew_due, lease.lost_at) for lease in live), default=None)
            with self._condition:
                if self._stopping:
                    return
                if self._changed:
                    continue
                timeout = None if wake_at is None else max(0.0, wake_at - time.monotonic())
                # A lease due while its renewal is in flight must not spin.
                if timeout is not None and self._in_flight is not None:
                    timeout = max(timeout, 0.05)
                self._condition.wait(timeout)

    @staticmethod
    def _declare_lost(leases: list[Lease], now: float) -> None:
        for lease in leases:
            if now >= lease.lost_at:
                lease._mark_lost(  # once: later calls do nothing
                    f"not renewed for {lease.ttl - lease.margin:.1f} s (database unreachable?); "
                    f"it may have expired, so it counts as lost"
                )

    def _start_renewal(self, due: list[Lease]) -> None:
        with self._condition:
            if self._in_flight is not None and self._in_flight.is_alive():
                return
            thread = threading.Thread(
                target=self._renew_round, args=(due,), name=f"{self._name}-renew", daemon=True
            )
            self._in_flight = thread
        thread.start()

    def _renew_round(self, due: list[Lease]) -> None:
        try:
            self._renew(due)
        except Exception as error:  # the thread must survive anything
            if isinstance(error, PathLockError):
                log.warning("renewing %d lease(s) failed, retrying soon: %s", len(due), error)
            else:
                log.exception("renewing %d lease(s) failed unexpectedly", len(due))
            retry_at = time.monotonic()
            for lease in due:
                lease.renew_due = retry_at + min(_RETRY_AFTER, lease.ttl / 10)
        finally:
            with self._condition:
                self._in_flight = None
                self._changed = True
                self._condition.notify()
