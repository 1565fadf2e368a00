"""Unit tests of the queue rules (pure: no database)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from pathlock._core.fairness import Locked, deadlock_party, requests_conflict, waiters_ahead
from pathlock.types import EXCLUSIVE, SHARED, LockInfo, Mode, Owner, WaiterInfo

NOW = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
ME = Owner("web-1", 1, "1")
OTHER = Owner("web-2", 2, "2")


def _waiter(ticket: int, *paths: Locked, owner: Owner = OTHER) -> WaiterInfo:
    return WaiterInfo(
        customer_id=1,
        ticket=ticket,
        paths=tuple((path, mode) for path, mode, _ in paths),
        lease_id=f"{ticket:032x}",
        owner=owner,
        reason="",
        created_at=NOW,
        expires_at=NOW + timedelta(seconds=5),
        shallow=frozenset(path for path, _, shallow in paths if shallow),
    )


def _paths(waiter: WaiterInfo) -> list[Locked]:
    return [(path, mode, path in waiter.shallow) for path, mode in waiter.paths]


def _lock(path: str, owner: Owner, mode: Mode = EXCLUSIVE) -> LockInfo:
    return LockInfo(
        customer_id=1,
        path=path,
        mode=mode,
        lease_id="0" * 32,
        owner=owner,
        reason="",
        fencing_token=1,
        created_at=NOW,
        expires_at=NOW + timedelta(seconds=30),
    )


def x(path: str, *, shallow: bool = False) -> Locked:
    return (path, EXCLUSIVE, shallow)


def s(path: str, *, shallow: bool = False) -> Locked:
    return (path, SHARED, shallow)


def test_requests_conflict_by_any_pair() -> None:
    assert requests_conflict([x("/a"), s("/b")], [s("/c"), s("/b/c")]) is False
    assert requests_conflict([x("/a"), s("/b")], [s("/c"), x("/b/c")]) is True
    assert requests_conflict([], [x("/")]) is False


def test_a_path_at_depth_0_meets_its_own_path_and_covering_ancestors_only() -> None:
    assert requests_conflict([x("/a", shallow=True)], [x("/a/b")]) is False
    assert requests_conflict([x("/a/b")], [x("/a", shallow=True)]) is False
    assert requests_conflict([x("/a", shallow=True)], [s("/a", shallow=True)]) is True
    assert requests_conflict([s("/a", shallow=True)], [s("/a", shallow=True)]) is False
    assert requests_conflict([x("/a/b", shallow=True)], [x("/a")]) is True
    assert requests_conflict([x("/a/b", shallow=True)], [x("/", shallow=True)]) is False
    assert requests_conflict([x("/", shallow=True)], [x("/")]) is True


def test_a_waiter_for_a_depth_0_lock_below_the_owners_is_not_passed_over() -> None:
    # The waiter wants /a/x alone; the owner holds /a at depth 0, which does
    # not reach it: the waiter does not wait for the owner, so it is ahead.
    waiter = _waiter(1, x("/a/x/y", shallow=True))
    ahead = waiters_ahead([x("/a/x")], [waiter], owner_locks=[x("/a", shallow=True)])
    assert ahead == [waiter]
    # With /a on its subtree, it waits for the owner: passed over.
    assert waiters_ahead([x("/a/x")], [waiter], owner_locks=[x("/a")]) == []


def test_conflicting_earlier_waiters_are_ahead_in_ticket_order() -> None:
    earlier = [_waiter(9, x("/a/b")), _waiter(3, s("/a")), _waiter(5, x("/c"))]
    ahead = waiters_ahead([x("/a")], earlier, owner_locks=[])
    assert [w.ticket for w in ahead] == [3, 9]
    # A shared request is only held back by the exclusive one.
    assert [w.ticket for w in waiters_ahead([s("/a")], earlier, [])] == [9]


def test_a_waiter_that_waits_for_the_owners_locks_is_passed_over() -> None:
    waits_for_me = _waiter(1, x("/a"))
    ahead = waiters_ahead([x("/a/y")], [waits_for_me], owner_locks=[x("/a/x")])
    assert ahead == []


def test_a_waiter_queued_behind_one_that_waits_for_the_owner_is_passed_over_too() -> None:
    waits_for_me = _waiter(1, x("/a"))
    behind_it = _waiter(2, x("/a/q"))  # conflicts with ticket 1, not with /a/x
    unrelated = _waiter(3, x("/a/q/r/s"))  # conflicts with 2, but 2 is passed over
    independent = _waiter(4, x("/b"))
    ahead = waiters_ahead(
        [x("/a/q/r"), x("/b/c")],
        [waits_for_me, behind_it, unrelated, independent],
        owner_locks=[x("/a/x")],
    )
    assert [w.ticket for w in ahead] == [4]


def test_an_older_waiter_is_not_passed_over_because_of_a_younger_one() -> None:
    # Ticket 1 came first; ticket 2 waiting for the owner says nothing about it.
    older = _waiter(1, x("/a/q"))
    younger = _waiter(2, x("/a"))
    ahead = waiters_ahead([x("/a/q/r")], [younger, older], owner_locks=[x("/a/x")])
    assert [w.ticket for w in ahead] == [1]


def test_a_cycle_of_two_owners_is_found() -> None:
    # OTHER holds /x (blocks us) and is queued for /y, which we hold.
    blockers = [_lock("/x", OTHER)]
    party = _waiter(4, x("/y"), owner=OTHER)
    assert deadlock_party(ME, blockers, [party], owner_locks=[x("/y")]) == party


def test_no_cycle_when_the_holder_waits_for_something_else() -> None:
    blockers = [_lock("/x", OTHER)]
    queued = [_waiter(4, x("/z"), owner=OTHER), _waiter(5, x("/y"), owner=Owner("n", 3, "3"))]
    assert deadlock_party(ME, blockers, queued, owner_locks=[x("/y")]) is None
    # Shared + shared is no conflict, so no cycle either.
    shared_wait = [_waiter(4, s("/y"), owner=OTHER)]
    assert deadlock_party(ME, blockers, shared_wait, owner_locks=[s("/y")]) is None


tree = st.sampled_from(["/", "/a", "/a/b", "/a/b/c", "/a/c", "/b", "/b/a"])
pairs = st.tuples(tree, st.sampled_from([EXCLUSIVE, SHARED]), st.booleans())
requests = st.lists(pairs, min_size=1, max_size=3, unique_by=lambda pair: pair[0])


@given(
    request=requests,
    queued=st.lists(requests, max_size=6),
    owner_locks=st.lists(pairs, max_size=3),
)
@settings(max_examples=300, deadline=None)
def test_waiters_ahead_properties(
    request: list[Locked], queued: list[list[Locked]], owner_locks: list[Locked]
) -> None:
    earlier = [_waiter(n, *paths) for n, paths in enumerate(queued, start=1)]
    ahead = waiters_ahead(request, earlier, owner_locks)
    # Only conflicting waiters, in ticket order, none that waits for the owner.
    assert [w.ticket for w in ahead] == sorted(w.ticket for w in ahead)
    for waiter in ahead:
        assert requests_conflict(_paths(waiter), request)
        assert not requests_conflict(_paths(waiter), owner_locks)
    # With no locks of its own, the owner waits for every conflicting waiter.
    everyone = [w for w in earlier if requests_conflict(_paths(w), request)]
    assert waiters_ahead(request, earlier, []) == everyone
