"""How many round trips an operation costs on MySQL and MariaDB: the commands
PyMySQL sends, counted where it sends them."""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pymysql.connections
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import DBAPIError

from pathlock import DatabaseTimeout, LockTimeout, Owner, PathLockManager, Settings
from pathlock import _batch as batch
from pathlock import _deadlines as deadlines
from pathlock._aio import watch_commits
from pathlock._core.records import GrantRequest
from pathlock.paths import normalize_request
from tests.integration.commit_faults import CommitFaults


@contextmanager
def sent(monkeypatch: pytest.MonkeyPatch, *, this_thread: bool = False) -> Iterator[list[str]]:
    """The SQL of every command sent meanwhile (``this_thread``: by the
    calling thread only), one entry per round trip."""
    commands: list[str] = []
    send = pymysql.connections.Connection._execute_command
    caller = threading.current_thread()

    def counted(self: pymysql.connections.Connection, command: int, sql: str | bytes) -> None:
        if not this_thread or threading.current_thread() is caller:
            commands.append(sql.decode() if isinstance(sql, bytes) else sql)
        send(self, command, sql)

    with monkeypatch.context() as patch:
        patch.setattr(pymysql.connections.Connection, "_execute_command", counted)
        yield commands


def test_a_release_is_one_round_trip_on_the_engines_pathlock_creates(
    mariadb_url: str, customer_id: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    with PathLockManager(mariadb_url, heartbeat=False) as manager:
        locks = manager.for_customer(customer_id)
        lease = locks.lock_paths("/a/b", shared=["/c"])
        with sent(monkeypatch) as commands:
            lease.release()
        assert len(commands) == 1, commands
        assert commands[0].rstrip().endswith("COMMIT")
        assert locks.list_locks() == []
        # The connection's next transaction is a new one: nothing was left open.
        again = locks.lock_paths("/a/b")
        assert again.fencing_token > lease.fencing_token
        again.release()
        assert locks.list_locks() == []


def test_an_engine_passed_in_sends_the_commit_on_its_own(
    mariadb_url: str, customer_id: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = create_engine(mariadb_url)
    try:
        with PathLockManager(engine, heartbeat=False) as manager:
            locks = manager.for_customer(customer_id)
            lease = locks.lock_paths("/a")
            with sent(monkeypatch) as commands:
                lease.release()
            # Its connections take one statement per query: the sentinel
            # write, the DELETE, the count and the COMMIT go one by one.
            # Around them, SQLAlchemy sets the connection's isolation level
            # to pathlock's at checkout and back to the engine's at return
            # (9 in all).
            own = [command.split()[0] for command in commands[2:6]]
            assert own == ["UPDATE", "DELETE", "UPDATE", "COMMIT"], commands
            assert len(commands) == 9, commands
            assert locks.list_locks() == []
    finally:
        engine.dispose()


def test_a_release_whose_commit_reply_is_lost_is_released(
    mariadb_url: str, customer_id: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The release's one round trip carries its COMMIT; the connection is cut
    before the reply. The release cannot tell whether it landed: it tries
    again, finds the rows gone, and counts the lease as released."""
    with PathLockManager(mariadb_url, heartbeat=False) as manager:
        locks = manager.for_customer(customer_id)
        lease = locks.lock_paths("/a")
        CommitFaults(monkeypatch).lose_reply()
        with sent(monkeypatch) as commands:
            lease.release()
        assert len(commands) >= 2, commands  # the batch, then the retry
        assert lease.released
        assert not lease.lost
        assert locks.list_locks() == []
        other = locks.try_lock_paths("/a")
        assert other is not None
        other.release()


@pytest.mark.parametrize("listened", [False, True], ids=["", "asyncio-listeners"])
@pytest.mark.parametrize(
    "outcome", ["reply lost", "commit refused", "statement refused", "committed"]
)
def test_a_batch_that_carries_a_commit_says_when_its_reply_is_missing(
    mariadb_url: str, monkeypatch: pytest.MonkeyPatch, outcome: str, listened: bool
) -> None:
    """While a batch's COMMIT is on its way, the attempt's limit counts it
    unanswered: after a lost reply, or an error answered to the COMMIT
    itself (a Galera node may answer 1213 to a COMMIT that lands all the
    same), the attempt is in doubt; after a statement's error (the server
    runs nothing after it, the COMMIT included) or the COMMIT's own reply, it
    is not. ``listened``: with the listeners of begin and commit that the
    asyncio API puts on its engines, which the batch goes without (the begin
    after an error, which they hear, must not clear the mark)."""
    steps: list[tuple[Any, dict[str, Any]]] = [(text("DO 1"), {})]
    if outcome == "statement refused":
        steps.append((text("SELECT * FROM no_such_table"), {}))
    with (
        PathLockManager(mariadb_url, heartbeat=False) as manager,
        manager.engine.connect() as connection,
    ):
        assert batch.commits_in_batches(connection)
        if listened:
            watch_commits(manager.engine)

        if outcome == "reply lost":
            CommitFaults(monkeypatch).lose_reply()
        elif outcome == "commit refused":
            CommitFaults(monkeypatch).refuse(1213)

        def attempt(limit: deadlines.Limit) -> bool:
            try:
                batch.run(connection, steps, commit=True)
            except DBAPIError:
                assert outcome != "committed"
            else:
                assert outcome == "committed"
                assert not connection.in_transaction()
            return limit.commit_unanswered

        unanswered = deadlines.within(time.monotonic() + 10, attempt)
    assert unanswered == (outcome in ("reply lost", "commit refused"))


def _statements(command: str) -> list[str]:
    return [part.split()[0].upper() for part in command.split(";\n")]


def test_an_uncontended_acquire_and_release_are_two_round_trips(
    mariadb_url: str, customer_id: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each with its COMMIT, and neither searches: the customer has no lock
    and no queued request (its sentinel row counts them), so the acquire
    writes the sentinel row only if its counts are zero, and inserts only if
    it did; the release deletes, and in one statement counts what is left
    and reads the version only if requests may be queued (none: nothing to
    hand over, and the version does not move)."""
    with PathLockManager(mariadb_url, heartbeat=False) as manager:
        locks = manager.for_customer(customer_id)
        locks.lock_paths("/warm").release()  # the sentinel row exists
        with sent(monkeypatch) as commands:
            lease = locks.lock_paths("/a/b", shared=["/c"])
            lease.release()
        assert [_statements(command) for command in commands] == [
            ["UPDATE", "INSERT", "COMMIT"],
            ["DELETE", "UPDATE", "COMMIT"],
        ], commands
        assert lease.fencing_token == _version(manager, customer_id)
        assert "lock_rows = 0" in commands[0]
        assert "waiter_rows = 0" in commands[0]
        assert "EXISTS" not in commands[0]


def test_the_grant_after_the_last_release_needs_no_search_again(
    mariadb_url: str, customer_id: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A grant beside another lock of the customer searches (its attempt
    without searches was refused: the customer holds a lock); the release
    that leaves the customer nothing says so in its reply, and the next
    grant goes without searches again, while a release that leaves a lock
    does not."""
    with PathLockManager(mariadb_url, heartbeat=False) as manager:
        locks = manager.for_customer(customer_id)
        first = locks.lock_paths("/a")
        second = locks.lock_paths("/b")  # beside /a: searches from now on
        first.release()  # /b is left
        with sent(monkeypatch) as commands:
            locks.lock_paths("/c").release()
        assert "EXISTS" in commands[0], commands
        second.release()  # nothing is left
        with sent(monkeypatch) as commands:
            locks.lock_paths("/d").release()
        assert _statements(commands[0]) == ["UPDATE", "INSERT", "COMMIT"], commands
        assert "EXISTS" not in commands[0], commands


def test_a_denied_attempt_commits_no_write(
    mariadb_url: str, customer_id: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A try-lock that is refused: its attempt without searches (the customer
    has a lock) and its one-round-trip attempt insert nothing and so write no
    sentinel, and the attempt that says who is in the way rolls its sentinel
    write back. The version (the next fencing token) does not move."""
    with (
        PathLockManager(mariadb_url, heartbeat=False) as holder,
        PathLockManager(mariadb_url, heartbeat=False) as other,
    ):
        lease = holder.for_customer(customer_id).lock_paths("/a")
        version = _version(holder, customer_id)
        with sent(monkeypatch) as commands:
            assert other.for_customer(customer_id).try_lock_paths("/a/b") is None
        assert _statements(commands[0]) == ["UPDATE", "INSERT", "COMMIT"], commands
        assert _statements(commands[1]) == ["SET", "UPDATE", "INSERT", "UPDATE", "COMMIT"], commands
        assert _version(holder, customer_id) == version
        lease.release()


def test_a_grant_that_waited_past_its_time_for_the_sentinel_lands_nothing(
    mariadb_url: str, customer_id: int
) -> None:
    """The sentinel row is held (by a client frozen in its transaction, say)
    while a grant in one round trip waits for it, and the grant's caller
    stops waiting. Once the row is free the server runs the rest of the
    query, its COMMIT included: the grant, begun after the time its caller
    waited, inserts nothing."""
    with PathLockManager(mariadb_url, heartbeat=False) as manager:
        locks = manager.for_customer(customer_id)
        locks.lock_paths("/warm").release()  # the sentinel row exists
        version = _version(manager, customer_id)
        request = GrantRequest(
            customer_id,
            secrets.token_hex(16),
            normalize_request(["/c"], []),
            Owner("late", 1, "t"),
            "",
            30.0,
        )
        with manager.engine.connect() as holder:
            holder.execute(
                text("UPDATE customer_locks SET version = version WHERE customer_id = :c"),
                {"c": customer_id},
            )
            started = time.monotonic()
            with pytest.raises(DatabaseTimeout):
                manager._store.grants.try_grant(
                    request, None, queue=False, patience=started + 0.5, deadline=started + 0.5
                )
            holder.commit()  # the row is free: the server goes on with the query
        time.sleep(0.5)
        assert locks.list_locks() == []
        assert _version(manager, customer_id) == version


def _version(manager: PathLockManager, customer_id: int) -> int:
    with manager.engine.connect() as connection:
        return int(
            connection.execute(
                text("SELECT version FROM customer_locks WHERE customer_id = :c"),
                {"c": customer_id},
            ).scalar_one()
        )


def test_a_denied_request_is_queued_in_three_round_trips(
    mariadb_url: str, customer_id: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The grant without searches (denied: the customer has a lock; a
    manager tries it on a customer only when it was not refused it
    lately); the grant in one round trip (denied: nothing written); then the
    grant again with, should it be denied, the queue row and the reads that
    say who is in the way (live locks, the queue, the owner's own locks,
    rows of its own lease that a release handed to it), with its COMMIT: one
    round trip while the request holds the customer's sentinel row, which
    every other grant and release of the customer waits for. It used to be
    two (the grant and the reads, then the queue row and the COMMIT), the
    row held while the client judged the reads."""
    with (
        PathLockManager(mariadb_url, heartbeat=False) as holder,
        PathLockManager(mariadb_url, heartbeat=False) as waiter,
    ):
        lease = holder.for_customer(customer_id).lock_paths("/a")
        with sent(monkeypatch) as commands, pytest.raises(LockTimeout):
            waiter.for_customer(customer_id).lock_paths("/a/b", timeout=0.2)
        assert _statements(commands[0]) == ["UPDATE", "INSERT", "COMMIT"], commands[0]
        assert _statements(commands[1]) == ["SET", "UPDATE", "INSERT", "UPDATE", "COMMIT"], (
            commands[1]
        )
        # The sentinel row locked, the grant, its count (none); the queue
        # row, its count, its paths' rows (revision 0007); the reads.
        queued = ["SET", "UPDATE", "INSERT", "UPDATE", "INSERT", "UPDATE", "INSERT"]
        assert _statements(commands[2]) == [*queued, *["SELECT"] * 5, "COMMIT"], commands[2]
        steps = commands[2].split(";\n")
        assert "path_lock_waiters" in steps[4]
        assert "waiter_rows" in steps[5]
        assert "path_lock_waiter_paths" in steps[6]
        # Queued once: what follows (the checks, the last attempt when the
        # time is up, leaving the queue) writes no queue row.
        assert all("INTO path_lock_waiters" not in command for command in commands[3:])
        lease.release()


def test_a_release_that_finds_a_queue_reads_its_head_in_one_round_trip(
    mariadb_url: str, customer_id: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A release by a manager that has not seen the customer's queue deletes
    and counts its rows in one round trip, which says that requests are
    queued; it reads the head of the queue and rolls back in one more (it
    took two: the read, then the ROLLBACK alone), then hands the paths over
    in a transaction of its own."""
    with (
        PathLockManager(mariadb_url, heartbeat=False) as holder,
        PathLockManager(mariadb_url, heartbeat=False) as waiter,
    ):
        lease = holder.for_customer(customer_id).lock_paths("/a")
        granted = threading.Event()

        def wait() -> None:
            waiter.for_customer(customer_id).lock_paths("/a", timeout=10).release()
            granted.set()

        thread = threading.Thread(target=wait)
        thread.start()
        deadline = time.monotonic() + 10
        while not holder.list_waiters(customer_id):
            assert time.monotonic() < deadline, "not queued in time"
            time.sleep(0.01)
        with sent(monkeypatch, this_thread=True) as commands:
            lease.release()
        thread.join()
        assert granted.is_set()
    assert [_statements(command) for command in commands] == [
        ["DELETE", "UPDATE", "COMMIT"],
        ["SELECT", "ROLLBACK"],
        ["SET", "UPDATE", "INSERT", "UPDATE", "DELETE", "UPDATE", "UPDATE", "COMMIT"],
    ], commands


def test_a_request_beside_the_queue_of_a_customer_is_granted_in_one_round_trip(
    mariadb_url: str, customer_id: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request that conflicts with nothing queued is granted in one round
    trip, its COMMIT included, however many requests are queued: the grant
    asks whether an older request in its way is queued (revision 0007). It
    used to require an empty queue: three round trips, and the whole queue
    read. A manager that has just seen the customer's queue sends, in that
    round trip, the queue row and the reads that say who is in the way too,
    should it be refused (then nothing is granted and it is queued)."""
    with (
        PathLockManager(mariadb_url, heartbeat=False) as holder,
        PathLockManager(mariadb_url, heartbeat=False) as other,
    ):
        lease = holder.for_customer(customer_id).lock_paths("/a")
        locks = other.for_customer(customer_id)
        outcome: list[object] = []

        def wait() -> None:
            try:
                locks.lock_paths("/a", timeout=10).release()
                outcome.append("granted")
            except Exception as error:  # noqa: BLE001 - the test looks at it
                outcome.append(error)

        waiting = threading.Thread(target=wait)
        waiting.start()
        deadline = time.monotonic() + 10
        while not holder.list_waiters(customer_id) and time.monotonic() < deadline:
            time.sleep(0.01)
        # Connections enough in the pool for both threads: none is opened
        # (and set up) during the count.
        with other.engine.connect(), other.engine.connect(), other.engine.connect():
            pass
        # The waiting thread checks for its paths meanwhile: not counted.
        with sent(monkeypatch, this_thread=True) as commands:
            sibling = locks.lock_paths("/b")
        sibling.release()
        lease.release()
        waiting.join()
    # Within half a second of seeing the queue, the queue row and the reads
    # travel with the grant (unused: it was granted); afterwards, the grant
    # alone.
    reads = ["SELECT"] * 5
    expected = (
        ["SET", "UPDATE", "INSERT", "UPDATE", "INSERT", "UPDATE", "INSERT", *reads, "COMMIT"],
        ["SET", "UPDATE", "INSERT", "UPDATE", "COMMIT"],
    )
    assert len(commands) == 1, commands
    assert _statements(commands[0]) in expected, commands
    assert outcome == ["granted"]


def test_a_waiters_checks_are_one_round_trip_each(
    mariadb_url: str, customer_id: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While it waits, a request reads the customer's version (and looks for
    paths handed to it), and judges its place once the request ahead of it
    has left the queue: each read ends with its ROLLBACK in the same round
    trip. A release hands the path to the first in line in one round trip
    after its own; each takes it up in one more. A lease that was handed the
    path knows who was next in line then, and its release hands the path on
    in its own round trip."""
    by_thread: dict[str, list[str]] = {"first": [], "second": []}
    send = pymysql.connections.Connection._execute_command

    def counted(self: pymysql.connections.Connection, command: int, sql: str | bytes) -> None:
        mine = by_thread.get(threading.current_thread().name)
        if mine is not None:
            mine.append(sql.decode() if isinstance(sql, bytes) else sql)
        send(self, command, sql)

    monkeypatch.setattr(pymysql.connections.Connection, "_execute_command", counted)
    with (
        PathLockManager(mariadb_url, heartbeat=False) as holder,
        PathLockManager(mariadb_url, heartbeat=False) as first,
        PathLockManager(mariadb_url, heartbeat=False) as second,
    ):
        holding = holder.for_customer(customer_id)
        lease = holding.lock_paths("/a")
        # A sibling's release concerns neither waiter: it hands nothing over
        # and does not move the version.
        sibling = holding.lock_paths("/b")
        waiting = []
        for name, manager in (("first", first), ("second", second)):

            def wait(manager: PathLockManager = manager) -> None:
                manager.for_customer(customer_id).lock_paths("/a", timeout=10).release()

            waiting.append(threading.Thread(target=wait, name=name))
            waiting[-1].start()
            time.sleep(0.2)
        version = _version(holder, customer_id)
        sibling.release()
        assert _version(holder, customer_id) == version
        time.sleep(0.3)
        lease.release()
        for thread in waiting:
            thread.join()

    queued = [
        ["UPDATE", "INSERT", "COMMIT"],  # the grant without searches, denied
        ["SET", "UPDATE", "INSERT", "UPDATE", "COMMIT"],  # the grant in one round trip, denied
        # the grant again (counted), denied: the queue row, counted, its
        # paths, and who is in the way
        [
            *("SET", "UPDATE", "INSERT", "UPDATE"),
            *("INSERT", "UPDATE", "INSERT"),
            *["SELECT"] * 5,
            "COMMIT",
        ],
    ]
    checks = {
        ("SELECT", "ROLLBACK"),  # the version, and anything handed over
        # locks, queued requests in the way, the queue (if the owner holds
        # locks), own locks, lease
        ("SELECT", "SELECT", "SELECT", "SELECT", "SELECT", "ROLLBACK"),
    }
    taken_up = ["UPDATE", "UPDATE", "COMMIT"]  # the sentinel row locked, the rows extended
    # A check that lands between the release and its hand-over finds the path
    # free: the waiter attempts, and its grant in one round trip either takes
    # the path first or is denied, by the rows handed to it, which the attempt
    # after it takes up.
    granted = ["SET", "UPDATE", "INSERT", "UPDATE", "DELETE", "UPDATE", "COMMIT"]
    attempt = ["UPDATE", "INSERT", "UPDATE", "SELECT", "SELECT", "SELECT", "SELECT", "SELECT"]
    raced = {tuple(granted), ("SET", "UPDATE", "INSERT", "UPDATE", "COMMIT"), tuple(attempt)}
    # Nobody queued: the rows deleted and counted, the version not read; or,
    # for a lease that was handed its paths when nobody was next in line,
    # the queue read in the release's round trip.
    released = (
        ["DELETE", "UPDATE", "UPDATE", "COMMIT"],
        ["UPDATE", "DELETE", "UPDATE", "SELECT", "COMMIT"],
    )
    # The holder saw the queue (its sibling's release read it): it reads the
    # queue and hands over in one transaction, in two round trips.
    read_and_handed = [
        ["UPDATE", "DELETE", "UPDATE", "SELECT"],
        ["SET", "INSERT", "UPDATE", "DELETE", "UPDATE", "UPDATE", "COMMIT"],
    ]
    handed_on = [
        *("SET", "UPDATE", "DELETE", "UPDATE"),  # the release, counted
        *("INSERT", "UPDATE", "DELETE", "UPDATE"),  # the grant, its queue row gone, counted
        *("UPDATE", "COMMIT"),
    ]
    first_sent = [_statements(command) for command in by_thread["first"]]
    assert first_sent[:3] == queued, first_sent
    if first_sent[-2] == taken_up:
        # Its check found the path handed to it, and who is next: the second.
        assert set(map(tuple, first_sent[3:-2])) <= checks | raced, first_sent
        assert first_sent[-1] == handed_on, first_sent
    else:
        # Granted by an attempt of its own (or its attempt took up the rows
        # handed to it): its release reads the queue, which it saw.
        assert set(map(tuple, first_sent[3:-3])) <= checks | raced, first_sent
        assert first_sent[-3] in (granted, ["UPDATE", "COMMIT"]), first_sent
        assert first_sent[-2:] == read_and_handed, first_sent
    second_sent = [_statements(command) for command in by_thread["second"]]
    assert second_sent[:3] == queued, second_sent
    assert set(map(tuple, second_sent[3:-2])) <= checks | raced, second_sent
    assert ("SELECT", "ROLLBACK") in map(tuple, second_sent[3:-2]), second_sent
    # The last in line: nobody to hand over to.
    assert second_sent[-2] in (taken_up, granted, ["UPDATE", "COMMIT"]), second_sent
    assert second_sent[-1] in released, second_sent


def test_the_waiters_of_one_process_keep_their_places_in_one_transaction(
    mariadb_url: str, customer_id: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each waiting request kept its queue row alive on its own, a durable
    commit every third of a waiter ttl each: with hundreds of threads
    waiting, more commits than the grants they waited for. The requests of
    one process and customer are now kept alive together, and a request
    whose row such a refresh kept alive moments ago sends nothing."""
    settings = Settings(waiter_ttl=3.0)  # a refresh every second
    waiting = 8
    with PathLockManager(mariadb_url, settings=settings, heartbeat=False) as manager:
        locks = manager.for_customer(customer_id)
        lease = locks.lock_paths("/a")
        granted: list[str] = []

        def wait(number: int) -> None:
            locks.lock_paths(f"/a/{number}", timeout=30, owner=f"w{number}").release()
            granted.append(f"w{number}")

        threads = [threading.Thread(target=wait, args=(n,)) for n in range(waiting)]
        with sent(monkeypatch) as commands:
            for thread in threads:
                thread.start()
            deadline = time.monotonic() + 10
            while len(manager.list_waiters(customer_id)) < waiting:
                assert time.monotonic() < deadline, "not queued in time"
                time.sleep(0.01)
            time.sleep(3.5)  # three refresh intervals and more
            refreshes = [
                command
                for command in commands
                if command.startswith("UPDATE path_lock_waiters SET expires_at")
            ]
            queued = manager.list_waiters(customer_id)
        lease.release()
        for thread in threads:
            thread.join(30)
    # Every request kept its place (none queued again: same tickets, alive).
    assert len(queued) == waiting
    assert sorted(granted) == sorted(f"w{n}" for n in range(waiting))
    # Refreshes of the waiting requests together, not one each: about one
    # per refresh interval instead of one per request and interval. (Each
    # statement has two commas of its own; one more per ticket after the
    # first. Requests queued more than half an interval apart on a loaded
    # machine are refreshed in two groups: at least half of them at once.)
    assert refreshes
    assert max(refresh.count(",") for refresh in refreshes) >= 2 + waiting // 2 - 1, refreshes
    assert len(refreshes) < waiting * 2, len(refreshes)
