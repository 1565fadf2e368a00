"""Fair waiting against the real databases: the queue's order, requests that do
not conflict, the own-owner exception, deadlocks of two owners, dead and
impatient waiters, and the version watch.

Fairness is checked by order, never by time: which request was granted before
which, and which requests a queued one kept out. Every other owner is another
thread (owners are node, process and thread) or, where a death or a second
process matters, a spawned process (``queue_worker.py``).
"""

from __future__ import annotations

import multiprocessing
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pymysql.connections
import pytest
from sqlalchemy import Engine, create_engine, event, text

from pathlock import (
    BackendError,
    CustomerLocks,
    DeadlockDetected,
    Lease,
    LockTimeout,
    Owner,
    PathLockError,
    PathLockManager,
    WaiterInfo,
)
from pathlock._statements.queue import MAX_AHEAD
from pathlock.settings import DEFAULT as SETTINGS
from pathlock.settings import Settings
from tests.integration import queue_worker

pytestmark = pytest.mark.timeout(120)

HANG = 30.0  # seconds after which something that should happen soon counts as stuck


def _waiters(locks: CustomerLocks) -> list[WaiterInfo]:
    return locks.manager.list_waiters(locks.customer_id)


def _until(condition: Callable[[], Any], what: str, seconds: float = HANG) -> Any:
    deadline = time.monotonic() + seconds
    while not (value := condition()):
        if time.monotonic() >= deadline:
            pytest.fail(f"{what} within {seconds:g} s", pytrace=False)
        time.sleep(0.01)
    return value


def _left_queue(locks: CustomerLocks) -> None:
    """Wait until the queue is empty, well before a row left behind would
    lapse: a request that gave up deletes its row on the way out or, when
    the database did not answer in time (a loaded machine), from the
    background soon after."""
    _until(
        lambda: not _waiters(locks),
        "the queue emptied before its rows lapsed",
        seconds=SETTINGS.waiter_ttl / 2,
    )


def _queued(locks: CustomerLocks, count: int) -> list[WaiterInfo]:
    """Wait until ``count`` requests are queued; return the queue."""

    def enough() -> list[WaiterInfo] | None:
        queue = _waiters(locks)
        return queue if len(queue) >= count else None

    return list(_until(enough, f"{count} queued requests"))


class Request(threading.Thread):
    """``lock_paths`` on a thread of its own (another owner). Appends its name
    to ``granted`` when granted, then holds until :meth:`finish` (or releases
    at once with ``hold=False``). With ``first``, the thread locks those paths
    before it requests, and holds them to the end, whatever the request does."""

    def __init__(
        self,
        locks: CustomerLocks,
        *paths: str,
        first: tuple[str, ...] = (),
        start_together: threading.Barrier | None = None,
        shared: tuple[str, ...] = (),
        timeout: float | None = HANG,
        granted: list[str] | None = None,
        name: str = "",
        hold: bool = True,
    ) -> None:
        super().__init__(name=f"request {name or paths}", daemon=True)
        self.locks = locks
        self.paths = paths
        self.first = first
        self.start_together = start_together
        self.shared = shared
        self.timeout = timeout
        self.granted = granted if granted is not None else []
        self.label = name or ",".join(paths)
        self.hold = hold
        self.lease: Lease | None = None
        self.error: PathLockError | None = None
        self.owner: Owner | None = None
        self.requested_at = 0.0
        self.granted_at = 0.0
        self.done = threading.Event()
        self._finish = threading.Event()

    def run(self) -> None:
        held = self.locks.lock_paths(*self.first, timeout=HANG) if self.first else None
        self.owner = held.owner if held is not None else None
        if self.start_together is not None:
            self.start_together.wait(HANG)
        self.requested_at = time.monotonic()
        try:
            lease = self.locks.lock_paths(*self.paths, shared=self.shared, timeout=self.timeout)
        except PathLockError as error:
            self.error = error
            self.done.set()
            self._finish.wait(HANG)
            if held is not None:
                held.release()
            return
        self.granted_at = time.monotonic()
        self.granted.append(self.label)
        self.lease = lease
        self.owner = lease.owner
        self.done.set()
        if self.hold:
            self._finish.wait(HANG)
        lease.release()
        if held is not None:
            held.release()

    def finish(self) -> None:
        self._finish.set()
        self.join(HANG)
        assert not self.is_alive(), f"{self.label} did not end"

    def outcome(self) -> Lease | PathLockError:
        assert self.done.wait(HANG), f"{self.label} got no answer within {HANG} s"
        result = self.lease if self.error is None else self.error
        assert result is not None
        return result


