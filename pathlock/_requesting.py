"""A manager's lock requests: the request made from the caller's arguments
and carried out by :func:`pathlock._acquire.acquire`, the grant delivered as a
lease, the hooks told how it ended, and whatever a failure or an interrupt
left of it resolved."""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

from pathlock import _deadlines as deadlines
from pathlock import events
from pathlock._acquire import acquire
from pathlock._core import validation
from pathlock._core.records import GrantRequest, lease_data
from pathlock._holding import Holding
from pathlock.errors import (
    BackendError,
    ContentionTimeout,
    DeadlockDetected,
    LockTimeout,
    PathLockError,
)
from pathlock.lease import Lease, LostCallback
from pathlock.paths import normalize_request, normalize_shallow
from pathlock.types import (
    Cancel,
    Owner,
    PathMode,
)

T = TypeVar("T")

_NONE_SHALLOW: frozenset[str] = frozenset()  # a request with no path at depth 0


class Requesting(Holding):
    """A manager's lock requests."""

    def _acquire(
        self,
        customer_id: int,
        exclusive: Iterable[str],
        shared: Iterable[str],
        *,
        timeout: object,
        reason: object,
        ttl: object,
        blocking: bool,
        on_lost: LostCallback | None,
        owner: object,
        cancel: object = None,
        holder: Owner | None = None,
        data: object = None,
        shallow: object = (),
    ) -> Lease | None:
        """A request (see :meth:`CustomerLocks.lock_paths`); ``holder``: the
        owner, found by the caller already (the asyncio API finds it in the
        caller's task)."""
        paths, depth_0 = self._request_paths(exclusive, shared, shallow)
        wait_limit = validation.timeout(timeout) if blocking else 0.0
        event = validation.cancel(cancel)
        request = GrantRequest(
            customer_id=customer_id,
            lease_id=secrets.token_hex(16),
            paths=paths,
            owner=self._owner(owner) if holder is None else holder,
            reason=validation.reason(reason),
            ttl=self._ttl if ttl is None else validation.ttl(ttl),
            abandoned=self._abandoned_leases(),
            data=lease_data(validation.data(data)),
            shallow=depth_0,
        )
        callbacks = () if on_lost is None else (on_lost,)

        def register(token: int, started: float, term: float | None) -> Lease:
            return self._register(request, token, started, callbacks, term)

        try:
            return self._grant(
                request, register, blocking=blocking, wait_limit=wait_limit, cancel=event
            )
        except BaseException:
            # Raised after the lease was registered, on the way out of the
            # call (a signal held back while the call counted itself out
            # raises there; a hook): the caller never gets the lease, so
            # nobody would release it, and its rows would make this owner's
            # next request fail as one that waits for itself.
            self._undelivered(request)
            raise

    def _request_paths(
        self, exclusive: object, shared: object, shallow: object
    ) -> tuple[tuple[PathMode, ...], frozenset[str]]:
        """A request's normalized (path, mode) pairs and those of its paths
        locked at depth 0 (see :meth:`CustomerLocks.lock_paths`)."""
        folded = self._case_insensitive
        depth_0 = _NONE_SHALLOW
        if shallow != ():  # given (the default is the empty tuple)
            depth_0 = normalize_shallow(shallow, case_insensitive=folded)
        paths = normalize_request(exclusive, shared, shallow=depth_0, case_insensitive=folded)
        return paths, depth_0

    def _grant(
        self,
        request: GrantRequest,
        deliver: Callable[[int, float, float | None], T],
        *,
        blocking: bool,
        wait_limit: float | None,
        cancel: Cancel | None,
        take_up_later: bool | None = None,
    ) -> T | None:
        """Carry out ``request`` (see :meth:`_acquire`): what ``deliver``
        makes of its grant (its fencing token, when its granting attempt
        started and how long its rows last from then if not its ttl: see
        :func:`pathlock._acquire.acquire`), or ``None`` for a try-lock that
        was denied. Paths handed to it are taken up by the lease's first
        renewal where the manager renews leases, unless ``take_up_later`` is
        false; else before this returns. Whatever raises after the grant,
        ``deliver`` included, leaves nothing of it."""
        called = time.monotonic()
        # The request's limit, to tell afterwards whether any of its attempts
        # got as far as a connection: if none did, nothing can have been
        # granted or queued, whatever stopped it (a database that never
        # answers a new connection, say), and there is nothing to clean up.
        scope: list[deadlines.Limit] = []

        def reached_database() -> bool:
            return not scope or scope[0].connected

        with self._told(request, called, blocking=blocking), self._call("lock paths"):
            try:
                granted = acquire(
                    self._store,
                    self._wakeups,
                    self._backoff,
                    request,
                    blocking=blocking,
                    wait_limit=wait_limit,
                    closed=lambda: self._closed,
                    cancel=cancel,
                    left_behind=self._leave_later,
                    take_up_later=self._renews if take_up_later is None else take_up_later,
                    limits=scope,
                )
                if granted is None:
                    self._events.timed_out(self._denied(request, called))
                    return None
                token, started, term = granted
                lease = deliver(token, started, term)
                # In the try: an interrupt in a hook must not leave the lease
                # registered and unknown to the caller.
                self._events.granted(
                    events.Granted(
                        request.customer_id,
                        request.lease_id,
                        request.paths,
                        request.owner,
                        token,
                        time.monotonic() - called,
                        blocking,
                    )
                )
                return lease  # noqa: TRY300 - see above
            except (BackendError, LockTimeout) as error:
                if isinstance(error, BackendError) and self._store.tables_missing(error):
                    raise  # without the tables nothing can have been granted
                if not reached_database():
                    raise
                if isinstance(error, BackendError) or error.contended or error.unanswered:
                    # An attempt whose COMMIT went out but whose reply never
                    # came may have granted the rows after all, and no later
                    # attempt found out. They block this owner like any
                    # abandoned lease until they are deleted by their lease id
                    # (soon, from a background thread, once the database
                    # answers) or expire within the ttl.
                    self._abandon(request.lease_id, request.ttl)
                    self._in_doubt.add(request.customer_id, request.lease_id, request.ttl)
                    self._in_doubt.settle_soon()
                if isinstance(error, ContentionTimeout) and not blocking:
                    # A try-lock that could not be granted without waiting.
                    self._events.timed_out(self._denied(request, called))
                    return None
                raise
            except PathLockError:
                raise  # denied for good (deadlock, closed): nothing was granted
            except BaseException:
                # Interrupted (Ctrl-C, an exception raised by a signal
                # handler, ...) at any point: the last attempt's COMMIT may
                # have landed, or the lease may be registered already. Its
                # rows must not outlive the call unknown to anyone.
                if reached_database():
                    self._resolve(request.customer_id, request.lease_id, request.ttl)
                raise

    @contextlib.contextmanager
    def _told(self, request: GrantRequest, called: float, *, blocking: bool) -> Iterator[None]:
        """Tell the hooks how a request that did not return ended."""
        try:
            yield
        except LockTimeout as error:
            waited = time.monotonic() - called
            self._events.timed_out(
                events.TimedOut(
                    request.customer_id,
                    request.lease_id,
                    request.paths,
                    waited,
                    blocking,
                    error.unanswered,
                )
            )
            raise
        except DeadlockDetected:
            waited = time.monotonic() - called
            self._events.deadlocked(
                events.Deadlocked(request.customer_id, request.lease_id, request.paths, waited)
            )
            raise
        except BaseException as error:
            self._events.failed(self._failure(request, called, error, blocking=blocking))
            raise

    @staticmethod
    def _denied(request: GrantRequest, called: float) -> events.TimedOut:
        """A try-lock that found a conflict."""
        waited = time.monotonic() - called
        return events.TimedOut(
            request.customer_id, request.lease_id, request.paths, waited, False, False
        )

    @staticmethod
    def _failure(
        request: GrantRequest, called: float, error: BaseException, *, blocking: bool
    ) -> events.Failed:
        waited = time.monotonic() - called
        return events.Failed(
            request.customer_id, request.lease_id, request.paths, waited, error, blocking
        )
