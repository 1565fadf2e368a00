"""A private MariaDB server for one test: its own data directory, port and process.

The fault tests kill and restart a database server in the middle of a workload;
the shared server on port 3306 belongs to everyone else's tests and must never
be touched. This helper initializes a fresh data directory with
``mariadb-install-db`` (root on 127.0.0.1, empty password), runs ``mariadbd``
on it on a free loopback port, and can stop it cleanly (SIGTERM), kill it
(SIGKILL) and start it again on the same data directory and port. It only ever
signals the process it started, by pid, and removes its directory at the end.

The server is started with the parent's death signal set to SIGKILL, so a test
run that is itself killed leaves no server behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

import pymysql

INSTALL_DB = "mariadb-install-db"
SERVER_CANDIDATES = ("/usr/sbin/mariadbd", "mariadbd")

# Small enough to start in a second and to be gentle with a shared 2-core
# machine; durable as a production server (every commit is flushed), since the
# tests rely on committed grants surviving a crash.
SERVER_OPTIONS = (
    "--innodb-buffer-pool-size=64M",
    "--innodb-log-file-size=32M",
    "--innodb-flush-log-at-trx-commit=1",
    "--innodb-buffer-pool-dump-at-shutdown=OFF",
    "--innodb-buffer-pool-load-at-startup=OFF",
    "--skip-name-resolve",
    "--performance-schema=OFF",
    "--max-connections=300",
)

_PR_SET_PDEATHSIG = 1
# An error line of the server's log, or of a script it ran (WSREP_SST).
_ERROR_LINE = re.compile(r"\[ERROR\]")


def _binaries() -> tuple[str | None, str | None]:
    install = shutil.which(INSTALL_DB)
    server = next(
        (
            found
            for found in (shutil.which(candidate) for candidate in SERVER_CANDIDATES)
            if found is not None
        ),
        None,
    )
    return install, server


def missing() -> str | None:
    """Why a private server cannot run here (``None`` if it can)."""
    install, server = _binaries()
    absent = [name for name, path in ((INSTALL_DB, install), ("mariadbd", server)) if path is None]
    if absent:
        return f"a private MariaDB server needs {' and '.join(absent)}, which is not installed"
    return None


# Where free_port() looks when the kernel's ephemeral range cannot be read.
_EPHEMERAL_DEFAULT = (32768, 60999)
# The lowest port free_port() hands out: above the well-known and most
# registered services' ports.
_LOWEST_PORT = 10000
# Ports free_port() has handed out in this process: free when picked, but maybe
# not bound yet by whoever asked, so a bind test alone would not see them.
_handed_out: set[int] = set()
_random = random.Random()  # noqa: S311 - spreads test ports, no secret


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return _EPHEMERAL_DEFAULT


def free_port() -> int:
    """A loopback port nothing is bound to right now, outside the kernel's
    ephemeral range, and not handed out before by this process.

    Outside the ephemeral range, because the kernel gives its ports to every
    outgoing connection: a port picked there (a bind to port 0 picks there)
    may be the local end of some client's connection by the time a server is
    told to listen on it. A Galera joiner's rsync daemon that finds its port
    so taken exits, and the joiner aborts its state transfer.
    """
    low, high = _ephemeral_range()
    candidates = [
        port
        for port in range(_LOWEST_PORT, 65536)
        if not low <= port <= high and port not in _handed_out
    ]
    for port in _random.sample(candidates, min(len(candidates), 200)):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free loopback port outside the ephemeral range {low}-{high}")


# Looked up here, in the parent: the forked child only calls it (no dlopen, no
# import, no lock another thread of the test may have held at the fork).
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform == "linux" else None


def all_threads_stopped(pid: int) -> bool:
    """Whether every thread of process ``pid`` is in the stopped state."""
    for task in Path("/proc", str(pid), "task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except FileNotFoundError:
            continue  # a thread that just exited
        # The state is the first field after the command name, which is in
        # parentheses and may itself contain spaces or parentheses.
        if stat.rsplit(")", 1)[1].split()[0] not in ("T", "t"):
            return False
    return True


def _die_with_parent() -> None:  # pragma: no cover - runs in the forked child
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL)


class PrivateMariaDB:
    """One private ``mariadbd``: :meth:`start` it, :meth:`kill` or :meth:`stop`
    it, start it again, :meth:`close` it (stops it and removes its files).

    ``url(database)`` is a SQLAlchemy URL as root with an empty password.
    """

    def __init__(self, parent: Path | None = None, *, port: int | None = None) -> None:
        reason = missing()
        if reason is not None:
            raise RuntimeError(reason)
        install, server = _binaries()
        assert install is not None
        assert server is not None
        self._install = install
        self._server = server
        self.base = Path(tempfile.mkdtemp(prefix="pathlock-mariadb-", dir=parent))
        self.datadir = self.base / "data"
        self.error_log = self.base / "error.log"
        self.port = free_port() if port is None else port
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    # -- lifecycle -------------------------------------------------------------

    def install(self) -> None:
        """Initialize the data directory (once)."""
        command = [
            self._install,
            "--no-defaults",
            f"--datadir={self.datadir}",
            "--auth-root-authentication-method=normal",
            "--skip-test-db",
            *self._user_option(),
            *SERVER_OPTIONS,
        ]
        log = self.base / "install.log"
        with log.open("wb") as output:
            done = subprocess.run(
                command, stdout=output, stderr=subprocess.STDOUT, check=False, timeout=120
            )
        if done.returncode != 0:
            raise RuntimeError(
                f"mariadb-install-db failed ({done.returncode}):\n"
                + log.read_text(encoding="utf-8", errors="replace")[-3000:]
            )

    def start(self, timeout: float = 60.0) -> float:
        """Start the server on the data directory and port (installing the data
        directory first if need be); return once it answers a query, with the
        seconds that took."""
        if self.process is not None and self.process.poll() is None:
            raise RuntimeError(f"the private server is running already (pid {self.process.pid})")
        if not self.datadir.exists():
            self.install()
        started = time.monotonic()
        command = [
            self._server,
            "--no-defaults",
            f"--datadir={self.datadir}",
            f"--port={self.port}",
            "--bind-address=127.0.0.1",
            f"--socket={self.base / 'mysqld.sock'}",
            f"--pid-file={self.base / 'mysqld.pid'}",
            f"--log-error={self.error_log}",
            f"--tmpdir={self.base}",
            # A restart right after a kill may find the port still closing.
            "--port-open-timeout=10",
            *self._user_option(),
            *SERVER_OPTIONS,
        ]
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            # Only a prctl call resolved beforehand: nothing that could wait
            # for a lock held by another thread at the fork.
            preexec_fn=_die_with_parent,  # noqa: PLW1509
        )
        self.starts += 1
        deadline = started + timeout
        while not self._answers():
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"the private server exited with {self.process.returncode}:\n"
                    + self.error_log_tail()
                )
            if time.monotonic() >= deadline:
                self.kill()
                raise RuntimeError(
                    f"the private server did not answer within {timeout:g} s:\n"
                    + self.error_log_tail()
                )
            time.sleep(0.05)
        return time.monotonic() - started

    def kill(self) -> None:
        """SIGKILL: a crash. Returns once the process is gone."""
        self._signal(signal.SIGKILL, timeout=30.0)

    def stop(self, timeout: float = 30.0) -> float:
        """A clean shutdown (SIGTERM), then SIGKILL after ``timeout`` seconds;
        return the seconds it took."""
        started = time.monotonic()
        self._signal(signal.SIGTERM, timeout=timeout)
        return time.monotonic() - started

    @contextlib.contextmanager
    def frozen(self, timeout: float = 10.0) -> Iterator[None]:
        """Within the block the server is stopped (SIGSTOP), as a hung server
        or a network path that drops every packet looks to a client: its
        sockets stay open and nothing answers. Continued (SIGCONT) on exit.

        SIGSTOP is asynchronous: ``kill()`` returns once the signal is queued,
        and each thread stops only when the kernel next runs it. On a busy
        machine a connection thread could still answer a query sent right
        after the signal, so this waits until every thread is stopped."""
        process = self.process
        if process is None or process.poll() is not None:
            raise RuntimeError("the private server is not running")
        os.kill(process.pid, signal.SIGSTOP)
        try:
            deadline = time.monotonic() + timeout
            while not all_threads_stopped(process.pid):
                if time.monotonic() >= deadline:
                    raise RuntimeError(f"the private server did not stop within {timeout:g} s")
                time.sleep(0.002)
            yield
        finally:
            os.kill(process.pid, signal.SIGCONT)

    def close(self) -> None:
        """Stop the server (if running) and remove its directory."""
        try:
            self.stop()
        finally:
            shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> PrivateMariaDB:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # -- using it --------------------------------------------------------------

    def url(self, database: str = "") -> str:
        return f"mysql+pymysql://root@127.0.0.1:{self.port}/{database}"

    def execute(self, sql: str) -> None:
        """Run one statement as root (administration: CREATE DATABASE ...)."""
        connection = self.connect(timeout=10)
        try:
            with connection.cursor() as cursor:
                cursor.execute(sql)
            connection.commit()
        finally:
            connection.close()

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def error_log_tail(self, characters: int = 3000) -> str:
        """The last ``characters`` of the error log, after the errors logged
        before them (the state transfer script's, say: the last lines of a
        failed start are only the shutdown that followed)."""
        if not self.error_log.exists():
            return "(no error log)"
        text = self.error_log.read_text(encoding="utf-8", errors="replace")
        tail = text[-characters:]
        earlier = [
            line for line in text[: len(text) - len(tail)].splitlines() if _ERROR_LINE.search(line)
        ]
        if not earlier:
            return tail
        return "errors logged before:\n" + "\n".join(earlier[-20:]) + "\n...\n" + tail

    # -- internals -------------------------------------------------------------

    @staticmethod
    def _user_option() -> list[str]:
        # mariadbd refuses to run as root unless told to.
        return ["--user=root"] if os.geteuid() == 0 else []

    def connect(self, timeout: float) -> pymysql.connections.Connection:
        return pymysql.connect(
            host="127.0.0.1", port=self.port, user="root", password="", connect_timeout=timeout
        )

    def _answers(self) -> bool:
        try:
            connection = self.connect(timeout=1)
        except pymysql.MySQLError:
            return False
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1")
        except pymysql.MySQLError:
            return False
        else:
            return True
        finally:
            with contextlib.suppress(pymysql.MySQLError):
                connection.close()

    def _signal(self, number: signal.Signals, timeout: float) -> None:
        process = self.process
        if process is None or process.poll() is not None:
            return
        process.send_signal(number)  # our own child, by pid
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
