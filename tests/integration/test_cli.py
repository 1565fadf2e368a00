"""The ``pathlock`` command line, run as real processes against every backend.

Each test runs ``python -m pathlock ...`` with an explicit ``--database-url``
and works in its own random customer; every outcome is checked in the
database independently, through ``raw_engine``. Commands run under ``lock`` are
small Python programs that leave files behind (their environment, the signals
they saw), so the test reads what the child saw without sharing its pipes.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import re
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, Row, delete, select

from pathlock import CustomerLocks, PathLockManager
from pathlock._backends import URL_ENV_VAR
from pathlock.cli import main
from pathlock.schema import REVISION, REVISIONS, customer_locks, path_locks
from tests.row_counts import count_added

pytestmark = pytest.mark.timeout(60)

PATHLOCK = (sys.executable, "-m", "pathlock")
WAIT = 15.0  # seconds for anything that should happen promptly (process start-up included)

# A command that records its lease in a file and then sleeps; on SIGTERM it
# notes the signal and dies of it (the default action, re-raised).
SLEEPER = """
import os, signal, sys, time
from pathlib import Path
def on_term(signum, frame):
    Path(sys.argv[2]).write_text(str(signum))
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
signal.signal(signal.SIGTERM, on_term)
Path(sys.argv[1] + ".tmp").write_text(
    os.environ["PATHLOCK_LEASE_ID"] + " " + os.environ["PATHLOCK_FENCING_TOKEN"]
)
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(60)
"""

# Like SLEEPER, but it survives SIGTERM (noting it): only SIGKILL stops it.
STUBBORN = SLEEPER.replace(
    "    signal.signal(signum, signal.SIG_DFL)\n    os.kill(os.getpid(), signum)\n", ""
)

# Errors of arguments are found before any connection is made.
NEVER_CONTACTED = "mysql+pymysql://nobody@127.0.0.1:1/none"

TOUCH = "import sys; from pathlib import Path; Path(sys.argv[1]).touch()"


# -- helpers ----------------------------------------------------------------------------


def _environment() -> dict[str, str]:
    environment = dict(os.environ)
    environment.pop(URL_ENV_VAR, None)  # every test names its database
    return environment


def pathlock(*args: str, **variables: str) -> subprocess.CompletedProcess[str]:
    """Run ``pathlock args``, with ``variables`` added to its environment."""
    return subprocess.run(
        [*PATHLOCK, *args],
        capture_output=True,
        text=True,
        timeout=WAIT * 2,
        env={**_environment(), **variables},
        check=False,
    )


def python(code: str, *args: str | Path) -> list[str]:
    """The argv of a Python one-off, for ``pathlock lock ... --``."""
    return [sys.executable, "-c", code, *map(str, args)]


class Running:
    """A pathlock process in the background, its stderr collected line by line."""

    def __init__(self, *args: str, wrapper: Sequence[str] = ()) -> None:
        self.process = subprocess.Popen(
            [*wrapper, *PATHLOCK, *args],  # wrapper: a command that runs pathlock (strace)
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=_environment(),
            # Its own process group, shared with its command: a failed test
            # kills both at once (see spawn) and leaves no sleeper behind.
            start_new_session=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        stream = self.process.stderr
        assert stream is not None
        with stream:
            for line in stream:
                self.lines.append(line)

    @property
    def stderr(self) -> str:
        return "".join(self.lines)

    def wait_for_line(self, text: str) -> None:
        _wait_until(lambda: text in self.stderr, f"line {text!r} from pathlock", self)

    def finish(self) -> int:
        try:
            status = self.process.wait(WAIT)
        except subprocess.TimeoutExpired:
            pytest.fail(f"pathlock did not exit within {WAIT:g} s:\n{self.stderr}")
        self._reader.join(WAIT)
        return status


Spawn = Callable[..., Running]


@pytest.fixture
def spawn() -> Iterator[Spawn]:
    """Start pathlock processes in the background; kill any left running."""
    started: list[Running] = []

    def start(*args: str) -> Running:
        started.append(Running(*args))
        return started[-1]

    yield start
    for running in started:
        with contextlib.suppress(ProcessLookupError):  # all gone already
            os.killpg(running.process.pid, signal.SIGKILL)
        running.process.wait()


def _wait_until(condition: Callable[[], bool], what: str, running: Running | None = None) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        if time.monotonic() >= deadline:
            output = f"; pathlock said:\n{running.stderr}" if running is not None else ""
            pytest.fail(f"no {what} within {WAIT:g} s{output}", pytrace=False)
        time.sleep(0.02)


def _rows(engine: Engine, customer_id: int) -> list[Row[Any]]:
    with engine.connect() as connection:
        rows = connection.execute(
            select(path_locks).where(path_locks.c.customer_id == customer_id)
        ).all()
        connection.rollback()
    return list(rows)


def _one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("pathlock: error: "), result.stderr
    return lines[0]


def _lock_row(customer_id: int, path: str, now: datetime, expires_in: float) -> dict[str, Any]:
    """A path_locks row expiring ``expires_in`` seconds after ``now`` (database
    time, stored as naive UTC; negative: expired already)."""
    now = now.replace(tzinfo=None)
    return {
        "customer_id": customer_id,
        "lease_id": secrets.token_hex(16),
        "path": path,
        "mode": "exclusive",
        "node_id": "test-cli-direct",
        "pid": 4242,
        "thread": "1",
        "reason": "inserted by test_cli",
        "fencing_token": 1,
        "created_at": now - timedelta(minutes=10),
        "expires_at": now + timedelta(seconds=expires_in),
    }


@pytest.fixture
def inserted(raw_engine: Engine, customer_id: int) -> Iterator[Callable[..., None]]:
    """Insert path_locks rows of the test's customer directly; delete them after."""

    def insert(*rows: dict[str, Any]) -> None:
        with raw_engine.begin() as connection:
            connection.execute(path_locks.insert(), list(rows))
            count_added(connection, path_locks, rows)

    yield insert
    with raw_engine.begin() as connection:
        connection.execute(delete(path_locks).where(path_locks.c.customer_id == customer_id))


