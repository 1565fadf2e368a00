"""The machinery of ``test_faults.py`` (and ``test_cluster_faults.py``, whose
workers list the nodes of a cluster): the workload of spawned workers, the
kills, the monitor that reads the tables while it runs, and the checker that
turns every worker's events into hold intervals for ``test_stress.py``'s
overlap check. See ``test_faults.py`` for what is checked and why."""

from __future__ import annotations

import itertools
import json
import multiprocessing
import os
import re
import secrets
import signal
import threading
import time
import traceback
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import NullPool

from pathlock import PathLockManager
from pathlock.settings import DEFAULT as SETTINGS
from tests.integration import fault_worker
from tests.integration.fault_worker import FaultSpec
from tests.integration.test_stress import (
    SEED,
    Atom,
    Hold,
    assert_safe,
    atoms_conflict,
    overlapping_conflicts,
)

WORKERS = int(os.environ.get("PATHLOCK_FAULT_WORKERS", "7"))
TTL = 3.0  # seconds: short, so renewals happen (every ttl/3) and dead leases lapse soon
START_TIMEOUT = 90.0  # seconds for the first workers to import, connect and say ready
JOIN_TIMEOUT = 60.0  # seconds for the workers to finish after the stop file appears
LIVE_MARGIN_US = 200_000  # a row counts as live in a snapshot only this far from its expiry
SLACK = 0.5  # seconds of clock and scheduling slack in the end-state bounds


# -- the workers -----------------------------------------------------------------------


@dataclass
class Worker:
    spec: FaultSpec
    process: BaseProcess
    killed_at: float | None = None

    @property
    def ready(self) -> bool:
        return self.spec.ready_path.exists()


class Workload:
    """Spawned workers of one test, started, killed, replaced and stopped."""

    def __init__(
        self,
        database_url: str | Sequence[str],
        customer_id: int,
        out_dir: Path,
        tag: str,
        long_hold: tuple[float, float] = (1.1, 5.0),
        *,
        ttl: float = TTL,
        affinity: bool = False,
    ) -> None:
        self.database_url = database_url
        self.long_hold = long_hold
        self.ttl = ttl
        self.affinity = affinity
        self.customer_id = customer_id
        self.out_dir = out_dir
        self.tag = tag
        self.workers: list[Worker] = []
        self._context = multiprocessing.get_context("spawn")
        self.started = 0.0
        self.stopped = 0.0

    def urls_of(self, index: int) -> str | list[str]:
        """The database of worker ``index``: the one URL, or the nodes of a
        cluster listed from node ``index % len(nodes)`` on, so that without
        affinity the workers' operations spread over the nodes."""
        if isinstance(self.database_url, str):
            return self.database_url
        nodes = list(self.database_url)
        first = index % len(nodes)
        return nodes[first:] + nodes[:first]

    def spawn(self) -> Worker:
        index = len(self.workers)
        spec = FaultSpec(
            database_url=self.urls_of(index),
            customer_id=self.customer_id,
            index=index,
            node_id=f"fault-{self.tag}-{index}-{secrets.token_hex(3)}",
            out_dir=self.out_dir,
            seed=SEED,
            ttl=self.ttl,
            max_seconds=240.0,
            long_hold=self.long_hold,
            affinity=self.affinity,
        )
        process = self._context.Process(
            target=fault_worker.run, args=(spec,), name=f"fault-{index}", daemon=True
        )
        process.start()
        worker = Worker(spec, process)
        self.workers.append(worker)
        return worker

    def start(self, count: int) -> None:
        """Spawn ``count`` workers and wait until every one is connected."""
        first = [self.spawn() for _ in range(count)]
        deadline = time.monotonic() + START_TIMEOUT
        while not all(worker.ready for worker in first):
            broken = [w for w in first if w.spec.error_path.exists() or not w.process.is_alive()]
            if broken or time.monotonic() > deadline:
                self.stop()
                self.fail_on_errors()
                pytest.fail(f"workers did not start within {START_TIMEOUT:g} s", pytrace=False)
            time.sleep(0.05)
        self.started = time.monotonic()

    def candidates(self) -> list[Worker]:
        """Workers that run the workload now (and may be killed)."""
        return [w for w in self.workers if w.killed_at is None and w.ready and w.process.is_alive()]

    def kill(self, worker: Worker) -> float:
        """SIGKILL ``worker``; return the moment the signal was sent, once it is dead."""
        pid = worker.process.pid
        assert pid is not None
        killed_at = time.monotonic()
        os.kill(pid, signal.SIGKILL)  # a worker this test spawned, by pid
        worker.killed_at = killed_at
        worker.process.join(10)
        assert not worker.process.is_alive(), f"worker {worker.spec.index} survived SIGKILL"
        return killed_at

    def stop(self) -> None:
        """Tell every worker to stop and wait for them; the stragglers are
        terminated (and reported by :meth:`fail_on_errors`)."""
        (self.out_dir / fault_worker.STOP_FILE).touch()
        self.stopped = time.monotonic()
        deadline = self.stopped + JOIN_TIMEOUT
        for worker in self.workers:
            worker.process.join(max(0.0, deadline - time.monotonic()))
        for worker in self.workers:
            if worker.process.is_alive():
                worker.process.terminate()
                worker.process.join(5)
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join()

    def fail_on_errors(self) -> None:
        """Fail the test with the traceback of every worker that died on its own."""
        problems = []
        for worker in self.workers:
            if worker.killed_at is not None:
                continue
            if worker.spec.error_path.exists():
                problems.append(worker.spec.error_path.read_text(encoding="utf-8"))
            elif worker.process.exitcode != 0:
                problems.append(f"worker {worker.spec.index} exited with {worker.process.exitcode}")
        if problems:
            pytest.fail("workers failed:\n\n" + "\n\n".join(problems), pytrace=False)

    def close(self) -> None:
        for worker in self.workers:
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join()
            worker.process.close()


