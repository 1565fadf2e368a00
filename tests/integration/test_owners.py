"""Owners that cannot be confused: managers, containers, thread pools, tasks.

An owner is a manager instance's random identity plus the holder within it (a
thread, an asyncio task, or a name the caller gives). Host names, pids and OS
thread ids repeat (two managers of one process, containers that are all pid 1
on one host name, pool threads), and none of them may make two holders one:
one holder's ``release_locks()`` must never free another's lease, and a
request blocked by someone else must wait, not fail as a deadlock with itself.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import textwrap
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import Engine, func, select

from pathlock import (
    ArgumentTypeError,
    CustomerLocks,
    InvalidArgument,
    Lease,
    LeaseLost,
    LockTimeout,
    PathLockManager,
)
from pathlock.schema import path_locks

HANG = 60.0  # seconds: only reached when something is broken


def _rows(engine: Engine, lease: Lease) -> int:
    with engine.connect() as connection:
        return int(
            connection.execute(
                select(func.count()).where(path_locks.c.lease_id == lease.lease_id)
            ).scalar_one()
        )


def test_two_managers_of_one_process_with_one_node_id_are_two_owners(
    database_url: str, customer_id: int, raw_engine: Engine
) -> None:
    with (
        PathLockManager(database_url, node_id="web-1") as first,
        PathLockManager(database_url, node_id="web-1") as second,
    ):
        lease = first.for_customer(customer_id).lock_paths("/Shared/a")
        other = second.for_customer(customer_id)
        assert other.release_locks() == 0
        lease.ensure_held()
        assert _rows(raw_engine, lease) == 1
        # Blocked by another owner: it waits (and times out), it is no deadlock.
        with pytest.raises(LockTimeout):
            other.lock_paths("/Shared/a/x", timeout=0.2)
        lease.release()


def test_a_thread_pool_keeps_named_owners_apart(locks: CustomerLocks, raw_engine: Engine) -> None:
    # One pool thread runs two unrelated requests one after the other.
    with ThreadPoolExecutor(max_workers=1) as pool:
        lease = pool.submit(locks.lock_paths, "/Shared/a", owner="request-1").result()
        with pytest.raises(LockTimeout):
            pool.submit(locks.lock_paths, "/Shared/a", timeout=0.2, owner="request-2").result()
        assert pool.submit(locks.release_locks, owner="request-2").result() == 0
        lease.ensure_held()
        assert _rows(raw_engine, lease) == 1
        # The owner it was taken for releases it, from whichever thread.
        assert locks.release_locks(owner="request-1") == 1
    assert lease.released
    assert _rows(raw_engine, lease) == 0


def test_a_thread_that_ended_holding_a_lease_is_nobody_else(
    locks: CustomerLocks, raw_engine: Engine
) -> None:
    leases: list[Lease] = []
    worker = threading.Thread(target=lambda: leases.append(locks.lock_paths("/Shared/a")))
    worker.start()
    worker.join()  # ends while its lease is still held

    def later_thread() -> int:
        with pytest.raises(LockTimeout):  # waits: the holder is another (ended) thread
            locks.lock_paths("/Shared/a", timeout=0.2)
        return locks.release_locks()

    for _ in range(3):  # new threads, whatever ids the OS gives them
        with ThreadPoolExecutor(max_workers=1) as pool:
            assert pool.submit(later_thread).result() == 0
    assert _rows(raw_engine, leases[0]) == 1
    leases[0].release()


def test_asyncio_tasks_of_one_loop_are_separate_owners(
    locks: CustomerLocks, raw_engine: Engine
) -> None:
    async def hold() -> Lease:
        return locks.lock_paths("/Shared/a")

    async def other() -> tuple[type[BaseException], int]:
        try:
            locks.lock_paths("/Shared/a/b", timeout=0.2)
        except LockTimeout as error:
            return type(error), locks.release_locks()
        raise AssertionError("granted while another task holds /Shared/a")

    async def main() -> tuple[Lease, type[BaseException], int]:
        lease = await asyncio.create_task(hold())
        kind, released = await asyncio.create_task(other())
        return lease, kind, released

    lease, kind, released = asyncio.run(main())
    assert (kind, released) == (LockTimeout, 0)
    lease.ensure_held()
    assert _rows(raw_engine, lease) == 1
    lease.release()


def _one_pool_thread() -> None:
    """The running loop's default executor (``to_thread``'s, and
    ``run_in_executor(None, ...)``'s) gets one thread: every call runs on it."""
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=1))


def test_tasks_that_call_through_to_thread_wait_for_each_other(
    manager: PathLockManager, locks: CustomerLocks, customer_id: int
) -> None:
    """``asyncio.to_thread`` runs both tasks' calls on the same pool thread,
    in a copy of each task's context: the second task waits for the first
    one's lease, it is no deadlock with itself."""

    async def main() -> tuple[Lease, Lease]:
        _one_pool_thread()
        lease = await asyncio.to_thread(locks.lock_paths, "/Shared/a")
        waiting = asyncio.create_task(
            asyncio.to_thread(locks.lock_paths, "/Shared/a", timeout=HANG)
        )
        while not waiting.done() and not manager.list_waiters(customer_id):
            await asyncio.sleep(0.01)  # until it is queued (or failed)
        lease.release()
        return lease, await waiting

    lease, granted = asyncio.run(main())
    assert granted.owner.key != lease.owner.key
    granted.release()


