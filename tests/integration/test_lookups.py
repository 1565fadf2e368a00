"""Lookups of the locks around one path (what a WebDAV server asks at every
request: is this resource locked, by a lock on it or on a folder above it,
and what is locked below it), each one indexed query however many locks the
customer holds."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, text

from pathlock import (
    ArgumentTypeError,
    AsyncPathLockManager,
    CustomerLocks,
    InvalidPath,
    Lease,
    PathLockManager,
)

_HELD = ("/a", "/a/b", "/a/b/c", "/a/bc", "/a/b%", "/x", "/")


@pytest.fixture
def held(locks: CustomerLocks) -> Iterator[dict[str, Lease]]:
    """One shared lock on each of ``_HELD``, every one its own lease."""
    leases = {path: locks.lock_paths(shared=[path], timeout=5) for path in _HELD}
    yield leases
    for lease in leases.values():
        lease.release()


def _paths(found: list[object]) -> list[str]:
    return [info.path for info in found]  # type: ignore[attr-defined]


def test_the_locks_on_a_path_and_around_it(locks: CustomerLocks, held: dict[str, Lease]) -> None:
    assert _paths(locks.locks_on("/a/b")) == ["/", "/a", "/a/b"]
    assert _paths(locks.locks_on("/a/b", ancestors=False)) == ["/a/b"]
    # Below /a/b: /a/b/c, not /a/bc nor /a/b% (which only share its spelling).
    assert _paths(locks.locks_on("/a/b", descendants=True)) == ["/", "/a", "/a/b", "/a/b/c"]
    assert _paths(locks.locks_on("/a/b", ancestors=False, descendants=True)) == [
        "/a/b",
        "/a/b/c",
    ]
    assert _paths(locks.locks_on("/a/b/c/d/e")) == ["/", "/a", "/a/b", "/a/b/c"]
    assert _paths(locks.locks_on("/", descendants=True)) == sorted(_HELD)
    assert _paths(locks.locks_on("/nothing", ancestors=False)) == []
    (on_x,) = locks.locks_on("/x", ancestors=False)
    assert on_x.lease_id == held["/x"].lease_id
    assert on_x.mode == "shared"
    assert on_x.owner == held["/x"].owner


def test_a_lookup_normalizes_its_path_and_checks_its_arguments(
    locks: CustomerLocks, held: dict[str, Lease]
) -> None:
    assert _paths(locks.locks_on("//a//b/", ancestors=False)) == ["/a/b"]
    with pytest.raises(InvalidPath):
        locks.locks_on("a/b")
    with pytest.raises(InvalidPath):
        locks.locks_on("/a/../b")
    with pytest.raises(ArgumentTypeError, match="descendants must be a bool"):
        locks.locks_on("/a", descendants=1)  # type: ignore[arg-type]
    assert held


def test_expired_locks_only_when_asked_for(database_url: str, customer_id: int) -> None:
    with PathLockManager(database_url, heartbeat=False) as manager:
        locks = manager.for_customer(customer_id)
        lease = locks.lock_detached("/dav/a", ttl=0.05)
        while locks.locks_on("/dav/a"):
            pass
        (expired,) = locks.locks_on("/dav/a", include_expired=True)
        assert expired.lease_id == lease.lease_id
        locks.release_detached(lease.lease_id)


def test_a_case_insensitive_manager_looks_up_folded_paths(
    database_url: str, customer_id: int
) -> None:
    with PathLockManager(database_url, heartbeat=False, case_insensitive=True) as manager:
        locks = manager.for_customer(customer_id)
        with locks.lock_paths("/Shared/Docs"):
            assert _paths(locks.locks_on("/SHARED/docs/x")) == ["/shared/docs"]


def test_a_lookup_reads_the_index_not_the_customer(mariadb_url: str, customer_id: int) -> None:
    """3,000 live locks of the customer; a lookup reads a few index entries
    (the server's own count of rows read, around the call)."""
    engine = create_engine(mariadb_url)

    def rows_read() -> int:
        with engine.connect() as connection:
            status = connection.execute(text("SHOW GLOBAL STATUS LIKE 'Handler_read%'")).all()
        return sum(int(value) for _, value in status)

    try:
        with PathLockManager(mariadb_url, heartbeat=False) as manager:
            locks = manager.for_customer(customer_id)
            bulk = [
                locks.lock_paths(shared=[f"/bulk{group}/{n}" for n in range(1000)], timeout=30)
                for group in range(3)
            ]
            target = locks.lock_paths(shared=["/bulk1/500/inside"])
            locks.locks_on("/bulk1/500")  # warm: connection and statement
            before = rows_read()
            found = locks.locks_on("/bulk1/500", descendants=True)
            read = rows_read() - before
            assert _paths(found) == ["/bulk1/500", "/bulk1/500/inside"]
            assert read < 300, f"{read} rows read for a lookup among 3,001 locks"
            target.release()
            for lease in bulk:
                lease.release()
    finally:
        engine.dispose()


def test_the_asyncio_api_looks_up_locks_too(database_url: str, customer_id: int) -> None:

    async def main() -> None:
        async with AsyncPathLockManager(database_url) as manager:
            locks = manager.for_customer(customer_id)
            async with locks.lock_paths("/a/b"):
                found = await locks.locks_on("/a", ancestors=False, descendants=True)
                assert _paths(found) == ["/a/b"]

    asyncio.run(main())
