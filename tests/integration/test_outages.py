"""Single outages at the worst moment, each the reproduction of a bug the fault
suite (``test_faults.py``) found:

- a release that fails while the database is down leaves rows that expire on
  their own: the same owner's next request must wait for them, not fail as a
  request that waits for itself;
- a COMMIT that lands while its reply is lost: a release retried after it is
  not a lost lease, and a grant whose reply comes back only after its ttl is
  not returned (someone else may hold the paths by then).

The lost reply is made in the driver: its ``commit`` commits on the real server
and then raises the error a broken connection gives (2013). The server, the
rows and every other statement are real.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, text

from pathlock import (
    AsyncPathLockManager,
    BackendError,
    DatabaseTimeout,
    LockTimeout,
    PathLockManager,
    Settings,
)
from pathlock._queue import Queue
from servers import private_mariadb
from tests.integration.commit_faults import CommitFaults
from tests.integration.conftest import PRIVATE_DATABASE

pytestmark = pytest.mark.timeout(120)

LOST = 2013  # CR_SERVER_LOST: "Lost connection to MySQL server during query"


def reply_lost_after_commit(
    monkeypatch: pytest.MonkeyPatch, stall: float = 0.0
) -> Callable[[], None]:
    """Make the next COMMIT of this process land, then (after ``stall``
    seconds) fail as a lost connection, whether it is sent on its own or at
    the end of a batch. Returns the function that arms it."""
    faults = CommitFaults(monkeypatch)
    return lambda: faults.lose_reply(LOST, stall=stall)


@pytest.fixture
def mariadb_engine(mariadb_url: str) -> Iterator[Engine]:
    """A plain engine for independent reads (not pathlock's queries)."""
    engine = create_engine(mariadb_url)
    yield engine
    engine.dispose()


def _rows(engine: Engine, customer_id: int) -> list[tuple[Any, ...]]:
    with engine.connect() as connection:
        rows = connection.execute(
            text("SELECT path, lease_id FROM path_locks WHERE customer_id = :c ORDER BY path"),
            {"c": customer_id},
        ).all()
        connection.rollback()
    return [tuple(row) for row in rows]


def test_after_a_failed_release_the_owner_waits_for_its_stale_rows(
    private_server: private_mariadb.PrivateMariaDB, customer_id: int
) -> None:
    url = private_server.url(PRIVATE_DATABASE)
    with PathLockManager(url, node_id="web-1", ttl=2, max_attempts=2, heartbeat=False) as manager:
        locks = manager.for_customer(customer_id)
        stale = locks.lock_paths("/a")
        private_server.stop()
        try:
            stale.release()  # fails: its rows are left to expire (a WARNING says so)
        finally:
            private_server.start()
        # The same thread asks again: its own stale row is in the way until
        # it expires, which is worth waiting for.
        lease = locks.lock_paths("/a", timeout=10)
        assert lease.fencing_token > stale.fencing_token
        lease.release()


def test_a_release_whose_reply_was_lost_is_not_a_lost_lease(
    mariadb_url: str,
    customer_id: int,
    mariadb_engine: Engine,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    arm = reply_lost_after_commit(monkeypatch)
    with PathLockManager(mariadb_url, node_id="web-1", heartbeat=False) as manager:
        lease = manager.for_customer(customer_id).lock_paths("/a")
        arm()
        with caplog.at_level(logging.WARNING, logger="pathlock"):
            lease.release()  # deleted and committed; the retry finds nothing
    assert lease.released
    assert not lease.lost
    assert any(str(LOST) in record.getMessage() for record in caplog.records)  # it was retried
    assert not any("gone" in record.getMessage() for record in caplog.records)
    assert _rows(mariadb_engine, customer_id) == []


def test_a_grant_whose_reply_came_back_after_its_ttl_is_not_returned(
    mariadb_url: str, customer_id: int, mariadb_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The grant commits, its reply is stuck for 2.5 s, longer than its 1 s
    # ttl; meanwhile another owner is granted the path. The retry finds its
    # own rows expired: it must not return them as a lease.
    arm = reply_lost_after_commit(monkeypatch, stall=2.5)
    with (
        PathLockManager(mariadb_url, node_id="slow", ttl=1, heartbeat=False) as slow,
        PathLockManager(mariadb_url, node_id="other", ttl=30, heartbeat=False) as other,
    ):
        slow.for_customer(customer_id).lock_paths("/warm-up").release()
        outcome: list[object] = []

        def slow_grant() -> None:
            arm()
            try:
                outcome.append(slow.for_customer(customer_id).lock_paths("/a", timeout=4))
            except LockTimeout as error:
                outcome.append(error)

        thread = threading.Thread(target=slow_grant)
        thread.start()
        time.sleep(1.5)  # the slow grant's rows have expired in database time
        theirs = other.for_customer(customer_id).lock_paths("/a", timeout=5)
        thread.join(30)
        assert not thread.is_alive()
        assert len(outcome) == 1
        assert isinstance(outcome[0], LockTimeout), outcome[0]
        assert [info.lease_id for info in outcome[0].held_by] == [theirs.lease_id]
        # The expired rows of the slow grant are gone; only the other's remain.
        assert _rows(mariadb_engine, customer_id) == [("/a", theirs.lease_id)]
        theirs.release()


def test_a_hung_server_fails_calls_instead_of_hanging_them(
    private_server: private_mariadb.PrivateMariaDB, customer_id: int
) -> None:
    # A stopped process is what a hung server, or a network path that drops
    # every packet, looks like to a client: the socket stays open, no reply
    # comes. Without socket timeouts (pathlock's default is 30 s; 1 s here)
    # the call would wait for TCP keepalive, hours; with several nodes it
    # could never move on.
    if not private_server.running:
        private_server.start()
    url = private_server.url(PRIVATE_DATABASE)
    options = {"connect_args": {"read_timeout": 1, "write_timeout": 1, "connect_timeout": 1}}
    with PathLockManager(
        url, node_id="hung", max_attempts=2, heartbeat=False, engine_options=options
    ) as manager:
        locks = manager.for_customer(customer_id)
        locks.lock_paths("/a").release()  # a pooled connection, alive
        with private_server.frozen():
            started = time.monotonic()
            with pytest.raises(BackendError, match="persisted through 2 attempts"):
                locks.lock_paths("/b", timeout=60)
            took = time.monotonic() - started
        assert took < 10
        with locks.lock_paths("/b") as lease:  # the same manager, once it answers again
            assert not lease.lost


def test_a_refused_commit_leaves_no_transaction_for_the_retry_to_run_in(
    mariadb_url: str, mariadb_engine: Engine, customer_id: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A Galera node that has just left the primary component refuses COMMIT
    # with 1047 and keeps the transaction open; the connection is not lost,
    # so it goes back to the pool. Found on the cluster (test_cluster_faults):
    # the retry then ran inside the old transaction, found its own
    # uncommitted rows by their lease id, rolled them back and returned a
    # lease whose rows nobody else could see.
    faults = CommitFaults(monkeypatch)
    with PathLockManager(mariadb_url, node_id="refused", heartbeat=False) as manager:
        locks = manager.for_customer(customer_id)
        locks.lock_paths("/warm").release()  # one pooled connection, reused below
        faults.refuse(1047)
        with locks.lock_paths("/a", "/b") as lease:
            assert _rows(mariadb_engine, customer_id) == [
                ("/a", lease.lease_id),
                ("/b", lease.lease_id),
            ]
            with PathLockManager(mariadb_url, node_id="other", heartbeat=False) as other:
                assert other.for_customer(customer_id).try_lock_paths("/a/x") is None
            faults.refuse(1047)  # the release's COMMIT (in its batch) refused too: retried
        assert _rows(mariadb_engine, customer_id) == []
        locks.lock_paths("/a").release()  # and the owner is not held back by anything


def test_a_queue_row_left_behind_by_a_timeout_is_deleted_soon(
    database_url: str,
    customer_id: int,
    raw_engine: Engine,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A request that timed out must leave the queue within its own time; on a
    loaded machine its last attempt can use that time up. Its row was then
    left to lapse (``waiter_ttl``), and every request queued behind it waited
    that long; now it is deleted from the background within about a second."""
    settings = Settings(waiter_ttl=60.0)
    leave_queue = Queue.leave_queue

    def no_answer(*_args: Any, **_kwargs: Any) -> None:
        monkeypatch.setattr(Queue, "leave_queue", leave_queue)  # once
        raise DatabaseTimeout("leaving the queue", TimeoutError(), "no answer within 0.5 s")

    with PathLockManager(database_url, heartbeat=False, settings=settings) as manager:
        locks = manager.for_customer(customer_id)
        holder = locks.lock_paths("/a", owner="holder")
        monkeypatch.setattr(Queue, "leave_queue", no_answer)
        with caplog.at_level(logging.WARNING, "pathlock"), pytest.raises(LockTimeout):
            locks.lock_paths("/a/b", timeout=0.2, owner="waiter")
        assert "deleting the row later" in caplog.text
        deadline = time.monotonic() + 10 * settings.settle_retry
        while _waiters(raw_engine, customer_id) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _waiters(raw_engine, customer_id) == 0
        holder.release()


def _waiters(engine: Engine, customer_id: int) -> int:
    with engine.connect() as connection:
        count: int = connection.execute(
            text("SELECT COUNT(*) FROM path_lock_waiters WHERE customer_id = :c"),
            {"c": customer_id},
        ).scalar_one()
        connection.rollback()
    return count


def test_a_refused_commit_leaves_no_transaction_behind_in_the_asyncio_api(
    mariadb_url: str, mariadb_engine: Engine, customer_id: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same refusal through asyncmy: the driver's own rollback() is a
    coroutine there, and calling it without awaiting it rolled nothing back."""
    import asyncmy.errors  # noqa: PLC0415 - the async extra
    from sqlalchemy.dialects.mysql.asyncmy import AsyncAdapt_asyncmy_connection  # noqa: PLC0415

    commit = AsyncAdapt_asyncmy_connection.commit
    armed = threading.Event()

    def refused_commit(self: AsyncAdapt_asyncmy_connection) -> None:
        if armed.is_set():
            armed.clear()
            raise asyncmy.errors.OperationalError(
                1047, "WSREP has not yet prepared node for application use"
            )
        commit(self)

    monkeypatch.setattr(AsyncAdapt_asyncmy_connection, "commit", refused_commit)

    async def main() -> None:
        async with AsyncPathLockManager(mariadb_url, node_id="refused", heartbeat=False) as manager:
            locks = manager.for_customer(customer_id)
            await (await locks.lock_paths("/warm")).release()  # one pooled connection
            armed.set()
            async with locks.lock_paths("/a", "/b") as lease:
                assert _rows(mariadb_engine, customer_id) == [
                    ("/a", lease.lease_id),
                    ("/b", lease.lease_id),
                ]
            assert _rows(mariadb_engine, customer_id) == []

    asyncio.run(asyncio.wait_for(main(), 60))
