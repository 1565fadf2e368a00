"""Isolation and authority: customers never meet, and only a lease's own id
releases or renews its rows.

Customers are tenants: every query of pathlock is by customer id, so one
customer's locks can never block another's, not even locks on the root. A
lease id is a 128-bit random token (``secrets``); release and renewal name it
in their WHERE clauses, so a stale ``Lease`` object cannot touch the rows of
the lease that succeeded it, and an operator releases a lease only by its
exact id (and is logged doing so: see ``test_cli.py``).
"""

from __future__ import annotations

import multiprocessing
import re
import secrets
import time
from typing import Any

import pytest
from sqlalchemy import Engine, text

from pathlock import (
    ArgumentTypeError,
    CustomerLocks,
    InvalidArgument,
    LeaseLost,
    PathLockManager,
)
from tests.integration import queue_worker

pytestmark = pytest.mark.timeout(120)

HANG = 60.0


def _expires_at(engine: Engine, lease_id: str) -> list[object]:
    with engine.connect() as connection:
        rows = connection.execute(
            text("SELECT expires_at FROM path_locks WHERE lease_id = :l ORDER BY path"),
            {"l": lease_id},
        ).scalars()
        return list(rows)


def test_customers_never_block_each_other_across_processes(database_url: str) -> None:
    # Each process try-locks the root of its own customer, over and over, all
    # at once: a lock of one tenant that blocked another would show up as a
    # refused try-lock.
    context = multiprocessing.get_context("spawn")
    events: Any = context.Queue()
    processes_count, rounds = 4, 150
    start = context.Barrier(processes_count)
    first = secrets.randbelow(2**62) + 1
    processes = [
        context.Process(
            target=queue_worker.own_customer,
            args=(database_url, first + n, rounds, start, events),
            daemon=True,
        )
        for n in range(processes_count)
    ]
    for process in processes:
        process.start()
    try:
        results = [events.get(timeout=HANG) for _ in processes]
    finally:
        for process in processes:
            process.join(HANG)
            if process.is_alive():
                process.kill()
    assert [kind for kind, *_ in results] == ["done"] * processes_count, results
    assert [(int(granted), int(refused)) for _, granted, refused in results] == [
        (rounds, 0)
    ] * processes_count


def test_a_stale_lease_cannot_release_or_renew_its_successors_rows(
    database_url: str, customer_id: int, raw_engine: Engine
) -> None:
    with PathLockManager(database_url, heartbeat=False) as manager:
        locks = manager.for_customer(customer_id)
        stale = locks.lock_paths("/a", ttl=0.3)
        time.sleep(0.6)  # expired in database time: /a is free
        successor = locks.lock_paths("/a/b", ttl=30)
        before = _expires_at(raw_engine, successor.lease_id)

        with pytest.raises(LeaseLost):
            stale.renew()
        stale.release()  # deletes the stale rows only

        assert [info.lease_id for info in locks.list_locks()] == [successor.lease_id]
        assert _expires_at(raw_engine, successor.lease_id) == before
        assert locks.try_lock_paths("/a") is None  # still held by the successor
        successor.release()


def test_lease_ids_are_unguessable_tokens(locks: CustomerLocks) -> None:
    ids = set()
    for n in range(200):
        lease = locks.lock_paths(f"/t/{n}")
        assert re.fullmatch(r"[0-9a-f]{32}", lease.lease_id)
        ids.add(lease.lease_id)
        lease.release()
    assert len(ids) == 200
    # 128 random bits: no two of 200 share even their first 8 hex digits by design
    # of the test's odds (about 5e-6), and the digits are spread over all 16 values.
    assert len({lease_id[:8] for lease_id in ids}) == 200
    assert set("".join(ids)) == set("0123456789abcdef")


def test_only_the_exact_lease_id_releases_a_lease(
    manager: PathLockManager, locks: CustomerLocks
) -> None:
    lease = locks.lock_paths("/held")
    near_miss = lease.lease_id[:-1] + ("0" if lease.lease_id[-1] != "0" else "1")
    assert manager.release_lease(near_miss, requested_by="test") == 0
    assert manager.release_lease(secrets.token_hex(16), requested_by="test") == 0
    for malformed in (lease.lease_id.upper(), lease.lease_id + " ", "%", "' OR '1'='1"):
        with pytest.raises(InvalidArgument):
            manager.release_lease(malformed, requested_by="test")
    assert [info.lease_id for info in locks.list_locks()] == [lease.lease_id]
    assert manager.release_lease(lease.lease_id, requested_by="test") == 1
    assert locks.list_locks() == []


def test_requested_by_is_named_in_its_errors(manager: PathLockManager) -> None:
    lease_id = secrets.token_hex(16)
    with pytest.raises(InvalidArgument, match="requested_by is longer than 1000"):
        manager.release_lease(lease_id, requested_by="x" * 1001)
    with pytest.raises(ArgumentTypeError, match="requested_by must be a str"):
        manager.release_node("web-1", requested_by=5)  # type: ignore[arg-type]
