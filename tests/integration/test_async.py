"""What only the asyncio API has: tasks as owners on one loop, a loop that is
never blocked, cancellation at any point that leaves nothing behind, the
drivers chosen from the URL, coroutine ``on_lost`` callbacks."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sqlite3
import threading
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

import pytest
from sqlalchemy import Connection, Engine, create_engine, event, func, make_url, select, text
from sqlalchemy.exc import ProgrammingError
from sqlalchemy.ext.asyncio import create_async_engine

from pathlock import (
    ArgumentTypeError,
    AsyncLease,
    AsyncPathLockManager,
    InvalidArgument,
    LeaseLost,
    LockTimeout,
    ManagerClosed,
    PathLockManager,
    SchemaMismatch,
    Settings,
    dialects,
)
from pathlock import _batch as batch
from pathlock._aio import spawn
from pathlock.dialects.base import is_async
from pathlock.schema import path_locks
from tests.conftest import MYSQL_URL
from tests.integration.apis import HANG
from tests.integration.conftest import TcpProxy
from tests.row_counts import rows_of

pytestmark = pytest.mark.timeout(180)

T = TypeVar("T")


def run(main: Callable[[], Awaitable[T]]) -> T:
    return asyncio.run(asyncio.wait_for(main(), HANG * 2))  # type: ignore[arg-type]


def _manager(url: str, **options: Any) -> AsyncPathLockManager:
    options.setdefault("node_id", "test-async")
    return AsyncPathLockManager(url, **options)


def test_tasks_of_one_loop_wait_for_each_other(database_url: str, customer_id: int) -> None:
    async def main() -> None:
        async with _manager(database_url) as manager:
            locks = manager.for_customer(customer_id)
            first = await locks.lock_paths("/a")

            async def second() -> AsyncLease:
                return await locks.lock_paths("/a/b", timeout=HANG)

            waiting = asyncio.create_task(second())
            await asyncio.sleep(0.2)
            assert not waiting.done()  # waiting, not DeadlockDetected
            await first.release()
            lease = await waiting
            assert lease.owner.key != first.owner.key
            # A task's release_locks() is its own: this task holds nothing now.
            assert await locks.release_locks() == 0
            await lease.release()

    run(main)


def test_the_loop_runs_while_a_task_waits(database_url: str, customer_id: int) -> None:
    async def main() -> None:
        async with _manager(database_url) as manager:
            locks = manager.for_customer(customer_id)
            holder = await locks.lock_paths("/a")
            ticks = 0
            stop = asyncio.Event()

            async def ticker() -> None:
                nonlocal ticks
                while not stop.is_set():
                    await asyncio.sleep(0.01)
                    ticks += 1

            ticking = asyncio.create_task(ticker())

            async def waiter() -> None:
                with contextlib.suppress(TimeoutError):
                    await locks.lock_paths("/a/b", timeout=1.0)

            await asyncio.create_task(waiter())  # another task: another owner
            stop.set()
            await ticking
            # A loop blocked for the whole wait would have ticked about once.
            assert ticks >= 20, ticks
            await holder.release()

    run(main)


def test_batches_that_end_their_transaction_skip_the_connections_begin(
    mariadb_url: str, customer_id: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The asyncio API listens for its engine's begin and commit (to know a
    COMMIT on its way), which a batch that sends its own COMMIT does itself:
    an uncontended acquire + release does not go through SQLAlchemy's
    begin() (it once went, twice: some 80 Python calls more per acquire +
    release). A listener of your own still hears every begin and commit."""
    begun: list[object] = []
    begin = Connection.begin

    def counted(self: Connection) -> Any:
        begun.append(self)
        return begin(self)

    async def main(listen: bool) -> None:
        async with _manager(mariadb_url) as manager:
            locks = manager.for_customer(customer_id)
            await (await locks.lock_paths("/warm")).release()
            heard: list[object] = []
            if listen:
                event.listen(manager._core.engine, "commit", heard.append)
            begun.clear()
            with monkeypatch.context() as patch:
                patch.setattr(Connection, "begin", counted)
                await (await locks.lock_paths("/a")).release()
            if listen:
                assert len(begun) == 2
                assert len(heard) == 2
            else:
                assert begun == []

    run(lambda: main(listen=False))
    run(lambda: main(listen=True))


