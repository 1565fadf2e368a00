"""A release hands its paths to the first request in line (MariaDB: where a
batch carries its COMMIT).

The release's own round trip reads the head of the queue; if that request
waited for the released paths, a second round trip grants them to it, for a
waiter's ttl, and the waiter takes them up for its own ttl when it notices.
These tests attack what that adds: a waiter that dies (or stalls) after the
hand-over, a waiter that gives up as it happens, a hand-over that comes too
late, a lost COMMIT reply, and requests queued by an older pathlock.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import text

from pathlock import Lease, Owner, PathLockManager, Settings
from pathlock import _handing_over as handing_over
from pathlock._core.records import Blocked, Deadlocked, Granted, GrantRequest
from pathlock._handing_over import HandOver, QueueHead
from pathlock._statements.queue import HAND_OVER_WAITERS
from pathlock._store import Store
from pathlock.paths import normalize_request
from pathlock.types import PathMode
from tests.integration.commit_faults import CommitFaults
from tests.integration.test_round_trips import _statements, _version, sent

# Short, so the tests that wait for handed paths to lapse are quick.
WAITER_TTL = 2.0
SETTINGS = Settings(waiter_ttl=WAITER_TTL)


def _rows(manager: PathLockManager, customer_id: int) -> list[Any]:
    """The customer's lock rows, with their seconds left by the database's clock."""
    with manager.engine.connect() as connection:
        return list(
            connection.execute(
                text(
                    "SELECT lease_id, path, fencing_token, owner_key, reason,"
                    " TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) / 1e6 AS left_s"
                    " FROM path_locks WHERE customer_id = :c ORDER BY id"
                ),
                {"c": customer_id},
            )
        )


def _calls(
    target: object, name: str, monkeypatch: pytest.MonkeyPatch | None = None
) -> list[object]:
    """The calls of ``target``'s function ``name`` from now on (it still runs;
    patched by ``monkeypatch`` where the target outlives the test)."""
    calls: list[object] = []
    method = getattr(target, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return method(*args, **kwargs)

    if monkeypatch is None:
        setattr(target, name, counted)
    else:
        monkeypatch.setattr(target, name, counted)
    return calls


def _wait_until(condition: Any, seconds: float = 10.0) -> None:
    ends = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > ends:
            raise AssertionError("timed out")
        time.sleep(0.01)


# Whether the releasing manager saw the customer's queue moments ago: then its
# release hands its paths over in its own transaction, else in one after it.
RELEASES = pytest.mark.parametrize("seen_queue", [True, False], ids=["seen-queue", "queue-unseen"])


def _release_path(manager: PathLockManager, customer_id: int, seen_queue: bool) -> None:
    """Make ``manager``'s next release of the customer read the head of the
    queue first and hand over in the release's own round trip
    (``seen_queue``), as after its own request was queued or its release read
    a queue, or hand over in a transaction of its own after it."""
    store: Store = manager._store
    if seen_queue:
        store.hints.seen_queued(customer_id)
    else:
        store.hints._queued.pop(customer_id, None)


def _queued(manager: PathLockManager, customer_id: int, count: int, seconds: float = 10.0) -> None:
    """Wait until ``count`` requests of the customer are queued."""
    _wait_until(lambda: len(manager.list_waiters(customer_id)) == count, seconds)


def _as_if_queued_by_an_older_pathlock(manager: PathLockManager, customer_id: int) -> None:
    """The customer's queue rows without ``hand_over_us``, as a pathlock
    older than revision 0006 writes them: releases hand them nothing and
    move the version instead."""
    with manager.engine.begin() as connection:
        connection.execute(
            text("UPDATE path_lock_waiters SET hand_over_us = NULL WHERE customer_id = :c"),
            {"c": customer_id},
        )


def _queue(
    store: Store, customer_id: int, paths: tuple[PathMode, ...], owner: str = "queued"
) -> tuple[GrantRequest, int]:
    """A request of ``paths`` that an attempt through ``store`` queued (something
    of another ``owner`` must be in its way), and its ticket."""
    request = GrantRequest(
        customer_id,
        secrets.token_hex(16),
        paths,
        Owner(owner, 1, "t", f"{owner}.t1"),
        "",
        30.0,
    )
    blocked = store.grants.try_grant(request, None, queue=True, patience=time.monotonic() + 5)
    assert isinstance(blocked, Blocked)
    assert blocked.ticket is not None
    return request, blocked.ticket


@contextmanager
def _waiting(
    manager: PathLockManager, customer_id: int, path: str, **options: Any
) -> Iterator[dict[str, Any]]:
    """A thread that requests ``path`` and keeps what came of it."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["lease"] = manager.for_customer(customer_id).lock_paths(path, **options)
        except BaseException as error:  # noqa: BLE001 - the test looks at it
            outcome["error"] = error

    thread = threading.Thread(target=run)
    thread.start()
    try:
        yield outcome
    finally:
        thread.join(30)