# -- what a killed worker left behind ------------------------------------------------------


@dataclass
class DeadLease:
    lease_id: str
    token: int
    paths: list[Atom]
    expiry: float  # monotonic: no later than the lease's expiry in the database


@dataclass
class Kill:
    """One SIGKILL and what the victim left in the database, read right after
    its death (``t_read``: when that read returned)."""

    worker: int
    aimed_at: str
    t_kill: float
    t_read: float
    leases: dict[str, DeadLease]
    waiters_remaining: list[float]  # seconds each queue row had left


_DEAD_LOCKS = text(
    "SELECT lease_id, path, mode, shallow, fencing_token, "
    "TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) AS remaining_us "
    "FROM path_locks WHERE customer_id = :c AND node_id = :n "
    # An expired row blocks nobody: it is no hold (a grant whose reply the
    # kill cut off may have expired before the read, and would look like a
    # hold that began after a later grant, with an older token).
    "AND expires_at > UTC_TIMESTAMP(6)"
)
_DEAD_WAITERS = text(
    "SELECT TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) AS remaining_us "
    "FROM path_lock_waiters WHERE customer_id = :c AND node_id = :n"
)


def read_remains(engine: Engine, customer_id: int, worker: Worker, aimed_at: str) -> Kill:
    """The rows of a dead worker. Expiries are turned into monotonic time from
    a moment taken before the read (so never later than the real expiry); a
    renewal or commit still in flight when it died only makes the real one later."""
    assert worker.killed_at is not None
    parameters = {"c": customer_id, "n": worker.spec.node_id}
    before = time.monotonic()
    with engine.connect() as connection:
        locks = connection.execute(_DEAD_LOCKS, parameters).all()
        waiters = connection.execute(_DEAD_WAITERS, parameters).all()
        connection.rollback()
    t_read = time.monotonic()
    leases: dict[str, DeadLease] = {}
    for row in locks:
        expiry = before + row.remaining_us / 1e6
        lease = leases.setdefault(
            row.lease_id, DeadLease(row.lease_id, int(row.fencing_token), [], expiry)
        )
        lease.paths.append((row.path, row.mode, bool(row.shallow)))
        lease.expiry = min(lease.expiry, expiry)
    return Kill(
        worker=worker.spec.index,
        aimed_at=aimed_at,
        t_kill=worker.killed_at,
        t_read=t_read,
        leases=leases,
        waiters_remaining=[row.remaining_us / 1e6 for row in waiters],
    )


