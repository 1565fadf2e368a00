"""pathlock on a 3-node MariaDB Galera cluster: the smoke tests.

The cluster is a private one (``servers/galera_cluster.py``), started once for
the session (``tests/integration/conftest.py``), with pathlock's schema
migrated on node 1 (DDL replicates to the others). What is checked:

1. a lock taken through node 1 is refused through nodes 2 and 3, and once
   released there, granted through node 3 with a larger fencing token;
2. a race: two spawned processes per node take one path over and over for a
   few seconds; an independent checker (``test_stress.py``'s) finds no two
   holds overlapping in time and tokens growing in grant order. One process
   per node reads with ``wsrep_sync_wait`` (causal reads, which pathlock turns
   on by itself on a Galera node), one with them turned off, so the check
   does not depend on them: a grant through one node conflicts with a
   concurrent grant through another at certification (both write the
   customer's sentinel row), and the loser gets error 1213, which pathlock
   retries until the caller's timeout. A second test asks for liveness:
   every racer is granted, none fails (before lost races were retried that
   long, the racers on nodes 2 and 3 starved: their requests gave up after
   ``max_attempts`` lost races, about a second);
3. a node killed (SIGKILL) and restarted rejoins by IST and has every grant.

Sizes: ``PATHLOCK_CLUSTER_RACE_SECONDS`` (default 5).
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import threading
import time
import traceback
import warnings
from collections import Counter
from dataclasses import dataclass
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from pathlock import PathLockError, PathLockManager
from servers import galera_cluster
from tests.integration.test_round_trips import _statements, sent
from tests.integration.test_stress import Hold, assert_safe, read_results, run_workers

pytestmark = pytest.mark.cluster

DATABASE = "pathlock_cluster"
RACE_SECONDS = float(os.environ.get("PATHLOCK_CLUSTER_RACE_SECONDS", "5"))
RACE_PATH = "/Shared/race"
WORKERS_PER_NODE = 2
# Causal reads: a session's reads and writes first wait until its node has
# applied everything the cluster committed before them (1 reads, 2 updates
# and deletes, 4 inserts). pathlock sets 3 on the engines it creates. Without
# it, a node's reads may lag the cluster's commits by a few milliseconds:
# never unsafe (certification catches the conflicting write), but a try-lock
# right after a release elsewhere may be refused.
_RETRY = re.compile(r"retrying in \d+ ms\): \((\d+),")


def _manager(
    url: str | list[str], name: str, *, sync_wait: bool, affinity: bool = False
) -> PathLockManager:
    if sync_wait or affinity:
        return PathLockManager(url, node_id=name, ttl=30, affinity=affinity)
    assert isinstance(url, str)
    # An engine passed in is used as it is: the only way to turn causal reads off.
    engine = create_engine(
        url,
        isolation_level="READ COMMITTED",
        connect_args={"init_command": "SET SESSION wsrep_sync_wait=0"},
    )
    return PathLockManager(engine, node_id=name, ttl=30)


def test_a_lock_through_one_node_holds_on_every_node(
    cluster: galera_cluster.GaleraCluster,
) -> None:
    customer = secrets.randbelow(2**40) + 1
    urls = cluster.urls(DATABASE)
    managers = [
        _manager(url, f"smoke-{number}", sync_wait=True) for number, url in enumerate(urls, 1)
    ]
    try:
        first, second, third = (manager.for_customer(customer) for manager in managers)
        lease = first.try_lock_paths("/Shared/a")
        assert lease is not None
        assert second.try_lock_paths("/Shared/a") is None
        assert third.try_lock_paths("/Shared/a/b") is None
        assert third.try_lock_paths("/Shared") is None
        assert second.try_lock_paths("/Shared/b") is not None  # a sibling: no conflict
        lease.release()
        after = third.try_lock_paths("/Shared/a")
        assert after is not None
        assert after.fencing_token > lease.fencing_token
        # Every node's tables say the same.
        for manager in managers:
            held = {info.path for info in manager.list_locks(customer_id=customer)}
            assert held == {"/Shared/a", "/Shared/b"}
            # pathlock turned causal reads on, for reads and for the sentinel write.
            with manager.engine.connect() as connection:
                assert connection.execute(text("SELECT @@wsrep_sync_wait")).scalar() == 3
    finally:
        for manager in managers:
            manager.close()


def test_a_galera_node_gets_its_commits_alone(
    cluster: galera_cluster.GaleraCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A release is one round trip on a plain server (its COMMIT at the end
    of its batch: test_round_trips.py); a Galera node gets the COMMIT on its
    own, since it sometimes answers 1213 to a batch's COMMIT that lands all
    the same (docs/CLUSTER.md)."""
    customer = secrets.randbelow(2**40) + 1
    with _manager(cluster.urls(DATABASE)[0], "alone", sync_wait=True) as manager:
        locks = manager.for_customer(customer)
        lease = locks.lock_paths("/Shared/a")
        with sent(monkeypatch) as commands:
            lease.release()
        assert len(commands) == 2, commands
        assert not commands[0].rstrip().upper().endswith("COMMIT"), commands
        assert commands[1].strip().upper() == "COMMIT", commands
        assert locks.list_locks() == []


