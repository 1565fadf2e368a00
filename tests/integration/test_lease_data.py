"""A lease's data: given with the request, granted with it in one
transaction, returned as given by get_lease() in any process, whichever way
the request was granted (at once, after waiting, handed its paths by a
release), and refused before anything is written when it is not bytes or
text or is over 64 KiB."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from sqlalchemy import Engine, func, select

from pathlock import (
    ArgumentTypeError,
    AsyncPathLockManager,
    CustomerLocks,
    InvalidArgument,
    Lease,
    PathLockManager,
)
from pathlock.schema import path_locks

HANG = 60.0  # seconds: only reached when something is broken
MAX = 64 * 1024

_GIVEN = [
    b"",
    "",
    b"\x00\x01\xff" * 100,
    "owner <D:href>mailto:kpatel@example.com</D:href> · café ☃",
    bytes(range(256)) * (MAX // 256),  # 64 KiB exactly, every byte value
    "é" * (MAX // 2),  # 64 KiB of UTF-8
]


@pytest.mark.parametrize(
    "data", _GIVEN, ids=["empty bytes", "empty text", "bytes", "text", "64 KiB", "64 KiB text"]
)
def test_data_comes_back_as_given(locks: CustomerLocks, data: bytes | str) -> None:
    lease = locks.lock_paths("/a", data=data)
    try:
        info = locks.get_lease(lease.lease_id)
        assert info is not None
        assert type(info.data) is type(data)
        assert info.data == data
    finally:
        lease.release()
    detached = locks.try_lock_detached("/b", ttl=60, data=data)
    assert detached is not None
    info = locks.get_lease(detached.lease_id)
    assert info is not None
    assert info.data == data
    locks.release_detached(detached.lease_id)


def test_no_data_is_none(locks: CustomerLocks) -> None:
    with locks.lock_paths("/a") as lease:
        info = locks.get_lease(lease.lease_id)
        assert info is not None
        assert info.data is None


def test_a_lease_of_many_paths_keeps_its_data_once(
    locks: CustomerLocks, raw_engine: Engine, customer_id: int
) -> None:
    data = b"x" * 1000
    with locks.lock_paths("/a", "/b", "/c/d", shared=["/e"], data=data) as lease:
        with raw_engine.connect() as connection:
            stored = connection.execute(
                select(func.count()).where(
                    path_locks.c.customer_id == customer_id,
                    path_locks.c.lease_id == lease.lease_id,
                    path_locks.c.data.is_not(None),
                )
            ).scalar_one()
        assert stored == 1
        info = locks.get_lease(lease.lease_id)
        assert info is not None
        assert info.data == data
        assert len(info.paths) == 4


def test_a_request_that_waited_keeps_its_data(database_url: str, customer_id: int) -> None:
    """Queued with its data, then granted: on MariaDB by the release, which
    hands it the paths and copies the data from its queue row; on SQLite by
    its own attempt."""
    with (
        PathLockManager(database_url, heartbeat=False) as first,
        PathLockManager(database_url, heartbeat=False) as second,
    ):
        holder = first.for_customer(customer_id).lock_paths("/a")
        got: list[Lease] = []
        waiter = threading.Thread(
            target=lambda: got.append(
                second.for_customer(customer_id).lock_paths(
                    "/a/b", "/c", timeout=HANG, data="waited"
                )
            )
        )
        waiter.start()
        deadline = time.monotonic() + HANG
        while not first.list_waiters(customer_id) and time.monotonic() < deadline:
            time.sleep(0.01)
        holder.release()
        waiter.join(HANG)
        (lease,) = got
        info = first.for_customer(customer_id).get_lease(lease.lease_id)
        assert info is not None
        assert info.data == "waited"
        lease.release()


@pytest.mark.parametrize(
    ("data", "error", "message"),
    [
        (b"x" * (MAX + 1), InvalidArgument, "at most 65536 bytes, got 65537"),
        ("é" * (MAX // 2) + "x", InvalidArgument, "at most 65536 bytes, got 65537"),
        ("\ud800", InvalidArgument, "surrogates"),
        (42, ArgumentTypeError, "data must be bytes or a str, got int"),
        (["a"], ArgumentTypeError, "got list"),
    ],
    ids=["bytes too long", "text too long", "lone surrogate", "int", "list"],
)
def test_bad_data_is_refused_before_anything_is_written(
    locks: CustomerLocks, data: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        locks.lock_paths("/a", data=data)  # type: ignore[arg-type]
    with pytest.raises(error, match=message):
        locks.try_lock_detached("/a", ttl=60, data=data)  # type: ignore[arg-type]
    assert locks.list_locks() == []
    assert locks.manager.list_waiters(locks.customer_id) == []


def test_a_bytearray_is_kept_as_bytes(locks: CustomerLocks) -> None:
    with locks.lock_paths("/a", data=bytearray(b"ab")) as lease:  # type: ignore[arg-type]
        info = locks.get_lease(lease.lease_id)
        assert info is not None
        assert info.data == b"ab"


def test_the_asyncio_api_carries_data_too(database_url: str, customer_id: int) -> None:

    async def main() -> None:
        async with AsyncPathLockManager(database_url) as manager:
            locks = manager.for_customer(customer_id)
            async with locks.lock_paths("/a", data=b"\x00async") as lease:
                info = await locks.get_lease(lease.lease_id)
                assert info is not None
                assert info.data == b"\x00async"
            detached = await locks.lock_detached("/b", ttl=60, data="text")
            info = await locks.get_lease(detached.lease_id)
            assert info is not None
            assert info.data == "text"
            await locks.release_detached(detached.lease_id)

    asyncio.run(main())
