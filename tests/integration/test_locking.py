"""The locking semantics against the real database: conflicts, all-or-nothing,
tenants, literal matching, Unicode, bad input, fencing tokens and timeouts."""

from __future__ import annotations

import logging
import secrets
import threading
import time

import pytest
from sqlalchemy import Engine, text

from pathlock import (
    CaseRuleMismatch,
    CustomerLocks,
    DeadlockDetected,
    InvalidPath,
    InvalidPathType,
    Lease,
    LeaseLost,
    LockTimeout,
    PathLockError,
    PathLockManager,
)


def _rows(engine: Engine, customer_id: int) -> list[tuple[str, str]]:
    """The customer's rows, read with plain SQL (not pathlock's queries)."""
    with engine.connect() as connection:
        result = connection.execute(
            text("SELECT path, mode FROM path_locks WHERE customer_id = :c ORDER BY path"),
            {"c": customer_id},
        )
        return [(row.path, row.mode) for row in result]


def _sentinel(engine: Engine, customer_id: int) -> int | None:
    with engine.connect() as connection:
        return connection.execute(
            text("SELECT version FROM customer_locks WHERE customer_id = :c"), {"c": customer_id}
        ).scalar()


def _other_owner(
    manager: PathLockManager,
    customer_id: int,
    action: str,
    *paths: str,
    shared: tuple[str, ...] = (),
) -> object:
    """Run try_lock_paths (or lock_paths with timeout 0) in another thread, i.e.
    as a different owner, and return what it returned or raised."""
    outcome: list[object] = []

    def run() -> None:
        locks = manager.for_customer(customer_id)
        try:
            if action == "try":
                lease = locks.try_lock_paths(*paths, shared=shared)
                outcome.append(lease)
                if lease is not None:
                    lease.release()
            else:
                outcome.append(locks.lock_paths(*paths, shared=shared, timeout=0))
        except PathLockError as error:
            outcome.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return outcome[0]


# (held path, held mode, requested path, requested mode, conflicts?)
MATRIX = [
    ("/a", "exclusive", "/a", "exclusive", True),
    ("/a", "exclusive", "/a", "shared", True),
    ("/a", "shared", "/a", "exclusive", True),
    ("/a", "shared", "/a", "shared", False),
    # ancestor held, descendant requested
    ("/a", "exclusive", "/a/b/c", "exclusive", True),
    ("/a", "shared", "/a/b/c", "exclusive", True),
    ("/a", "exclusive", "/a/b/c", "shared", True),
    ("/a", "shared", "/a/b/c", "shared", False),
    # descendant held, ancestor requested
    ("/a/b/c", "exclusive", "/a", "exclusive", True),
    ("/a/b/c", "shared", "/a", "exclusive", True),
    ("/a/b/c", "exclusive", "/a", "shared", True),
    ("/a/b/c", "shared", "/a", "shared", False),
    # siblings and cousins never conflict
    ("/a/b", "exclusive", "/a/c", "exclusive", False),
    ("/Shared/marketing/Dallas", "exclusive", "/Shared/Engineering/test", "exclusive", False),
    ("/Shared/marketing/Dallas", "exclusive", "/Shared/QA", "exclusive", False),
    ("/Shared/marketing/Dallas", "exclusive", "/private/kpatel", "exclusive", False),
    ("/Shared/marketing/Dallas", "exclusive", "/Shared", "exclusive", True),
    ("/Shared/marketing/Dallas", "exclusive", "/Shared/marketing/Dallas/q3", "shared", True),
    # the root is everyone's ancestor
    ("/", "exclusive", "/a/b", "exclusive", True),
    ("/a/b", "exclusive", "/", "exclusive", True),
    ("/", "shared", "/a/b", "shared", False),
    ("/a/b", "shared", "/", "exclusive", True),
    # prefix traps: string prefixes that are not path ancestors
    ("/a", "exclusive", "/ab", "exclusive", False),
    ("/ab", "exclusive", "/a", "exclusive", False),
    ("/a/b", "exclusive", "/a/bc/d", "exclusive", False),
    ("/a/bc/d", "exclusive", "/a/b", "exclusive", False),
    # LIKE wildcards and the escape character are literal
    ("/a%", "exclusive", "/ab", "exclusive", False),
    ("/a%", "exclusive", "/a%/x", "exclusive", True),
    ("/ab/x", "exclusive", "/a%", "exclusive", False),
    ("/a_", "exclusive", "/ab", "exclusive", False),
    ("/ab/x", "exclusive", "/a_", "exclusive", False),
    ("/a_/x", "exclusive", "/a_", "exclusive", True),
    ("/a\\", "exclusive", "/a\\/x", "exclusive", True),
    ("/a\\b/x", "exclusive", "/a\\", "exclusive", False),
    ("/a\\%", "exclusive", "/a\\x", "exclusive", False),
    ("/it's", "exclusive", '/it\'s/"quoted"', "exclusive", True),
    # case matters unless the manager folds case
    ("/Shared/A", "exclusive", "/Shared/a", "exclusive", False),
    ("/Shared/A", "exclusive", "/Shared/a/x", "exclusive", False),  # LIKE must not fold case
    ("/Shared/a/x", "exclusive", "/Shared/A", "exclusive", False),
    ("/Été/x", "exclusive", "/été", "exclusive", False),
    # Unicode NFC and NFD spellings are one path
    ("/caf\u00e9", "exclusive", "/cafe\u0301", "exclusive", True),
    ("/cafe\u0301/menu", "exclusive", "/caf\u00e9", "exclusive", True),
    # byte-exact comparison: no accent-insensitive collation
    ("/cafe", "exclusive", "/caf\u00e9", "exclusive", False),
]


