"""The Galera harness's repair (``servers/galera_cluster.py``), on the session's
cluster, with plain SQL (no pathlock): node 1 killed and node 3 isolated at
once (node 2, alone, loses the majority too), ``ensure_healthy`` brings all
three back with the data. Every cluster test leans on that repair (the
``healthy_cluster`` fixture). The harness's single steps (a partition by
``gmcast.isolate``, a lost majority and its bootstrap, restarts) are exercised,
with their error codes, under pathlock's workload in ``test_cluster_faults.py``.

The timings go to stdout (``-s`` shows them).
"""

from __future__ import annotations

import secrets

import pymysql
import pytest

from servers import galera_cluster
from tests.integration.conftest import CLUSTER_DATABASE

pytestmark = pytest.mark.cluster

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
