"""Faults injected while a stress workload runs (MariaDB only).

Each test runs the workload of ``fault_worker.py``: several spawned processes,
each with its own PathLockManager, doing random requests on a small tree of one
customer (exclusive and shared, several paths per request, try-locks and
blocking locks with timeouts, mostly short holds and a few long enough to be
renewed) while one fault is injected:

1. SIGKILL of random holders and waiters, each replaced by a new worker;
2. the server killing the workers' connections (``KILL CONNECTION``) at random
   points of acquire, release and renewal;
3. a restart of the database server (a private one, never the shared server):
   SIGKILL, or a clean shutdown (SIGTERM), then a start on the same data
   directory and port.

After the run, an independent checker (``test_stress.py``'s) proves that no two
conflicting holds overlapped in time and that fencing tokens are unique and
grow along conflicting grants. A hold is the interval in which its holder was
entitled to rely on the lease: from right after the grant returned until the
earliest of

- right before it called release (or left the ``with`` block),
- the moment it was told the lease was lost (``on_lost``), or the grant itself
  if the lease came back lost already,
- for a holder killed while holding: the lease's expiry in the database (read
  with plain SQL right after the kill), or the kill if that came later (a
  holder not told of a loss relied on its lease until it died).

Besides, throughout every run:

- a monitor reads the customer's ``path_locks`` rows with plain SQL ten times
  a second: each lease's rows are exactly the paths its request named (the
  request travels in the lease's reason, so this covers leases whose holder
  died or never heard of its grant): no request is ever partly granted; and no
  two rows of different leases that are live in one snapshot conflict;
- every call into pathlock ended in a grant, a try-lock's ``None`` or a
  :class:`~pathlock.PathLockError` (counted by class); transient database
  errors were retried with a WARNING (counted by action and error code);
  nothing else was raised, nothing was logged at ERROR;
- once the workers are gone nothing outlives its ttl: no lock row expires
  later than one ttl from then and no queue row later than the waiters' ttl
  (``Settings.waiter_ttl``); a
  probe locking ``/`` (which conflicts with everything) is granted once those
  have lapsed, so dead waiters stopped blocking, and it takes part in the
  overlap check, so it was not granted before; after the reaper the customer
  has no rows at all.

Sizes: ``PATHLOCK_FAULT_WORKERS`` (default 7) and ``PATHLOCK_STRESS_SEED``
(shared with ``test_stress.py``, to replay a run). The runs are short in CI
(12 s of SIGKILLs, 10 s of killed connections, 4 s of load after a restart);
``pytest --soak`` runs them twice as long (24 s, 20 s and 8 s).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import random
import secrets
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, make_url, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool

from pathlock.settings import DEFAULT as SETTINGS
from servers import private_mariadb
from tests.integration.conftest import PRIVATE_DATABASE
from tests.integration.fault_harness import (
    SLACK,
    WORKERS,
    DeadLease,
    Kill,
    Monitor,
    Worker,
    Workload,
    check,
    collect,
    event_record,
    figures,
    overlaps,
    read_logs,
    read_remains,
    settle,
)
from tests.integration.test_stress import (
    SEED,
    Hold,
    holds_conflict,
    overlapping_conflicts,
)

pytestmark = pytest.mark.stress


def test_checker_ends_holds_where_their_holders_stopped_relying_on_them(tmp_path: Path) -> None:
    """Released, lost, lost at grant, killed while holding (until the expiry
    read after the kill), killed before recording its grant; a killed worker's
    cut-off last line; and a grant made before a dead lease expired is seen."""
    a, a_b, x, x_y = (
        [["/a", "exclusive"]],
        [["/a/b", "exclusive"]],
        [["/x", "shared"]],
        [["/x/y", "exclusive"]],
    )
    dead = [
        event_record("grant", "released", t_start=1.0, paths=a, token=1),
        event_record("end", "released", t_end=2.0),
        event_record("grant", "lost", t_start=3.0, paths=x, token=2),
        event_record("lost", "lost", t_lost=4.0),
        event_record("end", "lost", t_end=4.5),
        event_record("grant", "lost-at-grant", t_start=4.6, paths=x, token=4, lost_at_grant=True),
        event_record("end", "lost-at-grant", t_end=4.9),
        event_record("grant", "killed", t_start=5.0, paths=a_b, token=5),
    ]
    alive = [
        event_record("grant", "after-loss", t_start=4.2, paths=x_y, token=3),
        event_record("end", "after-loss", t_end=4.3),
        event_record("grant", "too-early", t_start=8.0, paths=a, token=8),
        event_record("end", "too-early", t_end=8.2),
    ]
    for worker, events in ((0, dead), (1, alive)):
        lines = [json.dumps({"worker": worker, **event}) for event in events]
        if worker == 0:
            lines.append('{"ev": "gra')  # SIGKILL in the middle of a line
        (tmp_path / f"worker-{worker}.jsonl").write_text("\n".join(lines), encoding="utf-8")
    kill = Kill(
        worker=0,
        aimed_at="holder",
        t_kill=6.0,
        t_read=6.1,
        leases={
            "killed": DeadLease("killed", 5, [("/a/b", "exclusive", False)], 9.0),
            "unrecorded": DeadLease("unrecorded", 7, [("/a_b", "exclusive", False)], 8.5),
        },
        waiters_remaining=[],
    )
    tally = collect(tmp_path, [kill])
    assert {hold.lease_id: (hold.t_start, hold.t_end) for hold in tally.holds} == {
        "released": (1.0, 2.0),
        "lost": (3.0, 4.0),
        "lost-at-grant": (4.6, 4.6),
        "killed": (5.0, 9.0),
        "unrecorded": (6.1, 8.5),
        "after-loss": (4.2, 4.3),
        "too-early": (8.0, 8.2),
    }
    assert (tally.killed_holding, tally.killed_unrecorded, tally.lost_at_grant) == (1, 1, 1)
    assert not tally.anomalies
    found = overlapping_conflicts(tally.holds)
    assert [(first.lease_id, second.lease_id) for first, second in found] == [
        ("killed", "too-early")
    ]

    (tmp_path / "worker-0.log").write_text(
        "2026-01-01 10:00:00,000|1|MainThread|pathlock.store|WARNING|acquiring locks: "
        "transient database error (attempt 1 of 5, retrying in 50 ms): (2013, 'Lost')\n"
        "2026-01-01 10:00:00,000|1|Thread-1 (run)|pathlock.heartbeat|ERROR|renewing failed\n"
        "Traceback (most recent call last):\n"
        "2026-01-01 10:00:00,000|1|lane|pathlock.lease|WARNING|lease "
        + "0" * 32
        + " (/a (exclusive)) lost: not renewed for 2.7 s\n",
        encoding="utf-8",
    )
    logs = read_logs(tmp_path)
    assert logs.retries == {"acquiring locks: 2013": 1}
    assert len(logs.errors) == 1
    assert logs.warnings == {"lease <lease> (...) lost": 1}


# -- 1. SIGKILL of holders and waiters ---------------------------------------------------------


KILL_RUN = 12.0  # seconds of workload with kills (SOAK_KILL_RUN with --soak)
SOAK_KILL_RUN = 24.0
# Seconds between kills: a kill starts every 2 s at most, so the run has 6
# kills at least (2 aimed at holders, 2 at waiters), about 8 on average.
KILL_EVERY = (1.0, 2.0)


_HOLDING = text(
    "SELECT DISTINCT node_id FROM path_locks "
    "WHERE customer_id = :c AND expires_at > UTC_TIMESTAMP(6)"
)
_WAITING = text(
    "SELECT DISTINCT node_id FROM path_lock_waiters "
    "WHERE customer_id = :c AND expires_at > UTC_TIMESTAMP(6)"
)


def _pick_victim(
    engine: Engine, customer_id: int, candidates: list[Worker], aim: str, rng: random.Random
) -> Worker:
    """A worker that holds a lock (or waits in the queue) now, if any does."""
    if aim != "any":
        with engine.connect() as connection:
            nodes = set(
                connection.execute(_HOLDING if aim == "holder" else _WAITING, {"c": customer_id})
                .scalars()
                .all()
            )
            connection.rollback()
        matching = [worker for worker in candidates if worker.spec.node_id in nodes]
        if matching:
            return rng.choice(matching)
    return rng.choice(candidates)


def gaps_after(ended: set[str], holds: Sequence[Hold]) -> list[float]:
    """For each hold of ``ended`` (leases held by killed holders, or lost ones):
    seconds from the end of the hold to the next conflicting grant, if any."""
    gaps = []
    for first in holds:
        if first.lease_id not in ended:
            continue
        later = [
            hold.t_start
            for hold in holds
            if hold.lease_id != first.lease_id
            and hold.t_start >= first.t_start
            and holds_conflict(hold, first)
        ]
        if later:
            gaps.append(min(later) - first.t_end)
    return gaps


def _milliseconds(gaps: Sequence[float]) -> str:
    return f"min {min(gaps) * 1000:.0f} ms of {len(gaps)}" if gaps else "none"


@pytest.fixture
def soak(request: pytest.FixtureRequest) -> bool:
    """Whether the session runs the long sizes (``pytest --soak``)."""
    return bool(request.config.getoption("--soak"))


@pytest.mark.timeout(180)
def test_sigkill_of_holders_and_waiters(
    mariadb_url: str, customer_id: int, tmp_path: Path, soak: bool
) -> None:
    """Holders and waiters die at random moments (SIGKILL) and are replaced.
    A dead holder's paths are granted to nobody before its lease expires in the
    database; its queue rows stop counting within ``Settings.waiter_ttl``."""
    rng = random.Random(SEED)
    workload = Workload(mariadb_url, customer_id, tmp_path, "kill")
    admin = create_engine(mariadb_url, poolclass=NullPool)
    kills: list[Kill] = []
    try:
        with Monitor(mariadb_url, customer_id) as monitor:
            workload.start(WORKERS)
            aims = itertools.cycle(("holder", "waiter", "any"))
            until = workload.started + (SOAK_KILL_RUN if soak else KILL_RUN)
            while time.monotonic() < until:
                time.sleep(rng.uniform(*KILL_EVERY))
                candidates = workload.candidates()
                if not candidates:
                    continue
                aim = next(aims)
                victim = _pick_victim(admin, customer_id, candidates, aim, rng)
                workload.kill(victim)
                kills.append(read_remains(admin, customer_id, victim, aim))
                workload.spawn()  # the load goes on
            workload.stop()
        workload.fail_on_errors()
        end = settle(mariadb_url, customer_id)
    finally:
        workload.close()
        admin.dispose()
    tally = collect(tmp_path, kills)
    logs = read_logs(tmp_path)
    killed_nodes = {workload.workers[kill.worker].spec.node_id for kill in kills}
    dead_ids = {lease_id for kill in kills for lease_id in kill.leases}
    gaps = gaps_after(tally.held_until_expiry, [*tally.holds, end.probe])
    waiter_rows = [remaining for kill in kills for remaining in kill.waiters_remaining]
    print(
        f"\nfaults[sigkill] seed={SEED} workers={WORKERS} "
        f"{workload.stopped - workload.started:.1f} s, kills={len(kills)} "
        f"(aimed at {dict(Counter(kill.aimed_at for kill in kills))}; "
        f"{sum(1 for kill in kills if kill.leases)} held leases: {len(dead_ids)} leases, "
        f"{tally.killed_holding} recorded + {tally.killed_unrecorded} unrecorded; "
        f"{sum(1 for kill in kills if kill.waiters_remaining)} waited: {len(waiter_rows)} queue "
        f"rows, longest left {max(waiter_rows, default=0):.2f} s); next conflicting grant "
        f"after a dead lease's expiry: {_milliseconds(gaps)}; overlaps={overlaps(tally, end)}; "
        + figures("sigkill", tally, logs, monitor, end),
        file=sys.stderr,
    )
    check(tally, logs, monitor, end)

    # What a killed worker leaves stops counting on its own: queue rows within
    # the waiter ttl, lock rows at their expiry (checked above, with the probe).
    assert all(remaining <= SETTINGS.waiter_ttl + SLACK for remaining in waiter_rows), waiter_rows
    assert set(end.live_locks) <= killed_nodes, "a worker that closed its manager left locks"
    assert set(tally.errors) <= {"LockTimeout"}, dict(tally.errors)
    # The run meant something: kills of holders and of waiters, and many grants.
    assert len(kills) >= 6
    assert tally.held_until_expiry, "no worker was killed while holding a lease"
    assert waiter_rows, "no worker was killed while waiting"
    # A count, not a rate: each dead holder's or waiter's rows block a part
    # of the tree for up to 3 s or 5 s; runs of 12 s granted 60 to 230.
    assert tally.grants >= (80 if soak else 40)
    assert tally.try_none > 0


# -- 2. the server kills connections -----------------------------------------------------------


KILL_CONNECTIONS_RUN = 10.0  # seconds (SOAK_KILL_CONNECTIONS_RUN with --soak)
SOAK_KILL_CONNECTIONS_RUN = 20.0

_CONNECTIONS = text(
    "SELECT p.ID AS id, p.COMMAND AS command, p.INFO AS info, "
    "t.trx_id IS NOT NULL AS in_transaction "
    "FROM information_schema.PROCESSLIST p "
    "LEFT JOIN information_schema.INNODB_TRX t ON t.trx_mysql_thread_id = p.ID "
    "WHERE p.USER = :u AND p.DB = :db"
)

_UNKNOWN_THREAD = 1094


def _statement_kind(info: str | None, in_transaction: bool) -> str:
    """What a killed connection was doing, from its PROCESSLIST row."""
    if info is None:
        return "mid-transaction" if in_transaction else "idle"
    upper = " ".join(info.split()).upper()
    for needle, kind in (
        ("INSERT INTO PATH_LOCKS", "grant"),
        ("DELETE FROM PATH_LOCKS", "release"),
        ("UPDATE PATH_LOCKS SET EXPIRES_AT", "renewal"),
        ("PATH_LOCK_WAITERS", "queue"),
        ("COMMIT", "commit"),
        ("ROLLBACK", "rollback"),
        ("UPDATE CUSTOMER_LOCKS", "sentinel write"),
        ("CUSTOMER_LOCKS", "version watch"),
        ("PATH_LOCKS", "read"),
    ):
        if needle in upper:
            return kind
    return "other"


class ConnectionKiller:
    """``KILL CONNECTION`` of a random connection of one MariaDB user (the
    workers'; nobody else's) every 20 to 200 ms, from a thread of the test."""

    def __init__(self, admin_url: str, user: str, database: str, seed: int) -> None:
        self._engine = create_engine(admin_url, poolclass=NullPool, isolation_level="AUTOCOMMIT")
        self._parameters = {"u": user, "db": database}
        self._rng = random.Random(seed)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fault-killer", daemon=True)
        self.kills = 0
        self.gone = 0  # the connection ended before the KILL reached it
        self.hits: Counter[str] = Counter()
        self.failures: list[str] = []

    def __enter__(self) -> ConnectionKiller:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(30)
        self._engine.dispose()

    def _run(self) -> None:
        try:
            with self._engine.connect() as connection:
                while not self._stop.wait(self._rng.uniform(0.02, 0.2)):
                    self._kill_one(connection)
        except Exception as error:  # noqa: BLE001 - reported by the test
            self.failures.append(repr(error))

    def _kill_one(self, connection: Any) -> None:
        rows = connection.execute(_CONNECTIONS, self._parameters).all()
        # Half the time a busy connection (in a statement or a transaction):
        # most of the time most connections sit idle in their pools.
        busy = [row for row in rows if row.info is not None or row.in_transaction]
        if busy and self._rng.random() < 0.5:
            rows = busy
        if not rows:
            return
        victim = self._rng.choice(rows)
        try:
            connection.exec_driver_sql(f"KILL CONNECTION {int(victim.id)}")
        except DBAPIError as error:
            if error.orig is not None and error.orig.args[0] == _UNKNOWN_THREAD:
                self.gone += 1
                return
            raise
        self.kills += 1
        self.hits[_statement_kind(victim.info, bool(victim.in_transaction))] += 1


@pytest.fixture
def fault_user(mariadb_url: str) -> Iterator[tuple[str, str]]:
    """A MariaDB user of this test only, with rights on the test database only,
    so that killing its connections touches nobody else's: (user, URL)."""
    url = make_url(mariadb_url)
    name = f"pathlock_fault_{secrets.token_hex(4)}"
    password = secrets.token_hex(16)
    admin = create_engine(url, poolclass=NullPool)
    account = f"'{name}'@'127.0.0.1'"
    with admin.begin() as connection:
        connection.exec_driver_sql(f"CREATE USER {account} IDENTIFIED BY '{password}'")
        connection.exec_driver_sql(
            f"GRANT SELECT, INSERT, UPDATE, DELETE ON `{url.database}`.* TO {account}"
        )
    try:
        yield name, url.set(username=name, password=password).render_as_string(hide_password=False)
    finally:
        with admin.begin() as connection:
            connection.exec_driver_sql(f"DROP USER IF EXISTS {account}")
        admin.dispose()


