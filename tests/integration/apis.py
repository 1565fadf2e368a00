"""One face for the synchronous and the asyncio API, so that a conformance
test is written once and runs against both (the ``api`` fixture).

An :class:`Actor` is one owner: a thread of its own for the synchronous API,
a task of its own (on a loop running in a thread of the test) for the
asyncio API. Its calls run there, one at a time, in the order they are
submitted; :meth:`Actor.submit` returns a future, so a test can start a
request that waits and go on.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import make_url

from pathlock import (
    AsyncLease,
    AsyncPathLockManager,
    Lease,
    LockInfo,
    PathLockManager,
    WaiterInfo,
)

HANG = 30.0
"""Seconds after which a call that has not returned counts as hung."""

AnyLease = Lease | AsyncLease


class Actor:
    """One owner of the API under test."""

    def submit(self, name: str, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        """Start ``name`` (:meth:`lock`, :meth:`try_lock`, :meth:`release`,
        :meth:`release_locks`) in this actor."""
        raise NotImplementedError

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return self.submit(name, *args, **kwargs).result(HANG)

    def lock(self, *paths: str, **options: Any) -> AnyLease:
        return self.call("lock", *paths, **options)

    def try_lock(self, *paths: str, **options: Any) -> AnyLease | None:
        return self.call("try_lock", *paths, **options)

    def release(self, lease: AnyLease) -> None:
        self.call("release", lease)

    def release_locks(self) -> int:
        return int(self.call("release_locks"))

    def close(self) -> None:
        raise NotImplementedError


class Api:
    """A manager of one API on one database, for one customer."""

    kind: str

    def actor(self) -> Actor:
        """A new owner (a thread, or a task)."""
        raise NotImplementedError

    def list_locks(self) -> list[LockInfo]:
        raise NotImplementedError

    def list_waiters(self) -> list[WaiterInfo]:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


# -- the synchronous API --------------------------------------------------------------


class _ThreadActor(Actor):
    def __init__(self, api: SyncApi) -> None:
        self._api = api
        self._jobs: queue.Queue[tuple[Callable[[], Any], concurrent.futures.Future[Any]] | None]
        self._jobs = queue.Queue()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            function, future = job
            try:
                future.set_result(function())
            except BaseException as error:  # noqa: BLE001 - handed to the test
                future.set_exception(error)

    def submit(self, name: str, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        locks = self._api.locks
        operations: dict[str, Callable[..., Any]] = {
            "lock": locks.lock_paths,
            "try_lock": locks.try_lock_paths,
            "release": lambda lease: lease.release(),
            "release_locks": locks.release_locks,
        }
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._jobs.put((lambda: operations[name](*args, **kwargs), future))
        return future

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join(HANG)


class SyncApi(Api):
    kind = "sync"

    def __init__(self, url: str, customer_id: int, **options: Any) -> None:
        self.manager = PathLockManager(url, **options)
        self.locks = self.manager.for_customer(customer_id)
        self._actors: list[Actor] = []

    def actor(self) -> Actor:
        actor = _ThreadActor(self)
        self._actors.append(actor)
        return actor

    def list_locks(self) -> list[LockInfo]:
        return self.locks.list_locks()

    def list_waiters(self) -> list[WaiterInfo]:
        return self.manager.list_waiters(self.locks.customer_id)

    def close(self) -> None:
        for actor in self._actors:
            actor.close()
        self.manager.close()


# -- the asyncio API ----------------------------------------------------------------------


class _TaskActor(Actor):
    def __init__(self, api: AsyncApi) -> None:
        self._api = api
        self._jobs: asyncio.Queue[tuple[Callable[[], Any], concurrent.futures.Future[Any]] | None]
        self._task = api.run(self._start()).result(HANG)

    async def _start(self) -> asyncio.Task[None]:
        self._jobs = asyncio.Queue()
        return asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while (job := await self._jobs.get()) is not None:
            function, future = job
            try:
                future.set_result(await function())
            except BaseException as error:  # noqa: BLE001 - handed to the test
                future.set_exception(error)

    def submit(self, name: str, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        locks = self._api.locks

        async def lock() -> AsyncLease:
            return await locks.lock_paths(*args, **kwargs)

        operations: dict[str, Callable[[], Coroutine[Any, Any, Any]]] = {
            "lock": lock,
            "try_lock": lambda: locks.try_lock_paths(*args, **kwargs),
            # A lambda: the lease is only there for "release" (args[0]).
            "release": lambda: args[0].release(),  # noqa: PLW0108
            "release_locks": lambda: locks.release_locks(*args, **kwargs),
        }
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._api.loop.call_soon_threadsafe(self._jobs.put_nowait, (operations[name], future))
        return future

    def close(self) -> None:
        self._api.loop.call_soon_threadsafe(self._jobs.put_nowait, None)
        self._api.run(asyncio.wait_for(asyncio.shield(self._task), HANG)).result(HANG)


class AsyncApi(Api):
    kind = "async"

    def __init__(self, url: str, customer_id: int, **options: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.manager = AsyncPathLockManager(url, **options)
        self.run(self.manager.__aenter__()).result(HANG)
        self.locks = self.manager.for_customer(customer_id)
        self._actors: list[Actor] = []

    def run(self, coroutine: Coroutine[Any, Any, Any]) -> concurrent.futures.Future[Any]:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def actor(self) -> Actor:
        actor = _TaskActor(self)
        self._actors.append(actor)
        return actor

    def list_locks(self) -> list[LockInfo]:
        result: list[LockInfo] = self.run(self.locks.list_locks()).result(HANG)
        return result

    def list_waiters(self) -> list[WaiterInfo]:
        coroutine = self.manager.list_waiters(self.locks.customer_id)
        result: list[WaiterInfo] = self.run(coroutine).result(HANG)
        return result

    def close(self) -> None:
        try:
            for actor in self._actors:
                actor.close()
            self.run(self.manager.aclose()).result(HANG)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(HANG)
            self.loop.close()


APIS = ("sync", "async", "async-driver")
"""``async-driver``: the asyncio API on the URL of its family's asyncio
driver, where the synchronous spelling of the URL runs another way (SQLite:
the synchronous driver on worker threads, against aiosqlite)."""


def skip_same_as_async(kind: str, url: str) -> None:
    """Skip the ``async-driver`` API where it is the ``async`` one over again."""
    if kind == "async-driver" and make_url(url).get_backend_name() != "sqlite":
        pytest.skip("the asyncio API uses this database's asyncio driver anyway")


@contextmanager
def opened(kind: str, url: str, customer_id: int, **options: Any) -> Iterator[Api]:
    """A manager of the ``kind`` API, closed afterwards."""
    options.setdefault("node_id", f"test-{kind}")
    if kind == "async-driver":
        url = make_url(url).set(drivername="sqlite+aiosqlite").render_as_string(False)
    api: Api = (SyncApi if kind == "sync" else AsyncApi)(url, customer_id, **options)
    try:
        yield api
    finally:
        api.close()