@pytest.mark.parametrize(("held", "held_mode", "asked", "asked_mode", "conflicts"), MATRIX)
def test_conflict_matrix(
    manager: PathLockManager,
    locks: CustomerLocks,
    held: str,
    held_mode: str,
    asked: str,
    asked_mode: str,
    conflicts: bool,
) -> None:
    lease = locks.lock_paths(held) if held_mode == "exclusive" else locks.lock_paths(shared=[held])
    with lease:
        paths, shared = ((asked,), ()) if asked_mode == "exclusive" else ((), (asked,))
        got = _other_owner(manager, locks.customer_id, "try", *paths, shared=shared)
        assert (got is None) == conflicts


def test_all_or_nothing(manager: PathLockManager, locks: CustomerLocks, raw_engine: Engine) -> None:
    with locks.lock_paths("/b/inner"):
        got = _other_owner(manager, locks.customer_id, "try", "/a", "/b", "/c")
        assert got is None
        # Nothing of the partly conflicting request was written.
        assert _rows(raw_engine, locks.customer_id) == [("/b/inner", "exclusive")]
    assert _rows(raw_engine, locks.customer_id) == []


def test_multi_path_lease_holds_and_releases_as_a_unit(
    manager: PathLockManager, locks: CustomerLocks, raw_engine: Engine
) -> None:
    lease = locks.lock_paths("/Shared/target", shared=["/Shared/source"], reason="copy")
    assert lease.paths == (("/Shared/source", "shared"), ("/Shared/target", "exclusive"))
    assert _rows(raw_engine, locks.customer_id) == list(lease.paths)
    # shared + shared is fine, exclusive on the source is not.
    assert _other_owner(manager, locks.customer_id, "try", shared=("/Shared/source",)) is not None
    assert _other_owner(manager, locks.customer_id, "try", "/Shared/source/f.txt") is None
    lease.release()
    lease.release()  # idempotent
    assert lease.released
    assert _rows(raw_engine, locks.customer_id) == []
    assert _other_owner(manager, locks.customer_id, "try", "/Shared") is not None


def test_tenants_are_isolated(manager: PathLockManager, customer_id: int) -> None:
    with manager.for_customer(customer_id).lock_paths("/"):
        got = _other_owner(manager, customer_id + 1, "try", "/")
        assert got is not None
        assert _other_owner(manager, customer_id, "try", "/x") is None


def test_case_insensitive_manager_folds_case(database_url: str, customer_id: int) -> None:
    with PathLockManager(database_url, case_insensitive=True) as folding:
        locks = folding.for_customer(customer_id)
        with locks.lock_paths("/Shared/Straße") as lease:
            assert lease.paths == (("/shared/strasse", "exclusive"),)
            assert _other_owner(folding, customer_id, "try", "/SHARED/STRASSE/x") is None