# -- plain-SQL monitor ---------------------------------------------------------------------


_SNAPSHOT = text(
    "SELECT lease_id, path, mode, shallow, reason, "
    "expires_at > TIMESTAMPADD(MICROSECOND, :margin, UTC_TIMESTAMP(6)) AS live "
    "FROM path_locks WHERE customer_id = :c"
)


class Monitor:
    """Reads the customer's rows with plain SQL every ``interval`` seconds
    (on a cluster, through the one node ``database_url`` names; reads while
    it is down or out of the primary component count as failed).
    One SELECT is one consistent read (READ COMMITTED takes a read view per
    statement), so a lease's rows appear all together or not at all."""

    def __init__(self, database_url: str, customer_id: int, interval: float = 0.1) -> None:
        self._engine = create_engine(
            database_url,
            poolclass=NullPool,
            connect_args={"connect_timeout": 2, "read_timeout": 5},
        )
        self._customer_id = customer_id
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fault-monitor", daemon=True)
        self.snapshots = 0
        self.failed_reads = 0
        self.leases: set[str] = set()
        self.partial: list[str] = []
        self.foreign: set[str] = set()
        self.live_conflicts: list[str] = []
        self.crashed: list[str] = []

    def __enter__(self) -> Monitor:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(30)
        self._engine.dispose()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self._snapshot()
            except SQLAlchemyError:
                self.failed_reads += 1  # the server is down, or restarting
            except Exception:  # noqa: BLE001 - reported by check()
                self.crashed.append(traceback.format_exc())
                return

    def _snapshot(self) -> None:
        with self._engine.connect() as connection:
            rows = connection.execute(
                _SNAPSHOT, {"c": self._customer_id, "margin": LIVE_MARGIN_US}
            ).all()
            connection.rollback()
        self.snapshots += 1
        by_lease: dict[str, list[list[str]]] = {}
        reasons: dict[str, str] = {}
        for row in rows:
            by_lease.setdefault(row.lease_id, []).append([row.path, row.mode])
            reasons[row.lease_id] = row.reason
        self.leases.update(by_lease)
        for lease_id, held in by_lease.items():
            expected = fault_worker.decode_reason(reasons[lease_id])
            if expected is None:
                self.foreign.add(lease_id)
            elif sorted(held) != expected:
                self.partial.append(f"lease {lease_id}: rows {sorted(held)}, asked {expected}")
        live = [(row.lease_id, (row.path, row.mode, bool(row.shallow))) for row in rows if row.live]
        for (first, atom), (second, other) in itertools.combinations(live, 2):
            if first != second and atoms_conflict(atom, other):
                self.live_conflicts.append(f"{first} {atom} and {second} {other}")


# -- what the workers saw ------------------------------------------------------------------


@dataclass
class Tally:
    holds: list[Hold] = field(default_factory=list)
    grants: int = 0
    try_none: int = 0
    errors: Counter[str] = field(default_factory=Counter)  # PathLockError class
    errors_at: Counter[str] = field(default_factory=Counter)  # where:class
    unexpected: list[str] = field(default_factory=list)
    lost: int = 0  # on_lost callbacks
    lost_ids: set[str] = field(default_factory=set)
    lost_at_grant: int = 0  # leases that came back lost already
    lost_on_release: int = 0  # released fine, then lease.lost without on_lost
    mismatched: list[str] = field(default_factory=list)
    anomalies: list[str] = field(default_factory=list)
    killed_holding: int = 0  # killed with a recorded grant still held
    killed_unrecorded: int = 0  # killed after the grant committed, before it was recorded
    held_until_expiry: set[str] = field(default_factory=set)  # the two kinds above
    finished: int = 0  # workers that stopped on their own
    grant_times: list[float] = field(default_factory=list)

    @property
    def operations(self) -> int:
        return self.grants + self.try_none + sum(self.errors.values()) + len(self.unexpected)


