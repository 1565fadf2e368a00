"""The Galera harness's failures and repairs (``tests/galera_cluster.py``), on
the session's cluster, with plain SQL (no pathlock): what the cluster tests of
pathlock will lean on.

1. a partition: node 3 isolated (``gmcast.isolate``) answers 1047 once the
   others have evicted it, while nodes 1 and 2 keep taking writes (the first
   ones wait for the eviction); connected again, node 3 has them all;
2. a majority loss: nodes 2 and 3 killed, node 1 goes non-Primary (1047, and
   the commit in flight fails); bootstrapped, it takes writes alone; the two
   restarted nodes rejoin with every write;
3. a repair: node 1 killed and node 3 isolated at once (node 2, alone, loses
   the majority too), ``ensure_healthy`` brings all three back with the data.

The timings go to stdout (``-s`` shows them).
"""

from __future__ import annotations

import secrets
import time

import pymysql
import pytest

from tests import galera_cluster
from tests.integration.conftest import CLUSTER_DATABASE

pytestmark = pytest.mark.cluster

# ER_UNKNOWN_COM_ERROR, "WSREP has not yet prepared node for application use":
# a node outside the Primary component refuses statements on tables.
NOT_PRIMARY = 1047
# ER_ERROR_DURING_COMMIT: the write set could not be replicated.
COMMIT_FAILED = 1180
# Writes that wait for the eviction of a lost node (about 6.3 s measured).
WRITE_TIMEOUT = 30.0


def _table(cluster: galera_cluster.GaleraCluster) -> str:
    name = f"{CLUSTER_DATABASE}.harness_{secrets.token_hex(4)}"
    cluster.nodes[0].query(f"CREATE TABLE {name} (id INT PRIMARY KEY, node INT NOT NULL)")
    return name


def _insert(node: galera_cluster.GaleraNode, table: str, row_id: int) -> None:
    node.query(f"INSERT INTO {table} VALUES ({row_id}, {node.number})", WRITE_TIMEOUT)


def _ids(node: galera_cluster.GaleraNode, table: str) -> list[int]:
    return sorted(int(row[0]) for row in node.query(f"SELECT id FROM {table}"))


def _error_code(node: galera_cluster.GaleraNode, sql: str) -> int:
    with pytest.raises(pymysql.MySQLError) as caught:
        node.query(sql)
    return int(caught.value.args[0])


def test_an_isolated_node_refuses_then_catches_up(
    healthy_cluster: galera_cluster.GaleraCluster,
) -> None:
    cluster = healthy_cluster
    first, second, third = cluster.nodes
    table = _table(cluster)
    _insert(first, table, 1)

    started = time.monotonic()
    cluster.isolate(2)
    # Both wait until nodes 1 and 2 have evicted node 3, then commit.
    _insert(first, table, 2)
    _insert(second, table, 3)
    accepted = time.monotonic() - started
    cluster.wait_non_primary(2)
    refused = time.monotonic() - started
    assert cluster.wait_primary(0, size=2, timeout=1) < 1
    assert cluster.wait_primary(1, size=2, timeout=1) < 1
    assert not cluster.is_primary(2)
    assert _error_code(third, f"SELECT id FROM {table}") == NOT_PRIMARY
    assert _error_code(third, f"INSERT INTO {table} VALUES (99, 3)") == NOT_PRIMARY
    _insert(second, table, 4)  # no wait any more

    healing = time.monotonic()
    cluster.isolate(2, isolated=False)
    cluster.wait_all_synced(60)
    healed = time.monotonic() - healing
    assert [_ids(node, table) for node in cluster.nodes] == [[1, 2, 3, 4]] * 3
    print(
        f"isolated node 3: writes through 1 and 2 went through after {accepted:.1f} s, "
        f"node 3 non-Primary (1047) after {refused:.1f} s; "
        f"connected again: all synced after {healed:.1f} s"
    )


def test_a_lost_majority_is_bootstrapped_and_rejoined(
    healthy_cluster: galera_cluster.GaleraCluster,
) -> None:
    cluster = healthy_cluster
    survivor = cluster.nodes[0]
    table = _table(cluster)
    _insert(survivor, table, 1)
    in_flight = survivor.connect(timeout=5)
    try:
        with in_flight.cursor() as cursor:
            cursor.execute("BEGIN")
            cursor.execute(f"INSERT INTO {table} VALUES (2, 1)")
            started = time.monotonic()
            cluster.kill(1)
            cluster.kill(2)
            # Waits until node 1 notices it is alone, then fails.
            with pytest.raises(pymysql.MySQLError) as caught:
                cursor.execute("COMMIT")
            failed = time.monotonic() - started
    finally:
        in_flight.close()
    assert caught.value.args[0] in {COMMIT_FAILED, NOT_PRIMARY}, caught.value
    cluster.wait_non_primary(0)
    refused = time.monotonic() - started
    assert _error_code(survivor, f"INSERT INTO {table} VALUES (3, 1)") == NOT_PRIMARY

    bootstrapped = cluster.bootstrap(0)
    assert cluster.status(0)["wsrep_cluster_size"] == "1"
    _insert(survivor, table, 4)
    rejoined = cluster.restart(1) + cluster.restart(2)
    assert [_ids(node, table) for node in cluster.nodes] == [[1, 4]] * 3
    print(
        f"nodes 2 and 3 killed: the commit in flight failed after {failed:.1f} s "
        f"({caught.value.args[0]}), node 1 non-Primary after {refused:.1f} s; "
        f"bootstrapped in {bootstrapped:.2f} s; both restarted and synced in {rejoined:.1f} s"
    )


def test_ensure_healthy_repairs_a_killed_and_an_isolated_node(
    healthy_cluster: galera_cluster.GaleraCluster,
) -> None:
    cluster = healthy_cluster
    table = _table(cluster)
    _insert(cluster.nodes[1], table, 1)
    cluster.kill(0)  # node 1: its data directory is mariadb-install-db's
    cluster.isolate(2)
    repaired = cluster.ensure_healthy()
    for node in cluster.nodes:
        assert node.synced(3)
    _insert(cluster.nodes[0], table, 2)
    assert [_ids(node, table) for node in cluster.nodes] == [[1, 2]] * 3
    print(f"node 1 killed and node 3 isolated: repaired in {repaired:.1f} s")
