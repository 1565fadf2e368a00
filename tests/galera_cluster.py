"""A private 3-node MariaDB Galera cluster on loopback, for tests and for trying pathlock.

Each node is a :class:`~tests.private_mariadb.PrivateMariaDB` (its own data
directory, client port and process, root with an empty password on 127.0.0.1)
started with Galera: its own group-communication, IST and SST ports, all on
127.0.0.1. Node 1 bootstraps the cluster (``--wsrep-new-cluster``); nodes 2 and
3 join it one after the other by a full state transfer (SST, rsync) and the
cluster is up once every node counts 3 members and says ``Synced``. A node can
be killed (SIGKILL) and restarted: its last committed position is recovered
first (``mariadbd --wsrep-recover``), so it rejoins by an incremental transfer
(IST) from the others' write-set cache instead of a full copy.

Like the private server, it only ever signals the processes it started, by
pid (SIGTERM, then SIGKILL after a timeout); each server dies with the
process that started it; :meth:`GaleraCluster.close` stops every node and
removes the cluster's directory. Never the shared server on port 3306.

From a shell (it prints the three URLs and runs until Ctrl-C or SIGTERM)::

    python -m tests.galera_cluster start [--dir D] [--base-port P]
"""

from __future__ import annotations

import argparse
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType

import pymysql

from tests import private_mariadb

PROVIDER = Path("/usr/lib/galera/libgalera_smm.so")
CLUSTER_SIZE = 3
CLUSTER_NAME = "pathlock-test"
# Ports of one node: client, group communication (gmcast), IST, SST.
PORTS_PER_NODE = 4
# Apart enough that --base-port P gives P, P+10, P+20 for the clients.
BASE_PORT_STEP = 10

# What Galera needs of every node (row-based replication, interleaved
# auto-increment locks), plus a small write-set cache: enough for an IST
# rejoin after a short outage, gentle with a test machine's disk.
GALERA_OPTIONS = (
    "--wsrep-on=ON",
    f"--wsrep-provider={PROVIDER}",
    f"--wsrep-cluster-name={CLUSTER_NAME}",
    "--binlog-format=ROW",
    "--default-storage-engine=InnoDB",
    "--innodb-autoinc-lock-mode=2",
)
GCACHE_SIZE = "64M"

# The rsync SST's receiving daemon, started by a joiner running as root, writes
# as "nobody" (rsyncd's default for a root daemon; wsrep_sst_rsync sets no uid).
# So a joiner's data directory starts empty and owned by nobody, and every
# directory above it must let others through.
SST_USER = "nobody"
_TRAVERSABLE = 0o711

_RECOVERED = re.compile(r"WSREP: Recovered position:\s*(\S+)")


def sst_method() -> str | None:
    """rsync if installed (works offline), else mariabackup, else ``None``."""
    if shutil.which("rsync") is not None:
        return "rsync"
    if shutil.which("mariabackup") is not None:
        return "mariabackup"
    return None


def missing() -> str | None:
    """Why a Galera cluster cannot run here (``None`` if it can)."""
    reason = private_mariadb.missing()
    if reason is not None:
        return reason
    if not PROVIDER.exists():
        return f"a Galera cluster needs {PROVIDER} (Debian package galera-4), which is missing"
    if sst_method() is None:
        return "a Galera cluster needs rsync or mariabackup for state transfers: neither is here"
    return None