def test_a_task_calling_through_to_thread_releases_none_of_another_tasks_leases(
    locks: CustomerLocks, raw_engine: Engine
) -> None:
    async def main() -> tuple[Lease, int]:
        _one_pool_thread()
        lease = await asyncio.create_task(asyncio.to_thread(locks.lock_paths, "/Shared/a"))
        released = await asyncio.create_task(asyncio.to_thread(locks.release_locks))
        return lease, released

    lease, released = asyncio.run(main())
    assert released == 0
    lease.ensure_held()
    assert _rows(raw_engine, lease) == 1
    lease.release()


def test_a_with_block_whose_lease_release_locks_released_raises_lease_lost(
    locks: CustomerLocks,
) -> None:
    """Tasks whose calls ``loop.run_in_executor`` runs on one pool thread
    (no context copied) are that thread's owner: the later one's
    ``release_locks()`` releases the earlier one's lease while its ``with``
    block runs, and the block must not end as if it had held the lock
    throughout."""

    async def hold(inside: asyncio.Event, done: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        with await loop.run_in_executor(None, locks.lock_paths, "/Shared/a") as lease:
            inside.set()
            await done.wait()
            assert lease.lost

    async def main() -> int:
        _one_pool_thread()
        inside, done = asyncio.Event(), asyncio.Event()
        holder = asyncio.create_task(hold(inside, done))
        await inside.wait()
        loop = asyncio.get_running_loop()
        released = await loop.run_in_executor(None, locks.release_locks)
        done.set()
        with pytest.raises(LeaseLost, match="release_locks"):
            await holder
        return released

    assert asyncio.run(main()) == 1
    assert locks.list_locks() == []


def test_owner_names_are_checked_before_anything_is_written(locks: CustomerLocks) -> None:
    for bad in (b"x", 42, object()):
        with pytest.raises(ArgumentTypeError):
            locks.lock_paths("/a", owner=bad)  # type: ignore[arg-type]
        with pytest.raises(ArgumentTypeError):
            locks.release_locks(owner=bad)  # type: ignore[arg-type]
    for bad_value in ("", "x" * 256, "a\x00b"):
        with pytest.raises(InvalidArgument):
            locks.try_lock_paths("/a", owner=bad_value)
    assert locks.list_locks() == []


_CONTAINER = textwrap.dedent(
    """
    import os, sys, threading
    from pathlock import PathLockManager, LockTimeout, DeadlockDetected
    url, customer, role = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    assert os.getpid() == 1 and threading.get_native_id() == 1  # like every container
    manager = PathLockManager(url, node_id="web")
    locks = manager.for_customer(customer)
    if role == "hold":
        lease = locks.lock_paths("/Shared/a")
        print("held", flush=True)
        sys.stdin.readline()
        os._exit(0)  # dies holding it, as a crashed container would
    try:
        locks.lock_paths("/Shared/a", timeout=0.5)
        print("granted")
    except (LockTimeout, DeadlockDetected) as error:
        print(type(error).__name__, locks.release_locks())
    manager.close()
    """
)


def _container(url: str, customer_id: int, role: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            "unshare",
            "--pid",
            "--fork",
            sys.executable,
            "-c",
            _CONTAINER,
            url,
            str(customer_id),
            role,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare(1)")
def test_containers_sharing_host_name_and_pid_are_separate_owners(
    database_url: str, customer_id: int
) -> None:
    probe = subprocess.run(["unshare", "--pid", "--fork", "true"], check=False)
    if probe.returncode:
        pytest.skip("cannot create a pid namespace here")
    holder = _container(database_url, customer_id, "hold")
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        # Another container, same host name, pid 1, thread 1: it waits, and its
        # release_locks() frees nothing of the first one's.
        other = _container(database_url, customer_id, "ask")
        out, _ = other.communicate(timeout=60)
        assert out.split() == ["LockTimeout", "0"]
    finally:
        holder.communicate("\n", timeout=60)
    # Its restarted successor (same name, pid 1 again) waits for the dead one's
    # lock to expire instead of being told it deadlocked with itself.
    successor = _container(database_url, customer_id, "ask")
    out, _ = successor.communicate(timeout=60)
    assert out.split() == ["LockTimeout", "0"]


def test_only_a_named_owner_can_take_locks_while_one_of_its_requests_waits() -> None:
    """A thread or a task is busy in the call that waits; a name can be used
    by several threads at once. (A waiting request of a busy owner skips the
    rechecks that only such an owner's new locks could make worth it.)"""
    from pathlock import _owners as owners  # noqa: PLC0415 - the one private helper

    assert owners.is_named(owners.current("ident", "node", name="job-7"))
    assert not owners.is_named(owners.current("ident", "node"))
    assert not owners.is_named(owners.current("ident.n", "node"))  # only the holder counts

    async def in_a_task() -> bool:
        return owners.is_named(owners.current("ident", "node"))

    assert not asyncio.run(in_a_task())