def test_a_task_cancelled_while_it_waits_leaves_the_queue(
    database_url: str, customer_id: int, raw_engine: Engine
) -> None:
    async def main() -> None:
        async with _manager(database_url) as manager:
            locks = manager.for_customer(customer_id)
            holder = await locks.lock_paths("/a")
            waiting = asyncio.create_task(_lock(locks, "/a/b"))
            while not await manager.list_waiters(customer_id):
                await asyncio.sleep(0.01)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            # Gone before the cancellation reached the caller.
            assert await manager.list_waiters(customer_id) == []
            assert rows_of(raw_engine, customer_id) == (1, 0)
            await holder.release()

    run(main)


async def _lock(locks: Any, *paths: str, **options: Any) -> AsyncLease:
    lease: AsyncLease = await locks.lock_paths(*paths, **options)
    return lease


def test_asyncio_timeout_works_like_timeout(
    database_url: str, customer_id: int, raw_engine: Engine
) -> None:
    async def main() -> None:
        async with _manager(database_url) as manager:
            locks = manager.for_customer(customer_id)
            holder = await locks.lock_paths("/a")

            async def wait() -> None:  # another task: another owner
                async with asyncio.timeout(0.3):
                    await locks.lock_paths("/a/b")

            with pytest.raises(TimeoutError):
                await asyncio.create_task(wait())
            assert await manager.list_waiters(customer_id) == []
            assert rows_of(raw_engine, customer_id) == (1, 0)
            await holder.release()

    run(main)


async def _cancelled_after(locks: Any, steps: int) -> None:
    """A request of ``/a``, ``/b`` and shared ``/c``, cancelled after
    ``steps`` passes of the loop; a lease granted before the cancellation
    came is an ordinary one, and released."""
    request = asyncio.create_task(_lock(locks, "/a", "/b", shared=["/c"]))
    for _ in range(steps):
        await asyncio.sleep(0)
    request.cancel()
    try:
        lease = await request
    except asyncio.CancelledError:
        return
    await lease.release()


@pytest.mark.parametrize("steps", range(0, 60, 3))
def test_a_request_cancelled_at_any_step_leaves_nothing_behind(
    database_url: str, customer_id: int, raw_engine: Engine, steps: int
) -> None:
    """Cancel a request that would be granted after ``steps`` passes of the
    loop: in its attempt, its COMMIT, its registration, or after it. No row
    may outlive it, and the path is free at once for someone else."""

    async def main() -> None:
        async with _manager(database_url) as manager:
            locks = manager.for_customer(customer_id)
            await _cancelled_after(locks, steps)
            assert rows_of(raw_engine, customer_id) == (0, 0)

            async def other() -> AsyncLease | None:
                return await locks.try_lock_paths("/")

            lease = await asyncio.create_task(other())
            assert lease is not None
            await lease.release()

    run(main)


@pytest.mark.parametrize("steps", range(1, 41))
def test_a_cancellation_lets_the_attempt_under_way_finish(
    mariadb_url: str, customer_id: int, steps: int
) -> None:
    """Through an asyncio driver every statement of an attempt is awaited on
    the loop. A request cancelled while one is on its way must not drop the
    connection under it (a COMMIT could land after the request undid its
    grant): the attempt finishes, then the cancellation takes effect. So no
    connection is discarded and none opened anew, whichever pass of the loop
    the cancellation comes in (cut short, the attempt's connection would be
    dropped, and the next transaction would connect again)."""
    raw = create_engine(mariadb_url)

    async def main() -> None:
        async with _manager(mariadb_url) as manager:
            locks = manager.for_customer(customer_id)
            await (await locks.lock_paths("/warm")).release()  # one connection in the pool
            opened: list[object] = []
            event.listen(manager._core.engine, "connect", lambda *_: opened.append(None))
            await _cancelled_after(locks, steps)
            assert opened == []
            assert rows_of(raw, customer_id) == (0, 0)

    try:
        run(main)
    finally:
        raw.dispose()