def read_events(path: Path) -> list[dict[str, Any]]:
    """A worker's events; a killed worker's last line may be cut short."""
    lines = path.read_text(encoding="utf-8").splitlines()
    events = []
    for number, line in enumerate(lines):
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            if number != len(lines) - 1:
                raise
    return events


def collect(out_dir: Path, kills: Sequence[Kill] = ()) -> Tally:
    """Every worker's events as holds and counts (see the module docstring for
    where a hold ends)."""
    tally = Tally()
    by_worker = {kill.worker: kill for kill in kills}
    for path in sorted(out_dir.glob("worker-*.jsonl")):
        worker = int(path.stem.removeprefix("worker-"))
        seen = _Seen()
        for event in read_events(path):
            seen.count(event, tally)
        seen.holds(worker, by_worker.get(worker), tally)
    return tally


@dataclass
class _Seen:
    """One worker's grants, ends and losses, by lease id."""

    grants: dict[str, dict[str, Any]] = field(default_factory=dict)
    ends: dict[str, float] = field(default_factory=dict)
    losts: dict[str, float] = field(default_factory=dict)

    def count(self, event: dict[str, Any], tally: Tally) -> None:
        kind = event["ev"]
        if kind == "grant":
            self.grants[event["lease_id"]] = event
            tally.grants += 1
            tally.grant_times.append(event["t_start"])
            if event["held"] != event["expected"]:
                tally.mismatched.append(f"{event['lease_id']}: {event['held']}")
        elif kind == "end":
            self.ends[event["lease_id"]] = event["t_end"]
        elif kind == "lost":
            self.losts[event["lease_id"]] = event["t_lost"]
            tally.lost += 1
            tally.lost_ids.add(event["lease_id"])
        elif kind == "try_none":
            tally.try_none += 1
        elif kind == "error":
            tally.errors[event["cls"]] += 1
            tally.errors_at[f"{event['where']}:{event['cls']}"] += 1
        elif kind == "unexpected":
            tally.unexpected.append(f"worker {event['worker']} {event['where']}: {event['tb']}")
        elif kind == "released" and event["lost"] and event["lease_id"] not in self.losts:
            tally.lost_on_release += 1
        elif kind == "done":
            tally.finished += 1

    def holds(self, worker: int, kill: Kill | None, tally: Tally) -> None:
        for lease_id, grant in self.grants.items():
            ended, lost = self.ends.get(lease_id), self.losts.get(lease_id)
            hold_end = _hold_end(grant, ended, lost, kill, tally)
            if hold_end is not None:
                paths = tuple((path, mode, False) for path, mode in grant["paths"])
                tally.holds.append(
                    Hold(grant["t_start"], hold_end, worker, lease_id, grant["token"], paths)
                )
        if kill is None:
            return
        for lease_id, dead in kill.leases.items():
            if lease_id not in self.grants:
                # Granted, but killed before it could record the grant: held
                # at least from when the read saw it until its expiry.
                tally.killed_unrecorded += 1
                tally.held_until_expiry.add(lease_id)
                paths = tuple(dead.paths)
                tally.holds.append(
                    Hold(kill.t_read, dead.expiry, worker, lease_id, dead.token, paths)
                )


def _hold_end(
    grant: dict[str, Any],
    ended: float | None,
    lost: float | None,
    kill: Kill | None,
    tally: Tally,
) -> float | None:
    candidates = [moment for moment in (ended, lost) if moment is not None]
    if grant["lost_at_grant"]:
        tally.lost_at_grant += 1
        candidates.append(grant["t_start"])
    if ended is None and kill is not None:
        dead = kill.leases.get(grant["lease_id"])
        if dead is not None:
            tally.killed_holding += 1
            tally.held_until_expiry.add(grant["lease_id"])
            candidates.append(max(dead.expiry, kill.t_kill))
        elif lost is None:
            tally.anomalies.append(
                f"worker {kill.worker} was killed holding lease {grant['lease_id']}, "
                "but its rows were gone"
            )
    if not candidates:
        tally.anomalies.append(f"lease {grant['lease_id']} of worker {grant['worker']} never ended")
        return None
    return min(candidates)