@pytest.mark.parametrize("first", [False, True], ids=["sensitive-first", "insensitive-first"])
def test_a_customer_keeps_the_case_rule_of_its_first_lock(
    database_url: str, customer_id: int, first: bool
) -> None:
    # Both settings granting /Shared/Foo (as given, and folded) would let two
    # owners edit one folder. The first grant records its setting; the other
    # is refused at once, before any row is written, with or without a queue.
    with (
        PathLockManager(database_url, case_insensitive=first) as one,
        PathLockManager(database_url, case_insensitive=not first) as other,
    ):
        with one.for_customer(customer_id).lock_paths("/Shared/Foo"):
            before = _rows(one.engine, customer_id)
            version = _sentinel(one.engine, customer_id)
            for attempt in (
                lambda locks: locks.try_lock_paths("/Shared/Foo/x"),
                lambda locks: locks.lock_paths("/elsewhere", timeout=5),
            ):
                with pytest.raises(CaseRuleMismatch) as caught:
                    attempt(other.for_customer(customer_id))
                assert caught.value.customer_id == customer_id
                assert caught.value.recorded is first
                assert f"case_insensitive={first}" in str(caught.value)
            assert _rows(one.engine, customer_id) == before
            assert _sentinel(one.engine, customer_id) == version
        # Nothing held: still refused (the rule is the data's, not the lease's).
        with pytest.raises(CaseRuleMismatch):
            other.for_customer(customer_id).try_lock_paths("/Shared/Foo")
        # Other customers are not affected.
        with other.for_customer(customer_id + 1).lock_paths("/Shared/Foo"):
            pass


def test_a_customer_from_before_the_case_rule_records_it_at_its_next_lock(
    database_url: str, customer_id: int
) -> None:
    # Rows written before revision 0005 have no rule: the next grant sets it.
    with PathLockManager(database_url, case_insensitive=True) as folding:
        with folding.engine.begin() as connection:
            connection.execute(
                text("INSERT INTO customer_locks (customer_id, version) VALUES (:c, 7)"),
                {"c": customer_id},
            )
        with folding.for_customer(customer_id).lock_paths("/A") as lease:
            assert lease.fencing_token == 8
        with folding.engine.connect() as connection:
            recorded = connection.execute(
                text("SELECT case_insensitive FROM customer_locks WHERE customer_id = :c"),
                {"c": customer_id},
            ).scalar()
        assert recorded in (True, 1)
    with PathLockManager(database_url) as exact, pytest.raises(CaseRuleMismatch):
        exact.for_customer(customer_id).try_lock_paths("/A")


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "relative/path",
        "/a/../b",
        "/a/./b",
        "/..",
        "/a/\x00",
        "/a\nb",
        "/\x7f",
        "/\ud800",
        None,
        b"/bytes",
        42,
        "/" + "x" * 4000,
    ],
)
def test_bad_input_is_rejected_before_anything_is_written(
    locks: CustomerLocks, raw_engine: Engine, bad: object
) -> None:
    refused = InvalidPath if isinstance(bad, str) else InvalidPathType
    with pytest.raises(refused):
        locks.lock_paths("/fine", bad)  # type: ignore[arg-type]
    with pytest.raises(refused):
        locks.try_lock_paths(shared=["/fine", bad])  # type: ignore[list-item]
    assert _rows(raw_engine, locks.customer_id) == []
    # Not even the sentinel was touched.
    assert _sentinel(raw_engine, locks.customer_id) is None


def test_other_bad_arguments(manager: PathLockManager, locks: CustomerLocks) -> None:
    with pytest.raises(InvalidPath):
        locks.lock_paths()
    with pytest.raises(InvalidPathType):
        locks.lock_paths(shared="/a")  # a bare string is not a list of paths
    with pytest.raises(TypeError):
        manager.for_customer(True)
    with pytest.raises(ValueError, match="customer_id"):
        manager.for_customer(-1)
    with pytest.raises(ValueError, match="timeout"):
        locks.lock_paths("/a", timeout=-1)
    with pytest.raises(ValueError, match="timeout"):
        locks.lock_paths("/a", timeout=float("nan"))
    with pytest.raises(ValueError, match="ttl"):
        locks.lock_paths("/a", ttl=0)
    with pytest.raises(ValueError, match="reason"):
        locks.lock_paths("/a", reason="x" * 1001)
    assert locks.list_locks() == []


