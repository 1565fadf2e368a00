"""What happens when nodes die, and how their rows go away.

A killed holder's paths stay locked until its lease expires; a node that comes
back with ``cleanup_on_start`` frees what its earlier run left at once; the
reaper (on demand, on the manager's own scheduler or on the application's)
deletes exactly the expired rows; operators can release one lease or a whole
node. Holders are real processes killed with SIGKILL (see ``nodes_worker.py``)
and every check reads the database independently, through ``raw_engine``.

Rows inserted directly belong to the test's random customers and are deleted
afterwards (``tidy``). The database is shared with other tests, which may leave
expired rows of their own: counts returned by the reaper are checked with
``>=``, the rows of the test's customers exactly.
"""

from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing
import re
import secrets
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any, TypeVar

import pytest
from apscheduler.events import EVENT_JOB_ERROR, EVENT_JOB_EXECUTED, JobExecutionEvent
from apscheduler.schedulers.background import BackgroundScheduler
from sqlalchemy import URL, Engine, Row, Table, create_engine, delete, event, make_url, select

from pathlock import (
    ArgumentTypeError,
    BackendError,
    CustomerLocks,
    InvalidArgument,
    LeaseLost,
    LockTimeout,
    Owner,
    PathLockError,
    PathLockManager,
)
from pathlock.schema import metadata, path_lock_waiters, path_locks
from tests.integration import nodes_worker
from tests.row_counts import count_added, miscounted

pytestmark = pytest.mark.timeout(60)

T = TypeVar("T")

START_TIMEOUT = 60.0  # seconds for a spawned holder to import, connect and lock
GRACE = 3.0  # seconds past a dead lease's ttl within which its paths must be granted
WAIT = 5.0  # seconds for background work: reaper runs, renewals, lost-lease callbacks
HANG = 10.0  # seconds after which a call that should return at once counts as hung

DIRECT_NODE = "test-nodes-direct"  # the node of rows inserted directly
DIRECT_PID = 4242


# -- helpers ----------------------------------------------------------------------------


def _random_node(prefix: str = "node") -> str:
    return f"{prefix}-{secrets.token_hex(6)}"


def _random_customer() -> int:
    return secrets.randbelow(2**62) + 1


def _db_clock(moment: datetime) -> datetime:
    """A database-time instant as the DATETIME columns store it: naive UTC."""
    return moment.astimezone(UTC).replace(tzinfo=None)


def _lock_row(
    customer_id: int,
    path: str,
    now: datetime,
    expires_in: float,
    *,
    node_id: str = DIRECT_NODE,
) -> dict[str, Any]:
    """A path_locks row expiring ``expires_in`` seconds after ``now`` (database
    time; negative: expired already)."""
    return {
        "customer_id": customer_id,
        "lease_id": secrets.token_hex(16),
        "path": path,
        "mode": "exclusive",
        "node_id": node_id,
        "pid": DIRECT_PID,
        "thread": "1",
        "reason": "inserted by test_nodes",
        "fencing_token": 1,
        "created_at": _db_clock(now) - timedelta(minutes=10),
        "expires_at": _db_clock(now) + timedelta(seconds=expires_in),
    }


def _waiter_row(
    customer_id: int,
    paths: Sequence[tuple[str, str]],
    now: datetime,
    expires_in: float,
    *,
    node_id: str = DIRECT_NODE,
) -> dict[str, Any]:
    """A path_lock_waiters row; ``paths`` is stored as pathlock's JSON text."""
    return {
        "customer_id": customer_id,
        "lease_id": secrets.token_hex(16),
        "paths": json.dumps([list(pair) for pair in paths]),
        "node_id": node_id,
        "pid": DIRECT_PID,
        "thread": "1",
        "reason": "inserted by test_nodes",
        "created_at": _db_clock(now) - timedelta(minutes=10),
        "expires_at": _db_clock(now) + timedelta(seconds=expires_in),
    }


def _insert(engine: Engine, table: Table, rows: Sequence[dict[str, Any]]) -> None:
    with engine.begin() as connection:
        connection.execute(table.insert(), list(rows))
        count_added(connection, table, rows)


def _rows(engine: Engine, table: Table, customer_id: int) -> list[Row[Any]]:
    with engine.connect() as connection:
        rows = connection.execute(select(table).where(table.c.customer_id == customer_id)).all()
        connection.rollback()
    return list(rows)


