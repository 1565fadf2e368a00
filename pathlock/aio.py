"""The asyncio API: :class:`AsyncPathLockManager`, its customers' locks and
its leases.

It is the synchronous API's algorithm, run without blocking the event loop:
MySQL and MariaDB through asyncmy, SQLite on worker threads (or through
aiosqlite), every wait a coroutine on the loop (see :mod:`pathlock._aio`).
The owner of a lease is the asyncio task that asked for it (or the
``owner=`` name it gives).

Cancellation leaves nothing behind. A task cancelled while it waits leaves
the queue; one cancelled while its grant commits has the grant undone; the
clean-up runs before the cancellation reaches the caller (bounded by
``settings.resolve_time``; the manager finishes what is left). A release
that is cancelled goes on and finishes, in the manager's hands.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Generator, Iterable, Sequence
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar, cast

from sqlalchemy import URL

from pathlock import _deadlines as deadlines
from pathlock import _reaper as reaper
from pathlock import events
from pathlock._aio import TaskHeartbeat, spawn
from pathlock._core import validation
from pathlock.dialects.base import is_async
from pathlock.errors import ArgumentTypeError, InvalidArgument, LeaseLost
from pathlock.lease import Lease
from pathlock.manager import CLOSED_WHILE_HELD, PathLockManager
from pathlock.settings import Settings
from pathlock.types import DetachedLease, LeaseInfo, LockInfo, Owner, PathMode, WaiterInfo
from pathlock.waiting import WaitPolicy

if TYPE_CHECKING:
    from apscheduler.job import Job
    from apscheduler.schedulers.base import BaseScheduler
    from sqlalchemy.ext.asyncio import AsyncEngine

log = logging.getLogger("pathlock.manager")

T = TypeVar("T")

AsyncLostCallback = Callable[["AsyncLease"], object]
"""``on_lost`` of the asyncio API: a function or a coroutine function, called
(or awaited in a task of its own) on the manager's event loop with the lost
:class:`AsyncLease`."""


class _Core(PathLockManager):
    """The synchronous manager's code, set up to run in greenlets on a loop."""

    _asynchronous = True


