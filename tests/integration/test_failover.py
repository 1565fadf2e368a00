"""A manager given several database nodes, on one real server (issue 6, part 3).

The shared MariaDB stands in for a cluster whose nodes are always in sync: it
is reached under two addresses (``127.0.0.1`` and ``localhost``), which are two
nodes to pathlock. A node that is down is a port nothing listens on. What the
Galera cluster adds (nodes that lag, leave the primary component, get killed
under load) is tested in ``test_cluster*.py``.

- operations move past a dead node at once, with one WARNING naming it;
- a grant whose COMMIT landed through one node but whose reply was lost is
  granted once through the next node: its rows, found by their lease id,
  are replaced (never taken up: a COMMIT answered with an error may have
  landed unchecked), never doubled;
- with every node down, callers get a :class:`BackendError` after the usual
  number of attempts;
- the list is checked before anything is opened.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, make_url, text

from pathlock import (
    ArgumentTypeError,
    BackendError,
    InvalidArgument,
    LockTimeout,
    PathLockManager,
    Settings,
)
from tests.integration.commit_faults import CommitFaults
from tests.integration.test_outages import reply_lost_after_commit

pytestmark = pytest.mark.timeout(120)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def nodes(mariadb_url: str) -> list[str]:
    """Two names of the one server, and a dead node between them."""
    url = make_url(mariadb_url)
    return [
        url.set(host="127.0.0.1").render_as_string(hide_password=False),
        url.set(host="127.0.0.1", port=_free_port()).render_as_string(hide_password=False),
        url.set(host="localhost").render_as_string(hide_password=False),
    ]


@pytest.fixture
def plain(mariadb_url: str) -> Iterator[Engine]:
    engine = create_engine(mariadb_url)
    yield engine
    engine.dispose()


def _rows(engine: Engine, customer_id: int) -> list[tuple[str, str, int]]:
    with engine.connect() as connection:
        rows = connection.execute(
            text(
                "SELECT path, lease_id, fencing_token FROM path_locks "
                "WHERE customer_id = :c ORDER BY path"
            ),
            {"c": customer_id},
        )
        return [tuple(row) for row in rows]


def _version(engine: Engine, customer_id: int) -> int:
    with engine.connect() as connection:
        return int(
            connection.execute(
                text("SELECT version FROM customer_locks WHERE customer_id = :c"),
                {"c": customer_id},
            ).scalar_one()
        )


def test_a_dead_node_is_passed_over_at_once(
    nodes: list[str], customer_id: int, plain: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    dead = make_url(nodes[1])
    with (
        caplog.at_level(logging.WARNING, logger="pathlock"),
        PathLockManager([nodes[1], nodes[0]], node_id="failover", max_attempts=1) as manager,
    ):
        locks = manager.for_customer(customer_id)
        started = time.monotonic()
        with locks.lock_paths("/a", "/b/c") as lease:
            took = time.monotonic() - started
            assert [row[0] for row in _rows(plain, customer_id)] == ["/a", "/b/c"]
            assert locks.try_lock_paths("/b") is None
            assert [info.path for info in manager.list_locks(customer_id)] == ["/a", "/b/c"]
        assert lease.released
        assert _rows(plain, customer_id) == []
    # max_attempts=1: had the dead node cost an attempt, nothing would have
    # been granted. A refused connection on loopback is quick.
    assert took < 5
    warnings = [r.getMessage() for r in caplog.records if "database node" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert f"127.0.0.1:{dead.port}/" in warnings[0]


def test_a_grant_whose_reply_was_lost_is_granted_once_through_the_next_node(
    nodes: list[str], customer_id: int, plain: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    arm = reply_lost_after_commit(monkeypatch)
    with PathLockManager([nodes[0], nodes[2]], node_id="failover", ttl=30) as manager:
        locks = manager.for_customer(customer_id)
        locks.lock_paths("/warm").release()
        version = _version(plain, customer_id)
        arm()
        with locks.lock_paths("/x", "/y") as lease:
            rows = _rows(plain, customer_id)
            # One grant: the retry through the second node replaced the rows
            # of the first (found by their lease id) with its own, under the
            # next fencing token, instead of inserting a second set.
            assert rows == [
                ("/x", lease.lease_id, version + 2),
                ("/y", lease.lease_id, version + 2),
            ]
            assert lease.fencing_token == version + 2
            assert manager._store.router.nodes[0].set_aside_until > time.monotonic()
    assert _rows(plain, customer_id) == []


def test_rows_of_a_commit_answered_with_an_error_are_never_taken_up(
    mariadb_url: str, customer_id: int, plain: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a Galera node may do (docs/CLUSTER.md): the grant's COMMIT lands
    beside another client's conflicting grant it was never checked against,
    under the same fencing token, and is answered with 1213. Taking up the
    landed rows on the retry would hold /a beside the other holder; the
    retry drops them and waits for the other holder like anyone."""
    faults = CommitFaults(monkeypatch)
    with PathLockManager(mariadb_url, node_id="doubt", heartbeat=False) as manager:
        locks = manager.for_customer(customer_id)
        locks.lock_paths("/warm").release()
        version = _version(plain, customer_id)

        def beside() -> None:
            with plain.begin() as connection:
                connection.execute(
                    text(
                        "INSERT INTO path_locks (customer_id, lease_id, path, mode, node_id,"
                        " pid, thread, owner_key, reason, fencing_token, created_at,"
                        " expires_at) VALUES (:c, 'other-lease', '/a', 'exclusive', 'other',"
                        " 1, '1', 'other-owner', 'beside', :t, NOW(6),"
                        " NOW(6) + INTERVAL 1 HOUR)"
                    ),
                    {"c": customer_id, "t": version + 1},
                )
                # Counted, as the grant of another client would count it.
                connection.execute(
                    text(
                        "UPDATE customer_locks SET lock_rows = lock_rows + 1 WHERE customer_id = :c"
                    ),
                    {"c": customer_id},
                )

        faults.land_unchecked(beside)
        with pytest.raises(LockTimeout):
            locks.lock_paths("/a", timeout=1)
        assert [(path, lease) for path, lease, _ in _rows(plain, customer_id)] == [
            ("/a", "other-lease")
        ]
        # The sentinel moved past the token the rows of the COMMIT carried.
        assert _version(plain, customer_id) > version + 1