@pytest.fixture
def requests() -> Iterator[list[Request]]:
    """Threads started by a test; all finished afterwards, even on failure."""
    started: list[Request] = []
    yield started
    for request in started:
        request._finish.set()
    for request in started:
        request.join(HANG)


def _start(requests: list[Request], request: Request) -> Request:
    requests.append(request)
    request.start()
    return request


def _held_elsewhere(locks: CustomerLocks, requests: list[Request], *paths: str) -> Request:
    """Paths held by another owner (a waiter that waits for our own locks does
    not hold us back, so blocking must come from someone else)."""
    holder = _start(requests, Request(locks, *paths, name="holder"))
    assert isinstance(holder.outcome(), Lease)
    return holder


# -- FIFO -----------------------------------------------------------------------------------


def test_conflicting_requests_are_granted_in_queue_order(
    locks: CustomerLocks, requests: list[Request]
) -> None:
    # Every two of these conflict, so the queue decides the whole order.
    wanted = [("first", "/a"), ("second", "/a/x"), ("third", "/a"), ("fourth", "/a/x/y")]
    granted: list[str] = []
    holder = locks.lock_paths("/a")
    for count, (name, path) in enumerate(wanted, start=1):
        _start(requests, Request(locks, path, granted=granted, name=name, hold=False))
        queue = _queued(locks, count)
    assert [waiter.paths[0][0] for waiter in queue] == [path for _, path in wanted]
    assert [waiter.ticket for waiter in queue] == sorted(waiter.ticket for waiter in queue)

    holder.release()
    for request in requests:
        assert isinstance(request.outcome(), Lease)
    assert granted == [name for name, _ in wanted]
    assert _waiters(locks) == []


def test_processes_are_granted_in_queue_order(database_url: str, locks: CustomerLocks) -> None:
    context = multiprocessing.get_context("spawn")
    events: Any = context.Queue()
    names = ["p1", "p2", "p3"]
    holder = locks.lock_paths("/Shared/doc")
    processes = []
    try:
        for count, name in enumerate(names, start=1):
            process = context.Process(
                target=queue_worker.request,
                args=(database_url, locks.customer_id, "/Shared/doc", name, events),
                daemon=True,
            )
            process.start()
            processes.append(process)
            _queued(locks, count)
        holder.release()
        granted = []
        for _ in names:
            kind, name, detail = events.get(timeout=HANG)
            assert kind == "granted", detail
            granted.append((int(detail), name))
        # Events may arrive out of order; the fencing tokens give the grants'.
        assert [name for _, name in sorted(granted)] == names
    finally:
        holder.release()
        for process in processes:
            process.join(HANG)
            if process.is_alive():
                process.kill()


def test_a_later_request_does_not_overtake_a_queued_one_it_conflicts_with(
    locks: CustomerLocks, requests: list[Request]
) -> None:
    holder = _held_elsewhere(locks, requests, "/Shared/parent/child")
    parent = _start(requests, Request(locks, "/Shared/parent", name="parent"))
    (queued,) = _queued(locks, 1)

    # /Shared/parent/other is free, but the queued parent request wants it too.
    assert locks.try_lock_paths("/Shared/parent/other") is None
    with pytest.raises(LockTimeout) as caught:
        locks.lock_paths("/Shared/parent/other", timeout=0)
    assert caught.value.held_by == ()
    assert [waiter.ticket for waiter in caught.value.queued_behind] == [queued.ticket]
    assert "queued behind" in str(caught.value)
    assert f"ticket {queued.ticket}" in str(caught.value)

    holder.finish()
    assert isinstance(parent.outcome(), Lease)
    assert locks.try_lock_paths("/Shared/parent/other") is None  # now held by parent
    parent.finish()
    lease = locks.try_lock_paths("/Shared/parent/other")
    assert lease is not None
    lease.release()


def test_requests_that_do_not_conflict_never_wait_for_each_other(
    locks: CustomerLocks, requests: list[Request]
) -> None:
    holder = _held_elsewhere(locks, requests, "/Shared/parent/child")
    _start(requests, Request(locks, shared=("/Shared/parent",), name="reader"))
    _queued(locks, 1)

    # A sibling tree, and a shared request beside the queued shared one.
    for paths, shared in ((("/Shared/sibling",), ()), ((), ("/Shared/parent/other",))):
        lease = locks.try_lock_paths(*paths, shared=shared)
        assert lease is not None, (paths, shared)
        lease.release()
    # Another customer never sees this queue at all.
    other = locks.manager.for_customer(locks.customer_id + 1)
    lease = other.try_lock_paths("/Shared/parent")
    assert lease is not None
    lease.release()
    holder.finish()


