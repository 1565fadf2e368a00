"""Fixtures of the integration tests that need more than the shared server."""

from __future__ import annotations

from collections.abc import Iterator

import pymysql
import pytest

from pathlock import migrate
from servers import galera_cluster, private_mariadb

PRIVATE_DATABASE = "pathlock_faults"
# The database of the session's Galera cluster, migrated through node 1.
CLUSTER_DATABASE = "pathlock_cluster"


@pytest.fixture(scope="module")
def private_server(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[private_mariadb.PrivateMariaDB]:
    """A MariaDB server of this test module alone (see ``servers/private_mariadb.py``),
    which a test may stop, kill and start again, with the pathlock schema migrated
    into ``PRIVATE_DATABASE``."""
    reason = private_mariadb.missing()
    if reason is not None:
        pytest.skip(reason)
    server = private_mariadb.PrivateMariaDB(tmp_path_factory.getbasetemp())
    try:
        server.start()
        server.execute(f"CREATE DATABASE {PRIVATE_DATABASE}")
        migrate.upgrade(server.url(PRIVATE_DATABASE))
        yield server
    finally:
        server.close()


@pytest.fixture(scope="session")
def cluster() -> Iterator[galera_cluster.GaleraCluster]:
    """A running 3-node Galera cluster (``servers/galera_cluster.py``), started
    once for the whole session and shared by every test module that asks, with
    pathlock's schema migrated through node 1 into ``CLUSTER_DATABASE``. A
    test that kills or isolates nodes takes ``healthy_cluster`` instead."""
    reason = galera_cluster.missing()
    if reason is not None:
        pytest.skip(reason)
    # Under the system's temporary directory, not pytest's (which only its
    # owner may enter): the rsync SST writes as another user.
    nodes = galera_cluster.GaleraCluster()
    try:
        seconds = nodes.start()
        print(f"cluster up in {seconds:.1f} s")
        _create_cluster_database(nodes)
        yield nodes
    finally:
        nodes.close()


@pytest.fixture
def healthy_cluster(
    cluster: galera_cluster.GaleraCluster,
) -> Iterator[galera_cluster.GaleraCluster]:
    """The session's cluster with all three nodes running and Synced in one
    Primary component of three, before the test and again after it, whatever
    the test (or an earlier one) left killed, isolated or non-Primary (see
    ``GaleraCluster.ensure_healthy``). Should that repair fail, the cluster
    starts over, its database created and migrated again."""
    _make_healthy(cluster)
    yield cluster
    _make_healthy(cluster)


def _create_cluster_database(cluster: galera_cluster.GaleraCluster) -> None:
    cluster.nodes[0].execute(f"CREATE DATABASE {CLUSTER_DATABASE}")
    migrate.upgrade(cluster.nodes[0].url(CLUSTER_DATABASE))


def _make_healthy(cluster: galera_cluster.GaleraCluster) -> None:
    try:
        seconds = cluster.ensure_healthy()
    except (RuntimeError, pymysql.MySQLError) as error:
        print(f"cluster repair failed, starting a new cluster: {error}")
        seconds = cluster.reset()
        _create_cluster_database(cluster)
    if seconds >= 1:
        print(f"cluster repaired in {seconds:.1f} s")
