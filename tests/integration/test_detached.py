"""Detached leases: locks that outlive the request, the manager and the
process that took them (a WebDAV client's lock), renewed, inspected and
released by their lease id from any manager of any process.

Against the real server, with real processes: a worker that grants one and
exits (normally, through close() at exit, and by a recycle that cleans up its
node id) leaves it held; another process renews and releases it; it conflicts
and queues as every lease does; it expires by the database's clock and is
never brought back."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading
import time
from datetime import timedelta

import pytest

from pathlock import (
    AsyncPathLockManager,
    DetachedLease,
    Hooks,
    InvalidArgument,
    LeaseInfo,
    LeaseLost,
    LockTimeout,
    PathLockManager,
    events,
)

HANG = 60.0  # seconds: only reached when something is broken

_GRANT_AND_EXIT = textwrap.dedent(
    """
    import sys
    from pathlock import PathLockManager
    url, customer, node, how = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    manager = PathLockManager(url, node_id=node, ttl=5)
    lease = manager.for_customer(customer).lock_detached(
        "/dav/report.docx", shared=["/dav/template.dotx"], ttl=300, reason="LOCK by Word"
    )
    manager.for_customer(customer).lock_paths("/dav/other")  # an ordinary one beside it
    print(lease.lease_id, lease.fencing_token, flush=True)
    if how == "close":
        manager.close()
    # "exit": the interpreter's exit closes the manager
    """
)


def _granted_by_a_process_that_exits(
    database_url: str, customer_id: int, node: str, how: str
) -> tuple[str, int]:
    done = subprocess.run(
        [sys.executable, "-c", _GRANT_AND_EXIT, database_url, str(customer_id), node, how],
        capture_output=True,
        text=True,
        timeout=HANG,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lease_id, token = done.stdout.split()
    return lease_id, int(token)


@pytest.mark.parametrize("how", ["close", "exit"])
def test_a_detached_lease_outlives_the_process_that_took_it(
    database_url: str, customer_id: int, how: str
) -> None:
    lease_id, token = _granted_by_a_process_that_exits(
        database_url, customer_id, "web-1.worker-1", how
    )
    with PathLockManager(database_url, heartbeat=False) as other:
        locks = other.for_customer(customer_id)
        held = locks.get_lease(lease_id)
        assert isinstance(held, LeaseInfo)
        assert held.detached
        assert held.paths == (
            ("/dav/report.docx", "exclusive"),
            ("/dav/template.dotx", "shared"),
        )
        assert held.fencing_token == token
        assert held.reason == "LOCK by Word"
        assert held.owner.node_id == "web-1.worker-1"
        # The ordinary lease went with its process; the detached one stays.
        assert [info.path for info in locks.list_locks()] == [
            "/dav/report.docx",
            "/dav/template.dotx",
        ]
        assert locks.try_lock_paths("/dav") is None
        assert locks.try_lock_paths("/dav/template.dotx") is None  # exclusive on a shared one
        with locks.try_lock_paths(shared=["/dav/template.dotx"]) as reader:  # type: ignore[union-attr]
            assert reader is not None
        assert locks.release_detached(lease_id) == 2
        assert locks.get_lease(lease_id) is None
        assert locks.release_detached(lease_id) == 0  # released already
        with locks.lock_paths("/dav", timeout=5):
            pass


def test_a_workers_restart_with_clean_up_spares_its_detached_leases(
    database_url: str, customer_id: int
) -> None:
    """A gunicorn worker recycled with ``cleanup_on_start`` under its stable
    node id deletes what its previous run left: its ordinary leases, not the
    detached ones that clients hold."""
    node = f"web-1.worker-{customer_id}"
    lease_id, _ = _granted_by_a_process_that_exits(database_url, customer_id, node, "close")
    with PathLockManager(database_url, heartbeat=False, node_id=node) as crashed:
        ordinary = crashed.for_customer(customer_id).lock_paths("/elsewhere")
        ordinary._mark_released()  # as if its process died: the row stays
    with PathLockManager(
        database_url, heartbeat=False, node_id=node, cleanup_on_start=True
    ) as restarted:
        locks = restarted.for_customer(customer_id)
        assert [info.path for info in locks.list_locks()] == [
            "/dav/report.docx",
            "/dav/template.dotx",
        ]
        assert restarted.release_node(node) == 0
        assert locks.get_lease(lease_id) is not None
        assert locks.release_detached(lease_id) == 2


def test_renewal_extends_by_the_database_clock_and_never_revives(
    database_url: str, customer_id: int
) -> None:
    with PathLockManager(database_url, heartbeat=False) as manager:
        locks = manager.for_customer(customer_id)
        lease = locks.lock_detached("/dav/a", ttl=0.5)
        first = locks.get_lease(lease.lease_id)
        assert first is not None
        renewed = locks.renew_detached(lease.lease_id, ttl=3600)
        assert renewed.expires_at - first.expires_at > timedelta(seconds=3000)
        shorter = locks.renew_detached(lease.lease_id, ttl=0.3)  # a refresh may shorten it
        assert shorter.expires_at < renewed.expires_at
        while locks.get_lease(lease.lease_id) is not None:
            time.sleep(0.05)
        with pytest.raises(LeaseLost, match="expired"):
            locks.renew_detached(lease.lease_id, ttl=3600)
        assert locks.get_lease(lease.lease_id) is None  # not brought back
        taken = locks.lock_paths("/dav/a", timeout=5)  # free to others meanwhile
        with pytest.raises(LeaseLost):
            locks.renew_detached(lease.lease_id, ttl=3600)
        taken.release()
        with pytest.raises(LeaseLost, match="no such lease"):
            locks.renew_detached("0" * 32, ttl=10)


def test_a_detached_lease_queues_and_waits_as_every_lease(
    database_url: str, customer_id: int
) -> None:
    with (
        PathLockManager(database_url, heartbeat=False) as first,
        PathLockManager(database_url, heartbeat=False) as second,
    ):
        holder = first.for_customer(customer_id).lock_paths("/dav/folder")
        got: list[DetachedLease] = []
        waiter = threading.Thread(
            target=lambda: got.append(
                second.for_customer(customer_id).lock_detached(
                    "/dav/folder/file", ttl=60, timeout=HANG
                )
            )
        )
        waiter.start()
        deadline = time.monotonic() + HANG
        while not first.list_waiters(customer_id) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [w.paths for w in first.list_waiters(customer_id)] == [
            (("/dav/folder/file", "exclusive"),)
        ]
        # A later request queues behind it: first come, first served.
        with pytest.raises(LockTimeout) as later:
            first.for_customer(customer_id).lock_paths(
                "/dav/folder/file", timeout=0.3, owner="another request"
            )
        assert later.value.queued_behind
        holder.release()
        waiter.join(HANG)
        (lease,) = got
        assert lease.fencing_token > holder.fencing_token
        # Handed over by the release: its ttl taken up by its grant, not cut
        # short to the hand-over's term.
        info = second.for_customer(customer_id).get_lease(lease.lease_id)
        assert info is not None
        assert (info.expires_at - info.created_at).total_seconds() > 50
        assert first.for_customer(customer_id).release_detached(lease.lease_id) == 1


def test_each_detached_lease_is_an_owner_of_its_own(database_url: str, customer_id: int) -> None:
    """One caller's two overlapping detached leases conflict (two WebDAV
    clients of one user); a detached lease never makes its caller's own
    request a deadlock, nor does release_locks() release it."""
    with PathLockManager(database_url, heartbeat=False) as manager:
        locks = manager.for_customer(customer_id)
        lease = locks.lock_detached("/dav/a", ttl=60)
        assert locks.try_lock_detached("/dav/a/b", ttl=60) is None
        with pytest.raises(LockTimeout):
            # Waits (and times out): not a request that waits for itself.
            locks.lock_paths("/dav", timeout=0.2)
        assert locks.release_locks() == 0
        assert locks.get_lease(lease.lease_id) is not None
        mine = locks.lock_paths("/other")
        # Nor does it wait for its caller's locks as its own.
        with pytest.raises(LockTimeout):
            locks.lock_detached("/other/x", ttl=60, timeout=0.2)
        mine.release()
        assert locks.release_detached(lease.lease_id) == 1


def test_by_id_only_detached_leases_are_renewed_or_released(
    database_url: str, customer_id: int
) -> None:
    with PathLockManager(database_url, heartbeat=False) as manager:
        locks = manager.for_customer(customer_id)
        with locks.lock_paths("/held") as held:
            with pytest.raises(InvalidArgument, match="not detached"):
                locks.release_detached(held.lease_id)
            with pytest.raises(InvalidArgument, match="not detached"):
                locks.renew_detached(held.lease_id, ttl=60)
            info = locks.get_lease(held.lease_id)
            assert info is not None
            assert not info.detached
            assert info.owner == held.owner
            # Another customer's lease is not this customer's.
            assert manager.for_customer(customer_id + 1).get_lease(held.lease_id) is None
        for bad in ("", "XYZ", "0" * 31, "g" * 32):
            with pytest.raises(InvalidArgument):
                locks.get_lease(bad)
        with pytest.raises(InvalidArgument, match="ttl"):
            locks.lock_detached("/a", ttl=0)
        with pytest.raises(TypeError):
            locks.lock_detached("/a")  # type: ignore[call-arg]  # ttl is required
        assert locks.list_locks() == []


def test_hooks_hear_of_detached_grants_renewals_and_releases(
    database_url: str, customer_id: int
) -> None:
    heard: list[object] = []

    class Heard(Hooks):
        def lock_granted(self, event: events.Granted) -> None:
            heard.append(event)

        def leases_renewed(self, event: events.Renewed) -> None:
            heard.append(event)

        def lease_released(self, event: events.Released) -> None:
            heard.append(event)

    with PathLockManager(database_url, heartbeat=False, hooks=[Heard()]) as manager:
        locks = manager.for_customer(customer_id)
        lease = locks.lock_detached("/dav/a", ttl=60)
        locks.renew_detached(lease.lease_id, ttl=60)
        locks.release_detached(lease.lease_id)
    granted, renewed, released = heard
    assert isinstance(granted, events.Granted)
    assert granted.lease_id == lease.lease_id
    assert granted.owner.detached
    assert isinstance(renewed, events.Renewed)
    assert (renewed.leases, renewed.gone, renewed.background) == (1, 0, False)
    assert isinstance(released, events.Released)
    assert released.paths == (("/dav/a", "exclusive"),)
    assert released.held >= 0


def test_the_asyncio_api_takes_renews_and_releases_detached_leases(
    database_url: str, customer_id: int
) -> None:

    async def main() -> None:
        async with AsyncPathLockManager(database_url) as manager:
            locks = manager.for_customer(customer_id)
            lease = await locks.lock_detached("/dav/a", shared=["/dav/b"], ttl=60)
            assert await locks.try_lock_detached("/dav", ttl=60) is None
            info = await locks.get_lease(lease.lease_id)
            assert info is not None
            assert info.detached
            renewed = await locks.renew_detached(lease.lease_id, ttl=600)
            assert renewed.expires_at > info.expires_at
            # A request cancelled while it waits leaves nothing held.
            waiting = asyncio.ensure_future(locks.lock_detached("/dav", ttl=60, timeout=HANG))
            await asyncio.sleep(0.3)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            assert await locks.release_detached(lease.lease_id) == 2
            assert await locks.list_locks() == []
            assert await manager.list_waiters(customer_id) == []
        # Nor does the asyncio manager's close release one.
        async with AsyncPathLockManager(database_url) as manager:
            lease = await manager.for_customer(customer_id).lock_detached("/dav/kept", ttl=60)
        async with AsyncPathLockManager(database_url) as manager:
            locks = manager.for_customer(customer_id)
            assert await locks.get_lease(lease.lease_id) is not None
            assert await locks.release_detached(lease.lease_id) == 1

    asyncio.run(main())


def test_a_detached_grant_interrupted_on_its_way_out_leaves_nothing(
    database_url: str, customer_id: int
) -> None:
    """Granted, then interrupted before the caller has it (here in a hook;
    Ctrl-C may strike there too): nobody knows its lease id, so nobody would
    release it before its ttl. Its rows go at once."""

    class Interrupting(Hooks):
        def lock_granted(self, event: events.Granted) -> None:  # noqa: ARG002
            raise KeyboardInterrupt

    with PathLockManager(database_url, heartbeat=False, hooks=[Interrupting()]) as manager:
        with pytest.raises(KeyboardInterrupt):
            manager.for_customer(customer_id).lock_detached("/dav/a", ttl=3600)
        assert manager.list_locks(customer_id, include_expired=True) == []


def test_an_asyncio_caller_cancelled_as_its_detached_lease_is_granted_leaves_nothing(
    database_url: str, customer_id: int
) -> None:
    """The caller is cancelled while the grant comes back (here by a hook of
    the grant): nobody will have the lease id, so the manager releases it."""
    callers: list[asyncio.Task[object]] = []

    class CancelTheCaller(Hooks):
        def lock_granted(self, event: events.Granted) -> None:  # noqa: ARG002
            callers[0].cancel()

    async def main() -> None:
        async with AsyncPathLockManager(database_url, hooks=[CancelTheCaller()]) as manager:
            locks = manager.for_customer(customer_id)
            caller = asyncio.ensure_future(locks.lock_detached("/dav/a", ttl=3600))
            callers.append(caller)  # type: ignore[arg-type]
            with pytest.raises(asyncio.CancelledError):
                await caller
            assert await locks.list_locks() == []

    asyncio.run(main())


def test_a_release_by_id_interrupted_still_releases_soon(
    database_url: str, customer_id: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C (or any failure) in the middle of release_detached: whether its
    DELETE landed is unknown, and the lease would otherwise stay until its
    timeout, an hour here. The manager deletes its rows from the background
    within seconds."""
    from pathlock._releasing import Releases  # noqa: PLC0415 - the seam interrupted

    with PathLockManager(database_url, heartbeat=False) as manager:
        locks = manager.for_customer(customer_id)
        lease = locks.lock_detached("/dav/a", ttl=3600)

        def interrupted(*_args: object, **_kwargs: object) -> None:
            raise KeyboardInterrupt

        monkeypatch.setattr(Releases, "release", interrupted)
        with pytest.raises(KeyboardInterrupt):
            locks.release_detached(lease.lease_id)
        monkeypatch.undo()
        deadline = time.monotonic() + HANG
        while locks.get_lease(lease.lease_id) is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert locks.get_lease(lease.lease_id) is None
        assert locks.try_lock_paths("/dav") is not None
        locks.release_locks()
