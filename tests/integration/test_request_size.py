"""Requests at the size limits, on every backend (issue 14).

- The largest request allowed (1,000 paths, 100,000 characters, with the
  characters and depths that cost the most bytes) is granted and released,
  and blocks what it must; blocked, it is queued and reported like any other.
- One path or one character more raises :class:`RequestTooLarge` before
  anything is written.
- Paths of 2,000 components work: five of them were a 20 MB statement,
  refused by MariaDB's 16 MiB packet limit (a ``BackendError`` after a
  "server has gone away" retry).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text

from pathlock import LockTimeout, PathLockManager, RequestTooLarge
from pathlock.paths import MAX_REQUEST_CHARACTERS, MAX_REQUEST_PATHS

EMOJI = "\U0001f600"
# 1,000 paths of 100 characters: one-character components of four bytes each.
WIDE = [f"/{n:03d}" + f"/{EMOJI}" * 48 for n in range(MAX_REQUEST_PATHS)]
# 25 paths of 4,000 characters, 2,000 components each.
DEEP = [f"/{n:02d}" + f"/{EMOJI}" * 1998 for n in range(25)]


@pytest.fixture
def holder(database_url: str) -> Iterator[PathLockManager]:
    with PathLockManager(database_url, node_id=f"size-{secrets.token_hex(4)}") as manager:
        yield manager


@pytest.fixture
def prober(database_url: str) -> Iterator[PathLockManager]:
    """Another owner on the same database."""
    with PathLockManager(database_url, node_id=f"probe-{secrets.token_hex(4)}") as manager:
        yield manager


def _rows(engine: Engine, customer_id: int) -> dict[str, int]:
    with engine.connect() as connection:
        return {
            table: connection.execute(
                text(f"SELECT COUNT(*) FROM {table} WHERE customer_id = :c"), {"c": customer_id}
            ).scalar_one()
            for table in ("customer_locks", "path_locks", "path_lock_waiters")
        }


@pytest.mark.parametrize("paths", [WIDE, DEEP], ids=["1000-paths", "25-deep-paths"])
@pytest.mark.parametrize("shared", [False, True], ids=["exclusive", "shared"])
def test_the_largest_request_is_granted_and_released(
    holder: PathLockManager,
    prober: PathLockManager,
    raw_engine: Engine,
    customer_id: int,
    paths: list[str],
    shared: bool,
) -> None:
    assert sum(map(len, paths)) <= MAX_REQUEST_CHARACTERS
    locks = holder.for_customer(customer_id)
    other = prober.for_customer(customer_id)
    lease = locks.try_lock_paths(shared=paths) if shared else locks.try_lock_paths(*paths)
    assert lease is not None
    assert _rows(raw_engine, customer_id)["path_locks"] == len(paths)
    last = paths[-1]
    # An ancestor deep down, a descendant (of the shorter paths) and the
    # path itself are all blocked for an exclusive request.
    probes = [last.rsplit("/", 1)[0], last]
    if len(last) < 3990:
        probes.append(last + "/x")
    for probe in probes:
        assert other.try_lock_paths(probe) is None, probe[:40]
    # A sibling deep down is not.
    sibling = other.try_lock_paths(last.rsplit("/", 1)[0] + "/x")
    assert sibling is not None
    sibling.release()
    lease.release()
    assert _rows(raw_engine, customer_id)["path_locks"] == 0


def test_the_largest_request_is_queued_and_reports_its_blocker(
    holder: PathLockManager, prober: PathLockManager, raw_engine: Engine, customer_id: int
) -> None:
    blocker = prober.for_customer(customer_id).lock_paths(WIDE[-1])
    # The timeout bounds the whole call, the first compilation of a statement
    # for 1,000 paths included (a second or more of client CPU): it must leave
    # room for the denied attempt to read its blockers.
    with pytest.raises(LockTimeout) as raised:
        holder.for_customer(customer_id).lock_paths(*WIDE, timeout=5)
    assert [info.path for info in raised.value.held_by] == [WIDE[-1]]
    blocker.release()
    # A request whose time ran out before it could leave the queue (a slow
    # machine spends it on the 1,000 paths) has its row deleted from the
    # background: soon, and before the row would have lapsed.
    ends = time.monotonic() + holder.settings.waiter_ttl
    while _rows(raw_engine, customer_id)["path_lock_waiters"] and time.monotonic() < ends:
        time.sleep(0.05)
    assert _rows(raw_engine, customer_id) == {
        "customer_locks": 1,
        "path_locks": 0,
        "path_lock_waiters": 0,
    }


@pytest.mark.parametrize(
    "paths",
    [
        [f"/p{n}" for n in range(MAX_REQUEST_PATHS + 1)],
        # 25 paths of 4,000 characters and the root: 100,001 characters.
        [*(f"/{n:02d}" + "/x" * 1998 + "x" for n in range(25)), "/"],
    ],
    ids=["1001-paths", "100001-characters"],
)
def test_one_over_the_limit_is_refused_with_nothing_written(
    holder: PathLockManager, raw_engine: Engine, customer_id: int, paths: list[str]
) -> None:
    with pytest.raises(RequestTooLarge):
        holder.for_customer(customer_id).lock_paths(*paths, timeout=0)
    with pytest.raises(RequestTooLarge):
        holder.for_customer(customer_id).try_lock_paths(shared=paths)
    assert _rows(raw_engine, customer_id) == {
        "customer_locks": 0,
        "path_locks": 0,
        "path_lock_waiters": 0,
    }


def test_paths_of_2000_components(
    holder: PathLockManager, prober: PathLockManager, customer_id: int
) -> None:
    paths = [f"/{n}" + "/a" * 1998 for n in range(5)]
    # Nothing is in the way; the time is for a loaded machine (timeout=0
    # gave the first grant of five such paths 0.5 s in all, and a CI run
    # under load ran out of it).
    lease = holder.for_customer(customer_id).lock_paths(*paths, timeout=10)
    other = prober.for_customer(customer_id)
    assert other.try_lock_paths(paths[2][:2002]) is None  # an ancestor, 1,000 deep
    assert other.try_lock_paths(shared=[paths[4]]) is None
    lease.release()
    again = other.try_lock_paths(paths[2][:2002], shared=[paths[4]])
    assert again is not None
    again.release()