# -- lock ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "status"),
    [
        ("pass", 0),
        ("raise SystemExit(3)", 3),
        ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", 128 + signal.SIGKILL),
    ],
    ids=["zero", "three", "killed"],
)
def test_lock_passes_the_commands_exit_status_through(
    database_url: str, raw_engine: Engine, customer_id: int, code: str, status: int
) -> None:
    result = pathlock(
        "lock", "--database-url", database_url, "--customer", str(customer_id),
        "/jobs/one", "--", *python(code),
    )  # fmt: skip
    assert result.returncode == status, result.stderr
    assert result.stderr == ""
    assert _rows(raw_engine, customer_id) == []


def test_lock_hands_the_lease_to_the_command_and_forwards_sigterm(
    database_url: str, raw_engine: Engine, customer_id: int, tmp_path: Path, spawn: Spawn
) -> None:
    seen, signalled = tmp_path / "lease", tmp_path / "signalled"
    running = spawn(
        "lock", "--database-url", database_url, "--customer", str(customer_id),
        "/reports", "--shared", "/templates", "--", *python(SLEEPER, seen, signalled),
    )  # fmt: skip
    _wait_until(seen.exists, "lease seen by the command", running)
    lease_id, token = seen.read_text().split()
    rows = _rows(raw_engine, customer_id)
    assert sorted((row.path, row.mode) for row in rows) == [
        ("/reports", "exclusive"),
        ("/templates", "shared"),
    ]
    assert {row.lease_id for row in rows} == {lease_id}
    assert {row.fencing_token for row in rows} == {int(token)}
    assert {row.reason for row in rows} == {shlex.join(python(SLEEPER, seen, signalled))}

    running.process.send_signal(signal.SIGTERM)
    assert running.finish() == 128 + signal.SIGTERM, running.stderr
    assert signalled.read_text() == str(int(signal.SIGTERM))
    assert _rows(raw_engine, customer_id) == []


def test_lock_gives_up_with_124_after_its_timeout(
    database_url: str, raw_engine: Engine, customer_id: int, locks: CustomerLocks, tmp_path: Path
) -> None:
    ran = tmp_path / "ran"
    with locks.lock_paths("/busy", reason="holder") as holder:
        result = pathlock(
            "lock", "--database-url", database_url, "--customer", str(customer_id),
            "--timeout", "0.3", "/busy/inside", "--", *python(TOUCH, ran),
        )  # fmt: skip
        assert result.returncode == 124, result.stderr
        line = _one_line_error(result)
        assert "/busy/inside" in line
        assert "test-node" in line  # who is in the way
        assert "'holder'" in line
        assert {row.lease_id for row in _rows(raw_engine, customer_id)} == {holder.lease_id}
    assert not ran.exists()


def test_lock_case_insensitive_folds_the_paths_and_the_customer_keeps_the_rule(
    database_url: str, raw_engine: Engine, customer_id: int
) -> None:
    """The command line had no --case-insensitive: it could not lock the
    paths of a customer whose first lock recorded that rule."""
    customer = ("--database-url", database_url, "--customer", str(customer_id))
    # While /Shared/Foo is held, /shared/FOO is the same path: the inner
    # pathlock gives up at once (124), and the outer passes its status on.
    result = pathlock(
        "lock", *customer, "--case-insensitive", "/Shared/Foo", "--",
        *PATHLOCK, "lock", *customer, "--case-insensitive", "--timeout", "0", "/shared/FOO",
        "--", "true",
    )  # fmt: skip
    assert result.returncode == 124, result.stderr
    assert "/shared/foo (exclusive)" in result.stderr
    with raw_engine.connect() as connection:
        recorded = connection.execute(
            select(customer_locks.c.case_insensitive).where(
                customer_locks.c.customer_id == customer_id
            )
        ).scalar_one()
        connection.rollback()
    assert recorded is True
    assert pathlock("lock", *customer, "--case-insensitive", "/A", "--", "true").returncode == 0
    refused = pathlock("lock", *customer, "/A", "--", "true")
    assert refused.returncode == 125
    assert "add --case-insensitive" in _one_line_error(refused)
    assert _rows(raw_engine, customer_id) == []


