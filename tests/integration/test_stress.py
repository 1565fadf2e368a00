"""Many processes, one customer, an independent checker (python-redis-lock's
``test_no_overlap2`` idea).

Every worker process records each grant it gets as a hold interval measured with
``time.monotonic()`` (CLOCK_MONOTONIC is one clock for every process on Linux):
``t_start`` right after the grant returned, ``t_end`` right before the release
is called. The recorded interval lies inside the real one (grant commit to
release commit), so two recorded intervals that overlap prove a double grant.
The checker knows nothing of pathlock's own conflict logic: it has its own
definition of overlapping paths and conflicting modes. Some of the tree test's
grants are detached leases with data, renewed (their data checked) and
released by their id through a second manager of the worker.

Workers are started with the "spawn" start method and build their own
PathLockManager inside the child: nothing (engines, connections) crosses a fork.

The tree test's CI size is 8 workers x 250 operations (2,000), the counter
test's 8 x 40 grants; ``pytest --soak`` runs the tree test at 8 x 12,500
(100,000). Sizes are also tunable through environment
variables: ``PATHLOCK_STRESS_OPS`` (operations per worker of the tree test),
``PATHLOCK_STRESS_COUNTER_OPS`` (grants per worker of the counter test),
``PATHLOCK_STRESS_WORKERS`` and ``PATHLOCK_STRESS_SEED`` (to replay a run).
"""

from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing
import os
import random
import secrets
import sys
import threading
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from pathlock import CustomerLocks, DetachedLease, Lease, LockTimeout, PathLockManager

WORKERS = int(os.environ.get("PATHLOCK_STRESS_WORKERS", "8"))
TREE_OPS = int(os.environ.get("PATHLOCK_STRESS_OPS", "250"))
SOAK_OPS = 12_500  # per worker with --soak: 100,000 operations in all
COUNTER_OPS = int(os.environ.get("PATHLOCK_STRESS_COUNTER_OPS", "40"))
SEED = int(os.environ.get("PATHLOCK_STRESS_SEED", str(secrets.randbelow(2**32))))

# A small tree, so requests collide often, with traps: "/ab" and "/a/b/c%" share
# a string prefix with "/a" and "/a/b/c" without being inside them; "_" and "%"
# are LIKE wildcards that must match only themselves.
TREE = (
    "/",
    "/a",
    "/a/b",
    "/a/b/c",
    "/a/b/c%",
    "/a/b/d",
    "/a/e",
    "/a_b",
    "/a_b/c",
    "/ab",
    "/x",
    "/x/y",
    "/x/y/z",
)
# Operations of the tree test that take a detached lease (released by its id
# through another manager of the worker) instead of an ordinary one.
DETACHED_SHARE = 0.15
# Paths of the tree test's requests locked at depth 0 (shallow=).
SHALLOW_SHARE = 0.3
COUNTER_PATH = "/counter"
START_TIMEOUT = 120.0  # seconds for every spawned worker to import and connect
JOIN_TIMEOUT = 420.0  # seconds for the workers to finish, within the test's timeout
SOAK_JOIN_TIMEOUT = 3000.0
# A blocking grant slower than this waited at least once (an attempt takes a few
# milliseconds; a waiter's first check comes 2 ms after its first denial).
WAITED = 0.05


# -- the independent checker ---------------------------------------------------------


def _inside(path: str, ancestor: str) -> bool:
    """Whether ``path`` lies strictly inside ``ancestor`` (the root contains
    everything else)."""
    return path != ancestor and (ancestor == "/" or path.startswith(ancestor + "/"))


def paths_overlap(
    first: str, second: str, first_shallow: bool = False, second_shallow: bool = False
) -> bool:
    """Equal, or one lies inside the other and the other's lock covers its
    subtree (a lock at depth 0 covers its path alone)."""
    if first == second:
        return True
    return (_inside(second, first) and not first_shallow) or (
        _inside(first, second) and not second_shallow
    )