def test_fencing_tokens_strictly_increase(manager: PathLockManager, locks: CustomerLocks) -> None:
    tokens = []
    for _ in range(5):
        with locks.lock_paths("/doc") as lease:
            tokens.append(lease.fencing_token)
    other = locks.lock_paths("/elsewhere")
    tokens.append(other.fencing_token)
    other.release()
    assert tokens == sorted(set(tokens))
    # Another customer has its own sequence, starting over.
    with manager.for_customer(locks.customer_id + 1).lock_paths("/doc") as lease:
        assert lease.fencing_token == 1


def test_timeout_names_the_holder(manager: PathLockManager, locks: CustomerLocks) -> None:
    with locks.lock_paths("/Shared/marketing", reason="move to archive"):
        started = time.monotonic()
        error = _other_owner(manager, locks.customer_id, "lock", "/Shared/marketing/Dallas")
        assert isinstance(error, LockTimeout)
        assert isinstance(error, TimeoutError)
        assert error.timeout == 0
        assert error.paths == (("/Shared/marketing/Dallas", "exclusive"),)
        (holder,) = error.held_by
        assert holder.path == "/Shared/marketing"
        assert holder.reason == "move to archive"
        assert holder.owner.node_id == "test-node"
        assert "move to archive" in str(error)
        assert "/Shared/marketing (exclusive)" in str(error)

        outcome: list[BaseException] = []

        def wait_half_a_second() -> None:
            try:
                locks.lock_paths("/Shared", timeout=0.5)
            except LockTimeout as timeout:
                outcome.append(timeout)

        thread = threading.Thread(target=wait_half_a_second)
        thread.start()
        thread.join()
        # A lower bound only: it waited at least its timeout before giving up.
        assert time.monotonic() - started >= 0.5
        assert len(outcome) == 1


def test_waiter_is_granted_after_release(locks: CustomerLocks) -> None:
    granted = threading.Event()
    tokens: list[int] = []
    holder = locks.lock_paths("/project")

    def wait() -> None:
        with locks.lock_paths("/project/file", timeout=30) as lease:
            tokens.append(lease.fencing_token)
            granted.set()

    thread = threading.Thread(target=wait)
    thread.start()
    assert not granted.wait(0.3)
    holder.release()
    assert granted.wait(30)
    thread.join()
    assert tokens[0] > holder.fencing_token


def test_conflict_with_own_owner_fails_at_once(locks: CustomerLocks) -> None:
    with locks.lock_paths("/a/b", reason="first") as lease:
        with pytest.raises(DeadlockDetected) as caught:
            locks.lock_paths("/a", timeout=None)
        assert caught.value.held_by[0].lease_id == lease.lease_id
        assert isinstance(caught.value, PathLockError)
        # A try-lock just reports the conflict.
        assert locks.try_lock_paths("/a") is None


def test_release_locks_releases_only_this_owner(locks: CustomerLocks, raw_engine: Engine) -> None:
    first = locks.lock_paths("/one")
    second = locks.lock_paths("/two", shared=["/three"])
    other_thread: list[object] = []
    thread = threading.Thread(target=lambda: other_thread.append(locks.lock_paths("/four")))
    thread.start()
    thread.join()
    assert locks.release_locks() == 3
    assert first.released
    assert second.released
    assert _rows(raw_engine, locks.customer_id) == [("/four", "exclusive")]
    assert locks.release_locks() == 0


def test_expired_rows_never_block(database_url: str, customer_id: int) -> None:
    with PathLockManager(database_url, heartbeat=False) as manager:  # nothing renews
        locks = manager.for_customer(customer_id)
        lease = locks.lock_paths("/short", ttl=0.2)
        assert manager.list_locks(customer_id)[0].path == "/short"
        time.sleep(0.3)
        assert lease.lost
        with pytest.raises(LeaseLost):
            lease.ensure_held()
        # The row is still there until the reaper runs, but it blocks no one.
        assert manager.list_locks(customer_id) == []
        assert len(manager.list_locks(customer_id, include_expired=True)) == 1
        got = _other_owner(manager, customer_id, "try", "/short/x")
        assert got is not None


