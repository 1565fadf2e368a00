"""The lock request's loop, run on the caller's thread: the steps of
:class:`pathlock._core.flow.AcquireFlow` (which decides everything and does no I/O)
carried out against the store, this process's wake-ups and ``time``.

A step that fails is thrown back into the flow, which decides what the
failure means; an interrupt (Ctrl-C, an exception raised by a signal handler)
is not: it ends the request at once. Whatever ends it, a request that holds a
place in the queue gives it up before this returns.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from pathlock import _deadlines as deadlines
from pathlock import _owners as owners
from pathlock import events
from pathlock._core.flow import (
    AcquireFlow,
    Attempt,
    Behind,
    Judge,
    Place,
    ReadVersion,
    Refresh,
    Result,
    Sleep,
    Step,
    Stop,
    TakeUp,
    drive,
)
from pathlock._core.records import Granted, GrantRequest
from pathlock._store import Store
from pathlock.errors import LockCancelled, ManagerClosed, PathLockError
from pathlock.types import Cancel
from pathlock.waiting import LocalWakeups, WaitPolicy, Watch

log = logging.getLogger("pathlock.acquire")

CANCEL_CHECK = 0.05
"""Seconds between the checks of a waiting request's ``cancel`` event."""


LeftBehind = Callable[[int, str], None]
"""What :func:`acquire` calls with a request's customer and lease id when the
request could not leave the queue."""


def acquire(
    store: Store,
    wakeups: LocalWakeups,
    policy: WaitPolicy,
    request: GrantRequest,
    *,
    blocking: bool,
    wait_limit: float | None,
    closed: Callable[[], bool] = lambda: False,
    cancel: Cancel | None = None,
    left_behind: LeftBehind | None = None,
    take_up_later: bool = False,
    limits: list[deadlines.Limit] | None = None,
) -> Result:
    """Attempt until ``request`` is granted: return its fencing token, the
    lease clock's time (``settings.clock.now()``) when its granting attempt
    started, and how long its rows last from then if not its ttl (see
    :data:`pathlock._core.flow.Result`). ``None`` if ``blocking`` is false and the
    one attempt was denied.
    Raises what :class:`~pathlock._core.flow.AcquireFlow` raises: :class:`LockTimeout`
    after ``wait_limit`` seconds (``None``: no limit), :class:`DeadlockDetected`,
    :class:`ContentionTimeout` for a try-lock that kept losing races,
    :class:`ManagerClosed` once ``closed()`` is true (the manager's close wakes
    local waiters), :class:`LockCancelled` once ``cancel`` is set (seen within
    :data:`CANCEL_CHECK` seconds while the request sleeps; an attempt under way
    ends first).

    Paths a release handed to the request are taken up (extended to its
    ttl) before this returns, or with ``take_up_later`` (the caller renews
    its leases) by the lease's first renewal: then the result says how long
    they last until then.

    A request that gives up leaves the queue within its time; if the database
    does not answer in time, ``left_behind(customer_id, lease_id)`` is called
    so that its row is deleted later, before it would have lapsed
    (``settings.waiter_ttl``) and held up the requests queued behind it.

    Everything, the database's waits included, ends within ``wait_limit`` +
    ``grace`` seconds (a try-lock: ``try_time`` + ``grace``): a blocking
    request whose time ran out while the database did not answer raises
    :class:`LockTimeout` with ``unanswered`` set, a try-lock
    :class:`DatabaseTimeout`. Without a ``wait_limit``, each database call has
    its own bound (:class:`DatabaseTimeout` after ``call_time``).

    ``limits``: the request's limit is appended to it, for the caller to tell
    afterwards whether any attempt got a connection
    (:attr:`pathlock._deadlines.Limit.connected`)."""
    store.grants.prepare(request)  # client CPU, not the database's time
    flow = AcquireFlow(
        request,
        store.settings,
        policy.start(),
        blocking=blocking,
        wait_limit=wait_limit,
        handed_over=store.hands_over,
        owner_busy=not owners.is_named(request.owner),
        told=wakeups.told,
    )
    watch = wakeups.watch(request.customer_id, request.paths)

    def bounded(limit: deadlines.Limit) -> Result:
        if limits is not None:
            limits.append(limit)
        with watch:
            try:
                steps = _Steps(store, request, watch, closed, cancel, take_up_later=take_up_later)
                return _run(flow, steps)
            finally:
                _leave(store, request, flow.leave(), left_behind)

    try:
        return deadlines.within(flow.limit, bounded)
    finally:
        watch.close()  # again, if an interrupt cut the with block's exit short


