"""pathlock behind PgBouncer, a real one started for each test on a port of
127.0.0.1 in front of the test database (skipped where ``pgbouncer`` is not
installed; ``.ci/run`` installs it).

In transaction mode a client's transactions go to whichever server session
is free, and PgBouncer does not pass the ``options`` startup parameter on:
pathlock's session settings and prepared statements cannot hold there. It
must fail at once and say why, never retry in vain or hang. In session mode
with the settings given another way (``ALTER ROLE ... SET``) it works, but
a dropped connection's server session is no longer this client's alone:
pathlock must never end it."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import create_engine, make_url
from sqlalchemy.pool import NullPool

from pathlock import BackendError, Hooks, PathLockManager, events
from pathlock.dialects.base import SERVER_SESSION
from pathlock.dialects.postgresql import NOT_IN_FORCE, POOLED_HINT

PGBOUNCER = shutil.which("pgbouncer") or (
    "/usr/sbin/pgbouncer" if Path("/usr/sbin/pgbouncer").exists() else None
)

pytestmark = pytest.mark.skipif(PGBOUNCER is None, reason="pgbouncer is not installed")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class _Bouncer:
    """A PgBouncer in front of the server of ``url``, in ``mode``."""

    def __init__(self, url: str, directory: Path, mode: str, *, ignore_options: bool) -> None:
        server = make_url(url)
        self.user = server.username or "postgres"
        self.port = _free_port()
        self.url = server.set(host="127.0.0.1", port=self.port).render_as_string(
            hide_password=False
        )
        ignored = "extra_float_digits" + (",options" if ignore_options else "")
        (directory / "users.txt").write_text(f'"{self.user}" ""\n')
        config = directory / "pgbouncer.ini"
        config.write_text(
            "[databases]\n"
            f"* = host={server.host or '127.0.0.1'} port={server.port or 5432}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            f"auth_type = trust\nauth_file = {directory / 'users.txt'}\n"
            f"pool_mode = {mode}\nignore_startup_parameters = {ignored}\n"
            f"logfile = {directory / 'pgbouncer.log'}\n"
        )
        user = None
        if os.geteuid() == 0:  # PgBouncer refuses to run as root
            user = "postgres"
            shutil.chown(directory, user)
            for path in directory.iterdir():
                shutil.chown(path, user)
        self.process = subprocess.Popen(
            [str(PGBOUNCER), str(config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            user=user,
            start_new_session=True,  # no Ctrl-C of the test run's
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"pgbouncer did not start: {self.log(directory)}") from None
                time.sleep(0.05)

    @staticmethod
    def log(directory: Path) -> str:
        path = directory / "pgbouncer.log"
        return path.read_text() if path.exists() else "(no log)"

    def stop(self) -> None:
        self.process.send_signal(signal.SIGINT)  # PgBouncer's "shut down at once"
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@pytest.fixture
def settings_of_the_role(postgresql_url: str) -> Iterator[None]:
    """The session settings pathlock asks for, given to its role in the test
    database instead (as a DBA would for a pooler that drops startup
    options)."""
    url = make_url(postgresql_url)
    server = create_engine(url, poolclass=NullPool, isolation_level="AUTOCOMMIT")
    role, database = url.username or "postgres", url.database
    try:
        with server.connect() as connection:
            for name, value in (
                ("lock_timeout", "10s"),
                ("idle_in_transaction_session_timeout", "5s"),
            ):
                connection.exec_driver_sql(
                    f'ALTER ROLE "{role}" IN DATABASE "{database}" SET {name} = \'{value}\''
                )
        yield
    finally:
        with server.connect() as connection:
            connection.exec_driver_sql(f'ALTER ROLE "{role}" IN DATABASE "{database}" RESET ALL')
        server.dispose()


def _bouncer(postgresql_url: str, mode: str, *, ignore_options: bool) -> Iterator[_Bouncer]:
    # Not pytest's tmp_path: its parent is the invoking user's alone, and
    # PgBouncer may run as another.
    directory = Path(tempfile.mkdtemp(prefix="pathlock-pgbouncer-"))
    try:
        bouncer = _Bouncer(postgresql_url, directory, mode, ignore_options=ignore_options)
        try:
            yield bouncer
        finally:
            bouncer.stop()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def refusing(postgresql_url: str) -> Iterator[_Bouncer]:
    """Transaction mode, as PgBouncer comes: it refuses ``options``."""
    yield from _bouncer(postgresql_url, "transaction", ignore_options=False)


@pytest.fixture
def dropping(postgresql_url: str) -> Iterator[_Bouncer]:
    """Transaction mode, told to drop ``options``."""
    yield from _bouncer(postgresql_url, "transaction", ignore_options=True)


@pytest.fixture
def session_mode(postgresql_url: str) -> Iterator[_Bouncer]:
    """Session mode, told to drop ``options``."""
    yield from _bouncer(postgresql_url, "session", ignore_options=True)


def _fails_at_once(url: str, customer_id: int, said: str) -> None:
    retried: list[events.Retried] = []

    class Retries(Hooks):
        def database_retried(self, event: events.Retried) -> None:
            retried.append(event)

    with (
        PathLockManager(url, heartbeat=False, hooks=[Retries()]) as manager,
        pytest.raises(BackendError) as raised,
    ):
        manager.for_customer(customer_id).lock_paths("/Shared/a", timeout=10)
    assert said in str(raised.value)
    assert POOLED_HINT in str(raised.value)
    assert retried == []  # no retry can cure it


def test_a_pooler_that_refuses_the_startup_options_fails_at_once(
    refusing: _Bouncer, customer_id: int
) -> None:
    _fails_at_once(refusing.url, customer_id, "unsupported startup parameter: options")


def test_a_pooler_that_drops_the_startup_options_fails_at_once(
    dropping: _Bouncer, customer_id: int
) -> None:
    _fails_at_once(dropping.url, customer_id, NOT_IN_FORCE)


@pytest.mark.usefixtures("settings_of_the_role")
def test_in_transaction_mode_a_session_without_the_prepared_statements_fails_and_says_why(
    dropping: _Bouncer, customer_id: int
) -> None:
    """The settings hold (the role's), but the statements a connection
    prepared stay in the server session it happened to use: the next
    transaction, sent to another, fails with the reason, not in vain."""
    with PathLockManager(dropping.url, heartbeat=False) as manager:
        locks = manager.for_customer(customer_id)
        locks.lock_paths("/Shared/a", timeout=10).release()  # prepared in session 1
        # Another client takes session 1 and keeps it: pathlock's next
        # transaction goes to a new session, which has prepared nothing.
        with psycopg.connect(
            host="127.0.0.1", port=dropping.port, user=dropping.user,
            dbname=make_url(dropping.url).database,
        ) as other:  # fmt: skip
            other.execute("SELECT 1")  # inside a transaction: the session stays its own
            with pytest.raises(BackendError) as raised:
                locks.lock_paths("/Shared/a", timeout=10).release()
            other.rollback()
    assert "prepared statement" in str(raised.value)
    assert POOLED_HINT in str(raised.value)


@pytest.mark.usefixtures("settings_of_the_role")
def test_in_session_mode_locks_work_and_no_server_session_is_ever_ended(
    session_mode: _Bouncer, customer_id: int
) -> None:
    """Through a pooler in session mode a server session outlives its client
    connection and serves the next client: pathlock records none, so none is
    ended when a connection is dropped. Locks, waits and hand-overs work."""
    with PathLockManager(session_mode.url, heartbeat=False) as manager:
        locks = manager.for_customer(customer_id)
        held = locks.lock_paths("/Shared/a", timeout=10)
        granted = threading.Event()

        def wait() -> None:
            locks.lock_paths("/Shared/a/b", timeout=10, owner="waiter").release()
            granted.set()

        waiter = threading.Thread(target=wait)
        waiter.start()
        time.sleep(0.3)
        assert not granted.is_set()
        held.release()
        waiter.join(15)
        assert granted.is_set()
        with manager.engine.connect() as connection:
            record = connection.connection._connection_record  # type: ignore[union-attr]
            assert SERVER_SESSION not in record.info
            connection.rollback()
