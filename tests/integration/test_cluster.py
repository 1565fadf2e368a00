"""pathlock on a 3-node MariaDB Galera cluster (issue 6, first slice).

The cluster is a private one (``tests/galera_cluster.py``), started once for
the module, with pathlock's schema migrated on node 1 (DDL replicates to the
others). What is checked:

1. a lock taken through node 1 is refused through nodes 2 and 3, and once
   released there, granted through node 3 with a larger fencing token;
2. a race: two spawned processes per node take one path over and over for a
   few seconds; an independent checker (``test_stress.py``'s) finds no two
   holds overlapping in time and tokens growing in grant order. One process
   per node reads with ``wsrep_sync_wait`` (causal reads), one without, so the
   check does not depend on it: a grant through one node conflicts with a
   concurrent grant through another at certification (both write the
   customer's sentinel row), and the loser gets error 1213, which pathlock
   retries with a WARNING. A second test (``xfail``, strict) asks for
   liveness, which pathlock does not give yet: the racers on nodes 2 and 3
   starve (see docs/CLUSTER.md, "Open problem");
3. a node killed (SIGKILL) and restarted rejoins by IST and has every grant.

Sizes: ``PATHLOCK_CLUSTER_RACE_SECONDS`` (default 5).
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from pathlock import PathLockError, PathLockManager, migrate
from tests import galera_cluster
from tests.integration.test_stress import Hold, assert_safe, read_results, run_workers

pytestmark = pytest.mark.cluster

DATABASE = "pathlock_cluster"
RACE_SECONDS = float(os.environ.get("PATHLOCK_CLUSTER_RACE_SECONDS", "5"))
RACE_PATH = "/Shared/race"
WORKERS_PER_NODE = 2
# Causal reads: a session's reads and writes first wait until its node has
# applied everything the cluster committed before them (1 reads, 2 updates
# and deletes, 4 inserts). Without it, a node's reads may lag the cluster's
# commits by a few milliseconds: never unsafe (certification catches the
# conflicting write), but a try-lock right after a release elsewhere may be
# refused.
SYNC_WAIT = 7
_RETRY = re.compile(r"retrying in \d+ ms\): \((\d+),")


def _manager(url: str, name: str, *, sync_wait: bool) -> PathLockManager:
    options: dict[str, Any] = {}
    if sync_wait:
        options["connect_args"] = {"init_command": f"SET SESSION wsrep_sync_wait={SYNC_WAIT}"}
    return PathLockManager(url, node_id=name, ttl=30, engine_options=options)


@pytest.fixture(scope="module")
def cluster() -> Iterator[galera_cluster.GaleraCluster]:
    """A running 3-node cluster with pathlock's schema in ``DATABASE``."""
    reason = galera_cluster.missing()
    if reason is not None:
        pytest.skip(reason)
    # Under the system's temporary directory, not pytest's (which only its
    # owner may enter): the rsync SST writes as another user.
    nodes = galera_cluster.GaleraCluster()
    try:
        seconds = nodes.start()
        print(f"cluster up in {seconds:.1f} s")
        nodes.nodes[0].execute(f"CREATE DATABASE {DATABASE}")
        migrate.upgrade(nodes.nodes[0].url(DATABASE))
        yield nodes
    finally:
        nodes.close()


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
    finally:
        for manager in managers:
            manager.close()


# -- the race ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RaceSpec:
    """What one spawned racer needs (picklable)."""

    database_url: str
    customer_id: int
    index: int
    node: int
    sync_wait: bool
    seconds: float
    out_dir: Path


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
        manager = _manager(spec.database_url, f"race-{spec.index}", sync_wait=spec.sync_wait)
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

    def outcomes(self) -> Counter[str]:
        counted: Counter[str] = Counter()
        for summary in self.summaries:
            counted.update({key: summary[key] for key in summary.keys() - SUMMARY_FIELDS})
        return counted


SUMMARY_FIELDS = frozenset({"node", "sync_wait", "failures"})


@pytest.fixture(scope="module")
def race(cluster: galera_cluster.GaleraCluster, tmp_path_factory: pytest.TempPathFactory) -> Race:
    """One race for the module: two racers per node on one path of one customer."""
    out_dir = tmp_path_factory.mktemp("race")
    customer = secrets.randbelow(2**40) + 1
    urls = cluster.urls(DATABASE)
    specs = [
        RaceSpec(
            database_url=urls[index % len(urls)],
            customer_id=customer,
            index=index,
            node=index % len(urls) + 1,
            sync_wait=index < len(urls),
            seconds=RACE_SECONDS,
            out_dir=out_dir,
        )
        for index in range(WORKERS_PER_NODE * len(urls))
    ]
    elapsed = run_workers(race_worker, specs, out_dir, join_timeout=RACE_SECONDS + 60)
    summaries, records = read_results(out_dir)
    result = Race(
        [Hold.from_record(record) for record in records], summaries, retried_codes(out_dir)
    )
    print(
        f"race: {len(specs)} processes, {elapsed:.1f} s, {len(result.holds)} grants, "
        f"outcomes {dict(result.outcomes())}, retries by code {dict(result.retries)}"
    )
    for summary in summaries:
        print(f"  {summary}")
    return result


def test_racers_on_three_nodes_never_overlap(race: Race) -> None:
    assert_safe(race.holds)
    assert len(race.holds) == race.outcomes()["granted"] > 0
    # Whatever failed was a certification failure retried until pathlock gave up.
    failures = [failure for summary in race.summaries for failure in summary["failures"]]
    assert all("BackendError" in failure and "(1213," in failure for failure in failures)
    assert set(race.retries) <= {1213}, dict(race.retries)


@pytest.mark.xfail(
    strict=True,
    reason="issue 6: racers on nodes 2 and 3 starve; their sentinel writes keep losing "
    "certification to node 1's stream of grants and give up after max_attempts (BackendError)",
)
def test_racers_on_every_node_get_their_turn(race: Race) -> None:
    assert set(race.outcomes()) == {"granted"}, dict(race.outcomes())
    for summary in race.summaries:
        assert summary.get("granted", 0) >= 10, summary


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