def modes_conflict(first: str, second: str) -> bool:
    return not (first == "shared" and second == "shared")


Atom = tuple[str, str, bool]  # path, mode, at depth 0


def atoms_conflict(first: Atom, second: Atom) -> bool:
    return modes_conflict(first[1], second[1]) and paths_overlap(
        first[0], second[0], first[2], second[2]
    )


@dataclass(frozen=True, slots=True)
class Hold:
    """One grant as a worker saw it."""

    t_start: float
    t_end: float
    worker: int
    lease_id: str
    token: int
    # As requested: (path, mode, at depth 0), duplicates allowed.
    paths: tuple[Atom, ...]

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Hold:
        return cls(
            t_start=record["t_start"],
            t_end=record["t_end"],
            worker=record["worker"],
            lease_id=record["lease_id"],
            token=record["token"],
            paths=tuple((path, mode, depth == [0]) for path, mode, *depth in record["paths"]),
        )

    def describe(self) -> str:
        paths = ", ".join(
            f"{path} ({mode}{', depth 0' if shallow else ''})" for path, mode, shallow in self.paths
        )
        return (
            f"worker {self.worker} lease {self.lease_id} token {self.token} "
            f"[{self.t_start:.6f}, {self.t_end:.6f}] {paths}"
        )


def holds_conflict(first: Hold, second: Hold) -> bool:
    return any(atoms_conflict(a, b) for a in first.paths for b in second.paths)


def overlapping_conflicts(holds: Sequence[Hold]) -> list[tuple[Hold, Hold]]:
    """Pairs of conflicting holds of different leases whose intervals overlap."""
    ordered = sorted(holds, key=lambda hold: hold.t_start)
    found = []
    for index, first in enumerate(ordered):
        for second in ordered[index + 1 :]:
            if second.t_start >= first.t_end:
                break  # sorted by start: no later hold can overlap ``first``
            if second.lease_id != first.lease_id and holds_conflict(first, second):
                found.append((first, second))
    return found


def token_order_violations(holds: Sequence[Hold]) -> list[tuple[Hold, Hold]]:
    """Conflicting pairs where the later grant (by t_start) has the smaller or
    equal token. Pairs overlapping in time are reported by the overlap check."""
    atoms = {atom for hold in holds for atom in hold.paths}
    rivals = {atom: [other for other in atoms if atoms_conflict(atom, other)] for atom in atoms}
    # For each atom: the earlier hold with the largest token containing it.
    best: dict[Atom, Hold] = {}
    found = []
    for hold in sorted(holds, key=lambda hold: hold.t_start):
        earlier = [best[other] for atom in hold.paths for other in rivals[atom] if other in best]
        if earlier:
            top = max(earlier, key=lambda other: other.token)
            if top.token >= hold.token and top.t_end <= hold.t_start:
                found.append((top, hold))
        for atom in hold.paths:
            if atom not in best or best[atom].token < hold.token:
                best[atom] = hold
    return found