def test_lock_of_an_invalid_path_fails_with_125_and_writes_nothing(
    database_url: str, raw_engine: Engine, customer_id: int, tmp_path: Path
) -> None:
    ran = tmp_path / "ran"
    result = pathlock(
        "lock", "--database-url", database_url, "--customer", str(customer_id),
        "/fine", "not/absolute", "--", *python(TOUCH, ran),
    )  # fmt: skip
    assert result.returncode == 125
    assert "invalid path 'not/absolute'" in _one_line_error(result)
    assert not ran.exists()
    assert _rows(raw_engine, customer_id) == []
    with raw_engine.connect() as connection:
        sentinel = connection.execute(
            select(customer_locks).where(customer_locks.c.customer_id == customer_id)
        ).all()
    assert sentinel == []


@pytest.mark.parametrize(
    ("command", "status"), [("missing", 127), ("not-executable", 126)], ids=["127", "126"]
)
def test_lock_of_a_command_that_cannot_run_says_so_and_releases(
    database_url: str,
    raw_engine: Engine,
    customer_id: int,
    tmp_path: Path,
    command: str,
    status: int,
) -> None:
    program = tmp_path / command
    if command == "not-executable":
        program.write_text("#!/bin/sh\n")
        program.chmod(0o644)
    result = pathlock(
        "lock", "--database-url", database_url, "--customer", str(customer_id),
        "/jobs", "--", str(program), "--flag",
    )  # fmt: skip
    assert result.returncode == status
    assert str(program) in _one_line_error(result)
    assert _rows(raw_engine, customer_id) == []


def test_sigterm_while_waiting_stops_waiting_and_holds_nothing(
    database_url: str,
    raw_engine: Engine,
    customer_id: int,
    locks: CustomerLocks,
    tmp_path: Path,
    spawn: Spawn,
) -> None:
    ran = tmp_path / "ran"
    with locks.lock_paths("/busy") as holder:
        running = spawn(
            "lock", "-v", "--database-url", database_url, "--customer", str(customer_id),
            "/busy/inside", "--", *python(TOUCH, ran),
        )  # fmt: skip
        running.wait_for_line("locking /busy/inside")
        time.sleep(0.2)  # let it reach the wait (earlier is fine too: nothing is held yet)
        running.process.send_signal(signal.SIGTERM)
        assert running.finish() == 128 + signal.SIGTERM, running.stderr
        assert "nothing is held" in running.stderr
        assert {row.lease_id for row in _rows(raw_engine, customer_id)} == {holder.lease_id}
    assert not ran.exists()


def test_a_second_sigterm_stops_a_wait_on_a_database_that_does_not_answer(
    customer_id: int, tmp_path: Path, spawn: Spawn, silent_port: int
) -> None:
    # The first stop signal cancels the wait, which ends once the database
    # call under way returns: against a server that never answers, after the
    # call's time (10 s), with a DatabaseTimeout. The second one interrupts
    # the call: pathlock stops waiting, and exits without cleaning up (no
    # attempt got a connection: nothing can have been granted).
    ran = tmp_path / "ran"
    url = f"mysql+pymysql://root@127.0.0.1:{silent_port}/test"  # never answers
    running = spawn(
        "lock", "-v", "--database-url", url, "--customer", str(customer_id),
        "/a", "--", *python(TOUCH, ran),
    )  # fmt: skip
    running.wait_for_line("locking /a")
    time.sleep(0.3)
    running.process.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    assert running.process.poll() is None  # still in its database call
    running.process.send_signal(signal.SIGTERM)
    assert running.finish() == 128 + signal.SIGTERM, running.stderr
    assert "nothing is held" in running.stderr
    assert "DatabaseTimeout" not in running.stderr
    assert not ran.exists()


# How long past --timeout `pathlock lock` may take, at most (docs/CLI.md):
# the grace to find out whether a last attempt was granted, and the close;
# and, generously, loading the database's driver after the first line.
LOCK_MARGIN = 1.5
LOADING = 1.0