def test_an_attempt_left_waiting_for_the_file_by_a_cancelled_task_grants_nothing(
    sqlite_url: str, customer_id: int
) -> None:
    """On SQLite a transaction runs whole on a worker thread. Another process
    holds the file's write lock, so the request's attempt waits for it there
    while the loop runs on. The task is cancelled and does not wait for the
    attempt; when the file is free again, the attempt must not grant the
    cancelled request its paths behind everyone's back."""
    database = make_url(sqlite_url).database
    assert database is not None
    raw = create_engine(sqlite_url)

    async def main() -> None:
        async with _manager(sqlite_url) as manager:
            locks = manager.for_customer(customer_id)
            await (await locks.lock_paths("/warm")).release()  # the tables exist
            writer = sqlite3.connect(database, isolation_level=None)
            try:
                writer.execute("BEGIN IMMEDIATE")
                request = asyncio.create_task(_lock(locks, "/a", timeout=20.0))
                for _ in range(30):  # the loop runs while the attempt waits
                    await asyncio.sleep(0.01)
                assert not request.done()
                request.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await request
            finally:
                writer.rollback()
                writer.close()
            # The attempt's thread takes the write lock now, and stops.
            await asyncio.sleep(0.5)
            assert rows_of(raw, customer_id) == (0, 0)
            lease = await asyncio.create_task(locks.try_lock_paths("/a"))
            assert lease is not None
            await lease.release()

    try:
        run(main)
    finally:
        raw.dispose()


def test_a_grant_committed_on_its_thread_after_the_task_was_cancelled_is_undone(
    sqlite_url: str, customer_id: int
) -> None:
    """On SQLite an attempt that finds the file busy goes on on a worker
    thread, and a cancelled task does not wait for it. Cancelled while that
    thread is committing the grant, the request must still undo it (found by
    the asyncio stress run: such grants were left in place when the
    request's clean-up went by whether the attempt got a connection, which
    the worker thread could not tell the task)."""
    raw = create_engine(sqlite_url)

    async def main() -> None:
        async with _manager(sqlite_url) as manager:
            locks = manager.for_customer(customer_id)
            await (await locks.lock_paths("/warm")).release()  # the tables exist
            committing = threading.Event()
            armed = [True]

            def slow_commit(_connection: Connection) -> None:
                if armed[0] and threading.current_thread() is not threading.main_thread():
                    armed[0] = False
                    committing.set()
                    time.sleep(0.5)  # on the worker thread, before the COMMIT

            event.listen(manager._core.engine, "commit", slow_commit)
            # Busy for a moment: the grant goes to a worker thread.
            _hold_write_lock(sqlite_url, 0.2)
            request = asyncio.create_task(_lock(locks, "/a", timeout=20.0))
            while not committing.is_set():
                await asyncio.sleep(0.005)
            request.cancel()
            with pytest.raises(asyncio.CancelledError):
                await request
            await asyncio.sleep(1.0)  # the COMMIT lands; the clean-up follows it
            assert rows_of(raw, customer_id) == (0, 0)

    try:
        run(main)
    finally:
        raw.dispose()


def _hold_write_lock(sqlite_url: str, seconds: float) -> threading.Thread:
    """Another connection holds the SQLite file's write lock for ``seconds``
    (taken before this returns)."""
    holder = sqlite3.connect(
        make_url(sqlite_url).database or "", isolation_level=None, check_same_thread=False
    )
    holder.execute("BEGIN IMMEDIATE")

    def let_go() -> None:
        time.sleep(seconds)
        holder.execute("COMMIT")
        holder.close()

    thread = threading.Thread(target=let_go, daemon=True)
    thread.start()
    return thread


def test_on_sqlite_a_busy_file_moves_the_transaction_off_the_loop(
    sqlite_url: str, customer_id: int
) -> None:
    """SQLite's transactions run on the loop's own thread, which another
    process's transaction must never block: while the file's write lock is
    held elsewhere, a request's attempt goes to a worker thread and waits
    there, and a timer of the loop keeps its time; the request is granted
    once the lock is let go."""

    async def main() -> None:
        async with _manager(sqlite_url) as manager:
            locks = manager.for_customer(customer_id)
            await (await locks.lock_paths("/warm")).release()  # the tables exist
            late: list[float] = []
            ticking = True

            async def ticker() -> None:
                while ticking:
                    due = time.monotonic() + 0.005
                    await asyncio.sleep(0.005)
                    late.append(time.monotonic() - due)

            ticks = asyncio.create_task(ticker())
            holder = _hold_write_lock(sqlite_url, 0.5)
            started = time.monotonic()
            lease = await locks.lock_paths("/a", timeout=20.0)
            waited = time.monotonic() - started
            ticking = False
            await ticks
            holder.join()
            await lease.release()
            assert waited >= 0.3  # it did wait for the write lock
            assert len(late) >= 20  # the loop kept running meanwhile
            assert max(late) < 0.25, f"the loop was blocked for {max(late):.3f} s"

    run(main)


