"""A full connection pool costs a call its own time limit, no more.

SQLAlchemy's pools make a checkout wait for a free connection up to their
``pool_timeout`` (30 s), whatever the caller's ``timeout=``. When every
connection of a manager's pool is taken by requests stuck on a frozen
customer's row, a request of another customer must still end by its timeout.
Here the pool has one connection, and a request that waits for a row (or for
the SQLite file's write lock) that a plain connection holds keeps it: before
the pool's waits were bounded, the second request waited until the first one's
attempt ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from sqlalchemy import create_engine, event, make_url, text

from pathlock import (
    AsyncPathLockManager,
    CustomerLocks,
    DatabaseTimeout,
    LockTimeout,
    PathLockManager,
)

pytestmark = pytest.mark.timeout(120)

ONE_CONNECTION = {"pool_size": 1, "max_overflow": 0}
HELD = 8.0  # seconds the first request waits for the held row (its timeout)
SLACK = 2.0  # what a loaded machine may add to a bound


@contextmanager
def _customer_row_held(database_url: str, customer_id: int) -> Iterator[None]:
    """Another client holds what a grant for ``customer_id`` must wait for:
    its sentinel row (MariaDB) or the file's write lock (SQLite)."""
    url = make_url(database_url)
    if url.get_backend_name() == "sqlite":
        assert url.database is not None
        writer = sqlite3.connect(url.database, isolation_level=None)
        writer.execute("BEGIN IMMEDIATE")
        try:
            yield
        finally:
            writer.rollback()
            writer.close()
        return
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            connection.execute(
                text("SELECT version FROM customer_locks WHERE customer_id = :c FOR UPDATE"),
                {"c": customer_id},
            )
            yield
            connection.rollback()
    finally:
        engine.dispose()


def _pool_timed_out(error: BaseException) -> bool:
    cause = error.__cause__
    return isinstance(cause, DatabaseTimeout) and "every connection of the pool" in str(cause)


def test_a_request_waits_for_a_connection_no_longer_than_its_timeout(
    database_url: str, customer_id: int
) -> None:
    with PathLockManager(
        database_url, node_id="test-pool", engine_options=ONE_CONNECTION
    ) as manager:
        stuck = manager.for_customer(customer_id)
        stuck.lock_paths("/warm").release()  # the customer's row exists
        with _customer_row_held(database_url, customer_id):
            first = threading.Thread(target=_ignore_timeout, args=(stuck,))
            first.start()
            time.sleep(0.5)  # its attempt holds the pool's only connection
            other = manager.for_customer(customer_id + 1)
            began = time.monotonic()
            with pytest.raises(LockTimeout) as raised:
                other.lock_paths("/b", timeout=0.5)
            took = time.monotonic() - began
            assert first.is_alive(), "the first request should still hold the connection"
        first.join()
    assert took < 0.5 + SLACK, f"waited {took:.2f} s for a connection"
    assert raised.value.unanswered
    assert _pool_timed_out(raised.value)


def _ignore_timeout(locks: CustomerLocks) -> None:
    with contextlib.suppress(LockTimeout):
        locks.lock_paths("/a", timeout=HELD)


def test_an_asyncio_request_waits_for_a_connection_no_longer_than_its_timeout(
    mariadb_url: str, customer_id: int
) -> None:
    async def main() -> tuple[float, LockTimeout]:
        async with AsyncPathLockManager(
            mariadb_url, node_id="test-pool", engine_options=ONE_CONNECTION
        ) as manager:
            stuck = manager.for_customer(customer_id)
            await (await stuck.lock_paths("/warm")).release()
            with _customer_row_held(mariadb_url, customer_id):

                async def first() -> None:
                    with contextlib.suppress(LockTimeout):
                        await stuck.lock_paths("/a", timeout=HELD)

                waiting = asyncio.create_task(first())
                await asyncio.sleep(0.5)
                other = manager.for_customer(customer_id + 1)
                began = time.monotonic()
                try:
                    await other.lock_paths("/b", timeout=0.5)
                except LockTimeout as error:
                    raised = error
                else:  # pragma: no cover - the assertion below says it
                    pytest.fail("granted through a pool whose only connection was taken")
                took = time.monotonic() - began
                assert not waiting.done()
            await waiting
            return took, raised

    took, raised = asyncio.run(main())
    # The attempt's own timer ends the wait (by the time the pool would), and
    # says what the pool would have said: no connection came free.
    assert took < 0.5 + SLACK, f"waited {took:.2f} s for a connection"
    assert raised.unanswered
    assert _pool_timed_out(raised)


def test_the_default_pool_keeps_the_connections_a_burst_opened(
    database_url: str, customer_id: int
) -> None:
    """Requests that pile up take more than 5 connections; given back, those
    stay open for the next burst (SQLAlchemy's default pool closed every one
    beyond the fifth, and a busy process opened connections all the time)."""
    opened: list[object] = []
    with PathLockManager(database_url, node_id="test-pool") as manager:
        event.listen(manager.engine, "connect", lambda *_: opened.append(None))
        locks = manager.for_customer(customer_id)
        start = threading.Barrier(12)

        def burst(n: int) -> None:
            start.wait()
            for _ in range(5):
                locks.lock_paths(f"/burst/{n}").release()

        first = 0
        for round_ in range(3):
            threads = [threading.Thread(target=burst, args=(n,)) for n in range(12)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            if round_ == 0:
                first = len(opened)
        assert first > 5  # the burst needed more than SQLAlchemy's 5
        assert len(opened) - first <= 2, f"{len(opened) - first} connections opened anew"
