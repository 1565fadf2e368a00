"""The checks of several waiting requests of one process answered by one
read (pathlock._polls): the answers are those of one read per check, and
threads waiting on one customer keep being served in order."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable, Iterator, Sequence

import pytest

from pathlock import AsyncLease, AsyncPathLockManager, Lease, PathLockManager, Settings
from pathlock._core.records import Watched
from pathlock._polls import Ask
from pathlock.types import WaiterInfo

pytestmark = pytest.mark.timeout(120)

GONE = 2**62  # a ticket nobody has


def _until(condition: Callable[[], bool], seconds: float = 20.0) -> None:
    ends = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < ends, "never happened"
        time.sleep(0.01)


def _same(many: Watched, one: Watched) -> None:
    """Equal, but for how long handed rows have left (read at two times)."""
    assert dataclasses.replace(many, handed_for=0.0) == dataclasses.replace(one, handed_for=0.0)
    assert abs(many.handed_for - one.handed_for) < 2.0


@contextlib.contextmanager
def _waiting_behind(
    manager: PathLockManager, customer_id: int, count: int
) -> Iterator[tuple[Lease, list[WaiterInfo]]]:
    """``count`` threads queued for ``/Shared/a``, which a holder keeps until
    the block ends: the holder's lease, and the queued requests, oldest
    first."""
    locks = manager.for_customer(customer_id)
    held = locks.lock_paths("/Shared/a", owner="holder")

    def wait(number: int) -> None:
        with locks.lock_paths("/Shared/a", owner=f"waiter-{number}", timeout=60):
            pass

    waiting = [threading.Thread(target=wait, args=(n,)) for n in range(count)]
    try:
        for thread in waiting:
            thread.start()
        _until(lambda: len(manager.list_waiters(customer_id)) == count)
        yield held, manager.list_waiters(customer_id)
    finally:
        held.release()
        for thread in waiting:
            thread.join(60)


def _answered_alike(manager: PathLockManager, customer_id: int, asks: list[Ask]) -> list[Watched]:
    """The answers of one read to ``asks``, checked against a read each."""
    queue = manager._store.queue
    many = queue._watch(customer_id, asks, None)
    alone = [queue._watch(customer_id, [ask], None)[0] for ask in asks]
    for answer, own in zip(many, alone, strict=True):
        _same(answer, own)
    return many


def test_one_read_answers_each_check_as_a_read_of_its_own(
    database_url: str, customer_id: int
) -> None:
    manager = PathLockManager(database_url, heartbeat=False)
    other = manager.for_customer(customer_id).lock_paths("/Shared/z", owner="other")
    try:
        with _waiting_behind(manager, customer_id, 2) as (held, (first, second)):
            asks = [
                # Rows of its own (as if handed over), a ticket still queued and
                # one gone, a lease that holds and one that does not.
                Ask(held.lease_id, (first.ticket, GONE), (other.lease_id, "no-such-lease")),
                Ask(first.lease_id, (second.ticket, first.ticket), ("no-such-lease",)),
                Ask(None, (), ()),
                Ask("no-such-lease", (), (held.lease_id,)),
                Ask(None, (GONE, GONE + 1), ()),
            ]
            many = _answered_alike(manager, customer_id, asks)
            assert [answer.held_left for answer in many] == [1, 0, None, 1, None]
            assert [answer.ahead_left for answer in many] == [1, 2, None, None, 0]
            if many[0].looked:  # where releases hand over (MariaDB)
                assert [answer.handed for answer in many[:2]] == [held.fencing_token, None]
    finally:
        other.release()
        manager.close()


@pytest.mark.parametrize("gone", [3, 9, 30])
def test_checks_that_ask_about_many_tickets_and_leases_are_answered_alike(
    database_url: str, customer_id: int, gone: int
) -> None:
    """Checks whose lists are long (sent padded: see pathlock._batch) get
    the answers of a read each: every ticket still queued counted once,
    whether a lease in the way holds."""
    manager = PathLockManager(database_url, heartbeat=False)
    try:
        with _waiting_behind(manager, customer_id, 3) as (held, queued):
            tickets = [waiter.ticket for waiter in queued]
            nobody = [GONE + n for n in range(gone)]
            leases = [f"no-such-lease-{n}" for n in range(gone)]
            asks = [
                Ask(None, (*nobody, *tickets), ()),
                Ask(None, (tickets[0], *nobody), (*leases, held.lease_id)),
                Ask(None, tuple(nobody), tuple(leases)),
            ]
            many = _answered_alike(manager, customer_id, asks)
            assert [answer.ahead_left for answer in many] == [3, 1, 0]
            assert [answer.held_left for answer in many] == [None, 1, 0]
    finally:
        manager.close()


def test_threads_waiting_on_one_customer_are_served_in_order(
    database_url: str, customer_id: int
) -> None:
    """30 threads queue one after the other for one path, whose holder keeps
    it 0.3 s: their checks share reads (they are due together), and each is
    granted in the order it queued."""
    manager = PathLockManager(database_url, settings=Settings(shared_check=0.05))
    locks = manager.for_customer(customer_id)
    order: list[int] = []
    holder = locks.lock_paths("/Shared/a", owner="holder")

    def wait(number: int) -> None:
        with locks.lock_paths("/Shared/a", owner=f"waiter-{number}", timeout=60):
            order.append(number)

    threads = []
    try:
        for number in range(30):
            thread = threading.Thread(target=wait, args=(number,))
            thread.start()
            threads.append(thread)
            _until(lambda number=number: len(manager.list_waiters(customer_id)) == number + 1)
        time.sleep(0.3)
    finally:
        holder.release()
        for thread in threads:
            thread.join(60)
        manager.close()
    assert order == list(range(30))


def _counting_reads(manager: AsyncPathLockManager) -> list[int]:
    """The number of checks each read of the manager's shared checks answers,
    as they are made."""
    polls = manager._core._store.queue._polls
    read, sizes = polls._read, []

    def counted(customer_id: int, asks: Sequence[Ask], deadline: float | None) -> list[Watched]:
        sizes.append(len(asks))
        return read(customer_id, asks, deadline)

    polls._read = counted
    return sizes


async def _tasks_waiting(
    manager: AsyncPathLockManager, customer_id: int, paths: Sequence[str], order: list[int]
) -> list[asyncio.Task[None]]:
    """A task for each of ``paths``, queued one after the other, each
    appending its number to ``order`` once granted."""
    locks = manager.for_customer(customer_id)

    async def wait(number: int, path: str) -> None:
        lease: AsyncLease = await locks.lock_paths(path, timeout=60)
        order.append(number)
        await lease.release()

    tasks = []
    for number, path in enumerate(paths):
        tasks.append(asyncio.create_task(wait(number, path)))
        while len(await manager.list_waiters(customer_id)) < number + 1:
            await asyncio.sleep(0.01)
    return tasks


async def _served(
    database_url: str, customer_id: int, held: str, paths: Sequence[str]
) -> tuple[list[int], list[int]]:
    """Tasks queued one after the other for ``paths`` while ``held`` is held,
    and let go 0.3 s later: the numbers of the tasks in the order they were
    granted, and the number of checks each read answered."""
    order: list[int] = []
    async with AsyncPathLockManager(database_url, settings=Settings(shared_check=0.05)) as manager:
        sizes = _counting_reads(manager)
        holder = await manager.for_customer(customer_id).lock_paths(held)
        tasks = await _tasks_waiting(manager, customer_id, paths, order)
        await asyncio.sleep(0.3)
        await holder.release()
        await asyncio.wait_for(asyncio.gather(*tasks), 60)
        assert await manager.list_waiters(customer_id) == []
    return order, sizes


def test_tasks_of_one_loop_share_their_reads_of_a_customer(
    database_url: str, customer_id: int
) -> None:
    """30 tasks of one loop wait for paths of one holder, each for a path of
    its own, so each checks its customer: their checks share reads, waiting
    for one another on the loop (a read answers several), and all are
    granted when the holder lets go."""
    paths = [f"/Shared/{number}" for number in range(30)]
    order, sizes = asyncio.run(_served(database_url, customer_id, "/Shared", paths))
    assert max(sizes) > 1, sizes
    assert sum(sizes) > 2 * len(sizes), sizes
    assert sorted(order) == list(range(30))


def test_tasks_waiting_on_one_customer_are_served_in_order(
    database_url: str, customer_id: int
) -> None:
    """30 tasks queue one after the other for one path, whose holder keeps it
    0.3 s: each is granted in the order it queued."""
    order, _sizes = asyncio.run(_served(database_url, customer_id, "/Shared/a", ["/Shared/a"] * 30))
    assert order == list(range(30))


def test_tasks_cancelled_while_they_share_reads_leave_the_others_served(
    database_url: str, customer_id: int
) -> None:
    """Of 20 tasks whose checks share reads, every other one is cancelled,
    in whatever wait it is (for another's read, making one, gathering the
    checks of one): each leaves the queue, and the others are granted."""

    async def main() -> list[int]:
        order: list[int] = []
        async with AsyncPathLockManager(
            database_url, settings=Settings(shared_check=0.02)
        ) as manager:
            sizes = _counting_reads(manager)
            holder = await manager.for_customer(customer_id).lock_paths("/Shared")
            paths = [f"/Shared/{number}" for number in range(20)]
            tasks = await _tasks_waiting(manager, customer_id, paths, order)
            while max(sizes, default=0) < 3:
                await asyncio.sleep(0.005)
            for task in tasks[::2]:
                task.cancel()
                await asyncio.sleep(0.003)
            await holder.release()
            done = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 60)
            assert all(isinstance(result, asyncio.CancelledError) for result in done[::2])
            assert done[1::2] == [None] * 10
            assert await manager.list_waiters(customer_id) == []
        return order

    assert sorted(asyncio.run(main())) == list(range(1, 20, 2))