def test_a_cancelled_release_still_releases(
    database_url: str, customer_id: int, raw_engine: Engine
) -> None:
    async def main() -> None:
        async with _manager(database_url) as manager:
            locks = manager.for_customer(customer_id)
            in_flight = 0  # cancels that hit a release already under way
            for steps in range(12):
                lease = await locks.lock_paths("/a")
                releasing = asyncio.create_task(lease.release())
                for _ in range(steps):
                    await asyncio.sleep(0)
                if releasing.done():
                    # The release (one round trip) was over within these
                    # turns of the loop: later points are past its end.
                    await releasing
                    assert rows_of(raw_engine, customer_id) == (0, 0)
                    break
                releasing.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await releasing
                in_flight += steps > 0
                deadline = time.monotonic() + HANG
                while rows_of(raw_engine, customer_id) != (0, 0):
                    assert time.monotonic() < deadline, "the manager did not finish the release"
                    await asyncio.sleep(0.01)
            # On SQLite a release's transaction runs within one step of the
            # loop (unless the file is busy): nothing can cancel it midway.
            assert in_flight or database_url.startswith("sqlite"), (
                "no cancel hit a release under way"
            )

    run(main)


def test_a_coroutine_on_lost_callback_is_awaited_on_the_loop(
    database_url: str, customer_id: int
) -> None:
    async def main() -> None:
        lost: asyncio.Queue[tuple[AsyncLease, asyncio.AbstractEventLoop]] = asyncio.Queue()

        async def on_lost(lease: AsyncLease) -> None:
            await lost.put((lease, asyncio.get_running_loop()))

        async with _manager(database_url, ttl=1.5, on_lost=on_lost) as manager:
            locks = manager.for_customer(customer_id)
            lease = await locks.lock_paths("/a")
            assert await manager.release_lease(lease.lease_id, requested_by="test") == 1
            told, loop = await asyncio.wait_for(lost.get(), HANG)
            assert told is lease
            assert loop is asyncio.get_running_loop()
            assert lease.lost

    run(main)


def _expires_in(engine: Engine, lease_id: str) -> float:
    """Seconds until the lease's rows expire, read apart from pathlock (both
    databases run on this host, so its clock is theirs)."""
    with engine.connect() as connection:
        expires_at = connection.execute(
            select(func.min(path_locks.c.expires_at)).where(path_locks.c.lease_id == lease_id)
        ).scalar_one()
    return (expires_at.replace(tzinfo=UTC) - datetime.now(UTC)).total_seconds()


def test_renewals_are_a_task_of_the_loop(
    database_url: str, customer_id: int, raw_engine: Engine
) -> None:
    async def main() -> None:
        async with _manager(database_url, ttl=1.0) as manager:
            lease = await manager.for_customer(customer_id).lock_paths("/long/job")
            await asyncio.sleep(3.5)  # several ttls
            lease.ensure_held()
            await lease.verify()
            assert _expires_in(raw_engine, lease.lease_id) > 0
            names = [thread.name for thread in threading.enumerate()]
            assert not [name for name in names if name.startswith("pathlock-heartbeat")]
            await lease.release()

    run(main)


def test_a_renewal_stuck_in_the_network_does_not_delay_the_loss(
    mariadb_url: str, customer_id: int, proxy: TcpProxy
) -> None:
    """The renewal waits for its answer up to its call's bound (10 s); the
    loss must be declared before the lease could expire (2 s) all the same,
    and the loop keeps running meanwhile."""
    through_proxy = make_url(mariadb_url).set(host="127.0.0.1", port=proxy.port)

    async def main() -> None:
        told = asyncio.Event()
        lost_at: list[float] = []

        def on_lost(_lease: AsyncLease) -> None:
            lost_at.append(time.monotonic())
            told.set()

        manager = _manager(through_proxy, ttl=2.0, on_lost=on_lost)
        try:
            lease = await manager.for_customer(customer_id).lock_paths("/contested")
            frozen_at = time.monotonic()
            proxy.freeze()
            await asyncio.wait_for(told.wait(), HANG)
            assert lost_at[0] < frozen_at + lease.ttl  # before it could have expired
            assert lease.lost
            with pytest.raises(LeaseLost, match="not renewed"):
                lease.ensure_held()
        finally:
            proxy.cut()  # the frozen connections fail now: close() need not wait for them
            await manager.aclose()

    run(main)


