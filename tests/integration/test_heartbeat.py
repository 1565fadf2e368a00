"""Leases stay alive while held, and say so when they are not."""

from __future__ import annotations

import re
import threading
import time
from datetime import UTC, datetime

import pytest
from sqlalchemy import Engine, func, make_url, select, text

from pathlock import CustomerLocks, Lease, LeaseLost, PathLockManager
from pathlock.schema import path_locks
from tests.integration.conftest import TcpProxy


def _delete_rows(engine: Engine, lease: Lease) -> None:
    with engine.begin() as connection:
        connection.execute(
            text("DELETE FROM path_locks WHERE lease_id = :l"), {"l": lease.lease_id}
        )


def _expires_at(engine: Engine, lease: Lease) -> datetime:
    """When the lease's rows expire, read independently of pathlock."""
    with engine.connect() as connection:
        expires_at = connection.execute(
            select(func.min(path_locks.c.expires_at)).where(path_locks.c.lease_id == lease.lease_id)
        ).scalar_one()
    return expires_at.replace(tzinfo=UTC)


def _expires_in(engine: Engine, lease: Lease) -> float:
    """Seconds until the lease's rows expire. Both backends run on this host,
    so its clock is the database's."""
    return (_expires_at(engine, lease) - datetime.now(UTC)).total_seconds()


def test_renewal_keeps_a_lease_alive_past_several_ttls(
    database_url: str, customer_id: int, raw_engine: Engine
) -> None:
    with PathLockManager(database_url, ttl=1.0) as manager:
        locks = manager.for_customer(customer_id)
        with locks.lock_paths("/long/job") as lease:
            time.sleep(3.5)
            lease.ensure_held()
            assert not lease.lost
            assert _expires_in(raw_engine, lease) > 0
            other = _in_thread(lambda: locks.try_lock_paths("/long"))
            assert other is None


def test_lease_deleted_behind_its_back_is_reported_lost(
    database_url: str, customer_id: int, raw_engine: Engine
) -> None:
    lost: list[Lease] = []
    told = threading.Event()

    def on_lost(lease: Lease) -> None:
        lost.append(lease)
        told.set()

    manager_told: list[Lease] = []
    with PathLockManager(database_url, ttl=1.5, on_lost=manager_told.append) as manager:
        locks = manager.for_customer(customer_id)
        held: list[Lease] = []

        def hold() -> None:
            with locks.lock_paths("/doomed", on_lost=on_lost) as lease:
                held.append(lease)
                _delete_rows(raw_engine, lease)
                assert told.wait(10), "the heartbeat should notice within a renewal period"
                assert lease.lost
                with pytest.raises(LeaseLost):
                    lease.ensure_held()

        with pytest.raises(LeaseLost, match="gone"):  # leaving the block says so
            hold()
        (lease,) = held
        assert lost == [lease]
        assert manager_told == [lease]


def test_a_block_that_raised_keeps_its_own_error(
    database_url: str, customer_id: int, raw_engine: Engine
) -> None:
    with PathLockManager(database_url, ttl=30) as manager:
        locks = manager.for_customer(customer_id)

        def fail_while_holding() -> None:
            with locks.lock_paths("/x") as lease:
                _delete_rows(raw_engine, lease)
                with pytest.raises(LeaseLost):
                    lease.renew()
                raise KeyError("the block's own failure")

        with pytest.raises(KeyError):
            fail_while_holding()


def test_explicit_renew_extends_and_never_resurrects(
    database_url: str, customer_id: int, raw_engine: Engine
) -> None:
    with PathLockManager(database_url, ttl=30, heartbeat=False) as manager:
        locks = manager.for_customer(customer_id)
        lease = locks.lock_paths("/a", ttl=2)
        granted_until = _expires_at(raw_engine, lease)
        time.sleep(0.5)
        lease.renew()
        # Extended to a full ttl from the renewal, which came at least 0.5 s
        # after the grant (by the database's clock, whatever the machine's load).
        assert (_expires_at(raw_engine, lease) - granted_until).total_seconds() >= 0.5
        lease.release()

        short = locks.lock_paths("/b", ttl=0.3)
        time.sleep(0.5)
        with pytest.raises(LeaseLost):
            short.renew()
        # The expired row was not extended: someone else may hold /b by now.
        assert _expires_in(raw_engine, short) < 0


def test_unreachable_database_loses_the_lease_before_anyone_else_gets_it(
    mariadb_url: str, customer_id: int, proxy: TcpProxy
) -> None:
    through_proxy = make_url(mariadb_url).set(host="127.0.0.1", port=proxy.port)
    lost_at: list[float] = []
    holder = PathLockManager(
        through_proxy,
        ttl=2.0,
        node_id="partitioned",
        max_attempts=2,
        on_lost=lambda _lease: lost_at.append(time.monotonic()),
    )
    with PathLockManager(mariadb_url, ttl=2.0, node_id="healthy") as other:
        lease = holder.for_customer(customer_id).lock_paths("/contested")
        proxy.cut()
        locks = other.for_customer(customer_id)
        deadline = time.monotonic() + 20
        granted = None
        while granted is None and time.monotonic() < deadline:
            granted = locks.try_lock_paths("/contested")
            if granted is None:
                time.sleep(0.01)
        granted_at = time.monotonic()
        assert granted is not None, "the partitioned holder's lease should expire"
        granted.release()
    assert lost_at, "the holder was never told"
    assert lost_at[0] < granted_at, "the holder must hear of the loss before anyone is granted"
    assert lease.lost
    # The renewals ran, and got a refusal: the reason quotes it.
    with pytest.raises(LeaseLost, match=r"not renewed for .*: its last renewal, .* ago, did not"):
        lease.ensure_held()
    holder.close()


def test_a_renewal_the_database_never_answers_is_the_reason_of_the_loss(
    mariadb_url: str, customer_id: int, proxy: TcpProxy
) -> None:
    """The reason was "not renewed for 2.7 s (database unreachable?)", the
    same whatever happened; now it says what was measured: the renewal went
    out and got no answer."""
    lost = threading.Event()
    with PathLockManager(
        make_url(mariadb_url).set(host="127.0.0.1", port=proxy.port),
        ttl=3.0,
        node_id="frozen",
        on_lost=lambda _lease: lost.set(),
    ) as holder:
        lease = holder.for_customer(customer_id).lock_paths("/frozen")
        proxy.freeze()  # the connection stays open; nothing gets through
        assert lost.wait(15), "the holder was never told"
        with pytest.raises(LeaseLost) as error:
            lease.ensure_held()
    assert re.fullmatch(
        r"not renewed for \d+\.\d s: the database has not answered its renewal sent "
        r"\d+\.\d s ago; it may have expired, so it counts as lost",
        error.value.reason,
    ), error.value.reason


def _in_thread(function: object) -> object:
    result: list[object] = []
    thread = threading.Thread(target=lambda: result.append(function()))  # type: ignore[operator]
    thread.start()
    thread.join()
    return result[0]


def test_close_stops_the_heartbeat(database_url: str, locks: CustomerLocks) -> None:
    manager = PathLockManager(database_url, ttl=1.0)
    manager.for_customer(locks.customer_id).lock_paths("/x")
    names = {thread.name for thread in threading.enumerate()}
    assert any(name.startswith("pathlock-heartbeat") for name in names)
    manager.close()
    time.sleep(0.1)
    assert not any(
        thread.name.startswith("pathlock-heartbeat") and thread.is_alive()
        for thread in threading.enumerate()
        if thread.name.endswith(manager.node_id)
    )
