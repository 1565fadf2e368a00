"""A private 3-node MariaDB Galera cluster on loopback, for tests and for trying pathlock.

Each node is a :class:`~servers.private_mariadb.PrivateMariaDB` (its own data
directory, client port and process, root with an empty password on 127.0.0.1)
started with Galera: its own group-communication, IST and SST ports, all on
127.0.0.1. Node 1 bootstraps the cluster (``--wsrep-new-cluster``); nodes 2 and
3 join it one after the other by a full state transfer (SST, rsync) and the
cluster is up once every node counts 3 members and says ``Synced``. A node can
be killed (SIGKILL) and restarted: its last committed position is recovered
first (``mariadbd --wsrep-recover``), so it rejoins by an incremental transfer
(IST) from the others' write-set cache instead of a full copy.

The failures the cluster tests need, all on loopback and without root's
network tools: a partition (:meth:`GaleraCluster.isolate`, Galera's
``gmcast.isolate``), a crash (:meth:`GaleraCluster.kill`), the loss of the
majority and its way out (:meth:`GaleraCluster.bootstrap` of a survivor, or of
the most advanced stopped node); waits on a node's state
(:meth:`GaleraCluster.wait_primary`, :meth:`GaleraCluster.wait_non_primary`,
polled every ``POLL`` seconds); and :meth:`GaleraCluster.ensure_healthy`,
which brings three synced nodes back from any of those states.

Like the private server, it only ever signals the processes it started, by
pid (SIGTERM, then SIGKILL after a timeout); each server dies with the
process that started it; :meth:`GaleraCluster.close` stops every node and
removes the cluster's directory. Never the shared server on port 3306.

From a shell (it prints the three URLs and runs until Ctrl-C or SIGTERM)::

    python -m servers.galera_cluster start [--dir D] [--base-port P]
"""

from __future__ import annotations

import argparse
import contextlib
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
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Any

import pymysql

from servers import private_mariadb

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
_UNSAFE = re.compile(r"^safe_to_bootstrap:\s*0\s*$", re.MULTILINE)
# Seconds between two looks at a node's state while waiting for one.
POLL = 0.05
# Seconds a node gets to shut down cleanly in close() before SIGKILL.
CLOSE_TIMEOUT = 15.0
# At most this long, ensure_healthy() waits for the nodes' views to settle
# (a killed node is evicted after about 6 s) before it decides to bootstrap.
SETTLE_TIMEOUT = 30.0
# Seconds a harness statement may take (connect, read, write) before it gives up.
QUERY_TIMEOUT = 5.0


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
        if not new_cluster:
            self.let_sst_write()
        return self._start_with(self.galera_options(new_cluster=new_cluster), timeout)

    def let_sst_write(self) -> None:
        """Give the data directory, all of it, to ``SST_USER`` before a start
        that may receive a state transfer, when running as root with the rsync
        SST (otherwise do nothing).

        The joiner's rsync daemon writes as ``SST_USER``: into a data
        directory that ``mariadb-install-db`` made (node 1's) it cannot even
        write the IST marker, and a full SST must overwrite the files the
        server created as root since. The server itself, root, reads and
        writes them whoever owns them.
        """
        if os.geteuid() != 0 or sst_method() != "rsync" or not self.datadir.exists():
            return
        nobody = pwd.getpwnam(SST_USER)
        os.chown(self.datadir, nobody.pw_uid, nobody.pw_gid)
        for root, directories, files in os.walk(self.datadir):
            for name in (*directories, *files):
                os.chown(Path(root) / name, nobody.pw_uid, nobody.pw_gid, follow_symlinks=False)

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

    def query(self, sql: str, timeout: float = QUERY_TIMEOUT) -> tuple[tuple[Any, ...], ...]:
        """Run one statement as root (autocommit) and return its rows.

        Connecting, every read and every write give up after ``timeout``
        seconds (``pymysql.MySQLError``), so a node that hangs cannot hang
        the harness. A node outside the Primary component answers ``SHOW``,
        ``SET`` and table-less ``SELECT`` s, and error 1047 to everything else.
        """
        connection = pymysql.connect(
            host="127.0.0.1",
            port=self.port,
            user="root",
            password="",
            connect_timeout=timeout,
            read_timeout=timeout,
            write_timeout=timeout,
            autocommit=True,
        )
        try:
            with connection.cursor() as cursor:
                cursor.execute(sql)
                return tuple(cursor.fetchall())
        finally:
            with contextlib.suppress(pymysql.MySQLError):
                connection.close()

    def status(self, timeout: float = 2.0) -> dict[str, str]:
        """The node's ``wsrep_%`` status variables (``pymysql.MySQLError`` if
        it does not answer within ``timeout`` seconds)."""
        rows = self.query("SHOW GLOBAL STATUS LIKE 'wsrep\\_%'", timeout)
        return {str(name): str(value) for name, value in rows}

    def set_provider_option(self, option: str) -> None:
        """``SET GLOBAL wsrep_provider_options='option'`` (one ``name=value``),
        at run time: the others keep their values."""
        if "'" in option or ";" in option:
            raise ValueError(f"one provider option, unquoted: {option!r}")
        self.query(f"SET GLOBAL wsrep_provider_options='{option}'")

    def synced(self, size: int) -> bool:
        """Whether the node answers and is ready, in the Primary component,
        ``Synced``, with ``size`` members."""
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

    def mark_safe_to_bootstrap(self) -> None:
        """Set ``safe_to_bootstrap: 1`` in the stopped node's ``grastate.dat``,
        as the Galera manual's full-cluster recovery says to do on the most
        advanced node: without it, ``--wsrep-new-cluster`` refuses to start
        a node that did not leave the cluster last and cleanly."""
        if self.running:
            raise RuntimeError(f"{self.name} is running; edit grastate.dat only when stopped")
        grastate = self.datadir / "grastate.dat"
        text = grastate.read_text(encoding="utf-8")
        marked, count = _UNSAFE.subn("safe_to_bootstrap: 1", text)
        if count == 0 and "safe_to_bootstrap: 1" not in text:
            raise RuntimeError(f"{self.name}: no safe_to_bootstrap line in {grastate}:\n{text}")
        grastate.write_text(marked, encoding="utf-8")

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
            time.sleep(POLL)
        return time.monotonic() - started