def test_checker_sees_conflicts() -> None:
    """The checker itself: overlap, prefix and wildcard traps, modes, tokens."""
    assert paths_overlap("/", "/x/y")
    assert paths_overlap("/a", "/a/b/c")
    assert paths_overlap("/a/b", "/a/b")
    assert not paths_overlap("/a", "/ab")
    assert not paths_overlap("/a/b/c", "/a/b/c%")
    assert not paths_overlap("/a/b", "/a_b")
    assert not atoms_conflict(("/a", "shared", False), ("/a/b", "shared", False))
    assert atoms_conflict(("/a", "shared", False), ("/a/b", "exclusive", False))
    # Depth 0: the path alone.
    assert not paths_overlap("/a", "/a/b", first_shallow=True)
    assert paths_overlap("/a", "/a/b", second_shallow=True)
    assert not paths_overlap("/", "/x", first_shallow=True)
    assert paths_overlap("/a", "/a", True, True)
    assert atoms_conflict(("/a", "shared", True), ("/a", "exclusive", False))
    assert not atoms_conflict(("/a/b", "exclusive", False), ("/a", "exclusive", True))

    def hold(start: float, end: float, token: int, *paths: Atom) -> Hold:
        return Hold(start, end, 0, f"lease-{token}", token, paths)

    first = hold(0.0, 2.0, 1, ("/a", "exclusive", False))
    overlapping = hold(1.0, 3.0, 2, ("/a/b", "shared", False))
    sibling = hold(1.0, 3.0, 3, ("/ab", "exclusive", False))
    assert overlapping_conflicts([first, overlapping, sibling]) == [(first, overlapping)]
    shallow = hold(0.0, 2.0, 4, ("/a", "exclusive", True))
    assert overlapping_conflicts([shallow, overlapping]) == []
    stale = hold(4.0, 5.0, 1, ("/a/b", "exclusive", False))
    newer = hold(0.0, 1.0, 7, ("/", "shared", False))
    assert token_order_violations([newer, stale]) == [(newer, stale)]
    later = hold(3.0, 4.0, 9, ("/a/e", "shared", False))
    assert token_order_violations([first, later]) == []


# -- running workers -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """What one spawned worker needs (picklable: no engine, no connection)."""

    database_url: str
    customer_id: int
    index: int
    operations: int  # operations (tree test) or grants (counter test)
    out_dir: Path
    seed: int = 0
    counter_file: Path | None = None


def _start_worker(spec: WorkerSpec) -> None:
    """Per-process setup: warnings are errors (as in the parent), WARNING logs
    of the library go to a file the test summarises."""
    warnings.simplefilter("error")
    logging.basicConfig(
        filename=spec.out_dir / f"worker-{spec.index}.log",
        level=logging.WARNING,
        format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s",
    )


def _manager(spec: WorkerSpec) -> PathLockManager:
    # Built in the child: engines and connections never cross a process boundary.
    return PathLockManager(spec.database_url, node_id=f"stress-{spec.index}", ttl=60)


def _record_failure(spec: WorkerSpec, barrier: Barrier) -> None:
    """Leave the traceback for the parent, and free workers still waiting at
    the start line instead of letting them wait out START_TIMEOUT."""
    error_file = spec.out_dir / f"worker-{spec.index}.error"
    error_file.write_text(traceback.format_exc(), encoding="utf-8")
    barrier.abort()


def _write_results(spec: WorkerSpec, records: list[dict[str, Any]], stats: Counter[str]) -> None:
    lines = [json.dumps({"summary": dict(stats)})] + [json.dumps(record) for record in records]
    results = spec.out_dir / f"worker-{spec.index}.jsonl"
    results.write_text("\n".join(lines) + "\n", encoding="utf-8")


def run_workers(
    target: Callable[[WorkerSpec, Barrier], None],
    specs: Sequence[WorkerSpec],
    out_dir: Path,
    join_timeout: float = JOIN_TIMEOUT,
) -> float:
    """Run ``target(spec, barrier)`` in one spawned process per spec; fail the
    test with every worker's traceback if any failed. Returns the seconds the
    workers ran after the start barrier."""
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(len(specs) + 1)
    processes = [
        context.Process(
            target=target, args=(spec, barrier), name=f"stress-{spec.index}", daemon=True
        )
        for spec in specs
    ]
    try:
        for process in processes:
            process.start()
        with contextlib.suppress(threading.BrokenBarrierError):
            barrier.wait(START_TIMEOUT)  # broken: a worker failed; its traceback follows
        started = time.monotonic()
        deadline = started + join_timeout
        for process in processes:
            process.join(max(0.0, deadline - time.monotonic()))
        elapsed = time.monotonic() - started
        hung = [process.name for process in processes if process.is_alive()]
        failed = [process.name for process in processes if process.exitcode not in (0, None)]
    finally:
        for process in processes:
            if process.is_alive():
                process.terminate()
            process.join()
    errors = [path.read_text(encoding="utf-8") for path in sorted(out_dir.glob("*.error"))]
    # Workers that only saw the start barrier break come after the one that broke it.
    errors.sort(key=lambda error: "BrokenBarrierError" in error)
    if errors or hung or failed:
        pytest.fail(
            f"workers failed: {failed}, hung: {hung}\n\n" + "\n\n".join(errors),
            pytrace=False,
        )
    for process in processes:
        process.close()
    return elapsed