@pytest.mark.timeout(150)
def test_server_kills_connections(
    mariadb_url: str, fault_user: tuple[str, str], customer_id: int, tmp_path: Path, soak: bool
) -> None:
    """The server kills the workers' connections every 20-200 ms, hitting
    grants, releases, renewals, queue upkeep and idle pooled connections:
    pathlock retries transparently (a WARNING each) and never double-grants."""
    user, worker_url = fault_user
    database = make_url(mariadb_url).database
    assert database is not None
    workload = Workload(worker_url, customer_id, tmp_path, "conn")
    try:
        with Monitor(mariadb_url, customer_id) as monitor:
            workload.start(WORKERS)
            with ConnectionKiller(mariadb_url, user, database, SEED) as killer:
                time.sleep(SOAK_KILL_CONNECTIONS_RUN if soak else KILL_CONNECTIONS_RUN)
            workload.stop()
        workload.fail_on_errors()
        end = settle(mariadb_url, customer_id)
    finally:
        workload.close()
    tally = collect(tmp_path)
    logs = read_logs(tmp_path)
    print(
        f"\nfaults[kill-connection] seed={SEED} workers={WORKERS} "
        f"{workload.stopped - workload.started:.1f} s, connections killed={killer.kills} "
        f"(already gone {killer.gone}; hits {dict(killer.hits)}); "
        f"retries by code={dict(logs.retry_codes)}; overlaps={overlaps(tally, end)}; "
        + figures("kill-connection", tally, logs, monitor, end),
        file=sys.stderr,
    )
    check(tally, logs, monitor, end)

    assert not killer.failures, killer.failures
    assert killer.kills >= 50
    assert sum(logs.retries.values()) > 0, "killed connections should have been retried"
    # A count, not a rate (a CI run on a busy machine granted 88 where 100
    # were asked for): the workload went on. Speed is the benchmarks' business.
    assert tally.grants >= WORKERS, "the workload should go on while connections are killed"
    # Transparent: a request fails on the database only if every retry of one
    # transaction met a kill, which is rare at this rate.
    assert tally.errors["BackendError"] <= tally.operations // 100, dict(tally.errors)