def test_a_release_whose_reply_was_lost_is_finished_through_the_next_node(
    nodes: list[str], customer_id: int, plain: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    arm = reply_lost_after_commit(monkeypatch)
    with PathLockManager([nodes[0], nodes[2]], node_id="failover") as manager:
        lease = manager.for_customer(customer_id).lock_paths("/x")
        arm()
        lease.release()
        assert lease.released
        assert not lease.lost
        assert _rows(plain, customer_id) == []


def test_with_every_node_down_callers_get_a_backend_error(customer_id: int) -> None:
    dead = [f"mysql+pymysql://root@127.0.0.1:{_free_port()}/test" for _ in range(3)]
    with PathLockManager(dead, node_id="failover", max_attempts=2) as manager:
        locks = manager.for_customer(customer_id)
        started = time.monotonic()
        with pytest.raises(BackendError, match="persisted through 2 attempts"):
            locks.lock_paths("/a", timeout=30)
        assert time.monotonic() - started < 10
        # A try-lock too, and nothing is left behind for its owner to trip on.
        with pytest.raises(BackendError):
            locks.try_lock_paths("/a")


def test_a_node_that_comes_back_is_used_again(nodes: list[str], customer_id: int) -> None:
    with PathLockManager(
        [nodes[1], nodes[0]], node_id="failover", settings=Settings(set_aside=0.2)
    ) as manager:
        locks = manager.for_customer(customer_id)
        locks.lock_paths("/a").release()
        first = manager._store.router.nodes[0]
        assert first.set_aside_until > 0
        time.sleep(0.3)
        # Past its time: tried again (and, still dead, set aside again).
        before = first.set_aside_until
        locks.lock_paths("/a").release()
        assert first.set_aside_until > before


def test_nodes_are_checked_before_anything_is_opened(nodes: list[str], sqlite_url: str) -> None:
    with pytest.raises(InvalidArgument, match="empty"):
        PathLockManager([])
    with pytest.raises(InvalidArgument, match="given twice"):
        PathLockManager([nodes[0], nodes[0]])
    with pytest.raises(InvalidArgument, match="SQLite"):
        PathLockManager([nodes[0], sqlite_url])
    with pytest.raises(ArgumentTypeError, match="None"):
        PathLockManager([nodes[0], None])  # type: ignore[list-item]
    with pytest.raises(ArgumentTypeError, match="affinity"):
        PathLockManager(nodes[0], affinity="yes")  # type: ignore[arg-type]


def test_nodes_may_be_engines_and_urls_and_only_created_ones_are_disposed(
    nodes: list[str], customer_id: int
) -> None:
    engine = create_engine(nodes[2])
    try:
        with PathLockManager([nodes[0], engine], node_id="failover", affinity=True) as manager:
            assert len(manager.engines) == 2
            # Used as it is, with READ COMMITTED per checkout (a proxy of it).
            assert manager.engines[1].pool is engine.pool
            assert "+1 more nodes" in repr(manager)
            with manager.for_customer(customer_id).lock_paths("/a"):
                pass
        with engine.connect() as connection:  # still usable: not ours to dispose
            assert connection.execute(text("SELECT 1")).scalar() == 1
    finally:
        engine.dispose()


def test_affinity_keeps_a_customer_on_its_home_node(nodes: list[str]) -> None:
    with PathLockManager(
        [nodes[0], nodes[2]], node_id="failover", affinity=True, heartbeat=False
    ) as manager:
        homes = {manager._store.home(customer_id) for customer_id in range(1, 50)}
        assert len(homes) == 2  # customers spread over both
        customer_id = next(c for c in range(1, 50) if manager._store.home(c).startswith("local"))
        manager.engines[0].dispose()  # the schema check at construction went to the first node
        with manager.for_customer(customer_id).lock_paths("/a") as lease:
            # The grant went through "localhost": its connection is the one in that pool.
            assert manager.engines[1].pool.checkedin() >= 1  # type: ignore[attr-defined]
            assert manager.engines[0].pool.checkedin() == 0  # type: ignore[attr-defined]
            assert not lease.lost


def test_causal_reads_stay_off_on_a_server_that_is_no_galera_node(nodes: list[str]) -> None:
    with (
        PathLockManager(nodes[0], node_id="failover") as manager,
        manager.engine.connect() as connection,
    ):
        assert connection.execute(text("SELECT @@wsrep_sync_wait")).scalar() == 0


def test_a_lock_timeout_is_still_a_lock_timeout_with_several_nodes(
    nodes: list[str], customer_id: int
) -> None:
    with PathLockManager([nodes[0], nodes[2]], node_id="failover") as manager:
        locks = manager.for_customer(customer_id)
        errors: list[BaseException] = []
        with locks.lock_paths("/a"):
            # Another thread: the same owner would be a deadlock instead.
            thread = threading.Thread(target=_lock_in_thread, args=(locks, errors))
            thread.start()
            thread.join()
        assert len(errors) == 1
        assert isinstance(errors[0], LockTimeout)
        assert not errors[0].contended


def _lock_in_thread(locks: object, errors: list[BaseException]) -> None:
    try:
        locks.lock_paths("/a/b", timeout=0.3)  # type: ignore[attr-defined]
    except BaseException as error:  # noqa: BLE001 - handed to the test's thread
        errors.append(error)


def _socket_timeouts(manager: PathLockManager) -> tuple[object, object]:
    with manager.engine.connect() as connection:
        driver: Any = connection.connection.dbapi_connection
        return driver._read_timeout, driver._write_timeout


def test_pathlock_engines_give_up_on_a_silent_server(nodes: list[str]) -> None:
    with PathLockManager(nodes[0], node_id="failover", heartbeat=False) as manager:
        assert _socket_timeouts(manager) == (30, 30)
    options = {"connect_args": {"read_timeout": 7}}
    with PathLockManager(nodes[0], node_id="failover", engine_options=options) as manager:
        assert _socket_timeouts(manager) == (7, 30)  # the caller's connect_args win


def test_a_wait_for_a_busy_customer_row_is_no_node_failure(
    nodes: list[str], plain: Engine, customer_id: int, caplog: pytest.LogCaptureFixture
) -> None:
    """A statement that waits for the customer's row behind another client
    runs into the socket timeout of its attempt (half the time left while
    another node is untried). The node answers on another connection, so it is
    kept: passing it over would send the customer's writes through several
    nodes of a cluster, where they abort each other (certification failures)."""
    with PathLockManager([nodes[0], nodes[2]], node_id="failover", heartbeat=False) as manager:
        locks = manager.for_customer(customer_id)
        locks.lock_paths("/warm").release()  # the customer's row exists
        with plain.connect() as holder:
            holder.execute(
                text("SELECT * FROM customer_locks WHERE customer_id = :c FOR UPDATE"),
                {"c": customer_id},
            )
            # The request below gets 2 s on its first attempt, and waits for
            # the row for 2.5 s.
            threading.Timer(2.5, holder.connection.dbapi_connection.commit).start()  # type: ignore[union-attr]
            with caplog.at_level(logging.WARNING, logger="pathlock"):
                lease = locks.lock_paths("/a", timeout=4)
        try:
            assert [node.set_aside_until for node in manager._store.router.nodes] == [0.0, 0.0]
            assert not [r for r in caplog.records if "failed" in r.getMessage()]
            assert _rows(plain, customer_id)[0][:2] == ("/a", lease.lease_id)
        finally:
            lease.release()
