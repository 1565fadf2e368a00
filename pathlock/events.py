"""What happens to locks, told to hooks: one interface for logs, metrics and your own.

Subclass :class:`Hooks`, override the methods of the events you care about,
and pass instances to ``PathLockManager(..., hooks=[...])``::

    class SlowGrants(Hooks):
        def lock_granted(self, event: events.Granted) -> None:
            if event.waited > 1.0:
                print(f"customer {event.customer_id} waited {event.waited:.1f} s")

Every lock request ends in exactly one of :class:`Granted`, :class:`TimedOut`,
:class:`Deadlocked` or :class:`Failed`, each with the seconds it took. A
request that waits is :class:`Queued` first. The database's transient
failures are :class:`Retried`; a cluster node set aside is :class:`FailedOver`.
Held leases are :class:`Renewed` and end :class:`Released` or :class:`Lost`;
the reaper's work is :class:`Reaped`.

A hook runs on the thread where the event happened: the caller's for its
request and its release, the heartbeat's for renewals and most losses, the
reaper's for its runs. It must be quick, it must not call the manager, and it
should not raise: an exception from a hook is logged (logger
``pathlock.events``) and otherwise ignored, and the other hooks still run.

pathlock's own log lines (loggers ``pathlock.store``, ``pathlock.lease`` and
``pathlock.manager``) are one implementation of this
interface, always installed; OpenTelemetry metrics are another
(:mod:`pathlock.otel`, installed when ``opentelemetry-api`` is).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from pathlock.errors import ArgumentTypeError
from pathlock.types import Owner, PathMode, describe_paths

log = logging.getLogger(__name__)

Reason = Literal["transient", "lost race"]
"""Why a database transaction was retried: a transient failure (lost
connection, lock-wait timeout, a cluster node that cannot serve), or a race
lost to a concurrent write (a deadlock the database broke; on a cluster, a
certification failure)."""


@dataclass(frozen=True, slots=True)
class Granted:
    """A lock request was granted."""

    customer_id: int
    lease_id: str
    paths: tuple[PathMode, ...]
    owner: Owner
    fencing_token: int
    waited: float
    """Seconds from the call to the grant, waiting and retries included."""
    blocking: bool
    """False for :meth:`~pathlock.CustomerLocks.try_lock_paths`."""


@dataclass(frozen=True, slots=True)
class Queued:
    """A blocked request took a place in its customer's queue (once per
    request, and again if it lost its place and queued anew)."""

    customer_id: int
    lease_id: str
    paths: tuple[PathMode, ...]
    ticket: int
    ahead: int
    """Older conflicting requests that go first."""


@dataclass(frozen=True, slots=True)
class TimedOut:
    """A request was not granted in its time: :class:`~pathlock.LockTimeout`
    raised, or a try-lock that found a conflict (``blocking`` false) returned
    ``None``."""

    customer_id: int
    lease_id: str
    paths: tuple[PathMode, ...]
    waited: float
    blocking: bool
    unanswered: bool
    """The time ran out while the database did not answer."""


@dataclass(frozen=True, slots=True)
class Deadlocked:
    """A request could never be granted: :class:`~pathlock.DeadlockDetected`."""

    customer_id: int
    lease_id: str
    paths: tuple[PathMode, ...]
    waited: float


@dataclass(frozen=True, slots=True)
class Failed:
    """A request ended with any other error (the database failed, the manager
    closed, an interrupt): ``error`` is what the caller got."""

    customer_id: int
    lease_id: str
    paths: tuple[PathMode, ...]
    waited: float
    error: BaseException
    blocking: bool


@dataclass(frozen=True, slots=True)
class Retried:
    """One database transaction is tried again."""

    action: str
    """What the transaction does, in words (``"lock paths"``, ...)."""
    reason: Reason
    count: int
    """Retries of this transaction for this reason so far, this one included."""
    delay: float
    """Seconds until the next attempt."""
    node: str
    """The database node the failed attempt ran on (``host:port/database``)."""
    error: str


@dataclass(frozen=True, slots=True)
class FailedOver:
    """A node of several failed and is passed over for ``set_aside`` seconds:
    operations move to the other nodes."""

    node: str
    error: str
    set_aside: float


@dataclass(frozen=True, slots=True)
class Renewed:
    """Leases were renewed in one transaction."""

    leases: int
    """How many of the leases asked for were still there and renewed."""
    gone: int
    """How many were found gone (each is also :class:`Lost`)."""
    seconds: float
    background: bool
    """Renewed by the heartbeat (else by :meth:`~pathlock.Lease.renew`)."""


@dataclass(frozen=True, slots=True)
class Lost:
    """A lease held by this process is lost: found gone, or not renewed in time."""

    customer_id: int
    lease_id: str
    paths: tuple[PathMode, ...]
    reason: str
    held: float
    """Seconds since it was granted."""


@dataclass(frozen=True, slots=True)
class Released:
    """A lease of this process was released: by its holder
    (:meth:`~pathlock.Lease.release`, its ``with`` block,
    :meth:`~pathlock.CustomerLocks.release_locks`) or by ``close()``."""

    customer_id: int
    lease_id: str
    paths: tuple[PathMode, ...]
    held: float
    """Seconds from the grant to the release."""


@dataclass(frozen=True, slots=True)
class Reaped:
    """A run of :meth:`~pathlock.PathLockManager.reap_expired` deleted rows."""

    locks: int
    waiters: int
    seconds: float


class Hooks:
    """The events of a manager, one method each; every method here does
    nothing. Subclass it and override what you need."""

    def lock_granted(self, event: Granted) -> None:
        """A request was granted."""

    def lock_queued(self, event: Queued) -> None:
        """A blocked request took its place in the queue."""

    def lock_timed_out(self, event: TimedOut) -> None:
        """A request was not granted in its time (or a try-lock was denied)."""

    def deadlock_detected(self, event: Deadlocked) -> None:
        """A request could never be granted."""

    def lock_failed(self, event: Failed) -> None:
        """A request ended with another error."""

    def database_retried(self, event: Retried) -> None:
        """A database transaction is retried."""

    def failed_over(self, event: FailedOver) -> None:
        """A cluster node was set aside."""

    def leases_renewed(self, event: Renewed) -> None:
        """Leases were renewed."""

    def lease_lost(self, event: Lost) -> None:
        """A lease was lost."""

    def lease_released(self, event: Released) -> None:
        """A lease was released."""

    def expired_reaped(self, event: Reaped) -> None:
        """Expired rows were deleted."""


class LoggingHooks(Hooks):
    """pathlock's log lines, under the logger names operators filter on."""

    def __init__(self, max_attempts: int = 5) -> None:
        self._max_attempts = max_attempts
        self._store = logging.getLogger("pathlock.store")
        self._lease = logging.getLogger("pathlock.lease")
        self._manager = logging.getLogger("pathlock.manager")

    def database_retried(self, event: Retried) -> None:
        if event.reason == "transient":
            self._store.warning(
                "%s: transient database error (attempt %d of %d, retrying in %.0f ms): %s",
                event.action,
                event.count,
                self._max_attempts,
                event.delay * 1000,
                event.error,
            )
        # The first max_attempts lost races of an operation are logged, then
        # only the 8th, 16th, 32nd...: on a cluster without affinity a hot
        # customer loses many races, and one line per race would drown the log.
        elif event.count <= self._max_attempts or event.count & (event.count - 1) == 0:
            self._store.warning(
                "%s: lost a race with a concurrent write (%d so far, retrying in %.0f ms): %s",
                event.action,
                event.count,
                event.delay * 1000,
                event.error,
            )

    def failed_over(self, event: FailedOver) -> None:
        self._store.warning(
            "database node %s failed (%s); using the other nodes for %g s",
            event.node,
            event.error,
            event.set_aside,
        )

    def lease_lost(self, event: Lost) -> None:
        self._lease.warning(
            "lease %s (%s) lost: %s", event.lease_id, describe_paths(event.paths), event.reason
        )

    def expired_reaped(self, event: Reaped) -> None:
        # Every run, those that found nothing too: that the reaper runs at
        # all is what its operator looks for (`pathlock reaper -v`).
        self._manager.info(
            "reaped %d expired lock %s and %d dead waiter %s in %.3f s",
            event.locks,
            "row" if event.locks == 1 else "rows",
            event.waiters,
            "row" if event.waiters == 1 else "rows",
            event.seconds,
        )


