"""Locks at depth 0 (``shallow=``): a lock on a path alone, not its subtree
(WebDAV's ``Depth: 0``), against the real server.

It conflicts with locks on the same path and with those on its ancestors that
cover their subtree, never with locks below it; it is granted all or nothing
beside locks on their subtree, queues, is handed over and is judged by the
queue rules as every lock is. The random comparison of the conflict queries
with the rule is in test_conflict_forms.py, and the stress test mixes such
locks with the others (test_stress.py)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import pytest

from pathlock import (
    AsyncPathLockManager,
    CustomerLocks,
    DeadlockDetected,
    InvalidPath,
    InvalidPathType,
    Lease,
    LockTimeout,
    PathLockManager,
    RequestTooLarge,
)

HANG = 60.0  # seconds: only reached when something is broken


def _until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + HANG
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.01)


def test_a_folder_alone_leaves_its_contents_free(locks: CustomerLocks) -> None:
    folder = locks.lock_paths(shallow=["/Shared/docs"], owner="folder", timeout=10)
    assert folder.paths == (("/Shared/docs", "exclusive"),)
    assert folder.shallow == frozenset({"/Shared/docs"})
    # Below it: free, at any depth.
    inside = locks.try_lock_paths("/Shared/docs/report.odt", owner="file")
    assert inside is not None
    deeper = locks.try_lock_paths(shallow=["/Shared/docs/sub"], owner="sub")
    assert deeper is not None
    # The folder itself, and its ancestors on their subtree: taken.
    assert locks.try_lock_paths("/Shared/docs", owner="other") is None
    assert locks.try_lock_paths(shallow=["/Shared/docs"], owner="other") is None
    assert locks.try_lock_paths(shared=["/Shared/docs"], owner="other") is None
    assert locks.try_lock_paths("/Shared", owner="other") is None
    # An ancestor alone does not reach it.
    parent = locks.try_lock_paths(shallow=["/Shared"], owner="parent")
    assert parent is not None
    for lease in (folder, inside, deeper, parent):
        lease.release()
    assert locks.list_locks() == []


def test_shared_at_depth_0_meets_exclusive_locks_only(locks: CustomerLocks) -> None:
    reader = locks.lock_paths(shared=["/a"], shallow=["/a"], owner="reader", timeout=10)
    assert reader.paths == (("/a", "shared"),)
    assert reader.shallow == {"/a"}
    # An exclusive lock below a shared lock at depth 0 is granted.
    assert locks.try_lock_paths("/a/b", owner="below") is not None
    assert locks.try_lock_paths(shared=["/a"], shallow=["/a"], owner="r2") is not None
    assert locks.try_lock_paths("/a", owner="w") is None
    assert locks.try_lock_paths(shallow=["/a"], owner="w") is None
    # A shared lock of /a's subtree meets the exclusive one below.
    assert locks.try_lock_paths(shared=["/a"], owner="r3") is None
    # A positional path named in shallow too is exclusive.
    both = locks.try_lock_paths("/c", shared=["/c"], shallow=["/c"], owner="c")
    assert both is not None
    assert both.paths == (("/c", "exclusive"),)


def test_the_root_alone(locks: CustomerLocks) -> None:
    root = locks.lock_paths(shallow=["/"], owner="root", timeout=10)
    anything = locks.try_lock_paths("/anything", owner="x")
    assert anything is not None
    assert locks.try_lock_paths("/", owner="y") is None
    root.release()
    assert locks.try_lock_paths("/", owner="y") is None  # /anything is below it
    anything.release()
    everything = locks.lock_paths("/", owner="everything", timeout=HANG)
    assert locks.try_lock_paths(shallow=["/a"], owner="z") is None
    everything.release()


def test_depths_are_all_or_nothing_in_one_request(locks: CustomerLocks) -> None:
    blocker = locks.lock_paths("/dst/new", owner="blocker", timeout=10)
    # A move: the source and the destination on their subtree, their parents
    # alone (shared: others may create files beside them).
    with pytest.raises(LockTimeout) as refused:
        locks.lock_paths(
            "/src/old", "/dst/new", shared=["/src", "/dst"], shallow=["/src", "/dst"], timeout=0
        )
    assert refused.value.shallow == {"/src", "/dst"}
    assert "/dst (shared, depth 0), /dst/new (exclusive)" in str(refused.value)
    assert [lock.lease_id for lock in locks.list_locks()] == [blocker.lease_id]
    blocker.release()
    move = locks.lock_paths(
        "/src/old", "/dst/new", shared=["/src", "/dst"], shallow=["/src", "/dst"]
    )
    rows = {(lock.path, lock.mode, lock.shallow) for lock in locks.list_locks()}
    assert rows == {
        ("/dst", "shared", True),
        ("/dst/new", "exclusive", False),
        ("/src", "shared", True),
        ("/src/old", "exclusive", False),
    }
    # Beside it: another file created in the same folder.
    beside = locks.try_lock_paths("/dst/other", shared=["/dst"], shallow=["/dst"], owner="o")
    assert beside is not None
    beside.release()
    move.release()


def test_lookups_skip_ancestors_that_do_not_reach_the_path(locks: CustomerLocks) -> None:
    locks.lock_paths(shallow=["/a"], owner="alone", timeout=10)
    locks.lock_paths("/a/b", owner="subtree", timeout=10)
    locks.lock_paths(shallow=["/a/c"], owner="file", timeout=10)
    on_b = [(lock.path, lock.shallow) for lock in locks.locks_on("/a/b/x")]
    assert on_b == [("/a/b", False)]
    assert [lock.path for lock in locks.locks_on("/a/c")] == ["/a/c"]
    assert locks.locks_on("/a/c/d") == []
    on_a = [(lock.path, lock.shallow) for lock in locks.locks_on("/a", descendants=True)]
    assert on_a == [("/a", True), ("/a/b", False), ("/a/c", True)]


def test_a_waiter_at_depth_0_is_handed_its_paths_as_asked(
    manager: PathLockManager, customer_id: int
) -> None:
    locks = manager.for_customer(customer_id)
    holder = locks.lock_paths("/f", owner="holder", timeout=10)
    got: list[Lease] = []
    waiter = threading.Thread(
        target=lambda: got.append(
            locks.lock_paths(shallow=["/f"], data="folder lock", owner="waiter", timeout=HANG)
        )
    )
    waiter.start()
    _until(lambda: bool(manager.list_waiters(customer_id)))
    (queued,) = manager.list_waiters(customer_id)
    assert queued.shallow == {"/f"}
    assert "depth 0" in queued.describe()
    holder.release()
    waiter.join(HANG)
    (lease,) = got
    assert lease.shallow == {"/f"}
    ((row),) = locks.list_locks()
    assert (row.path, row.shallow) == ("/f", True)
    info = locks.get_lease(lease.lease_id)
    assert info is not None
    assert info.shallow == {"/f"}
    assert info.data == "folder lock"
    # Held at depth 0, as asked: what is below is free.
    assert locks.try_lock_paths("/f/x", owner="below") is not None
    lease.release()


def test_a_queued_request_at_depth_0_does_not_hold_back_one_below_it(
    manager: PathLockManager, customer_id: int
) -> None:
    locks = manager.for_customer(customer_id)
    holder = locks.lock_paths(shallow=["/f"], owner="holder", timeout=10)
    failed: list[BaseException] = []

    def wait() -> None:
        try:
            locks.lock_paths(shallow=["/f"], owner="queued", timeout=HANG)
        except BaseException as error:  # noqa: BLE001 - reported below
            failed.append(error)

    waiter = threading.Thread(target=wait)
    waiter.start()
    _until(lambda: bool(manager.list_waiters(customer_id)))
    # First come, first served among conflicting requests only: /f/x does
    # not conflict with the queued request for /f alone.
    below = locks.try_lock_paths("/f/x", owner="later")
    assert below is not None
    # A later request for /f on its subtree conflicts with the queued one:
    # it queues behind it.
    with pytest.raises(LockTimeout) as later:
        locks.lock_paths("/g", shallow=["/f"], owner="later 2", timeout=0.3)
    assert later.value.queued_behind
    below.release()
    holder.release()
    waiter.join(HANG)
    assert not failed
    locks.release_locks(owner="queued")


def _waiting(locks: CustomerLocks, path: str, owner: str) -> tuple[threading.Thread, list[str]]:
    """A thread whose request for ``path`` waits 3 s at most; what it met."""
    outcome: list[str] = []

    def wait() -> None:
        try:
            locks.lock_paths(path, owner=owner, timeout=3)
            outcome.append("granted")
        except (LockTimeout, DeadlockDetected) as error:
            outcome.append(type(error).__name__)

    thread = threading.Thread(target=wait)
    thread.start()
    return thread, outcome


def test_a_lock_that_does_not_reach_the_waiter_closes_no_cycle(
    manager: PathLockManager, customer_id: int
) -> None:
    """A holds /a alone; B holds /b and waits for /a/x (behind C). A asking
    for /b waits for B, which does not wait for A: a timeout, never
    DeadlockDetected. With /a on its subtree, it is a deadlock."""
    locks = manager.for_customer(customer_id)
    locks.lock_paths(shallow=["/a"], owner="A", timeout=10)
    locks.lock_paths("/a/x", owner="C", timeout=10)
    locks.lock_paths("/b", owner="B", timeout=10)
    waiter, outcome = _waiting(locks, "/a/x", "B")
    _until(lambda: bool(manager.list_waiters(customer_id)))
    with pytest.raises(LockTimeout):
        locks.lock_paths("/b", owner="A", timeout=0.5)
    waiter.join(HANG)
    assert outcome == ["LockTimeout"]
    locks.release_locks(owner="A")
    # The same with A's lock on /a's subtree: B waits for A too.
    locks.release_locks(owner="C")
    locks.lock_paths("/a", owner="A2", timeout=10)
    waiter, outcome = _waiting(locks, "/a/x", "B")
    _until(lambda: bool(manager.list_waiters(customer_id)))
    with pytest.raises(DeadlockDetected):
        locks.lock_paths("/b", owner="A2", timeout=HANG)
    waiter.join(HANG)
    assert outcome == ["LockTimeout"]


def test_detached_leases_at_depth_0(locks: CustomerLocks) -> None:
    lease = locks.lock_detached(shallow=["/dav/folder"], ttl=60, data=b"<owner/>")
    assert lease.shallow == {"/dav/folder"}
    assert "depth 0" in lease.describe_paths()
    assert locks.try_lock_detached("/dav/folder/file", ttl=60) is not None
    assert locks.try_lock_detached("/dav/folder", ttl=60) is None
    renewed = locks.renew_detached(lease.lease_id, ttl=120)
    assert renewed.shallow == {"/dav/folder"}
    assert locks.release_detached(lease.lease_id) == 1


def test_bad_shallow_arguments_are_refused_before_anything_is_written(
    locks: CustomerLocks,
) -> None:
    with pytest.raises(InvalidPathType):
        locks.try_lock_paths(shallow="/a")  # type: ignore[arg-type]  # one string
    with pytest.raises(InvalidPath):
        locks.try_lock_paths(shallow=["relative"])
    with pytest.raises(InvalidPath, match="no paths"):
        locks.try_lock_paths(shallow=[])
    with pytest.raises(RequestTooLarge):
        locks.try_lock_paths(shallow=(f"/p{n}" for n in range(1001)))
    with pytest.raises(RequestTooLarge):
        locks.try_lock_paths(
            *(f"/p{n}" for n in range(600)), shallow=[f"/q{n}" for n in range(600)]
        )
    assert locks.list_locks() == []


def test_case_folded_paths_at_depth_0(database_url: str, customer_id: int) -> None:
    with PathLockManager(database_url, case_insensitive=True, heartbeat=False) as manager:
        locks = manager.for_customer(customer_id)
        lease = locks.lock_paths("/Docs", shallow=["/DOCS"], timeout=10)
        assert lease.paths == (("/docs", "exclusive"),)
        assert lease.shallow == {"/docs"}
        assert locks.try_lock_paths("/docs/File", owner="x") is not None


def test_the_asyncio_api_locks_at_depth_0(database_url: str, customer_id: int) -> None:
    async def main() -> None:
        async with AsyncPathLockManager(database_url) as manager:
            locks = manager.for_customer(customer_id)
            async with locks.lock_paths(shallow=["/a"]) as lease:
                assert lease.shallow == {"/a"}
                below = await locks.try_lock_paths("/a/b", owner="below")
                assert below is not None
                assert await locks.try_lock_paths("/a", owner="on") is None
                await below.release()
            detached = await locks.try_lock_detached(shared=["/d"], shallow=["/d"], ttl=60)
            assert detached is not None
            assert detached.shallow == {"/d"}
            assert await locks.release_detached(detached.lease_id) == 1

    asyncio.run(main())