def _run(flow: AcquireFlow, steps: _Steps) -> Result:
    """Run ``flow``'s steps with ``steps``. The first attempt is made here,
    before the flow's generator: a request granted at once never drives it
    (see :meth:`AcquireFlow.attempt`)."""
    stop = steps.stop()
    if stop is not None:
        raise stop
    first: Any
    try:
        first = steps.attempt(flow.attempt())
    except PathLockError as error:
        first = error  # the flow decides what it means
    if isinstance(first, Granted):
        return flow.granted(first)
    return drive(flow.steps(first), steps, PathLockError)


class _Steps:
    """Carries out one request's steps."""

    def __init__(
        self,
        store: Store,
        request: GrantRequest,
        watch: Watch,
        closed: Callable[[], bool],
        cancel: Cancel | None,
        *,
        take_up_later: bool,
    ) -> None:
        self._take_up_later = take_up_later
        self._store = store
        self._request = request
        self._watch = watch
        self._closed = closed
        self._cancel = cancel

    def attempt(self, step: Attempt) -> Any:
        return self._store.grants.try_grant(
            self._request,
            step.ticket,
            queue=step.queue,
            patience=step.patience,
            deadline=step.deadline,
            first=step.first,
        )

    def stop(self) -> PathLockError | None:
        if self._closed():
            return ManagerClosed("lock paths")
        if self._cancel is not None and self._cancel.is_set():
            return LockCancelled(self._request.paths, self._request.shallow)
        return None

    def __call__(self, step: Step) -> Any:  # noqa: PLR0911 - one per kind of step
        store, request = self._store, self._request
        if isinstance(step, Attempt):
            return self.attempt(step)
        if isinstance(step, Sleep):
            if self._cancel is None:
                return self._watch.wait(step.seconds, step.idle)
            # An Event cannot wake the watch: sleep in short slices.
            seconds, idle = min(step.seconds, CANCEL_CHECK), min(step.idle, CANCEL_CHECK)
            return self._watch.wait(seconds, idle) or self._cancel.is_set()
        if isinstance(step, ReadVersion):
            lease_id = request.lease_id if step.handed else None
            return store.queue.watch(
                request.customer_id,
                lease_id,
                step.ahead,
                held=step.held,
                deadline=step.deadline,
                shared=True,
                asker=request.lease_id,
            )
        if isinstance(step, TakeUp):
            if step.later and self._take_up_later:
                return None  # the lease's first renewal takes them up
            return store.queue.take_up(request, deadline=step.deadline)
        if isinstance(step, Behind):
            return self._watch.behind()
        if isinstance(step, Judge):
            return store.queue.could_grant(request, step.ticket, deadline=step.deadline)
        if isinstance(step, Place):
            self._watch.queued(step.ticket, step.ahead)
            if step.new and step.ticket is not None:
                store.events.queued(
                    events.Queued(
                        request.customer_id,
                        request.lease_id,
                        request.paths,
                        step.ticket,
                        len(step.ahead),
                    )
                )
            return None
        if isinstance(step, Refresh):
            return self._refresh(step)
        if isinstance(step, Stop):
            return self.stop()
        raise TypeError(f"unknown step {step!r}")  # pragma: no cover - a bug

    def _refresh(self, step: Refresh) -> bool:
        """Keep the request's queue row alive, with the other queued
        requests of this process and customer that are due (one transaction
        for all); or nothing, where such a refresh, begun within half a
        refresh interval, found it alive or is under way. False when its row
        lapsed or was deleted."""
        watch, store = self._watch, self._store
        settings = store.settings
        now = settings.clock.monotonic()
        # A row kept alive from then lasts a waiter ttl (three refresh
        # intervals): more than the request waits until its next refresh,
        # with half a refresh to spare; and if a refresh under way fails,
        # the next one still finds the row alive.
        tickets = watch.to_refresh(step.ticket, now - settings.waiter_refresh / 2, now)
        if not tickets:
            return True
        alive: set[int] | None = None
        try:
            alive = store.queue.refresh_waiters(
                self._request.customer_id, tickets, deadline=step.deadline
            )
        finally:
            watch.kept_alive(tickets, alive, now)
        return step.ticket in alive


def _leave(
    store: Store, request: GrantRequest, ticket: int | None, left_behind: LeftBehind | None
) -> None:
    """Give up the place (timeout, deadlock, error, interrupt)."""
    if ticket is None:
        return
    try:
        store.queue.leave_queue(request.customer_id, request.lease_id, ticket)
    except PathLockError as error:
        log.warning(
            "could not leave the queue (customer %d, ticket %d): %s; %s",
            request.customer_id,
            ticket,
            error,
            "deleting the row later"
            if left_behind
            else f"the row stops counting within {store.settings.waiter_ttl:g} s",
        )
        if left_behind is not None:
            left_behind(request.customer_id, request.lease_id)
