"""Waiters woken by PostgreSQL's notices, on a real server: a release that
hands its paths to the request next in line tells that request's process
(``NOTIFY``) in its transaction, and only such a release does; each process
listens on one connection of its own, which comes back when it is lost and
goes with the last manager that listens."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from sqlalchemy.engine import make_url

from pathlock import AsyncPathLockManager, ExponentialBackoff, PathLockManager, Settings
from pathlock.dialects import PostgreSQL, _pg_notices
from pathlock.dialects._pg_notices import CHANNEL

HANG = 30.0  # seconds: only reached when something is broken
# A waiter that checks for itself only every 10 s or more (its polls, its
# recheck, the refresh of its place in the queue): granted before the last
# check of its time only if something wakes it.
SLOW = Settings(recheck=30.0, waiter_ttl=30.0)
NO_POLLS = ExponentialBackoff(first=30.0, maximum=30.0)
WOKEN = 1.5  # seconds from a release to the grant: woken (a notice takes ms)


def _conninfo(url: str) -> str:
    parsed = make_url(url)
    where = f"host={parsed.host} port={parsed.port or 5432}"
    return f"{where} user={parsed.username} dbname={parsed.database}"


@pytest.fixture
def notices(postgresql_url: str) -> Iterator[list[str]]:
    """The payloads of pathlock's notices on the test database, as a
    listener of the test's own hears them."""
    heard: list[str] = []
    stop = threading.Event()
    listening = threading.Event()

    def listen() -> None:
        with psycopg.connect(_conninfo(postgresql_url), autocommit=True) as connection:
            connection.execute(f"LISTEN {CHANNEL}")
            listening.set()
            while not stop.is_set():
                heard.extend(notice.payload for notice in connection.notifies(timeout=0.05))

    thread = threading.Thread(target=listen)
    thread.start()
    assert listening.wait(HANG)
    try:
        yield heard
    finally:
        stop.set()
        thread.join(HANG)


def _listening_sessions(postgresql_url: str) -> int:
    """Sessions of the test database whose last statement was pathlock's
    LISTEN or its check that it still listens."""
    with psycopg.connect(_conninfo(postgresql_url), autocommit=True) as connection:
        row = connection.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND query LIKE %s AND pid <> pg_backend_pid()",
            (f"%{CHANNEL}%",),
        ).fetchone()
    return int(row[0]) if row else 0


def _wait_for(condition: object, seconds: float = HANG) -> bool:
    ends = time.monotonic() + seconds
    while time.monotonic() < ends:
        if condition():  # type: ignore[operator]
            return True
        time.sleep(0.02)
    return False


@contextmanager
def _holder_and_waiter(url: str) -> Iterator[tuple[PathLockManager, PathLockManager]]:
    """A manager that holds, and one whose requests never poll."""
    with (
        PathLockManager(url, heartbeat=False) as holder,
        PathLockManager(url, heartbeat=False, backoff=NO_POLLS, settings=SLOW) as waiter,
    ):
        yield holder, waiter


def _handed_over(holder: PathLockManager, waiter: PathLockManager, customer_id: int) -> bool:
    """``holder`` holds ``/Shared/a`` while a request of ``waiter`` that
    never polls queues for it (its time: 4 s); the release hands the path
    over after a second: whether something woke the waiter before the last
    check of its time found it (at the earliest 3 s after the release)."""
    lease = holder.for_customer(customer_id).lock_paths("/Shared/a")
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(waiter.for_customer(customer_id).lock_paths, "/Shared/a", timeout=4.0)
        assert _wait_for(lambda: holder.list_waiters(customer_id), 4.0)
        time.sleep(1.0)  # the waiter's process listens by now
        released = time.monotonic()
        lease.release()
        waiting.result(HANG).release()
        return time.monotonic() - released < WOKEN


def test_only_a_release_that_hands_over_sends_a_notice(
    postgresql_url: str, customer_id: int, notices: list[str]
) -> None:
    with PathLockManager(postgresql_url, heartbeat=False) as manager:
        locks = manager.for_customer(customer_id)
        for _ in range(3):  # nobody waits: no notice
            locks.lock_paths("/Shared/a").release()
        with PathLockManager(postgresql_url, heartbeat=False) as other:
            assert _handed_over(manager, other, customer_id)
            assert manager.list_waiters(customer_id) == []
    assert _wait_for(lambda: len(notices) >= 1, 5.0)
    time.sleep(0.2)
    (payload,) = notices
    heard_customer, heard_ticket = (int(part) for part in payload.split())
    assert heard_customer == customer_id
    assert heard_ticket > 0