def test_close_wakes_waiting_tasks(database_url: str, customer_id: int, raw_engine: Engine) -> None:
    async def main() -> None:
        manager = _manager(database_url)
        locks = manager.for_customer(customer_id)
        holder = await locks.lock_paths("/a")
        waiting = asyncio.create_task(_lock(locks, "/a/b"))
        while not await manager.list_waiters(customer_id):
            await asyncio.sleep(0.01)
        await manager.aclose()
        with pytest.raises(ManagerClosed):
            await waiting
        assert holder.lost  # closed while held: the holder hears of it
        assert rows_of(raw_engine, customer_id) == (0, 0)
        with pytest.raises(ManagerClosed):
            manager.for_customer(customer_id)
        await manager.aclose()  # idempotent

    run(main)


def test_the_urls_of_both_apis(database_url: str, customer_id: int) -> None:
    async def main() -> None:
        url = make_url(database_url)
        family = url.get_backend_name()
        async with _manager(database_url) as manager:
            engine = manager._core.engine
            dialect = dialects.for_name(family)
            if not dialect.async_on_threads:
                assert is_async(engine)
                assert _driver(engine) == dialect.async_driver
            else:  # the synchronous driver, each transaction on a worker thread
                assert not is_async(engine)
                assert _driver(engine) == dialect.drivers[0]
        # The asyncio driver's own spelling is taken as it is.
        own = url.set(drivername=_async_driver(database_url))
        async with _manager(own) as manager:
            assert _driver(manager._core.engine) == own.get_driver_name()
            assert (await manager.for_customer(customer_id).try_lock_paths("/x")) is not None

    run(main)
    with pytest.raises(InvalidArgument, match="AsyncPathLockManager"):
        PathLockManager(make_url(database_url).set(drivername=_async_driver(database_url)))
    sync_engine = create_engine(database_url)
    try:
        with pytest.raises(ArgumentTypeError, match="AsyncEngine"):
            AsyncPathLockManager(sync_engine)
    finally:
        sync_engine.dispose()


def _async_driver(url: str) -> str:
    backend = make_url(url).get_backend_name()
    return f"{backend}+{dialects.for_name(backend).async_driver}"


def _driver(engine: Any) -> str:
    """The driver's name as a URL spells it (SQLAlchemy names psycopg's
    asyncio dialect "psycopg", its URL "psycopg_async")."""
    return str(engine.url.get_driver_name())


def test_an_async_engine_passed_in(database_url: str, customer_id: int) -> None:
    async def main() -> None:
        engine = create_async_engine(
            make_url(database_url).set(drivername=_async_driver(database_url))
        )
        try:
            async with _manager(engine) as manager:
                lease = await manager.for_customer(customer_id).lock_paths("/a")
                await lease.release()
        finally:
            await engine.dispose()

    run(main)


def test_a_manager_belongs_to_one_loop(database_url: str, customer_id: int) -> None:
    home = asyncio.new_event_loop()
    thread = threading.Thread(target=home.run_forever, daemon=True)
    thread.start()
    manager = _manager(database_url)

    def on_home(coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, home).result(HANG)

    async def use() -> None:
        await manager.list_locks(customer_id)

    try:
        on_home(use())
        with pytest.raises(InvalidArgument, match="another event loop"):
            run(use)
    finally:
        on_home(manager.aclose())
        home.call_soon_threadsafe(home.stop)
        thread.join(HANG)
        home.close()


def test_a_node_that_refuses_is_passed_over(mariadb_url: str, customer_id: int) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    refused = make_url(mariadb_url).set(port=port).render_as_string(hide_password=False)

    async def main() -> None:
        async with _manager([refused, mariadb_url]) as manager:
            lease = await manager.for_customer(customer_id).lock_paths("/a", timeout=HANG)
            await lease.release()

    run(main)