# -- the logs ------------------------------------------------------------------------------


_RETRY = re.compile(r"(?P<action>[\w' ]+): transient database error \(attempt \d+ of \d+")
_CODE = re.compile(r"\): \((?P<code>-?\d+),")
_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


@dataclass
class Logs:
    retries: Counter[str] = field(default_factory=Counter)  # "action: code"
    retry_codes: Counter[str] = field(default_factory=Counter)
    warnings: Counter[str] = field(default_factory=Counter)  # other WARNINGs, by kind
    errors: list[str] = field(default_factory=list)  # ERROR or worse


def read_logs(out_dir: Path) -> Logs:
    logs = Logs()
    for path in sorted(out_dir.glob("worker-*.log")):
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            fields = line.split("|", 5)  # fault_worker.LOG_FORMAT
            if len(fields) != 6 or fields[4] not in _LEVELS:
                continue  # a traceback's continuation line
            level, message = fields[4], fields[5]
            if level in ("ERROR", "CRITICAL"):
                logs.errors.append(line)
                continue
            retry = _RETRY.match(message)
            if retry is not None:
                code_match = _CODE.search(message)
                code = code_match["code"] if code_match else "?"
                logs.retries[f"{retry['action']}: {code}"] += 1
                logs.retry_codes[code] += 1
                continue
            kind = re.sub(r"[0-9a-f]{32}", "<lease>", message.split(": ", 1)[0])
            kind = re.sub(r"\(.*\)", "(...)", kind)
            logs.warnings[re.sub(r"\d+(\.\d+)?", "N", kind)[:70]] += 1
    return logs


# -- after the run -------------------------------------------------------------------------


@dataclass
class EndState:
    live_locks: dict[str, int]  # node -> live rows right after the workers stopped
    longest_lock: float  # seconds the longest-lived lock row still had
    longest_waiter: float
    probe: Hold
    probe_waited: float
    reaped: int


_LIVE = (
    "SELECT node_id, COUNT(*) AS n, "
    "MAX(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at)) AS longest_us "
    "FROM {table} WHERE customer_id = :c AND expires_at > UTC_TIMESTAMP(6) GROUP BY node_id"
)


def _live(engine: Engine, table: str, customer_id: int) -> dict[str, tuple[int, float]]:
    with engine.connect() as connection:
        rows = connection.execute(text(_LIVE.format(table=table)), {"c": customer_id}).all()
        connection.rollback()
    return {row.node_id: (int(row.n), row.longest_us / 1e6) for row in rows}


def _count(engine: Engine, table: str, customer_id: int) -> int:
    with engine.connect() as connection:
        count = connection.execute(
            text(f"SELECT COUNT(*) FROM {table} WHERE customer_id = :c"), {"c": customer_id}
        ).scalar_one()
        connection.rollback()
    return int(count)