def checked(hooks: object) -> tuple[Hooks, ...]:
    """``hooks`` (an iterable of :class:`Hooks`) as a tuple; a clear
    :class:`~pathlock.ArgumentTypeError` for anything else."""
    if isinstance(hooks, Hooks) or not isinstance(hooks, Iterable) or isinstance(hooks, str):
        raise ArgumentTypeError(
            f"hooks must be a list of pathlock.Hooks instances, got {type(hooks).__name__}"
        )
    result = tuple(hooks)
    for hook in result:
        if not isinstance(hook, Hooks):
            raise ArgumentTypeError(
                f"hooks must be pathlock.Hooks instances (subclass it), got {type(hook).__name__}"
            )
    return result


class Emitter:
    """Tells every hook of a manager about an event. A hook that raises is
    logged and skipped; the others still run, and the operation goes on."""

    __slots__ = ("hooks",)

    def __init__(self, hooks: Sequence[Hooks] = ()) -> None:
        self.hooks = tuple(hooks)

    def _emit(self, method: str, event: object) -> None:
        for hook in self.hooks:
            try:
                getattr(hook, method)(event)
            except Exception:
                log.exception("the %s hook of %r failed", method, hook)

    def granted(self, event: Granted) -> None:
        self._emit("lock_granted", event)

    def queued(self, event: Queued) -> None:
        self._emit("lock_queued", event)

    def timed_out(self, event: TimedOut) -> None:
        self._emit("lock_timed_out", event)

    def deadlocked(self, event: Deadlocked) -> None:
        self._emit("deadlock_detected", event)

    def failed(self, event: Failed) -> None:
        self._emit("lock_failed", event)

    def retried(self, event: Retried) -> None:
        self._emit("database_retried", event)

    def failed_over(self, event: FailedOver) -> None:
        self._emit("failed_over", event)

    def renewed(self, event: Renewed) -> None:
        self._emit("leases_renewed", event)

    def lost(self, event: Lost) -> None:
        self._emit("lease_lost", event)

    def released(self, event: Released) -> None:
        self._emit("lease_released", event)

    def reaped(self, event: Reaped) -> None:
        self._emit("expired_reaped", event)


SILENT = Emitter()
"""No hooks: for the internals used without a manager (tests, the benchmarks)."""