def test_a_waiter_on_a_galera_node_sends_its_commits_alone_and_little_else(
    cluster: galera_cluster.GaleraCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No batch carries a COMMIT on a Galera node, but the statements before
    one travel together: a denied request is queued in three round trips
    (the attempt, the queue row with the version put back, the COMMIT), each
    check while it waits is one (its ROLLBACK in the same query: a COMMIT
    alone is what the cluster needs, not a ROLLBACK), and its grant deletes
    its queue row in the grant's round trip, then commits."""
    customer = secrets.randbelow(2**40) + 1
    url = cluster.urls(DATABASE)[0]
    with (
        _manager(url, "holder", sync_wait=True) as holder,
        _manager(url, "waiter", sync_wait=True) as waiter,
    ):
        lease = holder.for_customer(customer).lock_paths("/Shared/a")
        locks = waiter.for_customer(customer)
        locks.lock_paths("/Shared/b").release()  # its connection opened and set up
        release = threading.Timer(0.3, lease.release)
        with sent(monkeypatch, this_thread=True) as commands:
            release.start()
            try:
                locks.lock_paths("/Shared/a", timeout=30).release()
            finally:
                release.join()
    statements = [_statements(command) for command in commands]
    assert statements[:3] == [
        ["UPDATE", "INSERT", "UPDATE"],  # the attempt (its rows counted), denied
        ["SELECT"] * 5,  # who is in the way
        # the queue row (counted) and its paths, the version put back
        ["INSERT", "UPDATE", "INSERT", "UPDATE"],
    ], commands
    assert statements[3] == ["COMMIT"], commands
    assert statements[-4:] == [
        # the grant, counted; the queue row deleted with it, counted
        ["UPDATE", "INSERT", "UPDATE", "DELETE", "UPDATE"],
        ["COMMIT"],
        ["UPDATE", "DELETE", "UPDATE"],  # the release, counted
        ["COMMIT"],
    ], commands
    checks = statements[4:-4]
    assert checks, commands
    assert all(check == ["SELECT", "ROLLBACK"] for check in checks), commands


# -- the race ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RaceSpec:
    """What one spawned racer needs (picklable)."""

    database_url: str | list[str]
    customer_id: int
    index: int
    node: int
    sync_wait: bool
    seconds: float
    out_dir: Path
    affinity: bool = False


def race_worker(spec: RaceSpec, barrier: Barrier) -> None:
    """Take ``RACE_PATH`` over and over for ``spec.seconds``; record each hold."""
    warnings.simplefilter("error")
    logging.basicConfig(
        filename=spec.out_dir / f"worker-{spec.index}.log",
        level=logging.WARNING,
        format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s",
    )
    records: list[dict[str, Any]] = []
    outcomes: Counter[str] = Counter()
    failures: list[str] = []
    try:
        manager = _manager(
            spec.database_url,
            f"race-{spec.index}",
            sync_wait=spec.sync_wait,
            affinity=spec.affinity,
        )
        locks = manager.for_customer(spec.customer_id)
        manager.database_time()  # connect before the start line
        barrier.wait(120)
        deadline = time.monotonic() + spec.seconds
        while time.monotonic() < deadline:
            try:
                with locks.lock_paths(RACE_PATH, timeout=20, reason=f"race-{spec.index}") as lease:
                    t_start = time.monotonic()
                    time.sleep(0.002)
                    t_end = time.monotonic()
            except PathLockError as error:
                outcomes[type(error).__name__] += 1
                if len(failures) < 3:
                    failures.append(f"{type(error).__name__}: {error}")
                continue
            outcomes["granted"] += 1
            records.append(
                {
                    "t_start": t_start,
                    "t_end": t_end,
                    "worker": spec.index,
                    "lease_id": lease.lease_id,
                    "token": lease.fencing_token,
                    "paths": [[RACE_PATH, "exclusive"]],
                }
            )
        manager.close()
    except BaseException:
        (spec.out_dir / f"worker-{spec.index}.error").write_text(
            traceback.format_exc(), encoding="utf-8"
        )
        barrier.abort()
        raise
    about = {"node": spec.node, "sync_wait": spec.sync_wait, "failures": failures}
    summary = {"summary": {**about, **outcomes}}
    lines = [json.dumps(summary)] + [json.dumps(record) for record in records]
    (spec.out_dir / f"worker-{spec.index}.jsonl").write_text(
        "\n".join(lines) + "\n", encoding="utf-8"
    )


def retried_codes(out_dir: Path) -> Counter[int]:
    """The error codes of the retries the racers logged."""
    codes: Counter[int] = Counter()
    for log in sorted(out_dir.glob("worker-*.log")):
        for line in log.read_text(encoding="utf-8").splitlines():
            found = _RETRY.search(line)
            if found:
                codes[int(found.group(1))] += 1
    return codes


@dataclass(frozen=True, slots=True)
class Race:
    """What the racers did."""

    holds: list[Hold]
    summaries: list[dict[str, Any]]
    retries: Counter[int]
    affinity: bool

    def outcomes(self) -> Counter[str]:
        counted: Counter[str] = Counter()
        for summary in self.summaries:
            counted.update({key: summary[key] for key in summary.keys() - SUMMARY_FIELDS})
        return counted


SUMMARY_FIELDS = frozenset({"node", "sync_wait", "failures"})


@pytest.fixture(scope="module", params=["spread", "affinity"])
def race(
    request: pytest.FixtureRequest,
    cluster: galera_cluster.GaleraCluster,
    tmp_path_factory: pytest.TempPathFactory,
) -> Race:
    """A race on one path of one customer: two racers per node ("spread": each
    connected to its node only), or six racers that list every node, each its
    own first, with customer affinity (so all of them go to the customer's home)."""
    out_dir = tmp_path_factory.mktemp("race")
    customer = secrets.randbelow(2**40) + 1
    urls = cluster.urls(DATABASE)
    affinity = request.param == "affinity"
    specs = [
        RaceSpec(
            database_url=urls[index % 3 :] + urls[: index % 3] if affinity else urls[index % 3],
            customer_id=customer,
            index=index,
            node=index % len(urls) + 1,
            sync_wait=affinity or index < len(urls),
            seconds=RACE_SECONDS,
            out_dir=out_dir,
            affinity=affinity,
        )
        for index in range(WORKERS_PER_NODE * len(urls))
    ]
    elapsed = run_workers(race_worker, specs, out_dir, join_timeout=RACE_SECONDS + 60)
    summaries, records = read_results(out_dir)
    result = Race(
        [Hold.from_record(record) for record in records],
        summaries,
        retried_codes(out_dir),
        affinity,
    )
    print(
        f"race ({request.param}): {len(specs)} processes, {elapsed:.1f} s, "
        f"{len(result.holds)} grants, "
        f"outcomes {dict(result.outcomes())}, retries by code {dict(result.retries)}"
    )
    for summary in summaries:
        print(f"  {summary}")
    return result


def test_racers_on_three_nodes_never_overlap(race: Race) -> None:
    assert_safe(race.holds)
    assert len(race.holds) == race.outcomes()["granted"] > 0
    # The racers' conflicts across nodes were certification failures, retried.
    assert set(race.retries) <= {1213}, dict(race.retries)


def test_racers_on_every_node_get_their_turn(race: Race) -> None:
    assert set(race.outcomes()) == {"granted"}, dict(race.outcomes())
    granted = [summary.get("granted", 0) for summary in race.summaries]
    assert min(granted) >= 1, race.summaries
    if race.affinity:
        # One node, one queue: its FIFO order takes turns among the racers.
        # Across nodes (spread) order is only approximate (docs/CLUSTER.md).
        assert min(granted) >= max(granted) / 2, granted


def test_a_killed_node_rejoins_by_ist(cluster: galera_cluster.GaleraCluster) -> None:
    customer = secrets.randbelow(2**40) + 1
    urls = cluster.urls(DATABASE)
    cluster.kill(2)
    with _manager(urls[0], "while-down", sync_wait=True) as manager:
        locks = manager.for_customer(customer)
        started = time.monotonic()
        leases = [locks.try_lock_paths(f"/Shared/{number}") for number in range(20)]
        # Until the others declare node 3 gone (evs.suspect_timeout), writes wait.
        granted = time.monotonic() - started
        assert all(lease is not None for lease in leases)
        seconds = cluster.restart(2)
        print(f"20 grants with node 3 dead: {granted:.1f} s; node 3 rejoined in {seconds:.1f} s")
        log = cluster.nodes[2].error_log.read_text(encoding="utf-8", errors="replace")
        assert "IST received" in log, cluster.nodes[2].error_log_tail()
        engine = create_engine(urls[2])
        try:
            with engine.connect() as connection:
                count = connection.execute(
                    text("SELECT COUNT(*) FROM path_locks WHERE customer_id = :c"),
                    {"c": customer},
                ).scalar_one()
        finally:
            engine.dispose()
        assert count == 20