def test_a_server_that_never_answers_costs_a_request_its_timeout(customer_id: int) -> None:
    """A TCP peer that accepts and then says nothing: the asyncio timeout of
    each attempt ends the wait, as the socket timeouts do for PyMySQL."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        port = silent.getsockname()[1]
        url = f"mysql+pymysql://root@127.0.0.1:{port}/test"

        async def main() -> None:
            # Short for what this test does not time: the schema check, and
            # aclose() giving the timed-out request's clean-up its bound.
            settings = Settings(schema_check_time=0.5, close_time=1.0)
            async with _manager(url, settings=settings) as manager:
                locks = manager.for_customer(customer_id)
                started = time.monotonic()
                with pytest.raises(LockTimeout) as caught:
                    await locks.lock_paths("/a", timeout=1.0)
                took = time.monotonic() - started
                assert caught.value.unanswered
                assert took < 1.0 + manager.settings.grace + 1.0, took
                # The pool had room: it was connecting, not waiting for a
                # connection to come free, when the time ran out.
                assert "every connection of the pool" not in str(caught.value.__cause__)

        run(main)


def test_a_request_cancelled_while_connecting_ends_at_once_and_leaves_nothing(
    customer_id: int,
) -> None:
    """Cancelled while its connection is being opened (the server never
    answers): nothing can be on its way to the database, so the request ends
    with its caller's cancellation rather than keep the manager busy (and
    aclose() waiting) until its connect times out; and nothing is left in
    doubt."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        url = f"mysql+pymysql://root@127.0.0.1:{silent.getsockname()[1]}/test"

        async def main() -> None:
            async with _manager(url, settings=Settings(schema_check_time=0.5)) as manager:
                locks = manager.for_customer(customer_id)

                async def request() -> None:
                    await locks.lock_paths("/a", timeout=30)

                waiting = asyncio.create_task(request())
                await asyncio.sleep(0.3)
                waiting.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await waiting
                assert manager._core._calls._count == 0, "the request is still running"
                assert not manager._core._in_doubt

        run(main)


def test_a_schema_at_another_revision_is_refused_on_entry(customer_id: int) -> None:
    """Opening fails on the way in: the error is the synchronous API's, and
    nothing of the manager stays open."""
    server = create_engine(MYSQL_URL)
    name = f"pathlock_async_{customer_id % 10**9}"
    with server.begin() as connection:
        connection.exec_driver_sql(f"CREATE DATABASE `{name}`")
        connection.exec_driver_sql(
            f"CREATE TABLE `{name}`.pathlock_alembic_version (version_num VARCHAR(32) PRIMARY KEY)"
        )
        connection.exec_driver_sql(f"INSERT INTO `{name}`.pathlock_alembic_version VALUES ('0002')")
    url = make_url(MYSQL_URL).set(database=name).render_as_string(hide_password=False)
    manager = _manager(url)

    async def main() -> None:
        with pytest.raises(SchemaMismatch):
            async with manager:
                pass

    try:
        run(main)
        assert manager._core._close_done
    finally:
        with server.begin() as connection:
            connection.exec_driver_sql(f"DROP DATABASE `{name}`")
        server.dispose()


def test_statements_are_batched_over_asyncmy_too(
    mariadb_url: str, customer_id: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A grant's and a release's statements go in one round trip each, with
    their COMMIT, as over PyMySQL; a statement that fails in
    the middle of a batch raises the error SQLAlchemy would have raised."""
    batches: list[tuple[int, str]] = []
    run_batch = batch.run

    def counted(
        connection: Connection, steps: Any, *, commit: bool = False, rollback: bool = False
    ) -> list[batch.Reply]:
        batches.append((len(steps), "COMMIT" if commit else "ROLLBACK" if rollback else ""))
        return run_batch(connection, steps, commit=commit, rollback=rollback)

    monkeypatch.setattr(batch, "run", counted)

    def failing(engine: Engine) -> None:
        with engine.connect() as connection:
            assert batch.supports_batches(connection)
            steps = [(text("DO 1"), {}), (text("SELECT * FROM no_such_table"), {})]
            with pytest.raises(ProgrammingError, match="1146"):
                run_batch(connection, steps)

    async def main() -> None:
        async with _manager(mariadb_url, heartbeat=False) as manager:
            locks = manager.for_customer(customer_id)
            lease = await locks.lock_paths("/a/b", shared=["/c"])
            assert await locks.try_lock_paths("/a") is None
            await lease.release()
            assert await locks.list_locks() == []
            await spawn(failing, manager._core.engine)

    run(main)
    # The grant without searches and the grant in one round trip (each with
    # its COMMIT; denied, since the customer's sentinel row does not exist
    # yet), the attempt that finds that out (with its reads of who is in the
    # way), then the row and the grant made one by one; the denied try in one
    # round trip (the customer has a lock now: no grant without searches),
    # then with its reads; the release, whose COMMIT goes with it (its rows
    # deleted, then counted down in one statement that reads the version only
    # if requests may be queued: none are).
    assert batches == [
        (2, "COMMIT"),
        (4, "COMMIT"),
        (8, ""),  # the sentinel write, the grant, its count, five reads
        (4, "COMMIT"),
        (8, ""),
        (2, "COMMIT"),
    ], batches