class GaleraNode(private_mariadb.PrivateMariaDB):
    """One node: a private MariaDB started with Galera's options.

    ``ports`` are (client, gmcast, IST, SST); ``peers`` the gmcast ports of
    every node, itself included. Starts, kills and stops are the private
    server's; :meth:`start` adds Galera and :meth:`recover` reads the last
    committed position after a crash.
    """

    def __init__(self, parent: Path, *, number: int, ports: Sequence[int], peers: Sequence[int]):
        client, self.gmcast_port, self.ist_port, self.sst_port = ports
        super().__init__(parent, port=client)
        self.number = number
        self.name = f"node{number}"
        self.cluster_address = "gcomm://" + ",".join(f"127.0.0.1:{port}" for port in peers)
        self.start_position: str | None = None

    def start(self, timeout: float = 60.0, *, new_cluster: bool = False) -> float:
        """Start the node (bootstrapping a new cluster if asked); return once it
        answers queries, with the seconds that took. It may not be synced yet:
        see :meth:`GaleraCluster.wait_synced`."""
        return self._start_with(self.galera_options(new_cluster=new_cluster), timeout)

    def galera_options(self, *, new_cluster: bool) -> list[str]:
        provider_options = (
            f"gmcast.listen_addr=tcp://127.0.0.1:{self.gmcast_port}; "
            f"ist.recv_addr=127.0.0.1:{self.ist_port}; "
            f"gcache.size={GCACHE_SIZE}"
        )
        method = sst_method()
        options = [
            *GALERA_OPTIONS,
            f"--wsrep-node-name={self.name}",
            f"--wsrep-node-address=127.0.0.1:{self.gmcast_port}",
            f"--wsrep-node-incoming-address=127.0.0.1:{self.port}",
            f"--wsrep-cluster-address={self.cluster_address}",
            f"--wsrep-provider-options={provider_options}",
            f"--wsrep-sst-method={method}",
            f"--wsrep-sst-receive-address=127.0.0.1:{self.sst_port}",
        ]
        if method == "mariabackup":
            # The donor's backup connects over the socket as root (no password).
            options.append("--wsrep-sst-auth=root:")
        if new_cluster:
            options.append("--wsrep-new-cluster")
        if self.start_position is not None:
            # Where a killed node stopped: the others send it the rest (IST).
            options.append(f"--wsrep-start-position={self.start_position}")
        return options

    def recover(self, timeout: float = 60.0) -> str:
        """After a crash (the node not running): run InnoDB recovery with
        ``--wsrep-recover`` and remember the last committed position, which
        the next :meth:`start` passes on so the node rejoins by IST."""
        if self.running:
            raise RuntimeError(f"{self.name} is running; recover only a stopped node")
        log = self.base / "recover.log"
        log.unlink(missing_ok=True)
        self.start_position = None
        # The node's own options: the server checks them (the rsync SST, for
        # one, wants a cluster address) before it recovers anything.
        command = [
            *self._server_command(log),
            *self.galera_options(new_cluster=False),
            "--wsrep-recover",
        ]
        done = subprocess.run(
            command,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            check=False,
            timeout=timeout,
        )
        text = log.read_text(encoding="utf-8", errors="replace") if log.exists() else ""
        text += done.stdout.decode(errors="replace") + done.stderr.decode(errors="replace")
        found = _RECOVERED.findall(text)
        if not found:
            raise RuntimeError(f"{self.name}: --wsrep-recover found no position:\n{text[-3000:]}")
        self.start_position = found[-1]
        return self.start_position

    def status(self) -> dict[str, str]:
        """The node's ``wsrep_%`` status variables."""
        connection = self.connect(timeout=2)
        try:
            with connection.cursor() as cursor:
                cursor.execute("SHOW GLOBAL STATUS LIKE 'wsrep\\_%'")
                return {str(name): str(value) for name, value in cursor.fetchall()}
        finally:
            connection.close()

    def synced(self, size: int) -> bool:
        try:
            status = self.status()
        except pymysql.MySQLError:
            return False
        return (
            status.get("wsrep_ready") == "ON"
            and status.get("wsrep_cluster_status") == "Primary"
            and status.get("wsrep_local_state_comment") == "Synced"
            and status.get("wsrep_cluster_size") == str(size)
        )

    # -- internals -------------------------------------------------------------

    def _server_command(self, error_log: Path) -> list[str]:
        return [
            self._server,
            "--no-defaults",
            f"--datadir={self.datadir}",
            f"--port={self.port}",
            "--bind-address=127.0.0.1",
            f"--socket={self.base / 'mysqld.sock'}",
            f"--pid-file={self.base / 'mysqld.pid'}",
            f"--log-error={error_log}",
            f"--tmpdir={self.base}",
            "--port-open-timeout=10",
            *self._user_option(),
            *private_mariadb.SERVER_OPTIONS,
        ]

    def _start_with(self, extra: Sequence[str], timeout: float) -> float:
        # The private server's start, with Galera's options: the same waiting
        # for an answer, the same death signal, the same error reporting.
        if self.running:
            raise RuntimeError(f"{self.name} is running already")
        if not self.datadir.exists():
            self.install()
        started = time.monotonic()
        self.process = subprocess.Popen(
            [*self._server_command(self.error_log), *extra],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=private_mariadb._die_with_parent,  # noqa: PLW1509 - a prctl call only
        )
        self.starts += 1
        deadline = started + timeout
        while not self._answers():
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with {self.process.returncode}:\n" + self.error_log_tail()
                )
            if time.monotonic() >= deadline:
                self.kill()
                raise RuntimeError(
                    f"{self.name} did not answer within {timeout:g} s:\n" + self.error_log_tail()
                )
            time.sleep(0.1)
        return time.monotonic() - started