def test_a_parent_folder_is_not_starved_by_a_stream_of_child_edits(
    locks: CustomerLocks, requests: list[Request]
) -> None:
    stop = threading.Event()
    children: list[tuple[float, float]] = []  # (requested, granted) per child grant
    failures: list[BaseException] = []

    def edit_children(number: int) -> None:
        try:
            while not stop.is_set():
                requested = time.monotonic()
                with locks.lock_paths(f"/Shared/parent/child{number}/file", timeout=HANG):
                    children.append((requested, time.monotonic()))
                    time.sleep(0.005)
        except BaseException as error:  # noqa: BLE001 - reported by the assertion below
            failures.append(error)

    editors = [threading.Thread(target=edit_children, args=(n,), daemon=True) for n in range(3)]
    for editor in editors:
        editor.start()
    try:
        _until(lambda: len(children) >= 10, "the child edits get going")
        parent = _start(requests, Request(locks, "/Shared/parent", name="parent"))
        _queued(locks, 1)
        seen_queued = time.monotonic()
        assert isinstance(parent.outcome(), Lease)
        parent.finish()
    finally:
        stop.set()
        for editor in editors:
            editor.join(HANG)
    assert failures == []
    # Every edit requested after the parent was seen queued came after it.
    overtakers = [
        (requested, granted)
        for requested, granted in children
        if requested > seen_queued and granted < parent.granted_at
    ]
    assert overtakers == []


# -- the requesting owner's own locks --------------------------------------------------------


def test_a_waiter_that_waits_for_this_owner_does_not_hold_it_back(
    locks: CustomerLocks, requests: list[Request]
) -> None:
    granted: list[str] = []
    first = locks.lock_paths("/a/x")
    waiting = _start(requests, Request(locks, "/a", granted=granted, name="waits for us"))
    _queued(locks, 1)
    # /a/y conflicts only with the queued /a, which waits for our /a/x.
    second = locks.try_lock_paths("/a/y")
    assert second is not None

    # Queued behind that waiter, so waiting for us too (through it).
    behind = _start(requests, Request(locks, "/a/q", granted=granted, name="behind it"))
    _queued(locks, 2)
    third = locks.try_lock_paths("/a/q/r")
    assert third is not None

    # Another owner, holding nothing, must queue as usual.
    outsider = _start(requests, Request(locks, "/a/q/r", timeout=0, name="outsider"))
    assert isinstance(outsider.outcome(), LockTimeout)

    for lease in (first, second, third):
        lease.release()
    for request in (waiting, behind):
        assert isinstance(request.outcome(), Lease)
        request.finish()
    assert granted == ["waits for us", "behind it"]


# -- deadlocks ------------------------------------------------------------------------------


def test_two_owners_waiting_for_each_other_fail_at_once(
    locks: CustomerLocks, requests: list[Request]
) -> None:
    mine = locks.lock_paths("/y")
    # A holds /x and waits for /y, which we hold ...
    other = _start(requests, Request(locks, "/y", first=("/x",), name="A"))
    (queued,) = _queued(locks, 1)
    # ... so our request for /x closes the cycle, and fails at once.
    with pytest.raises(DeadlockDetected) as caught:
        locks.lock_paths("/x", timeout=None)
    error = caught.value
    assert error.party is not None
    assert error.party.ticket == queued.ticket
    assert error.party.paths == (("/y", "exclusive"),)
    assert error.party.owner == other.owner
    assert [info.path for info in error.held_by] == ["/x"]
    assert f"ticket {queued.ticket}" in str(error)
    assert "/y (exclusive)" in str(error)
    assert [waiter.ticket for waiter in _waiters(locks)] == [queued.ticket]  # we left no row

    # The other party waits on, and gets /y once we let go.
    mine.release()
    assert isinstance(other.outcome(), Lease)