@pytest.mark.parametrize("timeout", ["2", "0"])
def test_lock_on_a_database_that_never_answers_exits_125_within_its_timeout(
    customer_id: int, tmp_path: Path, spawn: Spawn, silent_port: int, timeout: str
) -> None:
    """It used to exit 124, "the locks are busy", and only after the
    constructor's schema check (2 s) and then the whole --timeout: a script
    read a dead database as busy locks."""
    ran = tmp_path / "ran"
    url = f"mysql+pymysql://root@127.0.0.1:{silent_port}/test"  # never answers
    running = spawn(
        "lock", "-v", "--database-url", url, "--customer", str(customer_id),
        "--timeout", timeout, "/a", "--", *python(TOUCH, ran),
    )  # fmt: skip
    # From the first line: before it, Python starts and imports pathlock.
    running.wait_for_line("database: ")
    opening = time.monotonic()
    status = running.finish()
    took = time.monotonic() - opening
    assert status == 125, running.stderr
    assert "the database did not answer in time" in running.stderr
    assert took < max(float(timeout), 0.5) + LOCK_MARGIN + LOADING, running.stderr
    assert not ran.exists()


def test_lost_lease_stops_the_command_and_exits_122(
    database_url: str, raw_engine: Engine, customer_id: int, tmp_path: Path, spawn: Spawn
) -> None:
    seen, signalled = tmp_path / "lease", tmp_path / "signalled"
    running = spawn(
        "lock", "--database-url", database_url, "--customer", str(customer_id),
        "--ttl", "1.5", "--kill-grace", "0.5", "/doomed",
        "--", *python(STUBBORN, seen, signalled),
    )  # fmt: skip
    _wait_until(seen.exists, "lease seen by the command", running)
    lease_id = seen.read_text().split()[0]
    started = time.monotonic()
    with raw_engine.begin() as connection:  # an operator (or a reaper) behind its back
        connection.execute(delete(path_locks).where(path_locks.c.lease_id == lease_id))

    assert running.finish() == 122, running.stderr
    # Noticed at the next renewal (ttl/3), then SIGTERM, ignored, then SIGKILL.
    assert time.monotonic() - started < 5
    assert signalled.read_text() == str(int(signal.SIGTERM))
    errors = [line for line in running.lines if line.startswith("pathlock: error:")]
    assert len(errors) == 1, running.stderr
    assert f"lease {lease_id} lost: its rows were gone" in errors[0]
    assert "SIGKILL in 0.5 s" in errors[0]
    assert _rows(raw_engine, customer_id) == []


def test_a_lease_lost_while_pathlock_was_stopped_says_its_renewal_never_ran(
    database_url: str, customer_id: int, tmp_path: Path, spawn: Spawn
) -> None:
    """A process stopped (or starved of CPU) past its lease's margin used to
    report "not renewed for 2.7 s (database unreachable?)", the ttl less its
    margin whatever happened, while the database was fine: the message now
    says what was measured, that no renewal ran."""
    seen, signalled = tmp_path / "lease", tmp_path / "signalled"
    running = spawn(
        "lock", "--database-url", database_url, "--customer", str(customer_id),
        "--ttl", "3", "--kill-grace", "0.5", "/stopped", "--", *python(SLEEPER, seen, signalled),
    )  # fmt: skip
    _wait_until(seen.exists, "lease seen by the command", running)
    running.process.send_signal(signal.SIGSTOP)  # pathlock alone, not its command
    time.sleep(5)  # past the lease's lost_at, whenever it was last renewed
    running.process.send_signal(signal.SIGCONT)
    assert running.finish() == 122, running.stderr
    assert "database unreachable" not in running.stderr
    errors = [line for line in running.lines if line.startswith("pathlock: error:")]
    assert len(errors) == 1, running.stderr
    assert re.search(
        r"lost: not renewed for \d+\.\d s: its renewal, due \d+\.\d s ago, never ran: "
        r"pathlock's heartbeat did not run in time",
        errors[0],
    ), running.stderr


# -- ls --------------------------------------------------------------------------------


def test_ls_shows_detached_leases_as_such(
    database_url: str, customer_id: int, locks: CustomerLocks
) -> None:
    lease = locks.lock_detached("/dav/a", ttl=60, reason="LOCK")
    try:
        table = pathlock("ls", "--database-url", database_url, "--customer", str(customer_id))
        listed = pathlock(
            "ls", "--database-url", database_url, "--customer", str(customer_id), "--json"
        )
    finally:
        locks.release_detached(lease.lease_id)
    assert table.returncode == 0, table.stderr
    (line,) = [line for line in table.stdout.splitlines() if lease.lease_id in line]
    assert f"a detached lease from {locks.manager.node_id} pid {os.getpid()}" in line
    (entry,) = json.loads(listed.stdout)
    assert entry["owner"]["detached"] is True
    assert entry["lease_id"] == lease.lease_id