# -- 3. a database restart ---------------------------------------------------------------------


BEFORE_OUTAGE = 4.0  # seconds of workload before the server goes down
DOWN = {"SIGKILL": 3.0, "SIGTERM": 1.0}  # seconds it stays down before the restart
AFTER_OUTAGE = 4.0  # seconds of workload after it answers again (SOAK_AFTER_OUTAGE with --soak)
SOAK_AFTER_OUTAGE = 8.0


@pytest.mark.timeout(150)
@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_database_restart(
    private_server: private_mariadb.PrivateMariaDB,
    customer_id: int,
    tmp_path: Path,
    how: str,
    soak: bool,
) -> None:
    """The database server dies (SIGKILL) or shuts down cleanly (SIGTERM) in
    the middle of the workload and comes back on the same data directory.

    What is guaranteed, and checked:

    - Committed grants survive the restart (InnoDB, every commit flushed), so
      a lease's rows keep protecting its paths until their expiry in database
      time; nobody can be granted anything while the server is down.
    - A lease whose renewals fail (server down) is declared lost by its
      holder's heartbeat ``ttl/10`` before its conservative deadline (the
      monotonic time before the last successful grant or renewal statement,
      plus the ttl), which is never later than its expiry in the database.
      So the holder is told (``on_lost``, ``lease.lost``) before anyone else
      can be granted its paths: a hold ends at the earliest of its release and
      the moment the holder was told, and no conflicting grant may start
      before that. A renewal that succeeds after the restart keeps the lease.
    - A request caught by the outage ends in a grant (retried past it), or in
      a PathLockError (BackendError once its retries are spent while the
      server is down, LockTimeout, LeaseLost leaving a ``with`` block). A
      grant whose commit landed just before the crash but whose caller got
      BackendError leaves rows nobody holds: they block their paths until
      their ttl, which is safe, and the end state shows they lapse.
    - After the restart the workload goes on: grants resume.

    Not guaranteed: that a lease held across the outage survives it (it
    survives only if a renewal gets through before it may have lapsed), and
    that a release during the outage deletes the rows (they lapse at the ttl).
    Nor that a grant is still held when ``lock_paths`` returns it: one whose
    commit landed but whose reply was lost is replaced by its retry, and if
    the retries took longer than the ttl it comes back lost already
    (``lease.lost``); the checker ends such a hold at its grant.
    """
    if not private_server.running:  # an earlier test failed while it was down
        private_server.start()
    url = private_server.url(PRIVATE_DATABASE)
    # Long holds, so that many leases are held across the outage.
    workload = Workload(url, customer_id, tmp_path, how.lower(), long_hold=(2.0, 8.0))
    try:
        with Monitor(url, customer_id) as monitor:
            workload.start(WORKERS)
            time.sleep(BEFORE_OUTAGE)
            down_at = time.monotonic()
            stopping = 0.0
            if how == "SIGKILL":
                private_server.kill()
            else:
                stopping = private_server.stop()
            gone_at = time.monotonic()  # the server process has exited
            time.sleep(DOWN[how])
            starting_at = time.monotonic()
            restarting = private_server.start()
            up_at = time.monotonic()
            time.sleep(SOAK_AFTER_OUTAGE if soak else AFTER_OUTAGE)
            workload.stop()
        workload.fail_on_errors()
        end = settle(url, customer_id)
    finally:
        workload.close()
    tally = collect(tmp_path)
    logs = read_logs(tmp_path)
    gaps = gaps_after(tally.lost_ids, [*tally.holds, end.probe])
    after = sum(1 for moment in tally.grant_times if moment > up_at)
    # A grant recorded while no server ran would be a grant from nowhere (a
    # reply read just before the death may be recorded a moment after it).
    while_gone = sum(1 for moment in tally.grant_times if gone_at + 0.5 < moment < starting_at)
    during = sum(1 for moment in tally.grant_times if down_at <= moment <= up_at)
    kept = sum(1 for hold in tally.holds if hold.t_start < down_at and hold.t_end > up_at)
    print(
        f"\nfaults[restart-{how}] seed={SEED} workers={WORKERS} "
        f"{workload.stopped - workload.started:.1f} s, down {up_at - down_at:.2f} s "
        f"(shutdown {stopping:.2f} s, start {restarting:.2f} s); grants before/during/after "
        f"{tally.grants - after - during}/{during}/{after} ({while_gone} while no server "
        f"ran); leases held across the outage: {kept} kept, {tally.lost} lost; retries by code="
        f"{dict(logs.retry_codes)}; next conflicting grant after a lost lease's loss: "
        f"{_milliseconds(gaps)}; overlaps={overlaps(tally, end)}; "
        + figures(f"restart-{how}", tally, logs, monitor, end),
        file=sys.stderr,
    )
    check(tally, logs, monitor, end)

    assert private_server.starts >= 2
    assert while_gone == 0
    # A count, not a rate: a loaded machine grants fewer (a CI run with 32 of
    # a former 50 failed here), and speed is the benchmarks' business.
    assert after >= WORKERS, "the workload should go on after the restart"
    assert sum(logs.retries.values()) > 0, "the outage should have caused retries"
    # DeadlockDetected: a release that failed while the server was down leaves
    # its rows to lapse, and the same thread's next conflicting request is then
    # refused at once as waiting for itself (instead of waiting for the lapse).
    # DatabaseTimeout: a BackendError for a call that got no answer in its time.
    allowed = {"BackendError", "DatabaseTimeout", "LockTimeout", "LeaseLost", "DeadlockDetected"}
    assert set(tally.errors) <= allowed, dict(tally.errors)
    backend_errors = tally.errors["BackendError"] + tally.errors["DatabaseTimeout"]
    assert backend_errors > 0 or tally.lost > 0, "the outage went unnoticed"


def test_private_server_is_ours_alone(private_server: private_mariadb.PrivateMariaDB) -> None:
    """The helper's server: loopback only, on its own port, its own process."""
    assert private_server.port != 3306
    assert private_server.running
    with (
        contextlib.closing(private_server.connect(timeout=5)) as connection,
        connection.cursor() as cursor,
    ):
        cursor.execute("SELECT @@bind_address, @@port, @@datadir")
        bind, port, datadir = cursor.fetchone()
    assert bind == "127.0.0.1"
    assert port == private_server.port
    assert Path(datadir).resolve() == private_server.datadir.resolve()