def _lease_ids(engine: Engine, table: Table, customer_id: int) -> list[str]:
    return sorted(row.lease_id for row in _rows(engine, table, customer_id))


def _wait_until(condition: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() >= deadline:
            pytest.fail(f"{what} within {seconds:g} s", pytrace=False)
        time.sleep(0.05)


def _within(seconds: float, what: str, function: Callable[[], T]) -> T:
    """Call ``function`` on a helper thread; fail the test instead of hanging
    it if the call does not return within ``seconds``."""
    outcome: list[T] = []
    failure: list[BaseException] = []

    def call() -> None:
        try:
            outcome.append(function())
        except BaseException as error:  # noqa: BLE001 - re-raised on the test's thread below
            failure.append(error)

    thread = threading.Thread(target=call, name=f"test_nodes {what}", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        pytest.fail(f"{what} did not return within {seconds:g} s (deadlock?)", pytrace=False)
    if failure:
        raise failure[0]
    return outcome[0]


def _new_threads(before: set[threading.Thread]) -> list[threading.Thread]:
    return [
        thread for thread in threading.enumerate() if thread not in before and thread.is_alive()
    ]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _is_sqlite(database_url: str) -> bool:
    return make_url(database_url).get_backend_name() == "sqlite"


def _unreachable_url(database_url: str) -> URL:
    """The same kind of database, where nothing can be reached: a port nothing
    listens on, or a SQLite file that can never be created (below a file)."""
    url = make_url(database_url)
    if _is_sqlite(database_url):
        return url.set(database="/dev/null/pathlock/locks.sqlite3")
    return url.set(host="127.0.0.1", port=_free_port())


def _broken_manager(database_url: str, tmp_path: Path) -> PathLockManager:
    """A manager whose every database call fails, though building it did not.

    On a server: one at a port nothing listens on (construction does not
    connect). SQLite opens (and migrates) its file at construction, so it gets
    a file of its own whose tables are dropped afterwards.
    """
    node_id = _random_node("broken")
    if not _is_sqlite(database_url):
        return PathLockManager(
            _unreachable_url(database_url), node_id=node_id, heartbeat=False, max_attempts=1
        )
    url = f"sqlite:///{tmp_path / 'broken.sqlite3'}"
    manager = PathLockManager(url, node_id=node_id, heartbeat=False, max_attempts=1)
    engine = create_engine(url)
    try:
        metadata.drop_all(engine)
    finally:
        engine.dispose()
    return manager


@pytest.fixture
def tidy(raw_engine: Engine, customer_id: int) -> Iterator[list[int]]:
    """The customers whose rows are deleted after the test (its own customer
    first; append more): rows inserted directly must not pile up in a shared
    database."""
    customers = [customer_id]
    yield customers
    with raw_engine.begin() as connection:
        for table in (path_locks, path_lock_waiters):
            connection.execute(delete(table).where(table.c.customer_id.in_(customers)))


# -- holders in other processes ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Holder:
    """A spawned process that holds one lease until it is killed."""

    process: BaseProcess
    lease_id: str
    pid: int

    def kill(self) -> None:
        """SIGKILL: no clean-up of any kind runs in the holder."""
        self.process.kill()
        self.process.join(START_TIMEOUT)
        assert self.process.exitcode == -signal.SIGKILL


@contextlib.contextmanager
def _holder(
    database_url: str, customer_id: int, path: str, *, node_id: str, ttl: float
) -> Iterator[_Holder]:
    """A process (spawned: it builds its own manager) that has locked ``path``."""
    context = multiprocessing.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(
        target=nodes_worker.hold,
        args=(database_url, customer_id, path, node_id, ttl, sender),
        name=f"holder {node_id}",
        daemon=True,
    )
    process.start()
    sender.close()
    try:
        if not receiver.poll(START_TIMEOUT):
            pytest.fail(f"the holder did not lock {path} within {START_TIMEOUT:g} s")
        try:
            message = receiver.recv()
        except EOFError:
            process.join(START_TIMEOUT)
            pytest.fail(f"the holder died before locking {path} (exit code {process.exitcode})")
        if message[0] != "held":
            pytest.fail(f"the holder failed:\n{message[1]}", pytrace=False)
        _, lease_id, pid = message
        yield _Holder(process, lease_id, pid)
    finally:
        receiver.close()
        if process.is_alive():
            process.kill()
        process.join(START_TIMEOUT)


# -- 1. a killed holder -------------------------------------------------------------------


def test_paths_of_a_killed_holder_are_granted_once_its_lease_expires(
    database_url: str, locks: CustomerLocks
) -> None:
    ttl = 2.0
    with _holder(
        database_url, locks.customer_id, "/Shared/moving", node_id=_random_node(), ttl=ttl
    ) as holder:
        holder.kill()
        (dead,) = locks.list_locks(include_expired=True)
        assert (dead.lease_id, dead.owner.pid) == (holder.lease_id, holder.pid)

        # The rows outlive the process (renewed a moment ago, they have most of
        # their ttl left): the path, its subtree and its ancestors stay locked,
        # and the blocker is named.
        assert locks.try_lock_paths("/Shared/moving") is None
        assert locks.try_lock_paths("/Shared/moving/inside") is None
        assert locks.try_lock_paths(shared=["/Shared"]) is None
        with pytest.raises(LockTimeout) as blocked:
            locks.lock_paths("/Shared/moving", timeout=0)
        assert [info.owner.pid for info in blocked.value.held_by] == [holder.pid]

        # Nobody renews them any more: they expire within the ttl.
        with locks.lock_paths("/Shared/moving", timeout=ttl + GRACE) as lease:
            (granted,) = [info for info in locks.list_locks() if info.lease_id == lease.lease_id]
            # Granted by the database's clock, never before the dead lease expired.
            assert granted.created_at >= dead.expires_at
            assert lease.fencing_token > dead.fencing_token


# -- 2. cleanup_on_start ----------------------------------------------------------------


@pytest.mark.usefixtures("tidy")
def test_cleanup_on_start_frees_what_a_killed_run_of_the_node_left(
    database_url: str,
    manager: PathLockManager,
    locks: CustomerLocks,
    raw_engine: Engine,
    caplog: pytest.LogCaptureFixture,
) -> None:
    customer_id = locks.customer_id
    node = _random_node()
    lookalike = f"{node}0"  # another node, whose id merely starts with ours
    kept = locks.lock_paths("/kept")  # a live lock of another node ("test-node")
    now = manager.database_time()
    _insert(raw_engine, path_locks, [_lock_row(customer_id, "/other", now, 600, node_id=lookalike)])
    _insert(
        raw_engine,
        path_lock_waiters,
        [
            # Queued requests block later conflicting ones: this one is
            # elsewhere, so that the holder below is granted.
            _waiter_row(customer_id, [("/queued", "exclusive")], now, 600, node_id=node),
            _waiter_row(customer_id, [("/kept", "shared")], now, 600, node_id=lookalike),
        ],
    )
    with _holder(database_url, customer_id, "/Shared/big", node_id=node, ttl=60.0) as holder:
        holder.kill()
    assert locks.try_lock_paths("/Shared/big") is None  # and would be for a minute

    with caplog.at_level(logging.WARNING, logger="pathlock"):
        restarted = PathLockManager(
            database_url, node_id=node, cleanup_on_start=True, heartbeat=False
        )
    try:
        lease = locks.try_lock_paths("/Shared/big")
        assert lease is not None, "cleanup_on_start should have freed the killed run's path"
        lease.release()
        assert sorted(
            (row.node_id, row.path) for row in _rows(raw_engine, path_locks, customer_id)
        ) == [
            (lookalike, "/other"),
            ("test-node", "/kept"),
        ]
        assert [row.node_id for row in _rows(raw_engine, path_lock_waiters, customer_id)] == [
            lookalike
        ]
        kept.renew()  # still held, never touched
        assert any(
            record.levelno == logging.WARNING and node in record.getMessage()
            for record in caplog.records
        ), "the clean-up should be logged"
    finally:
        restarted.close()
        kept.release()


def test_cleanup_on_start_needs_an_explicit_node_id_and_a_bool(database_url: str) -> None:
    unreachable = _unreachable_url(database_url)
    # Refused before the database is touched: it would fail to connect otherwise.
    with pytest.raises(InvalidArgument, match="node_id"):
        PathLockManager(unreachable, cleanup_on_start=True)
    with pytest.raises(BackendError):  # with a node id, it does go to the database
        PathLockManager(unreachable, node_id=_random_node(), cleanup_on_start=True, max_attempts=1)
    for wrong in (1, "yes", None):
        with pytest.raises(ArgumentTypeError, match="cleanup_on_start"):
            PathLockManager(unreachable, node_id=_random_node(), cleanup_on_start=wrong)  # type: ignore[arg-type]


# -- 3. and 4. reap_expired ---------------------------------------------------------------

_DELETE = re.compile(r"\s*DELETE\s+FROM\s+[`\"]?(\w+)", re.IGNORECASE)


@contextlib.contextmanager
def _statements(engine: Engine) -> Iterator[list[tuple[str, int]]]:
    """Record the DELETEs run on ``engine`` as (table, rows deleted), and each
    commit as ("COMMIT", 0)."""
    seen: list[tuple[str, int]] = []

    def executed(_conn: object, cursor: Any, statement: str, *_args: object) -> None:
        match = _DELETE.match(statement)
        if match:
            seen.append((match.group(1), cursor.rowcount))

    def committed(_conn: object) -> None:
        seen.append(("COMMIT", 0))

    event.listen(engine, "after_cursor_execute", executed)
    event.listen(engine, "commit", committed)
    try:
        yield seen
    finally:
        event.remove(engine, "after_cursor_execute", executed)
        event.remove(engine, "commit", committed)


@pytest.mark.usefixtures("tidy")
def test_reap_expired_deletes_exactly_the_expired_rows_in_batches(
    manager: PathLockManager, locks: CustomerLocks, raw_engine: Engine
) -> None:
    customer_id = locks.customer_id
    held = locks.lock_paths("/held", ttl=30)
    now = manager.database_time()
    live_locks = [_lock_row(customer_id, f"/live/{n}", now, 3600) for n in range(3)]
    live_waiters = [_waiter_row(customer_id, [(f"/w/{n}", "shared")], now, 600) for n in range(2)]
    _insert(
        raw_engine,
        path_locks,
        [_lock_row(customer_id, f"/expired/{n}", now, -1.0 - n) for n in range(10)] + live_locks,
    )
    _insert(
        raw_engine,
        path_lock_waiters,
        [_waiter_row(customer_id, [(f"/w/{n}", "exclusive")], now, -1.0 - n) for n in range(4)]
        + live_waiters,
    )

    with _statements(manager.engine) as statements:
        reaped = manager.reap_expired(batch_size=3)

    assert reaped >= 14  # ours, and any other test's expired rows
    assert _lease_ids(raw_engine, path_locks, customer_id) == sorted(
        [held.lease_id] + [row["lease_id"] for row in live_locks]
    )
    assert _lease_ids(raw_engine, path_lock_waiters, customer_id) == sorted(
        row["lease_id"] for row in live_waiters
    )
    held.renew()  # a held lease is not touched
    held.release()

    # Batches: no transaction deleted more than batch_size rows (one DELETE
    # per customer), our 10 lock rows took at least 4 of them, and each batch
    # committed before the next began.
    batches: list[list[tuple[str, int]]] = [[]]
    for table, count in statements:
        if table == "COMMIT":
            batches.append([])
        else:
            batches[-1].append((table, count))
    assert batches[-1] == [], statements
    assert all(sum(count for _, count in batch) <= 3 for batch in batches), statements
    assert all(len({table for table, _ in batch}) <= 1 for batch in batches), statements
    ours = sum(1 for batch in batches if any(table == "path_locks" for table, _ in batch))
    assert ours >= 4, statements
    # The customer's counts went down with its rows.
    with raw_engine.connect() as connection:
        assert miscounted(connection, [customer_id], exact=True) == []


@pytest.mark.parametrize(
    ("batch_size", "error"),
    [
        (0, InvalidArgument),
        (-1, InvalidArgument),
        (True, ArgumentTypeError),
        ("3", ArgumentTypeError),
        (3.0, ArgumentTypeError),
        (None, ArgumentTypeError),
    ],
)
def test_bad_batch_sizes_are_rejected(
    manager: PathLockManager, batch_size: object, error: type[PathLockError]
) -> None:
    with pytest.raises(error, match="batch_size"):
        manager.reap_expired(batch_size=batch_size)  # type: ignore[arg-type]
    scheduler = BackgroundScheduler(daemon=True)  # never started: no thread
    with pytest.raises(error, match="batch_size"):
        manager.add_reaper_job(scheduler, batch_size=batch_size)  # type: ignore[arg-type]
    assert scheduler.get_jobs() == []


@pytest.mark.parametrize(
    ("interval", "error"),
    [
        (0, InvalidArgument),
        (-1, InvalidArgument),
        (float("inf"), InvalidArgument),
        (float("nan"), InvalidArgument),
        (True, ArgumentTypeError),
        ("60", ArgumentTypeError),
    ],
)
def test_bad_reaper_intervals_are_rejected_and_start_nothing(
    manager: PathLockManager, interval: object, error: type[PathLockError]
) -> None:
    before = set(threading.enumerate())
    with pytest.raises(error, match="interval"):
        manager.start_reaper(interval=interval)  # type: ignore[arg-type]
    scheduler = BackgroundScheduler(daemon=True)  # never started: no thread
    with pytest.raises(error, match="interval"):
        manager.add_reaper_job(scheduler, interval=interval)  # type: ignore[arg-type]
    with pytest.raises(ArgumentTypeError, match="job_id"):
        manager.add_reaper_job(scheduler, job_id=5)  # type: ignore[arg-type]
    assert scheduler.get_jobs() == []
    assert _new_threads(before) == []
    # The refused start left nothing behind that would refuse a good one.
    manager.start_reaper(interval=3600)


def test_two_managers_reaping_at_once_delete_every_expired_row(
    database_url: str, manager: PathLockManager, raw_engine: Engine, tidy: list[int]
) -> None:
    customer_id = tidy[0]
    now = manager.database_time()
    _insert(
        raw_engine,
        path_locks,
        [_lock_row(customer_id, f"/stale/{n}", now, -1.0 - n / 100) for n in range(200)],
    )
    _insert(
        raw_engine,
        path_lock_waiters,
        [_waiter_row(customer_id, [(f"/q/{n}", "exclusive")], now, -1.0) for n in range(20)],
    )
    with PathLockManager(database_url, node_id=_random_node("reaper"), heartbeat=False) as second:
        start = threading.Barrier(2, timeout=HANG)
        counts: list[int] = []
        failures: list[BaseException] = []

        def reap(reaper: PathLockManager) -> None:
            try:
                start.wait()
                counts.append(reaper.reap_expired(batch_size=7))
            except BaseException as error:  # noqa: BLE001 - reported by the assertion below
                failures.append(error)

        threads = [threading.Thread(target=reap, args=(m,)) for m in (manager, second)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert not any(thread.is_alive() for thread in threads), "a reaper hung"
    assert not failures, failures
    assert len(counts) == 2
    assert sum(counts) >= 220  # rows are counted once, by whoever deleted them
    assert _rows(raw_engine, path_locks, customer_id) == []
    assert _rows(raw_engine, path_lock_waiters, customer_id) == []


# -- 5. and 6. the reaper on a scheduler ------------------------------------------------


def _expired_row_is_reaped(
    manager: PathLockManager, raw_engine: Engine, customer_id: int, path: str
) -> None:
    _insert(raw_engine, path_locks, [_lock_row(customer_id, path, manager.database_time(), -1)])
    _wait_until(
        lambda: all(row.path != path for row in _rows(raw_engine, path_locks, customer_id)),
        WAIT,
        f"the reaper did not delete the expired row {path}",
    )


def test_start_reaper_reaps_in_the_background_until_close(
    database_url: str, raw_engine: Engine, tidy: list[int]
) -> None:
    customer_id = tidy[0]
    before = set(threading.enumerate())
    node = _random_node("reaper")
    # Renewed every second beside the reaper's runs; 3 s, not less: a loaded
    # machine delayed a renewal of a 1 s lease past its 0.9 s margin.
    manager = PathLockManager(database_url, node_id=node, ttl=3.0)
    try:
        _within(HANG, "start_reaper()", lambda: manager.start_reaper(interval=0.2, batch_size=50))
    except BaseException:
        # close() takes the lock a hung start_reaper() holds: let it hang on a
        # daemon thread rather than in the test.
        threading.Thread(target=manager.close, daemon=True).start()
        raise
    try:
        assert "APScheduler" in [thread.name for thread in _new_threads(before)]
        with pytest.raises(PathLockError, match="already running"):
            _within(HANG, "a second start_reaper()", lambda: manager.start_reaper(interval=0.2))
        lease = manager.for_customer(customer_id).lock_paths("/busy")  # starts the heartbeat
        _expired_row_is_reaped(manager, raw_engine, customer_id, "/stale")
        lease.ensure_held(verify=True)  # renewed, and its row left alone by the reaper
        started = {thread.name for thread in _new_threads(before)}
        assert f"pathlock-heartbeat-{node}" in started
    finally:
        _within(HANG, "close()", manager.close)

    # Nothing of the manager runs any more: no scheduler, no heartbeat. (A
    # renewal in flight may take a moment to finish on its own.)
    assert not [
        thread.name for thread in _new_threads(before) if not thread.name.endswith("-renew")
    ]
    _wait_until(lambda: not _new_threads(before), 2.0, "threads of the manager still ran")
    assert _rows(raw_engine, path_locks, customer_id) == []  # close() released /busy
    with pytest.raises(PathLockError, match="closed"):
        manager.start_reaper(interval=0.2)


def _application_task() -> None:
    """A job of the application's own, which the manager must leave alone."""


@contextlib.contextmanager
def _application_scheduler() -> Iterator[tuple[BackgroundScheduler, list[JobExecutionEvent]]]:
    scheduler = BackgroundScheduler(daemon=True)
    events: list[JobExecutionEvent] = []
    scheduler.add_listener(events.append, EVENT_JOB_EXECUTED | EVENT_JOB_ERROR)
    scheduler.add_job(_application_task, "interval", seconds=3600, id="application-job")
    scheduler.start()
    try:
        yield scheduler, events
    finally:
        scheduler.shutdown(wait=True)


def test_add_reaper_job_runs_on_the_applications_scheduler_until_close(
    database_url: str, raw_engine: Engine, tidy: list[int], caplog: pytest.LogCaptureFixture
) -> None:
    customer_id = tidy[0]
    job_id = f"reaper-{secrets.token_hex(4)}"
    with _application_scheduler() as (scheduler, events):
        manager = PathLockManager(database_url, node_id=_random_node("reaper"), heartbeat=False)
        try:
            job = manager.add_reaper_job(scheduler, interval=0.2, batch_size=50, job_id=job_id)
            assert job.id == job_id
            assert scheduler.get_job(job_id) is not None
            _expired_row_is_reaped(manager, raw_engine, customer_id, "/stale")
        finally:
            _within(HANG, "close()", manager.close)
        assert scheduler.get_job(job_id) is None, "close() should remove the reaper job"
        assert scheduler.running, "close() must not stop the application's scheduler"
        assert scheduler.get_job("application-job") is not None
    ours = [event for event in events if event.job_id == job_id]
    assert ours, "the reaper job never ran"
    assert not [event for event in ours if event.code == EVENT_JOB_ERROR]
    assert not [record for record in caplog.records if record.levelno >= logging.ERROR]


def test_close_leaves_no_reaper_run_going_on_the_applications_scheduler(
    database_url: str, raw_engine: Engine, tidy: list[int]
) -> None:
    """A run in progress when close() is called must not go on reaping after
    close() returned (on an engine close() has disposed)."""
    customer_id = tidy[0]
    backlog = 2000  # one row per batch: a run of a second or more
    with _application_scheduler() as (scheduler, _events):
        manager = PathLockManager(database_url, node_id=_random_node("reaper"), heartbeat=False)
        try:
            now = manager.database_time()
            _insert(
                raw_engine,
                path_locks,
                [_lock_row(customer_id, f"/stale/{n}", now, -1.0) for n in range(backlog)],
            )
            manager.add_reaper_job(scheduler, interval=3600, batch_size=1)

            def left() -> int:
                return len(_rows(raw_engine, path_locks, customer_id))

            _wait_until(lambda: left() < backlog, WAIT, "the reaper job never started")
            assert left() > 0, "the run ended before close(): make the backlog larger"
        finally:
            _within(HANG, "close()", manager.close)
        after_close = left()
        time.sleep(0.5)
        assert left() == after_close, "the reaper went on deleting after close() returned"


def test_a_failing_reaper_job_logs_a_warning_and_never_raises(
    database_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="pathlock")
    job_id = f"reaper-{secrets.token_hex(4)}"
    broken = _broken_manager(database_url, tmp_path)
    with _application_scheduler() as (scheduler, events):
        try:
            with pytest.raises(BackendError):  # called directly, the failure is raised
                broken.reap_expired()
            caplog.clear()
            broken.add_reaper_job(scheduler, interval=0.2, job_id=job_id)
            _wait_until(
                lambda: any(event.job_id == job_id for event in events),
                WAIT,
                "the reaper job never ran",
            )
        finally:
            _within(HANG, "close()", broken.close)
        assert scheduler.get_job(job_id) is None
    ours = [event for event in events if event.job_id == job_id]
    assert not [event for event in ours if event.code == EVENT_JOB_ERROR], [
        event.exception for event in ours
    ]
    failures = [
        record
        for record in caplog.records
        if record.name.startswith("pathlock") and "reap" in record.getMessage().lower()
    ]
    assert failures, "the failed run should be logged"
    assert {record.levelno for record in failures} == {logging.WARNING}
    assert not [record for record in caplog.records if record.levelno >= logging.ERROR]


def test_closing_a_manager_leaves_a_reaper_job_that_replaced_its_own(
    database_url: str,
) -> None:
    """Two managers adding the default job id to one scheduler: the second
    replaces the first, so the job belongs to the second, and closing the first
    must not remove it."""
    with _application_scheduler() as (scheduler, _events):
        first = PathLockManager(database_url, node_id=_random_node("first"), heartbeat=False)
        second = PathLockManager(database_url, node_id=_random_node("second"), heartbeat=False)
        try:
            first.add_reaper_job(scheduler, interval=3600)
            second.add_reaper_job(scheduler, interval=3600)
            first.close()
            job = scheduler.get_job("pathlock-reaper")
            assert job is not None, "closing the first manager removed the second's reaper job"
            assert second.node_id in job.name
        finally:
            first.close()
            second.close()
        assert scheduler.get_job("pathlock-reaper") is None


# -- 7. operators: release_lease and release_node -----------------------------------------


def test_release_lease_frees_the_paths_and_the_holder_hears_of_it(
    database_url: str,
    manager: PathLockManager,
    customer_id: int,
    caplog: pytest.LogCaptureFixture,
) -> None:
    told = threading.Event()
    with PathLockManager(database_url, node_id=_random_node("holder"), ttl=1.0) as holder:
        lease = holder.for_customer(customer_id).lock_paths(
            "/a", "/b/c", on_lost=lambda _lease: told.set()
        )
        with caplog.at_level(logging.WARNING, logger="pathlock"):
            assert manager.release_lease(lease.lease_id) == 2
        assert any(
            record.levelno == logging.WARNING and lease.lease_id in record.getMessage()
            for record in caplog.records
        ), "an operator's release should be logged"

        # Free for others at once; the holder finds out at its next renewal.
        other = manager.for_customer(customer_id).try_lock_paths("/a", "/b")
        assert other is not None
        other.release()
        assert told.wait(WAIT), "the holder was not told that its lease is gone"
        assert lease.lost
        with pytest.raises(LeaseLost):
            lease.ensure_held()
        lease.release()  # its rows are gone; releasing is still harmless
    assert manager.release_lease(secrets.token_hex(16)) == 0


@pytest.mark.parametrize(
    ("lease_id", "error"),
    [
        ("", InvalidArgument),
        ("abc", InvalidArgument),
        ("0123456789ABCDEF0123456789ABCDEF", InvalidArgument),  # upper case
        ("0" * 31, InvalidArgument),
        ("0" * 33, InvalidArgument),
        ("0" * 31 + "%", InvalidArgument),
        ("0" * 31 + "\n", InvalidArgument),
        (12345, ArgumentTypeError),
        (None, ArgumentTypeError),
    ],
)
def test_release_lease_rejects_malformed_ids(
    manager: PathLockManager, lease_id: object, error: type[PathLockError]
) -> None:
    with pytest.raises(error, match="lease_id"):
        manager.release_lease(lease_id)  # type: ignore[arg-type]


def test_release_node_deletes_only_that_nodes_rows(
    database_url: str,
    manager: PathLockManager,
    raw_engine: Engine,
    tidy: list[int],
    caplog: pytest.LogCaptureFixture,
) -> None:
    first, second = tidy[0], _random_customer()
    tidy.append(second)
    node = _random_node()
    lookalike = f"{node}0"
    with PathLockManager(database_url, node_id=node, heartbeat=False) as doomed:
        doomed.for_customer(first).lock_paths("/a", "/b")
        doomed.for_customer(second).lock_paths("/c")
        survivors = [
            manager.for_customer(first).lock_paths("/z"),
            manager.for_customer(second).lock_paths("/y"),
        ]
        now = manager.database_time()
        _insert(raw_engine, path_locks, [_lock_row(second, "/x", now, 600, node_id=lookalike)])
        _insert(
            raw_engine,
            path_lock_waiters,
            [
                _waiter_row(first, [("/a", "exclusive")], now, 600, node_id=node),
                _waiter_row(second, [("/c", "shared")], now, 600, node_id=node),
                _waiter_row(first, [("/z", "shared")], now, 600, node_id=lookalike),
            ],
        )
        with caplog.at_level(logging.WARNING, logger="pathlock"):
            assert manager.release_node(node) == 3
        assert any(node in record.getMessage() for record in caplog.records)

        def left(table: Table) -> list[tuple[int, str]]:
            return sorted(
                (customer, row.node_id)
                for customer in (first, second)
                for row in _rows(raw_engine, table, customer)
            )

        assert left(path_locks) == sorted(
            [(first, "test-node"), (second, "test-node"), (second, lookalike)]
        )
        assert left(path_lock_waiters) == [(first, lookalike)]
        assert doomed.for_customer(first).try_lock_paths("/a", "/b") is not None
    for lease in survivors:
        lease.renew()
        lease.release()
    with pytest.raises(InvalidArgument):
        manager.release_node("")
    with pytest.raises(ArgumentTypeError):
        manager.release_node(None)  # type: ignore[arg-type]


# -- 8. list_waiters and database_time ----------------------------------------------------


def test_list_waiters_shows_live_waiters_oldest_first_and_hides_expired_ones(
    manager: PathLockManager, raw_engine: Engine, tidy: list[int]
) -> None:
    customer_id = tidy[0]
    node = _random_node("waiting")
    now = manager.database_time()
    older = _waiter_row(customer_id, [("/a", "exclusive")], now, 600, node_id=node)
    newer = _waiter_row(
        customer_id, [("/b/c", "shared"), ("/d", "exclusive")], now, 600, node_id=node
    )
    expired = _waiter_row(customer_id, [("/gone", "exclusive")], now, -1, node_id=node)
    _insert(raw_engine, path_lock_waiters, [older])
    _insert(raw_engine, path_lock_waiters, [expired, newer])

    waiters = manager.list_waiters(customer_id)
    assert [(waiter.lease_id, waiter.paths) for waiter in waiters] == [
        (older["lease_id"], (("/a", "exclusive"),)),
        (newer["lease_id"], (("/b/c", "shared"), ("/d", "exclusive"))),
    ]
    assert waiters[0].ticket < waiters[1].ticket
    for waiter in waiters:
        assert waiter.customer_id == customer_id
        assert waiter.owner == Owner(node, DIRECT_PID, "1")
        assert waiter.reason == "inserted by test_nodes"
        assert waiter.expires_at.utcoffset() == timedelta(0)
        assert waiter.created_at < now < waiter.expires_at
    everyone = manager.list_waiters()
    assert [waiter for waiter in everyone if waiter.customer_id == customer_id] == waiters
    with pytest.raises(InvalidArgument):
        manager.list_waiters(-1)
    with pytest.raises(ArgumentTypeError):
        manager.list_waiters("1")  # type: ignore[arg-type]


def test_database_time_is_the_clock_of_every_lease(database_url: str, locks: CustomerLocks) -> None:
    manager = locks.manager
    before = manager.database_time()
    with locks.lock_paths("/timed", ttl=30) as lease:
        after = manager.database_time()
        (info,) = locks.list_locks()
        assert info.lease_id == lease.lease_id
    assert before.utcoffset() == timedelta(0)
    assert before <= info.created_at <= after
    assert abs(info.expires_at - info.created_at - timedelta(seconds=30)) < timedelta(
        milliseconds=1
    )
    closed = PathLockManager(database_url, node_id=_random_node(), heartbeat=False)
    closed.close()
    with pytest.raises(PathLockError, match="closed"):
        closed.database_time()