def test_a_waiter_that_never_polls_is_woken_by_the_release_that_hands_it_over(
    postgresql_url: str, customer_id: int
) -> None:
    with _holder_and_waiter(postgresql_url) as (holder, waiter):
        assert _handed_over(holder, waiter, customer_id)


def test_without_notices_such_a_waiter_waits_for_its_own_check(
    postgresql_url: str, customer_id: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The test above, failing where nothing is heard: it tests the notices.
    monkeypatch.setattr(PostgreSQL, "listen", lambda *_: None)
    with _holder_and_waiter(postgresql_url) as (holder, waiter):
        assert not _handed_over(holder, waiter, customer_id)


def test_the_listener_comes_back_after_its_session_is_ended(
    postgresql_url: str, customer_id: int
) -> None:
    with _holder_and_waiter(postgresql_url) as (holder, waiter):
        assert _handed_over(holder, waiter, customer_id)
        with psycopg.connect(_conninfo(postgresql_url), autocommit=True) as connection:
            connection.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND query LIKE %s AND pid <> pg_backend_pid()",
                (f"%{CHANNEL}%",),
            )
        assert _wait_for(lambda: _listening_sessions(postgresql_url) == 1)
        assert _handed_over(holder, waiter, customer_id)


def test_managers_of_a_process_share_one_listener_which_goes_with_the_last(
    postgresql_url: str, customer_id: int
) -> None:
    holder = PathLockManager(postgresql_url, heartbeat=False)
    waiters = [
        PathLockManager(postgresql_url, heartbeat=False, backoff=NO_POLLS, settings=SLOW)
        for _ in range(2)
    ]
    try:
        for waiter in waiters:
            assert _handed_over(holder, waiter, customer_id)
        assert _listening_sessions(postgresql_url) == 1
        waiters[0].close()
        assert _handed_over(holder, waiters[1], customer_id)
        waiters[1].close()
        holder.close()
        assert _wait_for(lambda: _listening_sessions(postgresql_url) == 0, 5.0)
    finally:
        for manager in (holder, *waiters):
            manager.close()


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # fork() with threads running
def test_a_forked_child_hears_on_a_connection_of_its_own(
    postgresql_url: str, customer_id: int
) -> None:
    with _holder_and_waiter(postgresql_url) as (holder, waiter):
        assert _handed_over(holder, waiter, customer_id)  # the parent listens
        # Another thread of the parent holds the listeners' lock at the fork.
        holding, done = threading.Event(), threading.Event()

        def hold() -> None:
            with _pg_notices._lock:
                holding.set()
                done.wait(HANG)

        thread = threading.Thread(target=hold)
        thread.start()
        assert holding.wait(HANG)
        try:
            pid = os.fork()
            if pid == 0:  # pragma: no cover - the child
                status = 1
                try:
                    signal.signal(signal.SIGALRM, signal.SIG_DFL)
                    signal.alarm(20)  # a hang kills the child, not the test run
                    status = 0 if _handed_over(holder, waiter, customer_id) else 2
                finally:
                    os._exit(status)
        finally:
            done.set()
            thread.join(HANG)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        # The child's listener went with it; the parent's still hears.
        assert _wait_for(lambda: _listening_sessions(postgresql_url) == 1)
        assert _handed_over(holder, waiter, customer_id)


def test_an_asyncio_waiter_that_never_polls_is_woken_too(
    postgresql_url: str, customer_id: int
) -> None:
    # Its process listens on a synchronous connection of its own, on a thread.
    async def run() -> float:
        async with AsyncPathLockManager(
            postgresql_url, heartbeat=False, backoff=NO_POLLS, settings=SLOW
        ) as waiter:
            with PathLockManager(postgresql_url, heartbeat=False) as holder:
                lease = holder.for_customer(customer_id).lock_paths("/Shared/a")
                locks = waiter.for_customer(customer_id)

                async def wait() -> Any:
                    return await locks.lock_paths("/Shared/a", timeout=4.0)

                waiting = asyncio.create_task(wait())
                await asyncio.sleep(1.0)  # queued, and listening
                released = time.monotonic()
                await asyncio.to_thread(lease.release)
                await (await waiting).release()
                return time.monotonic() - released

    assert asyncio.run(run()) < WOKEN