class GaleraCluster:
    """Three :class:`GaleraNode` s: :meth:`start` them; :meth:`kill`,
    :meth:`restart`, :meth:`isolate` and :meth:`bootstrap` one;
    :meth:`ensure_healthy` them all again; :meth:`close` them all (and remove
    their files), whatever their state.

    Nodes are named by 0-based index: ``nodes[0]`` is node 1.
    ``urls(database)`` are SQLAlchemy URLs, one per node.
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
        # Indexes of the nodes isolate() cut off and has not connected again.
        self.isolated: set[int] = set()

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
        """SIGKILL node ``index`` (0-based): a crash. The others notice after
        ``evs.suspect_timeout`` (5 s; about 6.3 s measured), and until then
        every commit through them waits; then they stay Primary if they are a
        majority of the last Primary component (two of three), else they go
        non-Primary (see :meth:`bootstrap`)."""
        self.nodes[index].kill()
        self.isolated.discard(index)

    def restart(self, index: int, timeout: float = 120.0) -> float:
        """Recover stopped node ``index``'s position, start it and wait until it
        and every other running node that is not isolated are synced in one
        cluster of them all (of three, when the others run); return the
        seconds that took. It rejoins by IST when the others' write-set cache
        still holds what it missed. It needs a Primary component to join:
        after a majority loss, :meth:`bootstrap` a survivor first."""
        started = time.monotonic()
        node = self.nodes[index]
        node.recover(timeout)
        node.start(timeout)
        self.wait_members_synced(_left(started, timeout))
        return time.monotonic() - started

    def isolate(self, index: int, isolated: bool = True) -> None:
        """Cut node ``index`` off from the others (``isolated=False``: connect it
        again): a network partition on loopback, without root's network tools,
        through Galera's provider option ``gmcast.isolate`` (1, then 0), set at
        run time on that node. Returns at once; wait for the effect with
        :meth:`wait_non_primary`, :meth:`wait_primary` and
        :meth:`wait_members_synced`.

        Measured here (Galera 26.4): nothing changes for about 6.3 s
        (``evs.suspect_timeout``, 5 s, and the view change), and meanwhile
        every commit waits, on every node. Then the other two form a Primary
        component of 2 and their waiting commits go through, while the
        isolated node is non-Primary (``wsrep_ready`` OFF): every statement
        there that reads or writes a table fails with error 1047; ``SHOW``,
        ``SET`` and table-less ``SELECT`` s still answer. Connected again, it
        rejoins by IST: Synced in a cluster of three about 4 s later.
        """
        self.nodes[index].set_provider_option(f"gmcast.isolate={int(isolated)}")
        if isolated:
            self.isolated.add(index)
        else:
            self.isolated.discard(index)

    def bootstrap(self, index: int, timeout: float = 120.0) -> float:
        """Make node ``index`` the new Primary component after the majority was
        lost; return once it is Primary and Synced, with the seconds that took.

        A running node (say, the survivor of two killed, non-Primary) gets
        ``pc.bootstrap=YES``: its component becomes Primary at once (under
        0.1 s measured), of its own members only (size 1 for a lone
        survivor), with its data and the cluster's state UUID, so the killed
        nodes :meth:`restart` into it by IST. If it still counts members that
        are gone (their eviction takes about 6 s), it first waits until it
        notices; a node already Primary is left as it is.

        A stopped node (every node down) is recovered (``--wsrep-recover``),
        marked safe to bootstrap in ``grastate.dat`` and started with
        ``--wsrep-new-cluster``: the manual's full-cluster restart. Pick the
        most advanced node (largest seqno), as :meth:`ensure_healthy` does.

        Refuses (``RuntimeError``) while another node is Primary with no more
        members than there are running nodes: two Primary components would be
        a split brain.
        """
        started = time.monotonic()
        node = self.nodes[index]
        for other, peer in enumerate(self.nodes):
            if other != index and peer.running and self._settled_primary(other):
                raise RuntimeError(
                    f"{peer.name} is in a Primary component: bootstrapping {node.name} "
                    "would split the cluster in two"
                )
        if node.running:
            running = self.running_count()
            status = self._wait_for(
                node,
                "out of the Primary component, or in one of running nodes only",
                lambda status: (
                    status.get("wsrep_cluster_status") != "Primary"
                    or int(status.get("wsrep_cluster_size", "0")) <= running
                ),
                timeout,
            )
            if status.get("wsrep_cluster_status") != "Primary":
                node.set_provider_option("pc.bootstrap=YES")
        else:
            node.recover(timeout)
            node.mark_safe_to_bootstrap()
            node.start(_left(started, timeout), new_cluster=True)
        self._wait_for(
            node,
            "Primary and Synced",
            lambda status: (
                status.get("wsrep_cluster_status") == "Primary"
                and status.get("wsrep_local_state_comment") == "Synced"
                and status.get("wsrep_ready") == "ON"
            ),
            _left(started, timeout),
        )
        return time.monotonic() - started

    def ensure_healthy(self, timeout: float = 180.0) -> float:
        """Bring the cluster back to three running nodes, Synced in one Primary
        component of three, whatever state it was left in (nodes killed,
        isolated, non-Primary); return the seconds that took (a few
        milliseconds if it was healthy). The data stays (unlike :meth:`reset`).

        In order: connect every isolated node again (and set
        ``gmcast.isolate=0`` on any running non-Primary node, in case it was
        isolated with SQL of its own); wait (up to ``SETTLE_TIMEOUT``) until
        every running node has settled: non-Primary, or Synced in a cluster
        of as many members as are running (a killed node takes about 6 s to
        be evicted); if no running node is Primary then, :meth:`bootstrap`
        the most advanced one (largest ``wsrep_last_committed``; with none
        running, the largest recovered seqno); :meth:`restart` every stopped
        node; wait until all three are Synced.
        """
        started = time.monotonic()
        if not self.isolated and self._all_synced():
            return time.monotonic() - started
        for index, node in enumerate(self.nodes):
            if node.running and (index in self.isolated or not self.is_primary(index)):
                with contextlib.suppress(pymysql.MySQLError):
                    self.isolate(index, isolated=False)
        self.isolated.clear()
        running = [index for index, node in enumerate(self.nodes) if node.running]
        if not running:
            positions = {index: self.nodes[index].recover(timeout) for index in range(CLUSTER_SIZE)}
            self.bootstrap(max(positions, key=lambda index: _seqno(positions[index])), timeout)
        else:
            self._wait_settled(min(SETTLE_TIMEOUT, _left(started, timeout)))
            if not any(self.is_primary(index) for index in running):
                self.bootstrap(self._most_advanced(running), _left(started, timeout))
        for index, node in enumerate(self.nodes):
            if not node.running:
                self.restart(index, _left(started, timeout))
        self.wait_all_synced(_left(started, timeout))
        return time.monotonic() - started

    def reset(self, timeout: float = 120.0) -> float:
        """Start over: stop every node, remove their data directories and
        :meth:`start` a new cluster on the same ports; return the seconds that
        took. Every database is gone: create (and migrate) them again. The
        last resort when :meth:`ensure_healthy` fails."""
        started = time.monotonic()
        self.stop(CLOSE_TIMEOUT)
        for node in self.nodes:
            shutil.rmtree(node.datadir, ignore_errors=True)
            node.start_position = None
        self.start(timeout)
        return time.monotonic() - started

    def stop(self, timeout: float = 30.0) -> None:
        """Shut every running node down at once, whatever its state (SIGTERM,
        then SIGKILL after ``timeout`` seconds); return once none runs."""
        running = [node for node in self.nodes if node.running]
        errors: list[BaseException] = []
        if running:
            with ThreadPoolExecutor(len(running)) as pool:
                futures = [pool.submit(node.stop, timeout) for node in running]
            errors = [error for future in futures if (error := future.exception()) is not None]
        for node in running:
            node.kill()  # a no-op unless its stop failed
        self.isolated.clear()
        if errors:
            raise errors[0]

    def close(self) -> None:
        """Stop every node, whatever its state (synced, isolated, non-Primary,
        killed), and remove the cluster's directory. A node gets
        ``CLOSE_TIMEOUT`` seconds to shut down cleanly, then SIGKILL."""
        try:
            self.stop(CLOSE_TIMEOUT)
        finally:
            for node in self.nodes:
                node.kill()
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

    def running_count(self) -> int:
        """How many nodes run (killed ones do not; isolated ones do)."""
        return sum(node.running for node in self.nodes)

    def status(self, index: int) -> dict[str, str]:
        """Node ``index``'s ``wsrep_%`` status variables
        (``pymysql.MySQLError`` if it does not answer)."""
        return self.nodes[index].status()

    def is_primary(self, index: int) -> bool:
        """Whether node ``index`` answers and says it is in the Primary
        component (``wsrep_cluster_status`` = ``Primary``). A node cut off
        from the others keeps saying so until it evicts them (about 6 s)."""
        try:
            status = self.nodes[index].status()
        except pymysql.MySQLError:
            return False
        return status.get("wsrep_cluster_status") == "Primary"

    def wait_primary(self, index: int, size: int | None = None, timeout: float = 30.0) -> float:
        """Wait until node ``index`` is in the Primary component (with ``size``
        members, if given); return the seconds that took."""
        started = time.monotonic()
        self._wait_for(
            self.nodes[index],
            "Primary" if size is None else f"Primary with {size} members",
            lambda status: (
                status.get("wsrep_cluster_status") == "Primary"
                and (size is None or status.get("wsrep_cluster_size") == str(size))
            ),
            timeout,
        )
        return time.monotonic() - started

    def wait_non_primary(self, index: int, timeout: float = 30.0) -> float:
        """Wait until node ``index`` answers and is out of the Primary
        component (from then on, error 1047 to any statement on a table);
        return the seconds that took."""
        started = time.monotonic()
        self._wait_for(
            self.nodes[index],
            "non-Primary",
            lambda status: status.get("wsrep_cluster_status", "Primary") != "Primary",
            timeout,
        )
        return time.monotonic() - started

    def wait_synced(self, node: GaleraNode, *, size: int, timeout: float) -> float:
        """Wait until ``node`` is ready, Primary, Synced, with ``size`` members;
        return the seconds that took."""
        started = time.monotonic()
        self._wait_for(
            node,
            f"synced in a cluster of {size}",
            lambda status: (
                status.get("wsrep_ready") == "ON"
                and status.get("wsrep_cluster_status") == "Primary"
                and status.get("wsrep_local_state_comment") == "Synced"
                and status.get("wsrep_cluster_size") == str(size)
            ),
            timeout,
        )
        return time.monotonic() - started

    def wait_all_synced(self, timeout: float) -> float:
        """Wait until all three nodes are synced in a cluster of three; return
        the seconds that took."""
        started = time.monotonic()
        for node in self.nodes:
            self.wait_synced(node, size=CLUSTER_SIZE, timeout=_left(started, timeout))
        return time.monotonic() - started

    def wait_members_synced(self, timeout: float) -> float:
        """Wait until every running node that is not isolated is synced in a
        cluster of exactly those nodes; return the seconds that took."""
        started = time.monotonic()
        members = [
            node
            for index, node in enumerate(self.nodes)
            if node.running and index not in self.isolated
        ]
        for node in members:
            self.wait_synced(node, size=len(members), timeout=_left(started, timeout))
        return time.monotonic() - started

    # -- internals -------------------------------------------------------------

    @staticmethod
    def _wait_for(
        node: GaleraNode, what: str, check: Callable[[dict[str, str]], bool], timeout: float
    ) -> dict[str, str]:
        # Poll the node's status every POLL seconds until check() holds; a
        # node that does not answer (starting, hung, busy) is polled again.
        deadline = time.monotonic() + timeout
        while True:
            try:
                status = node.status()
            except pymysql.MySQLError:
                pass
            else:
                if check(status):
                    return status
            if not node.running:
                raise RuntimeError(f"{node.name} exited:\n" + node.error_log_tail())
            if time.monotonic() >= deadline:
                raise RuntimeError(
                    f"{node.name} not {what} within {timeout:g} s:\n" + node.error_log_tail()
                )
            time.sleep(POLL)

    def _all_synced(self) -> bool:
        return all(node.running and node.synced(CLUSTER_SIZE) for node in self.nodes)

    def _settled_primary(self, index: int) -> bool:
        # Primary, and not merely because it has not yet noticed that members
        # were killed: it counts no more members than there are running nodes.
        try:
            status = self.nodes[index].status()
        except pymysql.MySQLError:
            return False
        return (
            status.get("wsrep_cluster_status") == "Primary"
            and int(status.get("wsrep_cluster_size", "0")) <= self.running_count()
        )

    def _wait_settled(self, timeout: float) -> bool:
        # Until every running node is non-Primary or Synced in a cluster of
        # all the running nodes; False if that did not happen in time.
        deadline = time.monotonic() + timeout
        while True:
            running = [node for node in self.nodes if node.running]
            try:
                statuses = [node.status() for node in running]
            except pymysql.MySQLError:
                statuses = None
            if statuses is not None and all(
                status.get("wsrep_cluster_status") != "Primary"
                or (
                    status.get("wsrep_local_state_comment") == "Synced"
                    and status.get("wsrep_cluster_size") == str(len(running))
                )
                for status in statuses
            ):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(POLL)

    def _most_advanced(self, indexes: Sequence[int]) -> int:
        # The node that committed the most (wsrep_last_committed), of those
        # that answer; the first one if none does.
        committed: dict[int, int] = {}
        for index in indexes:
            with contextlib.suppress(pymysql.MySQLError, ValueError):
                committed[index] = int(self.nodes[index].status()["wsrep_last_committed"])
        if not committed:
            return indexes[0]
        return max(committed, key=lambda index: committed[index])


def _left(started: float, timeout: float) -> float:
    """What is left of ``timeout`` seconds counted from ``started`` (at least 1 s)."""
    return max(1.0, timeout - (time.monotonic() - started))


def _seqno(position: str) -> int:
    """The seqno of a recovered position ``uuid:seqno`` (-1 if unknown)."""
    try:
        return int(position.rsplit(":", 1)[1])
    except (IndexError, ValueError):
        return -1


# -- the command line ------------------------------------------------------------------


def _arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m servers.galera_cluster",
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