def test_list_locks_reports_owner_and_times(manager: PathLockManager, locks: CustomerLocks) -> None:
    with locks.lock_paths("/a", shared=["/b"], reason="r", ttl=10) as lease:
        infos = manager.list_locks(customer_id=locks.customer_id)
        assert [(info.path, info.mode) for info in infos] == [("/a", "exclusive"), ("/b", "shared")]
        for info in infos:
            assert info.lease_id == lease.lease_id
            assert info.fencing_token == lease.fencing_token
            assert info.owner == lease.owner
            assert info.owner.pid > 0
            assert info.reason == "r"
            assert info.created_at.tzinfo is not None
            span = (info.expires_at - info.created_at).total_seconds()
            assert span == pytest.approx(10, abs=0.001)
        lease.ensure_held()


def test_closed_manager_refuses_and_released_its_leases(
    database_url: str, customer_id: int, raw_engine: Engine
) -> None:
    manager = PathLockManager(database_url)
    locks = manager.for_customer(customer_id)
    lease = locks.lock_paths("/left/open")
    manager.close()
    manager.close()
    assert lease.released
    assert _rows(raw_engine, customer_id) == []
    with pytest.raises(PathLockError, match="closed"):
        locks.lock_paths("/x")


def test_a_customers_first_use_by_many_clients_grants_one_path_once(database_url: str) -> None:
    """Many clients lock one path of a new customer at once, and hold it.
    A grant in one round trip locks the sentinel row, then inserts: on a
    customer's first use the row did not exist for that lock, another client
    made it in between, and the grant saw the row and inserted without
    holding its lock, blind to the rows of the others doing the same: two of
    them held the path."""
    clients = 12
    with PathLockManager(database_url, engine_options={"pool_size": clients}) as manager:
        for _ in range(15):
            locks = manager.for_customer(secrets.randbelow(2**62) + 1)
            barrier = threading.Barrier(clients)
            held: list[Lease] = []

            def work(
                locks: CustomerLocks = locks,
                barrier: threading.Barrier = barrier,
                held: list[Lease] = held,
            ) -> None:
                barrier.wait()
                lease = locks.try_lock_paths("/same")
                if lease is not None:
                    held.append(lease)

            threads = [threading.Thread(target=work) for _ in range(clients)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            tokens = [lease.fencing_token for lease in held]
            for lease in held:
                lease.release()
            assert len(held) <= 1, tokens


def test_first_use_of_a_customer_by_many_clients_at_once(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Creating the sentinel row inside the grant transaction deadlocked when
    several clients made a customer's first request together (1213, retried)."""
    clients = 12
    granted: list[int] = []
    with PathLockManager(database_url, engine_options={"pool_size": clients}) as manager:
        for _ in range(5):
            locks = manager.for_customer(secrets.randbelow(2**62) + 1)
            barrier = threading.Barrier(clients)

            def work(
                n: int, locks: CustomerLocks = locks, barrier: threading.Barrier = barrier
            ) -> None:
                barrier.wait()
                lease = locks.try_lock_paths(f"/p{n}")  # distinct paths: no conflict
                if lease is not None:
                    granted.append(lease.fencing_token)
                    lease.release()

            with caplog.at_level(logging.WARNING, logger="pathlock"):
                threads = [threading.Thread(target=work, args=(n,)) for n in range(clients)]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
    assert len(granted) == 5 * clients
    assert [record.getMessage() for record in caplog.records] == []


def test_long_paths_beyond_the_index_prefix_match_exactly(
    manager: PathLockManager, locks: CustomerLocks
) -> None:
    # The index covers the first 700 characters; these share far more than that.
    stem = "/" + "d" * 1500
    longest = stem + "/" + "x" * (4000 - len(stem) - 1)
    assert len(longest) == 4000
    with locks.lock_paths(stem + "/a" * 100):
        assert _other_owner(manager, locks.customer_id, "try", stem + "/b") is not None
        assert _other_owner(manager, locks.customer_id, "try", longest) is not None
        assert _other_owner(manager, locks.customer_id, "try", stem + "/a/a") is None
        assert _other_owner(manager, locks.customer_id, "try", stem) is None
    with locks.lock_paths(longest) as lease:
        assert lease.paths == ((longest, "exclusive"),)
        assert _other_owner(manager, locks.customer_id, "try", longest[:-1]) is not None
        assert _other_owner(manager, locks.customer_id, "try", stem) is None