class AsyncPathLockManager:
    """Hierarchical path locks for asyncio applications: the same locks, on
    the same database, as :class:`PathLockManager`, with the same options.

    ``database``: a URL (``mysql+pymysql://`` and ``mariadb+pymysql://`` are
    read with asyncmy; ``sqlite:///`` runs each transaction whole on a worker
    thread, through the standard library's driver; ``mysql+asyncmy://`` and
    ``sqlite+aiosqlite://`` are taken as they are), a
    :class:`~sqlalchemy.ext.asyncio.AsyncEngine`, a list of the nodes of a
    cluster, or ``None`` for the default database. The drivers come with
    ``pip install 'pathlock[async]'``.

    Nothing touches the database before the manager is first used (or
    entered with ``async with``); options are checked at once. Close it with
    :meth:`aclose` (or ``async with``) on the loop that used it.
    """

    def __init__(
        self,
        database: str | URL | AsyncEngine | Sequence[str | URL | AsyncEngine] | None = None,
        /,
        *,
        node_id: str | None = None,
        ttl: float = 30.0,
        case_insensitive: bool = False,
        backoff: WaitPolicy | None = None,
        max_attempts: int = 5,
        heartbeat: bool = True,
        on_lost: AsyncLostCallback | None = None,
        cleanup_on_start: bool = False,
        affinity: bool = False,
        engine_options: dict[str, Any] | None = None,
        settings: Settings | None = None,
        hooks: Iterable[events.Hooks] = (),
        meter_provider: object = None,
        tracer_provider: object = None,
    ) -> None:
        _callable_or_none("on_lost", on_lost)
        self._leases: dict[str, AsyncLease] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._opened = False
        self._opening = asyncio.Lock()
        self._on_lost = on_lost
        self._core = _Core(
            cast(Any, database),  # an AsyncEngine is taken through its synchronous face
            node_id=node_id,
            ttl=ttl,
            case_insensitive=case_insensitive,
            backoff=backoff,
            max_attempts=max_attempts,
            heartbeat=heartbeat,
            on_lost=None if on_lost is None else self._lost,
            cleanup_on_start=cleanup_on_start,
            affinity=affinity,
            engine_options=engine_options,
            settings=settings,
            hooks=hooks,
            meter_provider=meter_provider,
            tracer_provider=tracer_provider,
        )

    # -- options, read-only ---------------------------------------------------

    @property
    def node_id(self) -> str:
        """This app server's name, stored with every lock."""
        return self._core.node_id

    @property
    def ttl(self) -> float:
        """The default lease duration in seconds."""
        return self._core.ttl

    @property
    def case_insensitive(self) -> bool:
        """Whether paths are case-folded."""
        return self._core.case_insensitive

    @property
    def settings(self) -> Settings:
        """The timing of every operation (see :class:`Settings`)."""
        return self._core.settings

    @property
    def backoff(self) -> WaitPolicy:
        """How a blocked request paces its checks."""
        return self._core.backoff

    # -- the API --------------------------------------------------------------

    def for_customer(self, customer_id: int) -> AsyncCustomerLocks:
        """The locks of one customer (tenant); customers never block each other."""
        customer_id = validation.customer_id(customer_id)
        self._core._check_open("lock paths")
        return AsyncCustomerLocks(self, customer_id)

    async def create_schema(self) -> None:
        """Create the tables that do not exist yet (see
        :meth:`PathLockManager.create_schema`)."""
        await self._open()
        await self._direct(self._core.create_schema)

    async def list_locks(
        self, customer_id: int | None = None, *, include_expired: bool = False
    ) -> list[LockInfo]:
        """Locked paths of one customer (or of all), sorted by customer and path."""
        return await self._call(self._core.list_locks, customer_id, include_expired=include_expired)

    async def list_waiters(self, customer_id: int | None = None) -> list[WaiterInfo]:
        """Queued requests of one customer (or of all), oldest first."""
        return await self._call(self._core.list_waiters, customer_id)

    async def database_time(self) -> datetime:
        """The database's clock (UTC), by which every lease expires."""
        return await self._call(self._core.database_time)

    async def reap_expired(self, *, batch_size: int = reaper.BATCH_SIZE) -> int:
        """Delete expired lock rows and dead waiter rows; return how many (see
        :meth:`PathLockManager.reap_expired`)."""
        return await self._call(self._core.reap_expired, batch_size=batch_size)

    async def release_lease(self, lease_id: str, *, requested_by: str = "") -> int:
        """Delete the rows of any lease, by its id (the operator's escape hatch)."""
        return await self._finished(self._core.release_lease, lease_id, requested_by=requested_by)

    async def release_node(self, node_id: str, *, requested_by: str = "") -> int:
        """Delete every lock and waiter row of ``node_id``."""
        return await self._finished(self._core.release_node, node_id, requested_by=requested_by)

    async def start_reaper(
        self, interval: float = reaper.INTERVAL, *, batch_size: int = reaper.BATCH_SIZE
    ) -> None:
        """Run :meth:`reap_expired` every ``interval`` seconds on a scheduler
        thread of the manager's own (its database calls run on this loop)."""
        await self._open()
        self._core.start_reaper(interval, batch_size=batch_size)

    async def add_reaper_job(
        self,
        scheduler: BaseScheduler,
        *,
        interval: float = reaper.INTERVAL,
        batch_size: int = reaper.BATCH_SIZE,
        job_id: str = reaper.JOB_ID,
    ) -> Job:
        """Add the reaper to an application's APScheduler 3 scheduler (an
        ``AsyncIOScheduler`` runs it in its thread pool; its database calls
        run on this manager's loop)."""
        await self._open()
        return self._core.add_reaper_job(
            scheduler, interval=interval, batch_size=batch_size, job_id=job_id
        )

    async def aclose(self) -> None:
        """Stop renewals and the reaper, release every lease still held, and
        dispose the engines pathlock created (see
        :meth:`PathLockManager.close`). Requests waiting in other tasks wake
        and raise :class:`ManagerClosed`. Idempotent."""
        core = self._core
        leases = core._begin_close()
        if leases is None:
            return
        # Again on a second call: a cancellation may have stopped the first
        # before it stopped them (every step is idempotent).
        if self._opened:
            await cast(TaskHeartbeat, core._heartbeat).aclose(core.settings.close_wait)
            # Thread joins: off the loop, which their last calls may need.
            await asyncio.to_thread(core._stop_background)
        else:
            core._stop_background()  # never started: nothing to wait for
        if self._opened:
            async with deadlines.limit(time.monotonic() + core.settings.close_time):
                for lease in leases:
                    lease._end(CLOSED_WHILE_HELD)
                    await self._wrap(lease)._release_held()
                await asyncio.to_thread(core._calls.wait_idle, core.settings.close_wait)
                await spawn(core._in_doubt.settle)
                pending = [task for task in self._tasks if not task.done()]
                if pending:
                    timeout = deadlines.capped(core.settings.close_wait)
                    await asyncio.wait(pending, timeout=timeout)
        await self._direct(core._finish_close)
        core._loop_runner.shutdown()

    async def __aenter__(self) -> AsyncPathLockManager:
        try:
            await self._open()
        except BaseException:
            await self.aclose()  # no __aexit__ follows: dispose the engines now
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return "<Async" + repr(self._core)[1:].replace("_Core", "PathLockManager", 1)

    # -- internals --------------------------------------------------------------

    async def _open(self) -> None:
        """Bind the manager to the running loop and make its first database
        calls (see :meth:`PathLockManager._open`), once."""
        loop = asyncio.get_running_loop()
        if self._opened:
            if loop is not self._loop:
                raise InvalidArgument(
                    "this AsyncPathLockManager belongs to another event loop: create one per loop"
                )
            return
        async with self._opening:
            if self._opened:
                return
            self._core._check_open("open the database")
            self._loop = loop
            self._core._loop_runner.bind(loop)
            await self._direct(self._core._open)
            self._opened = True

    async def _direct(self, function: Callable[[], T]) -> T:
        """``function`` of the core that uses the engines directly, not
        through attempts: in a greenlet on the loop, or, where the database
        is reached through a synchronous driver (SQLite), on a worker thread."""
        if is_async(self._core.engine):
            return await spawn(function)
        return await self._core._loop_runner.run_blocking(function)

    async def _call(self, function: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """``function`` of the core, run on the loop; a cancellation ends it
        (it only reads, or is safe to cut short)."""
        await self._open()
        return await spawn(function, *args, **kwargs)

    async def _finished(self, function: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """``function`` of the core, run to its end in a task of the manager:
        a cancellation of the caller does not stop it."""
        await self._open()
        task = self._task(spawn(function, *args, **kwargs))
        return await asyncio.shield(task)

    def _task(self, coroutine: Awaitable[T]) -> asyncio.Task[T]:
        """A task of the manager's own, kept until it ends; its failure, if
        nobody awaits it any more, is logged."""
        task: asyncio.Task[T] = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.debug("a task of the AsyncPathLockManager failed", exc_info=task.exception())

    async def _request(
        self, customer_id: int, paths: tuple[str, ...], options: dict[str, Any]
    ) -> AsyncLease | None:
        await self._open()
        core = self._core
        on_lost = options.pop("on_lost")
        _callable_or_none("on_lost", on_lost)
        # The owner is the calling task: found here, before the request moves
        # to a task of its own.
        holder = core._owner(options.pop("owner"))
        callbacks = None if on_lost is None else self._lost_callback(on_lost)
        request = self._task(
            spawn(
                core._acquire,
                customer_id,
                paths,
                options.pop("shared"),
                on_lost=callbacks,
                owner=None,
                holder=holder,
                **options,
            )
        )
        try:
            lease = await asyncio.shield(request)
        except asyncio.CancelledError:
            await self._cancel(request)
            raise
        return None if lease is None else self._wrap(lease)

    async def _detached(
        self, customer_id: int, paths: tuple[str, ...], options: dict[str, Any]
    ) -> DetachedLease | None:
        """A request for a detached lease, in a task of the manager's own (see
        :meth:`_request`)."""
        await self._open()
        request = self._task(
            spawn(
                self._core._acquire_detached,
                customer_id,
                paths,
                options.pop("shared"),
                **options,
            )
        )
        try:
            return await asyncio.shield(request)
        except asyncio.CancelledError:
            await self._cancel(request)
            raise

    async def _cancel(self, request: asyncio.Task[Lease | DetachedLease | None]) -> None:
        """The caller of ``request`` was cancelled: cancel the request and
        wait (up to ``settings.resolve_time`` in all) while it leaves the
        queue or undoes a grant caught in the middle. A lease granted anyway
        (the cancellation came after the grant) is released. Whatever is not
        done in time, the manager finishes."""
        ends = time.monotonic() + self._core.settings.resolve_time
        self._core._loop_runner.cancel(request)
        await asyncio.wait([request], timeout=self._core.settings.resolve_time)
        if not request.done():
            request.add_done_callback(self._release_orphan)
            return
        release = self._release_orphan(request)
        if release is not None:
            await asyncio.wait([release], timeout=max(0.0, ends - time.monotonic()))

    def _release_orphan(
        self, request: asyncio.Task[Lease | DetachedLease | None]
    ) -> asyncio.Task[Any] | None:
        """Release what a request whose caller is gone was granted."""
        if request.cancelled() or request.exception() is not None:
            return None
        lease = request.result()
        if isinstance(lease, DetachedLease):
            core = self._core
            return self._task(spawn(core._release_detached, lease.customer_id, lease.lease_id))
        return None if lease is None else self._task(self._wrap(lease)._release_held())

    def _wrap(self, lease: Lease) -> AsyncLease:
        wrapped = self._leases.get(lease.lease_id)
        if wrapped is None:
            wrapped = self._leases[lease.lease_id] = AsyncLease(self, lease)
        return wrapped

    def _lost_callback(self, callback: AsyncLostCallback) -> Callable[[Lease], None]:
        """A callback for the core, which calls ``callback`` on the loop."""

        def lost(lease: Lease) -> None:
            self._on_loop(callback, lease)

        return lost

    def _lost(self, lease: Lease) -> None:
        if self._on_lost is not None:
            self._on_loop(self._on_lost, lease)

    def _on_loop(self, callback: AsyncLostCallback, lease: Lease) -> None:
        """Call (or start, for a coroutine function) ``callback`` with the
        lease on the manager's loop (the core's callbacks run there, but a
        loss found by a thread of the core is reported from that thread)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            log.warning("lease %s was lost after its event loop closed", lease.lease_id)
            return

        def call() -> None:
            try:
                result = callback(self._wrap(lease))
                if inspect.isawaitable(result):
                    self._task(_logged(result, callback, lease.lease_id))
            except Exception:
                log.exception("on_lost callback %r failed for lease %s", callback, lease.lease_id)

        try:
            loop.call_soon_threadsafe(call)
        except RuntimeError:  # closed meanwhile
            log.warning("lease %s was lost after its event loop closed", lease.lease_id)


async def _logged(awaitable: Awaitable[object], callback: object, lease_id: str) -> None:
    try:
        await awaitable
    except Exception:
        log.exception("on_lost callback %r failed for lease %s", callback, lease_id)


async def _shielded(task: asyncio.Task[T]) -> T:
    return await asyncio.shield(task)


def _callable_or_none(name: str, value: object) -> None:
    if value is not None and not callable(value):
        raise ArgumentTypeError(
            f"{name} must be a function or a coroutine function that takes the lost "
            f"lease, or None; got {type(value).__name__}"
        )


class AsyncCustomerLocks:
    """The locks of one customer; get one from
    :meth:`AsyncPathLockManager.for_customer`."""

    def __init__(self, manager: AsyncPathLockManager, customer_id: int) -> None:
        self.manager = manager
        self.customer_id = customer_id

    def lock_paths(
        self,
        *paths: str,
        shared: Iterable[str] = (),
        shallow: Iterable[str] = (),
        timeout: float | None = None,
        reason: str = "",
        ttl: float | None = None,
        on_lost: AsyncLostCallback | None = None,
        owner: str | None = None,
        data: bytes | str | None = None,
    ) -> LockRequest:
        """Lock every path at once, all or nothing, waiting while any conflicts
        (see :meth:`CustomerLocks.lock_paths`): ``await`` it for the
        :class:`AsyncLease`, or use it as ``async with ... as lease``, which
        releases on the way out. The owner is the calling task unless
        ``owner`` names one. ``asyncio.timeout()`` around it works like
        ``timeout=``, with asyncio's ``TimeoutError``."""
        options = {
            "shared": shared,
            "timeout": timeout,
            "reason": reason,
            "ttl": ttl,
            "on_lost": on_lost,
            "owner": owner,
            "blocking": True,
            "data": data,
            "shallow": shallow,
        }
        return LockRequest(self.manager._request(self.customer_id, paths, options))

    async def try_lock_paths(
        self,
        *paths: str,
        shared: Iterable[str] = (),
        shallow: Iterable[str] = (),
        reason: str = "",
        ttl: float | None = None,
        on_lost: AsyncLostCallback | None = None,
        owner: str | None = None,
        data: bytes | str | None = None,
    ) -> AsyncLease | None:
        """One attempt: an :class:`AsyncLease`, or ``None`` if anything conflicts."""
        options = {
            "shared": shared,
            "timeout": 0,
            "reason": reason,
            "ttl": ttl,
            "on_lost": on_lost,
            "owner": owner,
            "blocking": False,
            "data": data,
            "shallow": shallow,
        }
        return await self.manager._request(self.customer_id, paths, options)

    async def lock_detached(
        self,
        *paths: str,
        ttl: float,
        shared: Iterable[str] = (),
        shallow: Iterable[str] = (),
        timeout: float | None = None,
        reason: str = "",
        data: bytes | str | None = None,
    ) -> DetachedLease:
        """Lock every path at once for a detached lease (see
        :meth:`CustomerLocks.lock_detached`): one that outlives this task, this
        manager and this process, renewed and released by its lease id. A
        cancellation while it waits leaves nothing held."""
        options = {
            "shared": shared,
            "ttl": ttl,
            "timeout": timeout,
            "reason": reason,
            "data": data,
            "shallow": shallow,
        }
        lease = await self.manager._detached(self.customer_id, paths, options | {"blocking": True})
        if lease is None:  # pragma: no cover - a blocking acquire returns or raises
            raise AssertionError("blocking acquire returned no lease")
        return lease

    async def try_lock_detached(
        self,
        *paths: str,
        ttl: float,
        shared: Iterable[str] = (),
        shallow: Iterable[str] = (),
        reason: str = "",
        data: bytes | str | None = None,
    ) -> DetachedLease | None:
        """One attempt at :meth:`lock_detached`; ``None`` if anything conflicts."""
        options = {
            "shared": shared,
            "shallow": shallow,
            "ttl": ttl,
            "timeout": 0,
            "reason": reason,
            "data": data,
        }
        return await self.manager._detached(self.customer_id, paths, options | {"blocking": False})

    async def renew_detached(self, lease_id: str, *, ttl: float) -> LeaseInfo:
        """Renew the detached lease ``lease_id`` (see
        :meth:`CustomerLocks.renew_detached`)."""
        lease_id = validation.lease_id(lease_id)
        ttl = validation.ttl(ttl)
        manager = self.manager
        return await manager._call(manager._core._renew_detached, self.customer_id, lease_id, ttl)

    async def release_detached(self, lease_id: str) -> int:
        """Release the detached lease ``lease_id`` (see
        :meth:`CustomerLocks.release_detached`); carried out to its end even
        if the caller is cancelled."""
        lease_id = validation.lease_id(lease_id)
        manager = self.manager
        return await manager._finished(manager._core._release_detached, self.customer_id, lease_id)

    async def get_lease(self, lease_id: str) -> LeaseInfo | None:
        """The lease ``lease_id`` of this customer, if it exists and has not
        expired (see :meth:`CustomerLocks.get_lease`)."""
        lease_id = validation.lease_id(lease_id)
        manager = self.manager
        return await manager._call(manager._core._lease_info, self.customer_id, lease_id)

    async def locks_on(
        self,
        path: str,
        *,
        ancestors: bool = True,
        descendants: bool = False,
        include_expired: bool = False,
    ) -> list[LockInfo]:
        """The locks on ``path``, its ancestors and its descendants, as asked
        (see :meth:`CustomerLocks.locks_on`)."""
        manager = self.manager
        return await manager._call(
            manager._core._locks_on,
            self.customer_id,
            path,
            ancestors=ancestors,
            descendants=descendants,
            include_expired=include_expired,
        )

    async def release_locks(self, *, owner: str | None = None) -> int:
        """Release every lease this owner (the calling task, unless ``owner``
        names one) holds for this customer through this manager; the number
        of paths released."""
        manager = self.manager
        await manager._open()
        holder = manager._core._owner(owner)
        released = await manager._finished(
            manager._core._release_owner, self.customer_id, None, holder
        )
        for lease_id in [
            lease_id
            for lease_id, lease in manager._leases.items()
            if lease.released and lease.customer_id == self.customer_id
        ]:
            manager._leases.pop(lease_id, None)
        return released

    async def list_locks(self, *, include_expired: bool = False) -> list[LockInfo]:
        """This customer's locked paths."""
        return await self.manager.list_locks(self.customer_id, include_expired=include_expired)

    def __repr__(self) -> str:
        return f"<AsyncCustomerLocks customer_id={self.customer_id} {self.manager!r}>"


class LockRequest:
    """What :meth:`AsyncCustomerLocks.lock_paths` returns: ``await`` it for
    the lease, or enter it with ``async with`` (released on exit). Either
    once."""

    def __init__(self, request: Awaitable[AsyncLease | None]) -> None:
        self._request: Awaitable[AsyncLease | None] | None = request
        self._lease: AsyncLease | None = None

    def _take(self) -> Awaitable[AsyncLease | None]:
        request, self._request = self._request, None
        if request is None:
            raise RuntimeError("a lock_paths() request can be awaited or entered once")
        return request

    def __await__(self) -> Generator[Any, None, AsyncLease]:
        lease = yield from self._take().__await__()
        if lease is None:  # pragma: no cover - a blocking request returns or raises
            raise AssertionError("blocking acquire returned no lease")
        return lease

    async def __aenter__(self) -> AsyncLease:
        self._lease = await self
        return self._lease

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        lease = self._lease
        if lease is not None:
            await lease.__aexit__(exc_type, exc, traceback)

    def __del__(self) -> None:
        request = self._request
        if request is not None and inspect.iscoroutine(request):
            request.close()  # never awaited: nothing was asked of the database


class AsyncLease:
    """One granted request of the asyncio API: the paths held together (see
    :class:`Lease`, whose attributes it shares). ``await lease.release()``,
    or leave its ``async with`` block."""

    def __init__(self, manager: AsyncPathLockManager, lease: Lease) -> None:
        self._manager = manager
        self._lease = lease
        # Releases of this lease, one at a time (the lease's own lock is a
        # thread's, which a task must never wait for on the loop).
        self._releasing = asyncio.Lock()

    @property
    def customer_id(self) -> int:
        """The customer (tenant) whose paths are held."""
        return self._lease.customer_id

    @property
    def lease_id(self) -> str:
        """Random, unguessable id: the secret that authorises release and renewal."""
        return self._lease.lease_id

    @property
    def paths(self) -> tuple[PathMode, ...]:
        """The normalized (path, mode) pairs held, sorted by path."""
        return self._lease.paths

    @property
    def shallow(self) -> frozenset[str]:
        """The paths among :attr:`paths` held at depth 0 (``shallow=``)."""
        return self._lease.shallow

    @property
    def fencing_token(self) -> int:
        """Strictly increasing per customer over grants."""
        return self._lease.fencing_token

    @property
    def owner(self) -> Owner:
        return self._lease.owner

    @property
    def reason(self) -> str:
        return self._lease.reason

    @property
    def ttl(self) -> float:
        return self._lease.ttl

    @property
    def released(self) -> bool:
        """True once :meth:`release` was called (or the owner released it)."""
        return self._lease.released

    @property
    def lost(self) -> bool:
        """True when the lease is known or presumed to be no longer held."""
        return self._lease.lost

    @property
    def expires_in(self) -> float:
        """Seconds until the lease expires, by this process's conservative clock."""
        return self._lease.expires_in

    def ensure_held(self) -> None:
        """Raise :class:`LeaseLost` unless the lease is still held, as far as
        this process knows (no database call; see :meth:`verify`)."""
        self._lease.ensure_held()

    async def verify(self) -> None:
        """:meth:`ensure_held`, and ask the database too (see
        :meth:`Lease.ensure_held` with ``verify``)."""
        self._lease.ensure_held()
        await self._manager._call(self._lease.ensure_held, verify=True)

    async def renew(self) -> None:
        """Renew now (the manager does this on its own); raise
        :class:`LeaseLost` if the lease turned out to be gone."""
        await self._manager._call(self._lease.renew)

    def release(self) -> Coroutine[Any, Any, None]:
        """Release every path of the lease; idempotent. Await the result.

        The release starts when this is called and finishes in the manager's
        hands whatever happens to the caller: a task cancelled in (or before
        reaching) the ``await`` does not stop it."""
        return _shielded(self._manager._task(self._release_held()))

    async def _release_held(self) -> None:
        async with self._releasing:
            await spawn(self._lease.release)
        self._manager._leases.pop(self.lease_id, None)

    def describe_paths(self) -> str:
        return self._lease.describe_paths()

    async def __aenter__(self) -> AsyncLease:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        lease = self._lease
        lost = lease._why_not_held() if lease.lost else None
        await self.release()
        if lost is not None and exc_type is None:
            raise LeaseLost(lease.lease_id, lost)

    def __repr__(self) -> str:
        return "<Async" + repr(self._lease)[1:]


__all__ = [
    "AsyncCustomerLocks",
    "AsyncLease",
    "AsyncLostCallback",
    "AsyncPathLockManager",
    "LockRequest",
]