_LIST_AND_TRY_BELOW = """
import json, sys
from pathlock import PathLockManager
with PathLockManager(sys.argv[1], heartbeat=False) as manager:
    locks = manager.for_customer(int(sys.argv[2]))
    below = locks.try_lock_paths("/Shared/docs/file")
    beside = locks.try_lock_paths("/Shared/docs")
    rows = [[lock.path, lock.mode, lock.shallow] for lock in locks.list_locks()]
    print(json.dumps([below is not None, beside is not None, rows]))
"""


def test_lock_shallow_holds_the_path_alone_and_ls_says_so(
    database_url: str, customer_id: int, locks: CustomerLocks
) -> None:
    result = pathlock(
        "lock", "--database-url", database_url, "--customer", str(customer_id),
        "--shallow", "/Shared/docs", "--shared", "/Shared", "--shallow", "/Shared",
        "--", *python(_LIST_AND_TRY_BELOW, database_url, customer_id),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    below, beside, rows = json.loads(result.stdout)
    assert (below, beside) == (True, False)
    assert sorted(map(tuple, rows)) == [
        ("/Shared", "shared", True),
        ("/Shared/docs", "exclusive", True),
        ("/Shared/docs/file", "exclusive", False),
    ]
    with locks.lock_paths(shared=["/dav"], shallow=["/dav"], timeout=WAIT):
        table = pathlock("ls", "--database-url", database_url, "--customer", str(customer_id))
        listed = pathlock(
            "ls", "--database-url", database_url, "--customer", str(customer_id), "--json"
        )
    assert "/dav  shared (depth 0)  held" in table.stdout, table.stdout
    ((entry),) = json.loads(listed.stdout)
    assert (entry["mode"], entry["shallow"]) == ("shared", True)


def test_ls_json_shows_each_held_path_with_its_lease(
    database_url: str, customer_id: int, locks: CustomerLocks
) -> None:
    with locks.lock_paths("/Shared/a", shared=["/Shared/b"], reason="for ls") as lease:
        result = pathlock(
            "ls", "--database-url", database_url, "--customer", str(customer_id), "--json"
        )
    assert result.returncode == 0, result.stderr
    entries = json.loads(result.stdout)
    assert [(entry["path"], entry["mode"]) for entry in entries] == [
        ("/Shared/a", "exclusive"),
        ("/Shared/b", "shared"),
    ]
    for entry in entries:
        assert entry["customer_id"] == customer_id
        assert entry["state"] == "held"
        assert entry["lease_id"] == lease.lease_id
        assert entry["fencing_token"] == lease.fencing_token
        assert entry["owner"] == {
            "node_id": "test-node",
            "pid": os.getpid(),
            "thread": lease.owner.thread,
            "detached": False,
        }
        assert entry["reason"] == "for ls"
        created = datetime.fromisoformat(entry["created_at"])
        expires = datetime.fromisoformat(entry["expires_at"])
        assert entry["created_at"].endswith("Z")
        assert created.utcoffset() == timedelta(0)
        assert expires - created == timedelta(seconds=30)  # the manager's ttl, not renewed yet
        assert 0 <= entry["age_seconds"] < WAIT
        assert 30 - WAIT < entry["expires_in_seconds"] <= 30
        assert entry["age_seconds"] + entry["expires_in_seconds"] == pytest.approx(30, abs=0.01)


def test_ls_table_and_the_empty_listing(
    database_url: str, customer_id: int, locks: CustomerLocks
) -> None:
    with locks.lock_paths("/Shared/a", reason="line\nbreak") as lease:
        table = pathlock("ls", "--database-url", database_url, "--customer", str(customer_id))
    assert table.returncode == 0, table.stderr
    header, row = table.stdout.splitlines()
    assert header.split() == [
        "CUSTOMER", "PATH", "MODE", "STATE", "OWNER", "AGE", "LEFT", "TOKEN", "LEASE", "REASON",
    ]  # fmt: skip
    assert row.split()[:4] == [str(customer_id), "/Shared/a", "exclusive", "held"]
    assert f"test-node pid {os.getpid()} thread {lease.owner.thread}" in row
    assert row.split()[-3:] == [str(lease.fencing_token), lease.lease_id, "line\\nbreak"]
    assert header.index("LEASE") == row.index(lease.lease_id)  # aligned

    empty = pathlock("ls", "--database-url", database_url, "--customer", str(customer_id))
    assert (empty.returncode, empty.stdout) == (0, f"no locks for customer {customer_id}\n")
    empty_json = pathlock(
        "ls", "--database-url", database_url, "--customer", str(customer_id), "--json"
    )
    assert json.loads(empty_json.stdout) == []


def test_ls_tree_draws_the_locked_paths(
    database_url: str, customer_id: int, locks: CustomerLocks
) -> None:
    with (
        locks.lock_paths("/Shared/marketing/Dallas"),
        locks.lock_paths(shared=["/Shared/QA", "/private"]),
    ):
        result = pathlock(
            "ls", "--database-url", database_url, "--customer", str(customer_id), "--tree"
        )
    assert result.returncode == 0, result.stderr
    owner = f"test-node pid {os.getpid()} thread {threading.get_native_id()}"
    annotated = re.compile(r"(.*)  \[(exclusive|shared), " + re.escape(owner) + r", \S+ left\]$")
    shown = [
        f"{match.group(1)} <{match.group(2)}>" if (match := annotated.match(line)) else line
        for line in result.stdout.splitlines()
    ]
    assert shown == [
        f"customer {customer_id}",
        "/",
        "├── Shared",
        "│   ├── QA <shared>",
        "│   └── marketing",
        "│       └── Dallas <exclusive>",
        "└── private <shared>",
    ]


# -- release ---------------------------------------------------------------------------


def test_release_of_a_lease_deletes_it_and_says_who_asked(
    database_url: str, raw_engine: Engine, customer_id: int
) -> None:
    with PathLockManager(database_url, node_id="test-cli-holder", heartbeat=False) as holder:
        lease = holder.for_customer(customer_id).lock_paths("/hung/job", "/hung/other")
        # Who asked is the account the command runs as, whatever the
        # environment claims.
        result = pathlock(
            "release",
            "--database-url",
            database_url,
            lease.lease_id,
            USER="mallory",
            LOGNAME="mallory",
            SUDO_USER="",
        )
        assert result.returncode == 0, result.stderr
        user = pwd.getpwuid(os.getuid()).pw_name
        assert (
            f"released 2 paths of lease {lease.lease_id} (customer {customer_id}), "
            f"requested by {user} on {socket.gethostname()}\n"
        ) in result.stderr
        assert _rows(raw_engine, customer_id) == []

        again = pathlock("release", "--database-url", database_url, lease.lease_id)
        assert again.returncode == 1
        assert f"nothing released: no lease {lease.lease_id}, requested by " in again.stderr


def test_release_of_a_node_needs_yes(
    database_url: str, raw_engine: Engine, customer_id: int
) -> None:
    node = f"test-cli-{secrets.token_hex(6)}"
    with PathLockManager(database_url, node_id=node, heartbeat=False) as holder:
        holder.for_customer(customer_id).lock_paths("/dead/node/work")
        refused = pathlock("release", "--database-url", database_url, "--node", node)
        assert refused.returncode == 2
        assert "add --yes" in _one_line_error(refused)
        assert len(_rows(raw_engine, customer_id)) == 1

        result = pathlock("release", "--database-url", database_url, "--node", node, "--yes")
        assert result.returncode == 0, result.stderr
        assert f"released 1 path of node {node!r}, requested by " in result.stderr
        assert _rows(raw_engine, customer_id) == []


# -- reap and reaper --------------------------------------------------------------------


def test_reap_deletes_exactly_the_expired_rows(
    database_url: str,
    raw_engine: Engine,
    customer_id: int,
    manager: PathLockManager,
    inserted: Callable[..., None],
) -> None:
    now = manager.database_time()
    live = _lock_row(customer_id, "/live", now, 600)
    inserted(_lock_row(customer_id, "/old/a", now, -60), _lock_row(customer_id, "/old/b", now, -1))
    inserted(live)

    result = pathlock("reap", "--database-url", database_url, "--batch-size", "1")
    assert result.returncode == 0, result.stderr
    match = re.fullmatch(
        r"pathlock reap: deleted (\d+) expired rows? in \d+\.\d\d s\n", result.stdout
    )
    assert match, result.stdout
    assert int(match.group(1)) >= 2  # other tests may leave expired rows of their own
    assert [row.lease_id for row in _rows(raw_engine, customer_id)] == [live["lease_id"]]

    quiet = pathlock("reap", "--database-url", database_url, "--quiet")
    assert (quiet.returncode, quiet.stdout, quiet.stderr) == (0, "", "")


def test_reaper_reaps_until_sigterm(
    database_url: str,
    raw_engine: Engine,
    customer_id: int,
    manager: PathLockManager,
    inserted: Callable[..., None],
    spawn: Spawn,
) -> None:
    inserted(_lock_row(customer_id, "/old", manager.database_time(), -1))
    running = spawn("reaper", "--database-url", database_url, "--interval", "0.2", "-v")
    _wait_until(lambda: _rows(raw_engine, customer_id) == [], "expired row reaped", running)
    # -v says what each run deleted, nothing at times: the runs after the
    # row went found nothing to delete.
    running.wait_for_line("reaped 0 expired lock rows and 0 dead waiter rows in ")
    running.process.send_signal(signal.SIGTERM)
    assert running.finish() == 0, running.stderr
    assert re.search(
        r"reaped [1-9]\d* expired lock rows? and \d+ dead waiter rows? in ", running.stderr
    )
    # Only pathlock's own lines: it used to pass on APScheduler's ("Running
    # job ...", "Job ... executed successfully") and SQLAlchemy's ("Pool
    # disposed", "Pool recreating", logged under pathlock's name).
    expected = (
        r"pathlock: database: .* \(from --database-url\)",
        r"pathlock: reaping every 0.2 s until SIGTERM or SIGINT",
        r"pathlock: info: reaped \d+ expired lock rows? and \d+ dead waiter rows? in [\d.]+ s",
        r"pathlock: SIGTERM received: stopping",
        r"pathlock: info: Running upgrade .*",  # a new SQLite file's migrations
        # A run longer than the 0.2-s interval on a loaded machine: APScheduler
        # skips the runs due meanwhile (one run at a time), and says so.
        r'pathlock: warning: Execution of job "pathlock reaper .*" skipped: maximum number'
        r" of running instances reached \(1\)",
    )
    unexpected = [
        line
        for line in running.stderr.splitlines()
        if not any(re.fullmatch(pattern, line) for pattern in expected)
    ]
    assert unexpected == [], running.stderr


# -- db, help, version, errors -----------------------------------------------------------


def test_db_upgrade_sql_prints_the_schema(database_url: str) -> None:
    result = pathlock("db", "upgrade", "--sql", "--database-url", database_url)
    assert result.returncode == 0, result.stderr
    assert "CREATE TABLE path_locks" in result.stdout


# Help and version are argparse alone: run in-process, they cost no start-up.


@pytest.mark.parametrize(
    "subcommand",
    [
        [],
        ["lock"],
        ["ls"],
        ["release"],
        ["reap"],
        ["reaper"],
        ["db"],
        ["db", "upgrade"],
        ["db", "check"],
        ["info"],
    ],
)
def test_help_shows_examples(subcommand: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main([*subcommand, "--help"])
    assert exited.value.code == 0
    shown = capsys.readouterr().out
    assert "\nexamples:\n  pathlock " in shown
    if subcommand == ["lock"]:  # and its exit statuses
        for status in ("122", "124", "125", "126", "127", "128+N"):
            assert f"\n  {status} " in shown


def test_verbose_says_which_database(tmp_path: Path) -> None:
    """The embedded default depends on the user: -v names the database."""
    url = f"sqlite:///{tmp_path / 'locks.sqlite3'}"
    result = pathlock("-v", "ls", "--database-url", url)
    assert result.returncode == 0, result.stderr
    assert f"pathlock: database: {url} (from --database-url)\n" in result.stderr
    result = pathlock(
        "ls", "-v", "--database-url", "mysql+pymysql://app:secret@127.0.0.1:9/app"
    )  # nothing listens: the line comes first, then the error
    assert "pathlock: database: mysql+pymysql://app:***@127.0.0.1:9/app" in result.stderr
    assert "secret" not in result.stderr


def test_verbose_db_commands_name_the_database_first(mariadb_url: str, tmp_path: Path) -> None:
    """They used to name none, and showed Alembic's set-up lines instead
    ("Context impl MySQLImpl.", "Will assume non-transactional DDL.")."""
    url = f"sqlite:///{tmp_path / 'locks.sqlite3'}"
    result = pathlock("-v", "db", "upgrade", "--database-url", url)
    assert result.returncode == 0, result.stderr
    first, *steps = result.stderr.splitlines()
    assert first == f"pathlock: database: {url} (from --database-url)"
    assert len(steps) == len(REVISIONS), result.stderr
    assert all(step.startswith("pathlock: info: Running upgrade ") for step in steps)
    result = pathlock("db", "check", "-v", "--database-url", mariadb_url)
    assert result.returncode == 0, result.stderr
    assert result.stderr == f"pathlock: database: {mariadb_url} (from --database-url)\n"
    result = pathlock(
        "-v", "db", "current", "--database-url", "mysql+pymysql://app:secret@127.0.0.1:9/app"
    )
    assert result.stderr.startswith(
        "pathlock: database: mysql+pymysql://app:***@127.0.0.1:9/app (from --database-url)\n"
    ), result.stderr
    assert "secret" not in result.stderr


def test_info_says_which_database_what_chose_it_and_what_is_in_it(
    mariadb_url: str, customer_id: int
) -> None:
    with PathLockManager(mariadb_url) as manager:
        locks = manager.for_customer(customer_id)
        with locks.lock_paths("/a", "/b"), manager.for_customer(customer_id + 1).lock_paths("/c"):
            shown = pathlock("info", "--database-url", mariadb_url)
            facts = json.loads(pathlock("info", "--json", "--database-url", mariadb_url).stdout)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[1:3] == [f"database:   {mariadb_url}", "chosen by:  --database-url"]
    assert re.fullmatch(r"server:     MariaDB 10\.\S+", lines[3])
    assert lines[4] == f"schema:     at revision {REVISION}, the newest this pathlock ships"
    # Other tests' locks may be held at the same time: at least ours.
    held = re.fullmatch(
        r"locks:      (\d+) paths of (\d+) customers locked, \d+ requests? waiting", lines[5]
    )
    assert held is not None, lines[5]
    assert int(held[1]) >= 3
    assert int(held[2]) >= 2
    assert facts["databases"] == [mariadb_url]
    assert facts["revision"] == REVISION
    assert facts["locks"] >= 3


def test_info_names_the_configuration_file_that_chose_the_database(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'shared.sqlite3'}"
    config = tmp_path / "pathlock.toml"
    config.write_text(f'# the lock database of every user\ndatabase_url = "{url}"\n')
    result = pathlock("info", PATHLOCK_CONFIG=str(config))
    assert result.returncode == 0, result.stderr
    assert f"database:   {url}\nchosen by:  {config}\n" in result.stdout
    assert "locks:      0 paths locked, 0 requests waiting" in result.stdout
    # The environment variable wins over the file.
    other = f"sqlite:///{tmp_path / 'other.sqlite3'}"
    result = pathlock("info", PATHLOCK_CONFIG=str(config), PATHLOCK_DATABASE_URL=other)
    assert f"database:   {other}\nchosen by:  $PATHLOCK_DATABASE_URL\n" in result.stdout


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (None, "cannot read pathlock's configuration file"),
        ("database_url = ", "is not valid TOML"),
        ("database = 'sqlite:///x'", "must set database_url to a URL string"),
        ("database_url = 42", "must set database_url to a URL string"),
    ],
)
def test_a_bad_configuration_file_is_one_clear_line(
    tmp_path: Path, content: str | None, problem: str
) -> None:
    config = tmp_path / "pathlock.toml"
    if content is not None:
        config.write_text(content)
    result = pathlock("ls", PATHLOCK_CONFIG=str(config))
    assert result.returncode == 1
    _one_line_error(result)
    assert problem in result.stderr
    assert str(config) in result.stderr


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert re.fullmatch(r"pathlock \S+\n", capsys.readouterr().out)