def test_rows_of_a_failed_release_close_no_cycle(
    manager: PathLockManager,
    locks: CustomerLocks,
    requests: list[Request],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Our release of /y failed (the database refused it): its rows stay
    # until they expire, and they are no longer ours to release. Another
    # owner that holds /x queues for /y. Our request for /x must wait for it,
    # not fail as a deadlock: /y frees itself without us. (The same comes of
    # a grant left in doubt whose rows landed; a cluster fault run raised a
    # DeadlockDetected that way.)
    mine = locks.lock_paths("/y", ttl=3.0)

    def refused(*_args: object, **_kwargs: object) -> int:
        raise BackendError("releasing a lease", RuntimeError("the database refused"))

    with monkeypatch.context() as patched:
        patched.setattr(manager._store.releases, "release", refused)
        mine.release()  # logged; its rows expire within 3 s
    other = _start(requests, Request(locks, "/y", first=("/x",), name="A"))
    _queued(locks, 1)
    with pytest.raises(LockTimeout):  # waited for A: no DeadlockDetected
        locks.lock_paths("/x", timeout=1.0)
    assert isinstance(other.outcome(), Lease)  # /y lapsed
    other.finish()
    locks.lock_paths("/x", timeout=HANG).release()


@pytest.mark.parametrize("_round", range(3))
def test_of_two_owners_asking_at_once_exactly_one_fails(
    locks: CustomerLocks, requests: list[Request], _round: int
) -> None:
    # A holds /x and asks for /y; B holds /y and asks for /x, at the same moment.
    barrier = threading.Barrier(2)
    a = Request(locks, "/y", first=("/x",), start_together=barrier, name="A")
    b = Request(locks, "/x", first=("/y",), start_together=barrier, name="B")
    for request in (a, b):
        _start(requests, request)
    # The enqueue is written with the denial, under the customer's sentinel:
    # whichever attempt comes second sees the other queued.
    first_answer = _until(
        lambda: [r for r in (a, b) if r.done.is_set()], "one of the two got an answer"
    )
    (failed,) = first_answer
    assert isinstance(failed.error, DeadlockDetected), failed.error
    survivor = b if failed is a else a
    assert not survivor.done.is_set()
    failed.finish()  # gives up what it held
    assert isinstance(survivor.outcome(), Lease)


def test_waiting_for_an_owner_that_waits_for_someone_else_is_no_deadlock(
    locks: CustomerLocks, requests: list[Request]
) -> None:
    third_party = _start(requests, Request(locks, "/z", name="C"))
    assert isinstance(third_party.outcome(), Lease)
    # A holds /x and waits for /z, which C holds, not we.
    other = _start(requests, Request(locks, "/z", first=("/x",), name="A"))
    _queued(locks, 1)
    with pytest.raises(LockTimeout):
        locks.lock_paths("/x", timeout=0.2)
    third_party.finish()
    assert isinstance(other.outcome(), Lease)


# -- waiters that leave ---------------------------------------------------------------------


def test_a_timed_out_request_leaves_the_queue(
    locks: CustomerLocks, requests: list[Request]
) -> None:
    holder = _held_elsewhere(locks, requests, "/a/x")
    impatient = _start(requests, Request(locks, "/a", timeout=0.5, name="impatient"))
    _queued(locks, 1)
    error = impatient.outcome()
    assert isinstance(error, LockTimeout)
    assert [info.path for info in error.held_by] == ["/a/x"]
    _left_queue(locks)
    lease = locks.try_lock_paths("/a/y")  # nothing queued keeps it out
    assert lease is not None
    lease.release()
    holder.finish()


def test_a_dead_waiter_stops_blocking_within_its_expiry(
    database_url: str, locks: CustomerLocks
) -> None:
    holder = locks.lock_paths("/Shared/a/x")
    context = multiprocessing.get_context("spawn")
    events: Any = context.Queue()
    process = context.Process(
        target=queue_worker.request,
        args=(database_url, locks.customer_id, "/Shared/a", "doomed", events),
        daemon=True,
    )
    process.start()
    try:
        (dead,) = _queued(locks, 1)
        assert dead.owner.pid == process.pid
        os.kill(dead.owner.pid, signal.SIGKILL)
        process.join(HANG)
    finally:
        if process.is_alive():
            process.kill()
    holder.release()

    # /Shared/a/y conflicts only with the dead request; its row lapses unrefreshed.
    lease = locks.lock_paths("/Shared/a/y", timeout=SETTINGS.waiter_ttl + SETTINGS.recheck + HANG)
    lease.release()
    assert _waiters(locks) == []


def test_a_waiter_whose_row_was_deleted_queues_again(
    locks: CustomerLocks, raw_engine: Engine, requests: list[Request]
) -> None:
    holder = locks.lock_paths("/a")
    waiting = _start(requests, Request(locks, "/a", name="waiting"))
    (first,) = _queued(locks, 1)
    with raw_engine.begin() as connection:
        connection.execute(
            text("DELETE FROM path_lock_waiters WHERE ticket = :t"), {"t": first.ticket}
        )
    # Its next refresh finds the row gone: it queues again, with a new ticket.
    again = _until(
        lambda: [w for w in _waiters(locks) if w.lease_id == first.lease_id],
        "the request queued again",
        seconds=SETTINGS.waiter_refresh + SETTINGS.recheck + HANG,
    )
    assert again[0].ticket > first.ticket
    holder.release()
    assert isinstance(waiting.outcome(), Lease)


def test_a_request_of_many_long_paths_can_queue(
    locks: CustomerLocks, requests: list[Request]
) -> None:
    # About 80 KB of JSON in the queue row: more than a MySQL TEXT holds.
    paths = [f"/big/{n:02d}" + "x" * 3990 for n in range(20)]
    holder = _held_elsewhere(locks, requests, "/big")
    with pytest.raises(LockTimeout) as caught:
        locks.lock_paths(*paths, timeout=0.3)
    assert len(str(caught.value)) < 2000  # long paths are shortened in messages
    holder.finish()
    _left_queue(locks)


# -- the version watch ------------------------------------------------------------------------


def test_a_waiter_watches_with_plain_reads_between_attempts(
    database_url: str, customer_id: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    statements: list[str] = []
    with PathLockManager(database_url, node_id="watch-test") as manager:
        if manager.engine.dialect.name != "mysql":  # statements one by one

            @event.listens_for(manager.engine, "before_cursor_execute")
            def record(*args: Any) -> None:
                statements.append(args[2])

            if manager.engine.dialect.name == "postgresql":
                # And batches, sent past SQLAlchemy's events: each statement
                # prepared, its writes wrapped to reply with their row counts.
                from pathlock.dialects import _pg_batches, _psycopg  # noqa: PLC0415 - an extra

                send_batch = _psycopg.BoundedConnection.send_batch

                def statement(part: str) -> str:
                    name = re.match(r"EXECUTE (\w+)", part)
                    if name is not None:
                        part = _pg_batches.PREPARED[name[1]].split(" AS ", 1)[1]
                    return re.sub(r"^WITH t(\(k\))? AS \(", "", part)

                def batched(self: Any, sql: str, parameters: Any) -> None:
                    statements.extend(map(statement, sql.split(";\n")))
                    send_batch(self, sql, parameters)

                monkeypatch.setattr(_psycopg.BoundedConnection, "send_batch", batched)

        else:
            # Several statements travel in one query there, sent past
            # SQLAlchemy's events: count what the driver sends.
            send = pymysql.connections.Connection._execute_command

            def counted(
                self: pymysql.connections.Connection, command: int, sql: str | bytes
            ) -> None:
                text = sql.decode() if isinstance(sql, bytes) else sql
                statements.extend(text.split(";\n"))
                send(self, command, sql)

            monkeypatch.setattr(pymysql.connections.Connection, "_execute_command", counted)

        locks = manager.for_customer(customer_id)
        holder = Request(locks, "/a", name="holder")
        holder.start()
        assert isinstance(holder.outcome(), Lease)
        statements.clear()
        seconds = 2.0
        with pytest.raises(LockTimeout):
            locks.lock_paths("/a/b", timeout=seconds)
        holder.finish()

    # The writes, not the sentinel's lock and conditional write of a grant in
    # one round trip (MySQL, MariaDB), which goes first in every attempt.
    sentinel_writes = [
        s
        for s in statements
        if s.lstrip().upper().startswith("UPDATE CUSTOMER")
        and "row_count()" not in s
        and "pathlock.changed', true)" not in s
        and "SET version=customer_locks.version WHERE" not in s
        # A count going with the rows a write inserted or deleted.
        and "SET lock_rows=" not in s
        and "SET waiter_rows=" not in s
    ]
    # Plain, or as the first element of the one JSON column of a waiter's
    # check where releases hand over.
    version_reads = [
        s
        for s in statements
        if s.lstrip()
        .upper()
        .startswith(
            (
                "SELECT CUSTOMER_LOCKS.VERSION",
                "SELECT JSON_ARRAY(CUSTOMER_LOCKS.VERSION",
                "SELECT CAST(JSON_BUILD_ARRAY(CUSTOMER_LOCKS.VERSION",
            )
        )
    ]
    # Attempts: the first, one per recheck, the last at the deadline, leaving
    # the queue; polling at the policy's 10 ms would have made about 200.
    assert len(sentinel_writes) <= seconds / SETTINGS.recheck + 4
    assert len(version_reads) >= 10


def test_where_releases_do_not_hand_over_waiters_behind_others_judge_once_they_left(
    database_url: str, customer_id: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On SQLite, and through engines passed in (one statement per query, like
    a Galera node's COMMITs), releases hand nothing over: each request ahead
    grants itself the path and releases it, moving the version twice. A
    request third in line sleeps through those moves while any of the
    requests ahead is still queued (its checks count them) and judges its
    place, a read of every blocker and the queue, once they have all left,
    unless its check finds one of them holding the path (then it knows it is
    next: no judging at all); it used to judge at every move. No recheck
    falls due meanwhile."""
    settings = Settings(recheck=HANG)
    engines = [
        database_url if database_url.startswith("sqlite") else create_engine(database_url)
        for _ in range(4)
    ]
    managers = [PathLockManager(engine, settings=settings, heartbeat=False) for engine in engines]
    judged: list[float] = []
    third = managers[3]._store.queue
    could_grant = third.could_grant

    def counted(*args: Any, **kwargs: Any) -> Any:
        judged.append(time.monotonic())
        return could_grant(*args, **kwargs)

    monkeypatch.setattr(third, "could_grant", counted)
    try:
        holding, *waiting = (manager.for_customer(customer_id) for manager in managers)
        lease = holding.lock_paths("/a")
        order: list[str] = []
        threads = []
        for number, locks in enumerate(waiting, start=1):
            request = Request(locks, "/a", granted=order, name=str(number), hold=False)
            request.start()
            threads.append(request)
            _queued(holding, number)
        lease.release()
        for request in threads:
            assert isinstance(request.outcome(), Lease)
            request.finish()
        assert order == ["1", "2", "3"]
        assert len(judged) <= 1, judged
    finally:
        for manager in managers:
            manager.close()
        for engine in engines:
            if isinstance(engine, Engine):
                engine.dispose()


def _queued_paths(raw_engine: Engine, customer_id: int) -> list[tuple[str, str]]:
    with raw_engine.connect() as connection:
        rows = connection.execute(
            text(
                "SELECT path, mode FROM path_lock_waiter_paths WHERE customer_id = :c"
                " ORDER BY ticket, path"
            ),
            {"c": customer_id},
        ).all()
        connection.rollback()
    return [(str(path), str(mode)) for path, mode in rows]


def test_a_request_behind_a_crowd_reads_the_nearest_in_its_way_only(
    locks: CustomerLocks, requests: list[Request], raw_engine: Engine
) -> None:
    """An attempt asks the database for the older requests in its way (the
    oldest few, through an index), not for the whole queue: it used to read
    and decode every queued request of the customer, so a burst of many
    waiters cost the square of their number. Requests queued in another
    folder are not in the way, and do not delay a request beside them."""
    holder = _held_elsewhere(locks, requests, "/crowd", "/other")
    count = MAX_AHEAD + 4
    for number in range(count):
        _start(requests, Request(locks, f"/crowd/f{number}", name=f"crowd-{number}"))
        _queued(locks, number + 1)  # one at a time: their order is known
    _start(requests, Request(locks, "/other/x", name="elsewhere"))
    crowd = _queued(locks, count + 1)[:count]
    # Each queued request's paths have rows of their own.
    assert _queued_paths(raw_engine, locks.customer_id) == [
        *((f"/crowd/f{number}", "exclusive") for number in range(count)),
        ("/other/x", "exclusive"),
    ]
    late = _start(requests, Request(locks, "/crowd", timeout=0.5, name="late"))
    error = late.outcome()
    assert isinstance(error, LockTimeout)
    # Those just ahead of it, as many as one read returns, oldest first.
    assert [info.ticket for info in error.queued_behind] == [
        info.ticket for info in crowd[-MAX_AHEAD:]
    ]
    # A request beside the crowd is granted though the queue is not empty.
    beside = locks.try_lock_paths("/beside")
    assert beside is not None
    beside.release()
    late.finish()
    holder.finish()
    for request in requests[1:-1]:  # the crowd and the one elsewhere
        assert isinstance(request.outcome(), Lease)
        request.finish()
    _left_queue(locks)
    # The rows of requests that left the queue went with them.
    assert _queued_paths(raw_engine, locks.customer_id) == []