def test_a_release_hands_the_path_to_the_first_in_line(mariadb_url: str, customer_id: int) -> None:
    """The waiter gets the rows the release wrote for it (with the fencing
    token of that hand-over), extended to its own ttl, and its queue row is
    gone; a second waiter stays queued."""
    with (
        PathLockManager(mariadb_url, heartbeat=False, settings=SETTINGS) as holder,
        PathLockManager(mariadb_url, heartbeat=False, ttl=60.0) as first,
        PathLockManager(mariadb_url, heartbeat=False, ttl=60.0) as second,
    ):
        lease = holder.for_customer(customer_id).lock_paths("/a")
        attempts = _calls(first._store.grants, "try_grant")
        with _waiting(first, customer_id, "/a/b", timeout=10) as got:
            _queued(holder, customer_id, 1)
            with _waiting(second, customer_id, "/a", timeout=10) as later:
                _queued(holder, customer_id, 2)
                lease.release()
                _wait_until(lambda: "lease" in got or "error" in got)
                handed: Lease = got["lease"]
                # Granted by the release: one attempt (the denied one) only.
                assert len(attempts) == 1
                assert handed.fencing_token == lease.fencing_token + 1
                rows = _rows(holder, customer_id)
                assert [(row.lease_id, row.path) for row in rows] == [(handed.lease_id, "/a/b")]
                assert rows[0].left_s > 50  # taken up for the waiter's own ttl
                assert rows[0].owner_key == handed.owner.key
                queue = holder.list_waiters(customer_id)
                assert [info.paths for info in queue] == [(("/a", "exclusive"),)]
                handed.release()
                _wait_until(lambda: "lease" in later or "error" in later)
                later["lease"].release()
        assert _rows(holder, customer_id) == []


def test_the_first_renewal_takes_handed_paths_up(mariadb_url: str, customer_id: int) -> None:
    """Where the manager renews its leases, the waiter returns as soon as it
    sees the paths handed to it: its lease lasts as long as the handed rows
    (its waiter ttl from the hand-over, shorter than its ttl) until the
    heartbeat's first renewal, a third of the way in, extends them to the
    lease's ttl."""
    term = 4.5  # the waiter ttl: renewed 1.5 s in, room for a slow machine
    with (
        PathLockManager(mariadb_url, heartbeat=False) as holder,
        PathLockManager(mariadb_url, ttl=60.0, settings=Settings(waiter_ttl=term)) as waiter,
    ):
        lease = holder.for_customer(customer_id).lock_paths("/a")
        with _waiting(waiter, customer_id, "/a", timeout=10) as got:
            _queued(holder, customer_id, 1)
            lease.release()
            _wait_until(lambda: "lease" in got or "error" in got)
        handed: Lease = got["lease"]
        assert handed.expires_in <= term
        (row,) = _rows(holder, customer_id)
        assert row.left_s <= term
        _wait_until(lambda: handed.expires_in > 50, 10.0)
        (row,) = _rows(holder, customer_id)
        assert row.left_s > 50
        assert not handed.lost
        handed.release()


def test_a_hand_over_to_a_request_that_left_the_queue_grants_nothing(
    mariadb_url: str, customer_id: int
) -> None:
    """The release read the queue; before its hand-over, the head of the
    queue was granted some other way and released again (or gave up). The
    hand-over inserts nothing for it: rows of a finished request would block
    its owner's next request, as a request waiting for itself. The version
    moves instead, so whoever waits tries for itself."""
    with PathLockManager(mariadb_url, heartbeat=False) as manager:
        locks = manager.for_customer(customer_id)
        locks.lock_paths("/warm").release()
        lease = locks.lock_paths("/a")
        with _waiting(manager, customer_id, "/a", timeout=0.3, owner="gone"):
            _queued(manager, customer_id, 1)
            (head,) = manager.list_waiters(customer_id)
        # The waiter timed out and left: its queue row is gone.
        assert manager.list_waiters(customer_id) == []
        lease.release()
        version = _version(manager, customer_id)
        store: Store = manager._store
        store.hand_over.hand_over(customer_id, None, QueueHead(version, [head], 2_000_000), None)
        assert _rows(manager, customer_id) == []
        assert _version(manager, customer_id) == version + 1
        again = locks.lock_paths("/a", owner="gone", timeout=1)
        again.release()


