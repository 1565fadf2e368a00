"""Fixtures of the integration tests that need more than the shared server."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

import pymysql
import pytest
from sqlalchemy import make_url

from pathlock import migrate
from servers import galera_cluster, private_mariadb

PRIVATE_DATABASE = "pathlock_faults"
# The database of the session's Galera cluster, migrated through node 1.
CLUSTER_DATABASE = "pathlock_cluster"


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port whose listener lets clients connect and never says a word
    (MySQL's server speaks first: the client waits for its greeting)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        yield int(listener.getsockname()[1])


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


class TcpProxy:
    """A TCP proxy on loopback that can cut every connection at once, like a
    network partition between one app server and the database, or freeze
    them: they stay open and nothing gets through (a network path that
    drops every packet)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self._target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._cut = False
        self._frozen = False
        # hold(): the client ends of the connections whose data is kept back,
        # what was kept, and where it goes.
        self._holding: set[socket.socket] = set()
        self._kept: dict[socket.socket, list[bytes]] = {}
        self._upstream: dict[socket.socket, socket.socket] = {}
        self._let_go = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                if self._cut:
                    client.close()
                    continue
                upstream = socket.create_connection(self._target)
                self._sockets += [client, upstream]
                self._upstream[client] = upstream
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                with self._lock:
                    if source in self._holding:
                        self._kept.setdefault(source, []).append(data)
                        continue
                if not self._frozen:
                    sink.sendall(data)
            with self._lock:
                held = source in self._holding
            if held:
                # The client hung up; what it sent still arrives, late, and
                # then the server sees it hang up.
                self._let_go.wait()
                sink.shutdown(socket.SHUT_WR)

    def freeze(self) -> None:
        """From now on, drop whatever either side sends."""
        self._frozen = True

    def hold(self) -> None:
        """Keep back what the clients of the connections open now send (new
        connections pass), as a network path that delays their packets,
        until :meth:`let_go`."""
        with self._lock:
            self._holding = set(self._upstream)

    def let_go(self) -> None:
        """Deliver what :meth:`hold` kept back (even from clients that hung
        up since), and pass everything again."""
        with self._lock:
            for client, chunks in self._kept.items():
                with contextlib.suppress(OSError):
                    for chunk in chunks:
                        self._upstream[client].sendall(chunk)
            self._kept.clear()
            self._holding = set()
        self._let_go.set()

    def cut(self) -> None:
        """Drop every connection and refuse new ones."""
        with self._lock:
            self._cut = True
            self._listener.close()
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()


@pytest.fixture
def proxy(mariadb_url: str) -> Iterator[TcpProxy]:
    url = make_url(mariadb_url)
    proxy = TcpProxy((url.host or "127.0.0.1", url.port or 3306))
    yield proxy
    proxy.cut()
