"""What both APIs promise, tested once against each: the synchronous API and
the asyncio API (``api`` fixture), on every backend.

An actor is one owner: a thread of the synchronous API, a task of the asyncio
API (see ``apis.py``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine

from pathlock import (
    DeadlockDetected,
    InvalidPath,
    InvalidPathType,
    LeaseLost,
    LockTimeout,
    PathLockError,
)
from tests.integration.apis import APIS, HANG, Actor, Api, opened, skip_same_as_async
from tests.integration.test_locking import MATRIX, _rows

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(params=APIS)
def api(request: pytest.FixtureRequest, database_url: str, customer_id: int) -> Iterator[Api]:
    skip_same_as_async(request.param, database_url)
    with opened(request.param, database_url, customer_id, ttl=30.0) as api:
        yield api


@pytest.fixture
def me(api: Api) -> Actor:
    return api.actor()


@pytest.fixture
def other(api: Api) -> Actor:
    return api.actor()


def _until(condition: object, what: str) -> None:
    deadline = time.monotonic() + HANG
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.01)


@pytest.mark.parametrize(("held", "held_mode", "asked", "asked_mode", "conflicts"), MATRIX[::3])
def test_conflict_matrix(
    me: Actor,
    other: Actor,
    held: str,
    held_mode: str,
    asked: str,
    asked_mode: str,
    conflicts: bool,
) -> None:
    # Every third row of the synchronous suite's matrix (which runs it all):
    # the SQL is the same, the API around it is what differs here.
    lease = me.lock(held) if held_mode == "exclusive" else me.lock(shared=[held])
    paths, shared = ((asked,), ()) if asked_mode == "exclusive" else ((), (asked,))
    got = other.try_lock(*paths, shared=shared)
    assert (got is None) == conflicts
    if got is not None:
        other.release(got)
    me.release(lease)


def test_all_or_nothing(api: Api, me: Actor, other: Actor, raw_engine: Engine) -> None:
    lease = me.lock("/b/inner")
    assert other.try_lock("/a", "/b", "/c") is None
    assert _rows(raw_engine, api.locks.customer_id) == [("/b/inner", "exclusive")]
    me.release(lease)
    assert _rows(raw_engine, api.locks.customer_id) == []


def test_modes_and_release(api: Api, me: Actor, other: Actor, raw_engine: Engine) -> None:
    lease = me.lock("/Shared/target", shared=["/Shared/source"], reason="copy")
    assert lease.paths == (("/Shared/source", "shared"), ("/Shared/target", "exclusive"))
    reader = other.try_lock(shared=["/Shared/source"])
    assert reader is not None
    assert other.try_lock("/Shared/source/f.txt") is None
    other.release(reader)
    me.release(lease)
    me.release(lease)  # idempotent
    assert lease.released
    assert _rows(raw_engine, api.locks.customer_id) == []


def test_fencing_tokens_increase(me: Actor) -> None:
    tokens = []
    for _ in range(3):
        lease = me.lock("/a")
        tokens.append(lease.fencing_token)
        me.release(lease)
    assert tokens == sorted(tokens)
    assert len(set(tokens)) == 3


def test_a_waiter_is_granted_after_the_release(api: Api, me: Actor, other: Actor) -> None:
    holder = me.lock("/project")
    waiting = other.submit("lock", "/project/file", timeout=HANG)
    _until(lambda: len(api.list_waiters()) == 1, "the request is queued")
    assert not waiting.done()
    me.release(holder)
    lease = waiting.result(HANG)
    assert lease.fencing_token > holder.fencing_token
    other.release(lease)
    assert api.list_waiters() == []


def test_conflicting_requests_are_granted_in_queue_order(api: Api, me: Actor) -> None:
    holder = me.lock("/a")
    actors = [api.actor() for _ in range(3)]
    waiting = []
    for count, (actor, path) in enumerate(zip(actors, ["/a/x", "/a", "/a/x/y"], strict=True), 1):
        waiting.append(actor.submit("lock", path, timeout=HANG))
        _until(lambda count=count: len(api.list_waiters()) == count, f"{count} requests queued")
    me.release(holder)
    leases = []
    for actor, future in zip(actors, waiting, strict=True):
        lease = future.result(HANG)
        leases.append(lease)
        actor.release(lease)
    tokens = [lease.fencing_token for lease in leases]
    assert tokens == sorted(tokens)


def test_a_conflict_with_the_own_owner_fails_at_once(me: Actor) -> None:
    lease = me.lock("/a/b", reason="first")
    with pytest.raises(DeadlockDetected) as caught:
        me.lock("/a")
    assert caught.value.held_by[0].lease_id == lease.lease_id
    assert me.try_lock("/a") is None
    me.release(lease)


def test_release_locks_releases_only_this_owner(
    api: Api, me: Actor, other: Actor, raw_engine: Engine
) -> None:
    first = me.lock("/one")
    second = me.lock("/two", shared=["/three"])
    other.lock("/four")
    assert me.release_locks() == 3
    assert first.released
    assert second.released
    assert _rows(raw_engine, api.locks.customer_id) == [("/four", "exclusive")]
    assert me.release_locks() == 0
    assert other.release_locks() == 1


def test_a_timeout_names_the_holder(me: Actor, other: Actor) -> None:
    lease = me.lock("/a")
    started = time.monotonic()
    with pytest.raises(LockTimeout) as caught:
        other.lock("/a/b", timeout=0.3)
    assert time.monotonic() - started < HANG
    assert [held.lease_id for held in caught.value.held_by] == [lease.lease_id]
    me.release(lease)


@pytest.mark.parametrize("kind", APIS)
def test_expired_rows_never_block(database_url: str, customer_id: int, kind: str) -> None:
    skip_same_as_async(kind, database_url)
    with opened(kind, database_url, customer_id, heartbeat=False) as api:  # nothing renews
        me, other = api.actor(), api.actor()
        lease = me.lock("/short", ttl=0.2)
        time.sleep(0.3)
        assert lease.lost
        with pytest.raises(LeaseLost):
            lease.ensure_held()
        assert api.list_locks() == []
        got = other.try_lock("/short/x")
        assert got is not None
        other.release(got)


@pytest.mark.parametrize(
    ("paths", "error"),
    [
        (("relative/path",), InvalidPath),
        (("/a/../b",), InvalidPath),
        (("/a\x00b",), InvalidPath),
        ((b"/bytes",), InvalidPathType),
        ((None,), InvalidPathType),
        ((), InvalidPath),
    ],
)
def test_bad_input_is_refused_before_anything_is_written(
    api: Api, me: Actor, raw_engine: Engine, paths: tuple[object, ...], error: type[Exception]
) -> None:
    with pytest.raises(error) as caught:
        me.lock(*paths)
    assert isinstance(caught.value, PathLockError)
    assert _rows(raw_engine, api.locks.customer_id) == []
    assert api.list_waiters() == []