def test_a_release_of_a_customer_seen_with_a_queue_reads_it_first_and_hands_over_in_one(
    mariadb_url: str, customer_id: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A manager that saw the customer's queue moments ago reads the head of
    the queue first, locking nothing (a read and its ROLLBACK), then releases
    and hands the paths over in one round trip that locks the sentinel row
    and ends with the COMMIT. Two round trips and one COMMIT, where a release
    and a hand-over of its own take two of each; and the sentinel row, which
    every grant of the customer waits for, is held for one of them."""
    with (
        PathLockManager(mariadb_url, heartbeat=False) as holder,
        PathLockManager(mariadb_url, heartbeat=False) as waiter,
    ):
        lease = holder.for_customer(customer_id).lock_paths("/a")
        with _waiting(waiter, customer_id, "/a", timeout=10) as got:
            _queued(holder, customer_id, 1)
            # The holder's own try-lock sees the queue, as a request of its
            # that queued would.
            assert holder.for_customer(customer_id).try_lock_paths("/a", owner="probe") is None
            with sent(monkeypatch, this_thread=True) as commands:
                lease.release()
            _wait_until(lambda: "lease" in got or "error" in got)
        assert [_statements(command) for command in commands] == [
            ["SELECT", "ROLLBACK"],
            [
                *("SET", "UPDATE", "DELETE", "UPDATE"),  # the sentinel row locked, the release
                *("INSERT", "UPDATE", "DELETE", "UPDATE"),  # the hand-over
                *("UPDATE", "COMMIT"),  # the version moved only if nothing was handed
            ],
        ], commands
        handed: Lease = got["lease"]
        assert handed.fencing_token == lease.fencing_token + 1
        assert [row.lease_id for row in _rows(holder, customer_id)] == [handed.lease_id]
        handed.release()
        assert _rows(holder, customer_id) == []


def test_a_hand_over_the_server_refuses_still_releases(
    mariadb_url: str,
    customer_id: int,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The hand-over in the release's own round trip, after it read the head
    of the queue, fails with an error that no retry helps (here: a statement
    the server refuses, after which it runs nothing of the query): the
    release is made without it, the version moves, a warning says so, and
    the waiter takes the path for itself."""
    refused = [(text("SELECT * FROM pathlock_no_such_table"), {})]

    with (
        PathLockManager(mariadb_url, heartbeat=False) as holder,
        PathLockManager(mariadb_url, heartbeat=False) as waiter,
    ):
        lease = holder.for_customer(customer_id).lock_paths("/a")
        with _waiting(waiter, customer_id, "/a", timeout=10) as got:
            _queued(holder, customer_id, 1)
            _release_path(holder, customer_id, seen_queue=True)
            version = _version(holder, customer_id)
            monkeypatch.setattr(HandOver, "handing_to", lambda *_args: refused)
            lease.release()
            monkeypatch.undo()
            assert lease.released
            _wait_until(lambda: "lease" in got or "error" in got)
        assert "could not hand customer" in caplog.text
        # Granted by its own attempt, after the release moved the version.
        assert got["lease"].fencing_token == version + 2
        assert [row.lease_id for row in _rows(holder, customer_id)] == [got["lease"].lease_id]
        got["lease"].release()


@RELEASES
def test_a_release_that_cannot_hand_over_moves_the_version_it_read(
    mariadb_url: str, customer_id: int, seen_queue: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The head of the queue waited for the released path and for one still
    held: the hand-over grants nothing and moves the version (in a hand-over
    of its own, from the one the release's reply carried), so the waiters
    try for themselves. Whether the release hands over in its own round trip
    after reading the queue (the manager saw the customer's queue moments
    ago) or in a transaction after it."""
    with PathLockManager(mariadb_url, heartbeat=False) as manager:
        locks = manager.for_customer(customer_id)
        for _ in range(3):
            locks.lock_paths("/warm").release()  # a version other than 0
        lease, other = locks.lock_paths("/a"), locks.lock_paths("/b")
        store: Store = manager._store
        request, _ticket = _queue(store, customer_id, normalize_request(["/a", "/b"], []))
        _release_path(manager, customer_id, seen_queue)
        handed = _calls(handing_over, "heir", monkeypatch)
        version = _version(manager, customer_id)
        store.releases.release(customer_id, lease.lease_id, paths=lease.paths)
        ((released, waiters, term_us),) = handed
        assert released == lease.paths
        assert [info.lease_id for info in waiters] == [request.lease_id]
        assert waiters[0].paths == (("/a", "exclusive"), ("/b", "exclusive"))
        assert term_us == round(manager.settings.waiter_ttl * 1_000_000)
        assert [row.lease_id for row in _rows(manager, customer_id)] == [other.lease_id]
        assert _version(manager, customer_id) == version + 1
        other.release()


@RELEASES
def test_a_release_after_the_sentinel_row_was_deleted_by_hand(
    mariadb_url: str, customer_id: int, seen_queue: bool
) -> None:
    """An operator deleted the customer's sentinel row while a lease was held:
    the release still deletes the lease's rows, and makes the row again, so
    that the customer's version is there for waiters and later grants."""
    with PathLockManager(mariadb_url, heartbeat=False) as manager:
        locks = manager.for_customer(customer_id)
        lease = locks.lock_paths("/a")
        with manager.engine.begin() as connection:
            connection.execute(
                text("DELETE FROM customer_locks WHERE customer_id = :c"), {"c": customer_id}
            )
        _release_path(manager, customer_id, seen_queue)
        lease.release()
        assert _rows(manager, customer_id) == []
        assert _version(manager, customer_id) >= 1
        locks.lock_paths("/a", timeout=1).release()


def test_a_request_that_leaves_the_queue_as_it_is_handed_the_paths_leaves_nothing(
    mariadb_url: str, customer_id: int
) -> None:
    """A waiter whose time runs out just as a release hands it the paths:
    leaving the queue deletes those rows too, so nobody waits a waiter's ttl
    for them."""
    with PathLockManager(mariadb_url, heartbeat=False) as manager:
        locks = manager.for_customer(customer_id)
        lease = locks.lock_paths("/a")
        store: Store = manager._store
        request, ticket = _queue(store, customer_id, normalize_request(["/a"], []))
        store.releases.release(customer_id, lease.lease_id, paths=lease.paths)
        assert [row.lease_id for row in _rows(manager, customer_id)] == [request.lease_id]
        store.queue.leave_queue(customer_id, request.lease_id, ticket)
        assert _rows(manager, customer_id) == []
        assert manager.list_waiters(customer_id) == []


def test_requests_queued_by_an_older_pathlock_are_not_handed_paths(
    mariadb_url: str, customer_id: int
) -> None:
    """A queue row without ``hand_over_us`` (written by a pathlock older than
    revision 0006, still running during an upgrade) is left to try for
    itself: the release moves the version instead."""
    with (
        PathLockManager(mariadb_url, heartbeat=False) as holder,
        PathLockManager(mariadb_url, heartbeat=False) as waiter,
    ):
        lease = holder.for_customer(customer_id).lock_paths("/a")
        handed = _calls(waiter._store.queue, "take_up")
        with _waiting(waiter, customer_id, "/a", timeout=10) as got:
            _queued(holder, customer_id, 1)
            _as_if_queued_by_an_older_pathlock(holder, customer_id)
            version = _version(holder, customer_id)
            lease.release()
            _wait_until(lambda: "lease" in got or "error" in got)
        # The release moved the version once, and the waiter's own grant once
        # more (a hand-over would have given it version + 1). Read from its
        # lease: a read of the version after release() may already see the
        # waiter's grant.
        assert got["lease"].fencing_token == version + 2
        got["lease"].release()
        assert handed == []  # it attempted for itself


@RELEASES
def test_a_hand_over_whose_commit_reply_is_lost_reaches_the_waiter(
    mariadb_url: str, customer_id: int, monkeypatch: pytest.MonkeyPatch, seen_queue: bool
) -> None:
    """The hand-over's COMMIT lands and its reply is lost: the release does not
    fail, and the waiter finds the paths handed to it."""
    faults = CommitFaults(monkeypatch)
    grant_head = HandOver._grant_head

    def lossy(self: HandOver, *args: Any, **kwargs: Any) -> None:
        faults.lose_reply()
        grant_head(self, *args, **kwargs)

    with (
        PathLockManager(mariadb_url, heartbeat=False) as holder,
        PathLockManager(mariadb_url, heartbeat=False) as waiter,
    ):
        lease = holder.for_customer(customer_id).lock_paths("/a")
        with _waiting(waiter, customer_id, "/a", timeout=10) as got:
            _queued(holder, customer_id, 1)
            _release_path(holder, customer_id, seen_queue)
            monkeypatch.setattr(HandOver, "_grant_head", lossy)
            lease.release()
            monkeypatch.setattr(HandOver, "_grant_head", grant_head)
            _wait_until(lambda: "lease" in got or "error" in got, 5.0)
        granted: Lease = got["lease"]
        assert lease.released
        assert granted.fencing_token == lease.fencing_token + 1  # the hand-over's
        granted.release()
        assert _rows(holder, customer_id) == []


_STOPPED_WAITER = """
import sys
from pathlock import PathLockManager, Settings
url, customer = sys.argv[1], int(sys.argv[2])
with PathLockManager(url, node_id="doomed", settings=Settings(waiter_ttl={ttl})) as manager:
    lease = manager.for_customer(customer).lock_paths("/a", timeout=60, reason="doomed")
    print("granted", flush=True)
"""


@RELEASES
def test_a_waiter_killed_after_the_hand_over_holds_the_paths_a_waiters_ttl_at_most(
    mariadb_url: str, customer_id: int, seen_queue: bool
) -> None:
    """A waiting process is frozen (SIGSTOP) with its queue row alive; the
    holder releases and hands it the path; it is killed (SIGKILL) without
    ever knowing. Nobody is granted the path while the handed rows live (the
    waiter might have been about to use them), and the next request gets it
    once they lapse: a waiter's ttl after the hand-over, not a lease's."""
    with (
        PathLockManager(mariadb_url, heartbeat=False, settings=SETTINGS) as holder,
        PathLockManager(mariadb_url, heartbeat=False, ttl=60.0) as other,
    ):
        locks = holder.for_customer(customer_id)
        lease = locks.lock_paths("/a")
        doomed = subprocess.Popen(
            [
                sys.executable,
                "-c",
                _STOPPED_WAITER.format(ttl=WAITER_TTL),
                mariadb_url,
                str(customer_id),
            ],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )
        try:
            _queued(holder, customer_id, 1, 60.0)
            os.kill(doomed.pid, signal.SIGSTOP)
            _release_path(holder, customer_id, seen_queue)
            lease.release()
            read_from = time.monotonic()
            handed = _rows(holder, customer_id)
            read_by = time.monotonic()
            assert [(row.path, row.reason) for row in handed] == [("/a", "doomed")]
            assert 0 < handed[0].left_s <= WAITER_TTL
            os.kill(doomed.pid, signal.SIGKILL)
        finally:
            doomed.kill()
            doomed.wait(30)
            assert doomed.stdout is not None
            output = doomed.stdout.read()
            doomed.stdout.close()
        assert output == ""  # it never heard of its grant
        after = other.for_customer(customer_id).lock_paths("/a", timeout=30)
        granted = time.monotonic()
        # Not before the handed rows lapsed (by the database's clock, read
        # between read_from and read_by); soon after (its recheck).
        left = handed[0].left_s
        assert read_from + left - 0.05 <= granted <= read_by + left + 2.0, (granted, handed)
        assert after.fencing_token > handed[0].fencing_token
        after.release()
        # The handed rows lapsed (the reaper deletes them); nothing else is left.
        assert [row.left_s <= 0 for row in _rows(holder, customer_id)] == [True]


@RELEASES
def test_the_head_of_a_queue_of_an_unrelated_path_is_left_alone(
    mariadb_url: str, customer_id: int, seen_queue: bool
) -> None:
    """A release of /b hands nothing to a request waiting for /a, and does
    not move the version: nobody waiting has anything new to try."""
    with PathLockManager(mariadb_url, heartbeat=False) as manager:
        locks = manager.for_customer(customer_id)
        first = locks.lock_paths("/a")
        sibling = locks.lock_paths("/b")
        with _waiting(manager, customer_id, "/a", timeout=10, owner="waiter") as got:
            _queued(manager, customer_id, 1)
            version = _version(manager, customer_id)
            _release_path(manager, customer_id, seen_queue)
            sibling.release()
            assert _version(manager, customer_id) == version
            assert [row.path for row in _rows(manager, customer_id)] == ["/a"]
            first.release()
            _wait_until(lambda: "lease" in got or "error" in got)
        got["lease"].release()


@RELEASES
def test_a_queue_row_written_by_hand_is_handed_nothing(
    mariadb_url: str, customer_id: int, seen_queue: bool
) -> None:
    """A queue row whose paths are not a request pathlock could have made (a
    DBA's INSERT) heads the queue: the release still succeeds, hands it
    nothing, and moves the version for whoever waits."""
    with PathLockManager(mariadb_url, heartbeat=False) as manager:
        locks = manager.for_customer(customer_id)
        lease = locks.lock_paths("/a")
        with manager.engine.begin() as connection:
            connection.execute(
                text(
                    "INSERT INTO path_lock_waiters (customer_id, lease_id, paths, node_id, pid,"
                    " thread, reason, created_at, expires_at, owner_key, hand_over_us)"
                    " VALUES (:c, 'by-hand', :p, 'dba', 1, 't', '', UTC_TIMESTAMP(6),"
                    " TIMESTAMPADD(SECOND, 30, UTC_TIMESTAMP(6)), '', 2000000)"
                ),
                {"c": customer_id, "p": '[["/a/../b", "exclusive"], ["a", "sideways"]]'},
            )
            # Rows written by hand are not counted: the DBA says so.
            connection.execute(
                text("UPDATE customer_locks SET counted_version = NULL WHERE customer_id = :c"),
                {"c": customer_id},
            )
        version = _version(manager, customer_id)
        _release_path(manager, customer_id, seen_queue)
        lease.release()
        assert lease.released
        assert _rows(manager, customer_id) == []
        assert _version(manager, customer_id) == version + 1
        with manager.engine.begin() as connection:
            connection.execute(
                text("DELETE FROM path_lock_waiters WHERE customer_id = :c"), {"c": customer_id}
            )


def test_an_attempt_of_a_request_handed_shared_paths_takes_them_up_once(
    mariadb_url: str, customer_id: int
) -> None:
    """A shared request's own rows do not conflict with it. If it attempts
    on its own after a release handed it the paths (its check came late, or
    it took its missing queue row for one that lapsed), the attempt takes
    them up; it never grants them a second time beside them (a database
    restart in the fault suite found two sets of rows for one lease)."""
    with PathLockManager(mariadb_url, heartbeat=False) as manager:
        locks = manager.for_customer(customer_id)
        lease = locks.lock_paths("/a")
        store: Store = manager._store
        request, _ticket = _queue(store, customer_id, normalize_request([], ["/a/b"]))
        store.releases.release(customer_id, lease.lease_id, paths=lease.paths)
        (handed,) = _rows(manager, customer_id)
        assert handed.lease_id == request.lease_id
        assert handed.left_s <= 5.0
        again = store.grants.try_grant(request, None, queue=True, patience=time.monotonic() + 5)
        assert again == Granted(handed.fencing_token)
        (row,) = _rows(manager, customer_id)
        assert (row.lease_id, row.path, row.fencing_token) == (
            request.lease_id,
            "/a/b",
            handed.fencing_token,
        )
        assert row.left_s > 25  # taken up for its ttl
        assert store.queue.could_grant(request, None).free  # a check says: take them up
        store.releases.release(customer_id, request.lease_id, paths=request.paths)
        assert _rows(manager, customer_id) == []


def test_only_a_requests_first_attempt_skips_the_look_for_its_own_rows(
    mariadb_url: str, customer_id: int
) -> None:
    """The grant of a request's first attempt does not look for rows of its
    own lease (none can exist yet); every later attempt of a queued request
    does, since a release may have handed it rows meanwhile."""
    with (
        PathLockManager(mariadb_url, heartbeat=False) as holder,
        PathLockManager(mariadb_url, heartbeat=False) as waiter,
    ):
        firsts: list[bool] = []
        try_grant = waiter._store.grants.try_grant

        def spied(*args: Any, **kwargs: Any) -> Any:
            firsts.append(kwargs["first"])
            return try_grant(*args, **kwargs)

        waiter._store.grants.try_grant = spied  # type: ignore[method-assign]
        lease = holder.for_customer(customer_id).lock_paths("/a")
        with _waiting(waiter, customer_id, "/a", timeout=10) as got:
            _queued(holder, customer_id, 1)
            # Moves the version without a hand-over: the waiter attempts again.
            _as_if_queued_by_an_older_pathlock(holder, customer_id)
            lease.release()
            _wait_until(lambda: "lease" in got or "error" in got)
        got["lease"].release()
        assert firsts[0] is True
        assert len(firsts) >= 2
        assert not any(firsts[1:])


def _handed_with_one_behind(
    manager: PathLockManager,
    customer_id: int,
    behind: tuple[PathMode, ...] = (("/a", "exclusive"),),
) -> tuple[GrantRequest, GrantRequest, int]:
    """A request of /a handed the path by a release, which its check found,
    with a request of ``behind`` queued after it: both requests, and the
    ticket of the second."""
    locks = manager.for_customer(customer_id)
    store: Store = manager._store
    lease = locks.lock_paths("/a")
    first, _ = _queue(store, customer_id, normalize_request(["/a"], []))
    second, ticket = _queue(store, customer_id, behind)
    lease.release()
    watched = store.queue.watch(customer_id, first.lease_id, ())
    assert watched.handed == lease.fencing_token + 1
    return first, second, ticket


def test_a_lease_handed_its_paths_hands_them_on_in_its_release(
    mariadb_url: str, customer_id: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check that found the paths handed to a request also read who was
    next in line: the lease's release hands them on in its own round trip,
    for that request's waiter ttl, as a release that reads the queue
    first would."""
    with PathLockManager(mariadb_url, heartbeat=False, settings=SETTINGS) as manager:
        store: Store = manager._store
        first, second, _ticket = _handed_with_one_behind(manager, customer_id)
        version = _version(manager, customer_id)
        with sent(monkeypatch) as commands:
            assert store.releases.release(customer_id, first.lease_id, paths=first.paths) == 1
        assert [_statements(command) for command in commands] == [
            [
                *("SET", "UPDATE", "DELETE", "UPDATE"),  # the release, counted
                *("INSERT", "UPDATE", "DELETE", "UPDATE"),  # the grant, the queue row gone, counted
                *("UPDATE", "COMMIT"),
            ]
        ], commands
        (row,) = _rows(manager, customer_id)
        assert (row.lease_id, row.path, row.fencing_token) == (second.lease_id, "/a", version + 1)
        assert 0 < row.left_s <= WAITER_TTL
        assert _version(manager, customer_id) == version + 1
        assert manager.list_waiters(customer_id) == []
        store.releases.release(customer_id, second.lease_id)


@RELEASES
def test_a_release_hands_nothing_to_a_head_of_a_long_queue_that_waits_for_other_paths(
    mariadb_url: str, customer_id: int, monkeypatch: pytest.MonkeyPatch, seen_queue: bool
) -> None:
    """More requests are queued than a release reads (16), and the first in
    line waits for another path than the one released: the release sends no
    grant for it (one that could only be refused, under the customer's row),
    and moves the version, so that the requests that waited for the path try
    for themselves. It once granted to the head of a long queue whatever the
    head waited for."""
    with PathLockManager(mariadb_url, heartbeat=False) as manager:
        locks, store = manager.for_customer(customer_id), manager._store
        lease, other = locks.lock_paths("/a"), locks.lock_paths("/b", owner="other")
        head, _ = _queue(store, customer_id, normalize_request(["/b"], []))
        for number in range(HAND_OVER_WAITERS):
            _queue(store, customer_id, normalize_request(["/a"], []), owner=f"q{number}")
        _release_path(manager, customer_id, seen_queue)
        version = _version(manager, customer_id)
        with sent(monkeypatch) as commands:
            assert store.releases.release(customer_id, lease.lease_id, paths=lease.paths) == 1
        assert not any("INSERT" in _statements(command) for command in commands), commands
        assert [row.lease_id for row in _rows(manager, customer_id)] == [other.lease_id]
        assert _version(manager, customer_id) == version + 1
        waiting = manager.list_waiters(customer_id)
        assert len(waiting) == HAND_OVER_WAITERS + 1
        assert waiting[0].lease_id == head.lease_id
        other.release()


def test_a_lease_handed_its_paths_whose_next_in_line_waits_for_others_reads_first(
    mariadb_url: str, customer_id: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The request next in line when a lease was handed its paths waits for
    other paths: the lease's release, of a customer seen with a queue, reads
    the head of the queue before it locks the customer's row, as a release
    that knows nobody does (it once read the queue under the row)."""
    with PathLockManager(mariadb_url, heartbeat=False, settings=SETTINGS) as manager:
        store: Store = manager._store
        other = manager.for_customer(customer_id).lock_paths("/b", owner="other")
        first, second, _ticket = _handed_with_one_behind(
            manager, customer_id, normalize_request(["/b"], [])
        )
        _release_path(manager, customer_id, seen_queue=True)
        version = _version(manager, customer_id)
        with sent(monkeypatch) as commands:
            assert store.releases.release(customer_id, first.lease_id, paths=first.paths) == 1
        assert _statements(commands[0]) == ["SELECT", "ROLLBACK"], commands
        assert len(commands) == 2, commands
        assert [row.lease_id for row in _rows(manager, customer_id)] == [other.lease_id]
        # Nobody waited for /a: the version does not move.
        assert _version(manager, customer_id) == version
        assert [info.lease_id for info in manager.list_waiters(customer_id)] == [second.lease_id]
        other.release()


def test_a_check_whose_reads_straddle_the_hand_over_hands_on_to_the_next_in_line(
    mariadb_url: str, customer_id: int
) -> None:
    """A waiter's check reads the queue and then its own rows, each by a
    statement of its own (plain reads, READ COMMITTED): a hand-over that
    commits between the two shows the request handed the paths and still
    queued. The request is not its own heir: its release hands the paths on
    to the one behind it (it once handed them to itself, found nothing, and
    left the one behind to try for itself)."""
    with PathLockManager(mariadb_url, heartbeat=False, settings=SETTINGS) as manager:
        store: Store = manager._store
        lease = manager.for_customer(customer_id).lock_paths("/a")
        first, ticket = _queue(store, customer_id, normalize_request(["/a"], []))
        second, _ = _queue(store, customer_id, normalize_request(["/a"], []), owner="second")
        with manager.engine.begin() as connection:
            queued = connection.execute(
                text("SELECT * FROM path_lock_waiters WHERE ticket = :t"), {"t": ticket}
            ).one()
        lease.release()  # hands /a to the first, whose queue row goes
        assert [row.lease_id for row in _rows(manager, customer_id)] == [first.lease_id]
        # The check as its reads see it when the hand-over lands between them.
        columns = ", ".join(queued._fields)
        values = ", ".join(f":{name}" for name in queued._fields)
        insert = f"INSERT INTO path_lock_waiters ({columns}) VALUES ({values})"
        with manager.engine.begin() as connection:
            connection.execute(text(insert), queued._asdict())
        outlook = store.queue.could_grant(first, ticket)
        assert outlook.handed == lease.fencing_token + 1
        with manager.engine.begin() as connection:
            connection.execute(
                text("DELETE FROM path_lock_waiters WHERE ticket = :t"), {"t": ticket}
            )
        version = _version(manager, customer_id)
        assert store.releases.release(customer_id, first.lease_id, paths=first.paths) == 1
        (row,) = _rows(manager, customer_id)
        assert (row.lease_id, row.fencing_token) == (second.lease_id, version + 1)
        store.releases.release(customer_id, second.lease_id)


def test_a_hand_on_to_a_request_that_left_the_queue_moves_the_version(
    mariadb_url: str, customer_id: int
) -> None:
    """The request next in line when the paths were handed over gave up
    before the release: it is handed nothing, and the version moves, so that
    the one queued behind it tries for itself."""
    with PathLockManager(mariadb_url, heartbeat=False) as manager:
        store: Store = manager._store
        first, second, ticket = _handed_with_one_behind(manager, customer_id)
        third, _ = _queue(store, customer_id, normalize_request(["/a"], []), owner="third")
        store.queue.leave_queue(customer_id, second.lease_id, ticket)
        version = _version(manager, customer_id)
        assert store.releases.release(customer_id, first.lease_id, paths=first.paths) == 1
        assert _rows(manager, customer_id) == []
        assert _version(manager, customer_id) == version + 1
        assert [info.lease_id for info in manager.list_waiters(customer_id)] == [third.lease_id]


def test_a_hand_on_to_a_request_still_blocked_moves_the_version(
    mariadb_url: str, customer_id: int
) -> None:
    """The request next in line also waits for a path someone else holds: it
    is handed nothing (all or none), stays queued, and the version moves."""
    with PathLockManager(mariadb_url, heartbeat=False) as manager:
        other = manager.for_customer(customer_id).lock_paths("/b", owner="other")
        first, second, _ticket = _handed_with_one_behind(
            manager, customer_id, normalize_request(["/a", "/b"], [])
        )
        store: Store = manager._store
        version = _version(manager, customer_id)
        assert store.releases.release(customer_id, first.lease_id, paths=first.paths) == 1
        assert [row.lease_id for row in _rows(manager, customer_id)] == [other.lease_id]
        assert _version(manager, customer_id) == version + 1
        assert [info.lease_id for info in manager.list_waiters(customer_id)] == [second.lease_id]
        other.release()


def test_a_hand_on_whose_commit_reply_is_lost_lands(
    mariadb_url: str, customer_id: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The release that hands the paths on lands and its reply is lost: the
    release does not fail, and the next in line has the paths."""
    faults = CommitFaults(monkeypatch)
    with PathLockManager(mariadb_url, heartbeat=False) as manager:
        store: Store = manager._store
        first, second, _ticket = _handed_with_one_behind(manager, customer_id)
        version = _version(manager, customer_id)
        faults.lose_reply()
        # The retry finds the rows gone: the first attempt may have deleted them.
        assert store.releases.release(customer_id, first.lease_id, paths=first.paths) is None
        (row,) = _rows(manager, customer_id)
        assert (row.lease_id, row.fencing_token) == (second.lease_id, version + 1)
        store.releases.release(customer_id, second.lease_id)


def _request(customer_id: int, path: str, owner: str) -> GrantRequest:
    return GrantRequest(
        customer_id,
        secrets.token_hex(16),
        normalize_request([path], []),
        Owner(owner, 1, "t", f"{owner}.t1"),
        "",
        30.0,
    )


def _handed_on(manager: PathLockManager, customer_id: int) -> GrantRequest:
    """/a handed to a request, and by that request's release handed on to the
    one behind it, which holds it now (returned)."""
    store: Store = manager._store
    first, second, _ticket = _handed_with_one_behind(manager, customer_id)
    store.releases.release(customer_id, first.lease_id, paths=first.paths)
    assert [row.lease_id for row in _rows(manager, customer_id)] == [second.lease_id]
    return second


def _attempt(store: Store, request: GrantRequest) -> Granted | Blocked | Deadlocked:
    return store.grants.try_grant(
        request, None, queue=True, patience=time.monotonic() + 5, first=True
    )


def test_a_request_after_a_hand_on_is_queued_in_one_round_trip(
    mariadb_url: str, customer_id: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A manager that has just handed a path on expects its next request of
    it to wait (on a busy path its process asks again at once): the grant in
    one round trip, the queue row if a live lock is in the way, and the
    reads that say who is in the way, in one round trip with the COMMIT;
    the customer's sentinel row is held for that round trip only."""
    with PathLockManager(mariadb_url, heartbeat=False) as manager:
        store: Store = manager._store
        holder = _handed_on(manager, customer_id)
        version = _version(manager, customer_id)
        again = _request(customer_id, "/a", "again")
        with sent(monkeypatch) as commands:
            blocked = _attempt(store, again)
        assert [_statements(command) for command in commands] == [
            # ... the queue row, counted, and its paths' rows (revision 0007)
            [
                *("SET", "UPDATE", "INSERT", "UPDATE", "INSERT", "UPDATE", "INSERT"),
                *["SELECT"] * 5,
                "COMMIT",
            ]
        ], commands
        assert isinstance(blocked, Blocked)
        assert [info.lease_id for info in blocked.blockers] == [holder.lease_id]
        assert blocked.ahead == ()
        assert blocked.version == version  # queuing moves nothing
        (waiting,) = manager.list_waiters(customer_id)
        assert (waiting.lease_id, waiting.ticket) == (again.lease_id, blocked.ticket)
        assert _version(manager, customer_id) == version
        store.queue.leave_queue(customer_id, again.lease_id, blocked.ticket)
        store.releases.release(customer_id, holder.lease_id)


def test_a_request_after_a_hand_on_of_a_path_free_again_is_granted_in_one_round_trip(
    mariadb_url: str, customer_id: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    with PathLockManager(mariadb_url, heartbeat=False) as manager:
        store: Store = manager._store
        holder = _handed_on(manager, customer_id)
        store.releases.release(customer_id, holder.lease_id)
        again = _request(customer_id, "/a", "again")
        with sent(monkeypatch) as commands:
            granted = _attempt(store, again)
        assert len(commands) == 1, commands
        assert isinstance(granted, Granted)
        assert granted.fencing_token == _version(manager, customer_id)
        assert [row.lease_id for row in _rows(manager, customer_id)] == [again.lease_id]
        assert manager.list_waiters(customer_id) == []
        store.releases.release(customer_id, again.lease_id)


def test_a_request_after_a_hand_on_that_waits_only_for_the_queue_is_judged_as_ever(
    mariadb_url: str, customer_id: int
) -> None:
    """The path is free, but an older request that wants it waits for another
    one too: the round trip queues nothing (who goes first is judged request
    by request), and the attempt after it queues the request behind that
    one."""
    with PathLockManager(mariadb_url, heartbeat=False) as manager:
        store: Store = manager._store
        holder = _handed_on(manager, customer_id)
        other = manager.for_customer(customer_id).lock_paths("/b", owner="other")
        older, older_ticket = _queue(
            store, customer_id, normalize_request(["/a", "/b"], []), owner="older"
        )
        store.releases.release(customer_id, holder.lease_id)
        assert [row.lease_id for row in _rows(manager, customer_id)] == [other.lease_id]
        again = _request(customer_id, "/a", "again")
        blocked = _attempt(store, again)
        assert isinstance(blocked, Blocked)
        assert blocked.blockers == ()
        assert [info.ticket for info in blocked.ahead] == [older_ticket]
        assert [info.lease_id for info in manager.list_waiters(customer_id)] == [
            older.lease_id,
            again.lease_id,
        ]
        store.queue.leave_queue(customer_id, again.lease_id, blocked.ticket)
        store.queue.leave_queue(customer_id, older.lease_id, older_ticket)
        other.release()


def test_a_request_after_a_hand_on_that_would_wait_for_its_own_owner_leaves_the_queue(
    mariadb_url: str, customer_id: int
) -> None:
    """Queued in the same round trip, then found waiting for a lock of its own
    owner: DeadlockDetected as ever, and its queue row is gone again (the
    version moves for whoever judged its place behind it)."""
    with PathLockManager(mariadb_url, heartbeat=False) as manager:
        store: Store = manager._store
        holder = _handed_on(manager, customer_id)  # owner "queued"
        version = _version(manager, customer_id)
        outcome = _attempt(store, _request(customer_id, "/a", "queued"))
        assert isinstance(outcome, Deadlocked)
        assert outcome.party is None
        assert [info.lease_id for info in outcome.held_by] == [holder.lease_id]
        assert manager.list_waiters(customer_id) == []
        assert _version(manager, customer_id) == version + 1
        store.releases.release(customer_id, holder.lease_id)


def test_a_hand_on_the_server_refuses_still_releases(
    mariadb_url: str,
    customer_id: int,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The hand-on in the release's round trip fails with an error no retry
    helps (here: a statement the server refuses, after which it runs nothing
    of the query): the release is made without it, the version moves so that
    the next in line tries for itself, and a warning says so."""
    with PathLockManager(mariadb_url, heartbeat=False) as manager:
        store: Store = manager._store
        first, second, ticket = _handed_with_one_behind(manager, customer_id)
        version = _version(manager, customer_id)
        refused = [(text("SELECT * FROM pathlock_no_such_table"), {})]
        monkeypatch.setattr(HandOver, "handing_to", lambda *_args: refused)
        assert store.releases.release(customer_id, first.lease_id, paths=first.paths) == 1
        monkeypatch.undo()
        assert "could not hand customer" in caplog.text
        assert _rows(manager, customer_id) == []
        assert _version(manager, customer_id) == version + 1
        assert [info.ticket for info in manager.list_waiters(customer_id)] == [ticket]
        store.queue.leave_queue(customer_id, second.lease_id, ticket)