def read_results(out_dir: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every worker's summary and every grant record."""
    summaries, records = [], []
    for path in sorted(out_dir.glob("worker-*.jsonl")):
        with path.open(encoding="utf-8") as lines:
            for line in lines:
                item = json.loads(line)
                if "summary" in item:
                    summaries.append(item["summary"])
                else:
                    records.append(item)
    return summaries, records


def logged_warnings(out_dir: Path) -> list[str]:
    lines = []
    for path in sorted(out_dir.glob("worker-*.log")):
        lines.extend(path.read_text(encoding="utf-8").splitlines())
    return lines


def summarize_warnings(lines: Sequence[str]) -> Counter[str]:
    """Count logged warnings by kind: the message up to "(attempt", so the
    retries of different attempts group together."""
    kinds: Counter[str] = Counter()
    for line in lines:
        _, _, message = line.partition(" WARNING ")
        kinds[message.split("(attempt", 1)[0].strip()[:80]] += 1
    return kinds


def remaining_rows(raw_engine: Engine, customer_id: int) -> int:
    """Lock rows and queue rows (and their paths) of the customer still in
    the tables."""
    count = 0
    with raw_engine.connect() as connection:
        for table in ("path_locks", "path_lock_waiters", "path_lock_waiter_paths"):
            count += connection.execute(
                text(f"SELECT COUNT(*) FROM {table} WHERE customer_id = :c"), {"c": customer_id}
            ).scalar_one()
        connection.rollback()
    return int(count)


def describe_rows(
    raw_engine: Engine, customer_id: int, outcomes: dict[str, str] | None = None
) -> str:
    """The customer's lock and queue rows, one per line, for a failure
    message: whose they are and when they were written and expire; with
    ``outcomes`` (by the request's reason), how its request ended, as its
    caller saw it."""
    lines = []
    with raw_engine.connect() as connection:
        for table, what in (("path_locks", "path, mode"), ("path_lock_waiters", "paths")):
            rows = connection.execute(
                text(
                    f"SELECT lease_id, {what}, node_id, pid, thread, owner_key, reason,"
                    f" created_at, expires_at FROM {table} WHERE customer_id = :c"
                ),
                {"c": customer_id},
            )
            for row in rows:
                line = f"  {table}: {tuple(row)}"
                if outcomes is not None:
                    line += f", its request ended as {outcomes.get(row.reason, '?')!r}"
                lines.append(line)
        connection.rollback()
    return "rows left behind:\n" + "\n".join(lines)


def assert_safe(holds: Sequence[Hold]) -> None:
    """No double grant, unique tokens, tokens increase along conflicting grants."""
    doubles = overlapping_conflicts(holds)
    assert not doubles, "conflicting holds overlapped in time:\n" + "\n".join(
        f"  {first.describe()}\n  {second.describe()}\n" for first, second in doubles[:10]
    )
    tokens = Counter(hold.token for hold in holds)
    repeated = {token: count for token, count in tokens.items() if count > 1}
    assert not repeated, f"fencing tokens handed out more than once: {repeated}"
    disorder = token_order_violations(holds)
    assert not disorder, "a later conflicting grant got a smaller token:\n" + "\n".join(
        f"  {first.describe()}\n  {second.describe()}\n" for first, second in disorder[:10]
    )


# -- test 1: random requests on a small tree --------------------------------------------


def _effective(paths: Iterable[tuple[str, str]]) -> list[list[str]]:
    """What the lease should hold: each path once, exclusive if asked both ways."""
    modes: dict[str, str] = {}
    for path, mode in paths:
        if modes.get(path) != "exclusive":
            modes[path] = mode
    return [[path, modes[path]] for path in sorted(modes)]


def _random_request(rng: random.Random) -> tuple[list[str], list[str]]:
    exclusive: list[str] = []
    shared: list[str] = []
    for path in rng.choices(TREE, k=rng.randint(1, 3)):  # repeats and overlaps allowed
        (exclusive if rng.random() < 0.5 else shared).append(path)
    return exclusive, shared


def _random_depths(rng: random.Random, exclusive: list[str], shared: list[str]) -> list[str]:
    """The paths of a request to lock at depth 0: some of those it names,
    and now and then one it names only there (locked exclusive)."""
    shallow = [path for path in exclusive + shared if rng.random() < SHALLOW_SHARE]
    if rng.random() < 0.1:
        shallow.append(rng.choice(TREE))
    return shallow


def _effective_request(
    exclusive: Sequence[str], shared: Sequence[str], shallow: Sequence[str]
) -> list[list[str]]:
    """:func:`_effective` of a request with paths at depth 0 (those only
    there are exclusive)."""
    return _effective(
        [(p, "exclusive") for p in exclusive]
        + [(p, "shared") for p in shared]
        + [(p, "exclusive") for p in shallow if p not in exclusive and p not in shared]
    )


def _hold_briefly(rng: random.Random) -> None:
    if rng.random() < 0.25:
        return
    time.sleep(rng.uniform(0.0, 0.003))


def hold_record(
    lease: Lease | DetachedLease,
    worker: int,
    t_start: float,
    t_end: float,
    exclusive: Sequence[str],
    shared: Sequence[str],
    shallow: Sequence[str] = (),
) -> dict[str, Any]:
    """What the checker needs of one hold (see :meth:`Hold.from_record`):
    its paths as requested, ``[path, mode, 0]`` for those at depth 0."""
    depth_0 = set(shallow)
    only_shallow = [path for path in shallow if path not in exclusive and path not in shared]
    atoms = [(path, "exclusive") for path in [*exclusive, *only_shallow]]
    atoms += [(path, "shared") for path in shared]
    return {
        "t_start": t_start,
        "t_end": t_end,
        "worker": worker,
        "lease_id": lease.lease_id,
        "token": lease.fencing_token,
        "paths": [[path, mode, 0] if path in depth_0 else [path, mode] for path, mode in atoms],
    }


def _detached_operation(
    locks: CustomerLocks, other: CustomerLocks, rng: random.Random, index: int, stats: Counter[str]
) -> dict[str, Any] | None:
    """A detached lease taken through ``locks`` and renewed and released by
    its id through ``other``, another manager."""
    exclusive, shared = _random_request(rng)
    shallow = _random_depths(rng, exclusive, shared)
    data = f"worker {index}, request {rng.random()}"
    lease: DetachedLease | None
    if rng.random() < 0.3:
        try:
            lease = locks.lock_detached(
                *exclusive,
                shared=shared,
                shallow=shallow,
                ttl=60,
                timeout=rng.uniform(5, 20),
                data=data,
            )
        except LockTimeout:
            stats["timeouts"] += 1
            return None
    else:
        lease = locks.try_lock_detached(
            *exclusive, shared=shared, shallow=shallow, ttl=60, data=data
        )
        if lease is None:
            stats["try_none"] += 1
            return None
    t_start = time.monotonic()
    if rng.random() < 0.3 and other.renew_detached(lease.lease_id, ttl=60).data != data:
        raise AssertionError(f"{lease!r} lost its data")
    _hold_briefly(rng)
    t_end = time.monotonic()
    if other.release_detached(lease.lease_id) != len(lease.paths):
        raise AssertionError(f"{lease!r} was not held until its release")
    stats["grants"] += 1
    stats["detached"] += 1
    stats["shallow"] += bool(shallow)
    return {
        **hold_record(lease, index, t_start, t_end, exclusive, shared, shallow),
        "held": [list(pair) for pair in lease.paths],
        "expected": _effective_request(exclusive, shared, shallow),
        "held_shallow": sorted(lease.shallow),
        "expected_shallow": sorted(set(shallow)),
    }


def _one_operation(
    locks: CustomerLocks, rng: random.Random, index: int, stats: Counter[str]
) -> dict[str, Any] | None:
    exclusive, shared = _random_request(rng)
    shallow = _random_depths(rng, exclusive, shared)
    blocking = rng.random() < 0.3
    asked = time.monotonic()
    lease: Lease | None
    if blocking:
        try:
            lease = locks.lock_paths(
                *exclusive, shared=shared, shallow=shallow, timeout=rng.uniform(5, 20)
            )
        except LockTimeout:
            stats["timeouts"] += 1
            return None
    else:
        lease = locks.try_lock_paths(*exclusive, shared=shared, shallow=shallow)
        if lease is None:
            stats["try_none"] += 1
            return None
    t_start = time.monotonic()
    if blocking:
        stats["blocking_waited" if t_start - asked > WAITED else "blocking_at_once"] += 1
    by_with = rng.random() < 0.2
    if by_with:
        with lease:
            _hold_briefly(rng)
            t_end = time.monotonic()
    else:
        _hold_briefly(rng)
        t_end = time.monotonic()
        lease.release()
    if lease.lost or not lease.released:
        raise AssertionError(f"{lease!r} was not cleanly released (lost={lease.lost})")
    stats["grants"] += 1
    stats["shallow"] += bool(shallow)
    return {
        **hold_record(lease, index, t_start, t_end, exclusive, shared, shallow),
        "held": [list(pair) for pair in lease.paths],
        "expected": _effective_request(exclusive, shared, shallow),
        "held_shallow": sorted(lease.shallow),
        "expected_shallow": sorted(set(shallow)),
    }


def tree_worker(spec: WorkerSpec, barrier: Barrier) -> None:
    """Spawned: random requests on TREE, records every grant."""
    _start_worker(spec)
    try:
        rng = random.Random(spec.seed * 1000 + spec.index)
        stats: Counter[str] = Counter()
        records = []
        with _manager(spec) as manager, _manager(spec) as second:
            locks = manager.for_customer(spec.customer_id)
            other = second.for_customer(spec.customer_id)
            locks.list_locks()  # connect before the start line
            other.list_locks()
            barrier.wait(START_TIMEOUT)
            for _ in range(spec.operations):
                if rng.random() < DETACHED_SHARE:
                    record = _detached_operation(locks, other, rng, spec.index, stats)
                else:
                    record = _one_operation(locks, rng, spec.index, stats)
                if record is not None:
                    records.append(record)
        _write_results(spec, records, stats)
    except BaseException:
        _record_failure(spec, barrier)
        raise


@pytest.fixture
def tree_ops(request: pytest.FixtureRequest) -> int:
    """Operations per worker: the CI size, or the soak size with --soak."""
    soak = bool(request.config.getoption("--soak"))
    return SOAK_OPS if soak and "PATHLOCK_STRESS_OPS" not in os.environ else TREE_OPS


@pytest.mark.stress
@pytest.mark.timeout(JOIN_TIMEOUT + 120)
def test_no_conflicting_holds_overlap(
    database_url: str, raw_engine: Engine, customer_id: int, tmp_path: Path, tree_ops: int
) -> None:
    specs = [
        WorkerSpec(database_url, customer_id, i, tree_ops, tmp_path, seed=SEED)
        for i in range(WORKERS)
    ]
    join_timeout = SOAK_JOIN_TIMEOUT if tree_ops > TREE_OPS else JOIN_TIMEOUT
    elapsed = run_workers(tree_worker, specs, tmp_path, join_timeout)
    summaries, records = read_results(tmp_path)
    totals: Counter[str] = Counter()
    for summary in summaries:
        totals.update(summary)
    warned = logged_warnings(tmp_path)
    print(
        f"\nstress seed={SEED} workers={WORKERS} ops/worker={tree_ops} {elapsed:.1f} s: "
        f"{dict(totals)}; logged warnings: {dict(summarize_warnings(warned))}",
        file=sys.stderr,
    )

    assert len(summaries) == WORKERS
    assert totals["grants"] == len(records)
    mismatched = [
        r
        for r in records
        if r["held"] != r["expected"] or r["held_shallow"] != r["expected_shallow"]
    ]
    assert not mismatched, f"leases hold other paths than requested: {mismatched[:5]}"
    assert_safe([Hold.from_record(record) for record in records])
    assert remaining_rows(raw_engine, customer_id) == 0, describe_rows(raw_engine, customer_id)

    # The run must have meant something: enough grants (a third of the
    # operations are granted, and a quarter at least), and real contention.
    assert len(records) >= min(1000, WORKERS * tree_ops // 4)
    assert totals["try_none"] + totals["blocking_waited"] + totals["timeouts"] > 0
    assert totals["detached"] > 0
    assert totals["shallow"] > 0
    if tree_ops >= 100:  # tiny runs may by chance never wait
        assert totals["try_none"] > 0
        assert totals["blocking_waited"] > 0


# -- test 2: a shared counter behind one exclusive path ------------------------------------


def counter_worker(spec: WorkerSpec, barrier: Barrier) -> None:
    """Spawned: read-sleep-write a counter file under an exclusive lock; a
    double grant shows up as a lost update."""
    _start_worker(spec)
    try:
        counter_file = spec.counter_file
        assert counter_file is not None, "counter_worker needs spec.counter_file"
        stats: Counter[str] = Counter()
        records = []
        with _manager(spec) as manager:
            locks = manager.for_customer(spec.customer_id)
            locks.list_locks()
            barrier.wait(START_TIMEOUT)
            while stats["grants"] < spec.operations:
                try:
                    lease = locks.lock_paths(COUNTER_PATH, timeout=30)
                except LockTimeout:
                    stats["timeouts"] += 1
                    continue
                t_start = time.monotonic()
                value = int(counter_file.read_text(encoding="utf-8"))
                time.sleep(0.001)
                counter_file.write_text(str(value + 1), encoding="utf-8")
                t_end = time.monotonic()
                lease.release()
                stats["grants"] += 1
                records.append(
                    {
                        "t_start": t_start,
                        "t_end": t_end,
                        "worker": spec.index,
                        "lease_id": lease.lease_id,
                        "token": lease.fencing_token,
                        "paths": [[COUNTER_PATH, "exclusive"]],
                    }
                )
        _write_results(spec, records, stats)
    except BaseException:
        _record_failure(spec, barrier)
        raise


@pytest.mark.stress
@pytest.mark.timeout(JOIN_TIMEOUT + 120)
def test_counter_has_no_lost_updates(
    database_url: str, raw_engine: Engine, customer_id: int, tmp_path: Path
) -> None:
    counter_file = tmp_path / "counter"
    counter_file.write_text("0", encoding="utf-8")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    specs = [
        WorkerSpec(database_url, customer_id, i, COUNTER_OPS, out_dir, counter_file=counter_file)
        for i in range(WORKERS)
    ]
    elapsed = run_workers(counter_worker, specs, out_dir)
    summaries, records = read_results(out_dir)
    totals: Counter[str] = Counter()
    for summary in summaries:
        totals.update(summary)
    print(
        f"\ncounter workers={WORKERS} grants/worker={COUNTER_OPS} {elapsed:.1f} s: "
        f"{dict(totals)}; logged warnings: "
        f"{dict(summarize_warnings(logged_warnings(out_dir)))}",
        file=sys.stderr,
    )

    assert totals["grants"] == WORKERS * COUNTER_OPS == len(records)
    assert int(counter_file.read_text(encoding="utf-8")) == totals["grants"]
    assert_safe([Hold.from_record(record) for record in records])
    assert remaining_rows(raw_engine, customer_id) == 0, describe_rows(raw_engine, customer_id)