class GaleraCluster:
    """Three :class:`GaleraNode` s: :meth:`start` them, :meth:`kill` and
    :meth:`restart` one, :meth:`close` them all (and remove their files).

    ``nodes[0]`` is node 1. ``urls(database)`` are SQLAlchemy URLs, one per node.
    """

    def __init__(self, parent: Path | None = None, *, base_port: int | None = None) -> None:
        reason = missing()
        if reason is not None:
            raise RuntimeError(reason)
        self.base = Path(tempfile.mkdtemp(prefix="pathlock-galera-", dir=parent))
        self.base.chmod(_TRAVERSABLE)
        ports = [self._ports(number, base_port) for number in range(CLUSTER_SIZE)]
        peers = [node_ports[1] for node_ports in ports]
        self.nodes = [
            GaleraNode(self.base, number=number + 1, ports=node_ports, peers=peers)
            for number, node_ports in enumerate(ports)
        ]
        for node in self.nodes:
            node.base.chmod(_TRAVERSABLE)

    @staticmethod
    def _ports(number: int, base_port: int | None) -> list[int]:
        if base_port is None:
            return [private_mariadb.free_port() for _ in range(PORTS_PER_NODE)]
        first = base_port + BASE_PORT_STEP * number
        return list(range(first, first + PORTS_PER_NODE))

    # -- lifecycle -------------------------------------------------------------

    def start(self, timeout: float = 120.0) -> float:
        """Bootstrap node 1, then join nodes 2 and 3 one at a time (each by a
        full SST); return once every node is synced in a cluster of three,
        with the seconds that took (data directory set-up included)."""
        started = time.monotonic()
        first, *others = self.nodes
        first.install()
        for node in others:
            self._prepare_joiner(node)
        first.start(timeout, new_cluster=True)
        self.wait_synced(first, size=1, timeout=timeout)
        for count, node in enumerate(others, start=2):
            node.start(timeout)
            self.wait_synced(node, size=count, timeout=timeout)
        self.wait_all_synced(timeout)
        return time.monotonic() - started

    def _prepare_joiner(self, node: GaleraNode) -> None:
        # Empty: the joiner gets everything by SST; owned by the user the
        # rsync daemon writes as (see SST_USER).
        blocked = [
            str(directory)
            for directory in node.datadir.parents
            if directory.stat().st_mode & 0o001 == 0
        ]
        if sst_method() == "rsync" and os.geteuid() == 0 and blocked:
            raise RuntimeError(
                f"rsync SST writes as {SST_USER}, who cannot pass {blocked[0]}: "
                "put the cluster under a directory others can traverse (like /tmp)"
            )
        node.datadir.mkdir()
        if os.geteuid() == 0:
            nobody = pwd.getpwnam(SST_USER)
            os.chown(node.datadir, nobody.pw_uid, nobody.pw_gid)

    def kill(self, index: int) -> None:
        """SIGKILL node ``index`` (0-based): a crash. The others keep quorum."""
        self.nodes[index].kill()

    def restart(self, index: int, timeout: float = 120.0) -> float:
        """Recover node ``index``'s position, start it and wait until the
        whole cluster is synced again; return the seconds that took."""
        started = time.monotonic()
        node = self.nodes[index]
        node.recover(timeout)
        node.start(timeout)
        self.wait_all_synced(timeout)
        return time.monotonic() - started

    def stop(self, timeout: float = 30.0) -> None:
        """Shut every running node down at once (SIGTERM, then SIGKILL after
        ``timeout`` seconds each)."""
        running = [node for node in self.nodes if node.running]
        if running:
            with ThreadPoolExecutor(len(running)) as pool:
                list(pool.map(lambda node: node.stop(timeout), running))

    def close(self) -> None:
        """Stop every node and remove the cluster's directory."""
        try:
            self.stop()
        finally:
            shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> GaleraCluster:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # -- using it --------------------------------------------------------------

    def urls(self, database: str = "") -> list[str]:
        return [node.url(database) for node in self.nodes]

    def wait_synced(self, node: GaleraNode, *, size: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not node.synced(size):
            if not node.running:
                raise RuntimeError(f"{node.name} exited:\n" + node.error_log_tail())
            if time.monotonic() >= deadline:
                raise RuntimeError(
                    f"{node.name} not synced in a cluster of {size} within {timeout:g} s:\n"
                    + node.error_log_tail()
                )
            time.sleep(0.1)

    def wait_all_synced(self, timeout: float) -> None:
        for node in self.nodes:
            self.wait_synced(node, size=CLUSTER_SIZE, timeout=timeout)


# -- the command line ------------------------------------------------------------------


def _arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tests.galera_cluster",
        description="Run a private 3-node MariaDB Galera cluster on 127.0.0.1 until interrupted.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    start = commands.add_parser("start", help="start the cluster, print its URLs, wait")
    start.add_argument("--dir", type=Path, help="parent of the cluster's directory (default: /tmp)")
    start.add_argument(
        "--base-port",
        type=int,
        help="client ports P, P+10, P+20 (Galera's P+1..P+3 and so on); default: free ports",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    arguments = _arguments(argv)
    reason = missing()
    if reason is not None:
        print(reason, file=sys.stderr)
        return 1
    stopping = threading.Event()
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, lambda *_: stopping.set())
    with GaleraCluster(arguments.dir, base_port=arguments.base_port) as cluster:
        print(f"starting a 3-node Galera cluster in {cluster.base} ...", flush=True)
        seconds = cluster.start()
        print(f"up in {seconds:.1f} s; root, empty password:")
        for node, url in zip(cluster.nodes, cluster.urls(), strict=True):
            print(f"  {node.name}: {url}")
        print("Ctrl-C (or SIGTERM) stops the cluster and removes its files.", flush=True)
        while not stopping.wait(1.0):
            pass
        print("stopping ...", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