def settle(database_url: str, customer_id: int, ttl: float = TTL) -> EndState:
    """Once the workers are gone: bound what is left, lock "/" as soon as it
    lapses, reap, and check that nothing remains (plain SQL throughout).
    ``ttl``: the workers' (no row may outlive it). On a cluster, any one
    node's URL."""
    engine = create_engine(database_url, poolclass=NullPool)
    try:
        locks = _live(engine, "path_locks", customer_id)
        waiters = _live(engine, "path_lock_waiters", customer_id)
        longest_lock = max((longest for _, longest in locks.values()), default=0.0)
        longest_waiter = max((longest for _, longest in waiters.values()), default=0.0)
        # Nothing is renewed once its holder is gone: no row outlives a ttl.
        assert longest_lock <= ttl + SLACK, f"lock rows outlive their ttl: {locks}"
        assert longest_waiter <= SETTINGS.waiter_ttl + SLACK, (
            f"queue rows outlive theirs: {waiters}"
        )
        wait = max(longest_lock, longest_waiter)
        with PathLockManager(database_url, node_id="fault-probe", ttl=TTL) as manager:
            asked = time.monotonic()
            lease = manager.for_customer(customer_id).lock_paths(
                "/", timeout=wait + 5.0, reason="probe of test_faults"
            )
            t_start = time.monotonic()
            t_end = time.monotonic()
            lease.release()
            probe = Hold(
                t_start,
                t_end,
                -1,
                lease.lease_id,
                lease.fencing_token,
                (("/", "exclusive", False),),
            )
            time.sleep(max(0.0, asked + wait + 0.1 - time.monotonic()))
            reaped = manager.reap_expired()
        assert _count(engine, "path_locks", customer_id) == 0, "lock rows left after reaping"
        assert _count(engine, "path_lock_waiters", customer_id) == 0, "queue rows left"
    finally:
        engine.dispose()
    return EndState(
        live_locks={node: count for node, (count, _) in locks.items()},
        longest_lock=longest_lock,
        longest_waiter=longest_waiter,
        probe=probe,
        probe_waited=t_start - asked,
        reaped=reaped,
    )


# -- the common verdict ----------------------------------------------------------------


def overlaps(tally: Tally, end: EndState) -> int:
    """Pairs of conflicting holds that overlapped in time (the probe's too)."""
    return len(overlapping_conflicts([*tally.holds, end.probe]))


def check(tally: Tally, logs: Logs, monitor: Monitor, end: EndState) -> None:
    """The assertions every fault test makes."""
    assert not tally.unexpected, "calls raised something other than PathLockError:\n" + "\n".join(
        tally.unexpected[:5]
    )
    assert not logs.errors, "pathlock logged errors:\n" + "\n".join(logs.errors[:10])
    assert not tally.anomalies, "\n".join(tally.anomalies[:10])
    assert not tally.mismatched, f"leases hold other paths than requested: {tally.mismatched[:5]}"
    assert not monitor.crashed, monitor.crashed[0]
    assert monitor.snapshots > 0
    assert not monitor.partial, "partly granted requests in path_locks:\n" + "\n".join(
        monitor.partial[:10]
    )
    assert not monitor.live_conflicts, "conflicting live rows in one snapshot:\n" + "\n".join(
        monitor.live_conflicts[:10]
    )
    assert not monitor.foreign, f"rows without the workers' reason: {sorted(monitor.foreign)[:5]}"
    assert_safe([*tally.holds, end.probe])


def figures(name: str, tally: Tally, logs: Logs, monitor: Monitor, end: EndState) -> str:
    return (
        f"grants={tally.grants} try_none={tally.try_none} "
        f"errors={dict(tally.errors)} (at {dict(tally.errors_at)}) "
        f"unexpected={len(tally.unexpected)} lost={tally.lost} "
        f"lost_at_grant={tally.lost_at_grant} lost_on_release={tally.lost_on_release}; "
        f"retries={dict(logs.retries)}; other warnings={dict(logs.warnings)}; "
        f"monitor: {monitor.snapshots} snapshots ({monitor.failed_reads} failed), "
        f"{len(monitor.leases)} leases seen, partial={len(monitor.partial)}, "
        f"live conflicts={len(monitor.live_conflicts)}; "
        f"end: live rows by node={end.live_locks}, longest lock {end.longest_lock:.2f} s, "
        f"waiter {end.longest_waiter:.2f} s, probe waited {end.probe_waited:.2f} s, "
        f"reaped {end.reaped} [{name}]"
    )


# -- the checker itself ---------------------------------------------------------------


def event_record(kind: str, lease_id: str, **fields: Any) -> dict[str, Any]:
    if kind == "grant":
        paths = fields.pop("paths")
        fields |= {
            "paths": paths,
            "held": paths,
            "expected": paths,
            "token": fields.get("token", 1),
            "lost_at_grant": fields.get("lost_at_grant", False),
        }
    return {"ev": kind, "lease_id": lease_id, **fields}