@pytest.mark.parametrize(
    ("args", "status"),
    [
        (["ls", "--database-url", "nosuch://host/db"], 1),
        (["release", "--database-url", "{url}", "not-a-lease-id"], 1),
        (["release", "--database-url", "{url}"], 2),
        (["lock", "--database-url", "{url}", "/a"], 2),
        (["ls", "--database-url", "{url}", "--customer", "-5"], 2),
        (["ls", "--database-url", "{url}", "--", "true"], 2),
        (["frobnicate"], 2),
    ],
)
def test_errors_are_one_line(args: list[str], status: int) -> None:
    result = pathlock(*(arg.replace("{url}", NEVER_CONTACTED) for arg in args))
    assert result.returncode == status
    _one_line_error(result)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["db", "current", "mysql://nobody@127.0.0.1:1/none"], "write mysql+pymysql://"),
        (["db", "upgrade", "mariadb://nobody@127.0.0.1:1/none"], "write mariadb+pymysql://"),
        (["db", "check", "postgresql+psycopg2://127.0.0.1:1/none"], "write postgresql+psycopg://"),
        (["db", "stamp", "0005", "foo://127.0.0.1:1/none"], "unsupported database 'foo'"),
        (["db", "downgrade", "0004", "not a url"], "not a database URL"),
        (["bench", "--quick", "--no-report", "mysql://nobody@127.0.0.1:1/none"], "write mysql+"),
    ],
    ids=["mysql", "mariadb", "postgresql", "foo", "unparseable", "bench"],
)
def test_db_and_bench_refuse_a_url_as_the_other_commands_do(args: list[str], says: str) -> None:
    """They used to print a traceback (ModuleNotFoundError: No module named
    'MySQLdb', NoSuchModuleError, ArgumentError)."""
    *command, url = args
    result = pathlock(*command, "--database-url", url)
    listed = pathlock("ls", "--database-url", url)
    assert (result.returncode, _one_line_error(result)) == (
        listed.returncode,
        _one_line_error(listed),
    )
    assert says in result.stderr


def test_several_database_urls_are_the_nodes_of_one_cluster(
    mariadb_url: str, customer_id: int
) -> None:
    # A dead node first: the command moves past it to the live one.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    dead = mariadb_url.replace("127.0.0.1:3306", f"127.0.0.1:{port}")
    assert dead != mariadb_url
    result = pathlock(
        "--database-url", dead, "--database-url", mariadb_url,
        "lock", "--customer", str(customer_id), "/Shared/a", "--",
        sys.executable, "-c", "print('held')",
    )  # fmt: skip
    assert (result.returncode, result.stdout) == (0, "held\n"), result.stderr
    assert f"database node 127.0.0.1:{port}/" in result.stderr
