"""The stress workload as app servers run it, judged by the independent checker
of ``test_stress.py`` (issue "Safe wherever Python file servers run").

Each spawned worker builds a manager, uses it, takes a lease of its own and
then forks children (as gunicorn forks its workers after the app is loaded).
Each child keeps using the manager it inherited, from its main thread and from
a thread pool whose threads are reused across requests, some requests under a
named owner, the others as their thread. Into the main thread's requests a
timer fires ``KeyboardInterrupt`` at random moments: inside the grant, its
COMMIT, the release, or between them.

The checker sees every hold a caller got (hold intervals on CLOCK_MONOTONIC,
as in ``test_stress.py``): no two conflicting holds may overlap and fencing
tokens must increase along conflicting grants. After every process has closed
its manager, no lock or queue row may be left. The parent's own lease (of
another customer) must
survive its children (they cannot release or renew it), and in the children it
counts as lost.

Sizes: ``PATHLOCK_HOSTILE_WORKERS`` (spawned workers, 2 children each) and
``PATHLOCK_HOSTILE_OPS`` (requests per thread); ``PATHLOCK_STRESS_SEED``
replays a run.
"""

from __future__ import annotations

import faulthandler
import json
import os
import random
import signal
import sys
import threading
import time
import traceback
import warnings
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.synchronize import Barrier
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from sqlalchemy import Engine

from pathlock import CustomerLocks, Lease, LeaseLost, LockTimeout, PathLockManager
from tests.integration.test_stress import (
    SEED,
    START_TIMEOUT,
    Hold,
    WorkerSpec,
    _random_request,
    _record_failure,
    _start_worker,
    assert_safe,
    describe_rows,
    hold_record,
    read_results,
    remaining_rows,
    run_workers,
)

WORKERS = int(os.environ.get("PATHLOCK_HOSTILE_WORKERS", "2"))
OPS = int(os.environ.get("PATHLOCK_HOSTILE_OPS", "60"))
CHILDREN = 2  # forked by each worker
POOL_THREADS = 3  # per child, besides its main thread
INTERRUPT_WITHIN = 0.006  # seconds: the timer fires this long after a request begins, at most
CHILD_TIMEOUT = float(os.environ.get("PATHLOCK_HOSTILE_CHILD_TIMEOUT", "300"))


class _Interrupts:
    """SIGALRM raises KeyboardInterrupt in the main thread, but only while
    armed: disarming is one assignment, after which nothing is raised."""

    def __init__(self) -> None:
        self.armed = False
        self.fired = 0
        signal.signal(signal.SIGALRM, self._handler)

    def _handler(self, _signum: int, _frame: FrameType | None) -> None:
        if self.armed:
            self.armed = False
            self.fired += 1
            raise KeyboardInterrupt

    def arm(self, rng: random.Random) -> None:
        self.armed = True
        signal.setitimer(signal.ITIMER_REAL, rng.uniform(0.0001, INTERRUPT_WITHIN))

    def disarm(self) -> None:
        self.armed = False
        signal.setitimer(signal.ITIMER_REAL, 0)


def _grant(
    locks: CustomerLocks,
    rng: random.Random,
    exclusive: list[str],
    shared: list[str],
    owner: str | None,
    stats: Counter[str],
) -> Lease | None:
    if rng.random() < 0.3:
        try:
            return locks.lock_paths(
                *exclusive, shared=shared, timeout=rng.uniform(5, 20), owner=owner
            )
        except LockTimeout:
            stats["timeouts"] += 1
            return None
    lease = locks.try_lock_paths(*exclusive, shared=shared, owner=owner)
    if lease is None:
        stats["try_none"] += 1
    return lease


def _request(
    locks: CustomerLocks,
    rng: random.Random,
    worker: int,
    owner: str | None,
    stats: Counter[str],
    interrupts: _Interrupts | None = None,
) -> dict[str, Any] | None:
    """One request: a grant (blocking or a try), a brief hold, a release; the
    hold as the caller saw it, if it got one. With ``interrupts``, a
    KeyboardInterrupt may arrive anywhere in between; whatever it interrupted
    is finished without interrupts afterwards, as a program that catches
    Ctrl-C would."""
    exclusive, shared = _random_request(rng)
    lease: Lease | None = None
    t_start = t_end = None
    try:
        try:
            if interrupts is not None:
                interrupts.arm(rng)
            lease = _grant(locks, rng, exclusive, shared, owner, stats)
            if lease is None:
                return None
            t_start = time.monotonic()
            time.sleep(rng.uniform(0.0, 0.003))
            t_end = time.monotonic()
            lease.release()
        finally:
            if interrupts is not None:
                interrupts.disarm()
    except KeyboardInterrupt:  # fires once per arm(), so not in here
        stats["interrupted"] += 1
    if lease is not None and t_start is not None and t_end is None:
        t_end = time.monotonic()  # interrupted while holding: the release follows
    if lease is not None:
        lease.release()  # again, if the first one was interrupted: it finishes it
        if not lease.released or lease.lost:
            raise AssertionError(f"{lease!r} was not cleanly released (lost={lease.lost})")
    # A grant that returned just as the interrupt came, before the caller saw
    # it, belongs to the owner all the same: release it (not recorded: its
    # hold interval is unknown).
    if interrupts is not None and owner is not None:
        stats["released_unseen"] += bool(locks.release_locks(owner=owner))
    if lease is None or t_start is None or t_end is None:
        return None
    stats["grants"] += 1
    return hold_record(lease, worker, t_start, t_end, exclusive, shared)


def _child(spec: WorkerSpec, child: int, manager: PathLockManager, inherited: Lease) -> None:
    """A forked child: the inherited manager from its main thread (with
    interrupts) and from a thread pool (some requests under named owners)."""
    stats: Counter[str] = Counter()
    records: list[dict[str, Any]] = []
    records_lock = threading.Lock()
    base = spec.index * 100 + child * 10
    if not inherited.lost:
        raise AssertionError("a lease inherited over fork() must count as lost in the child")
    try:
        inherited.ensure_held()
    except LeaseLost:
        stats["inherited_lost"] += 1
    locks = manager.for_customer(spec.customer_id)

    def pool_thread(number: int) -> None:
        rng = random.Random(f"{spec.seed}-{base}-{number}")
        own: Counter[str] = Counter()
        for index in range(OPS):
            owner = f"req-{base}-{number}-{index}" if rng.random() < 0.5 else None
            record = _request(locks, rng, base + number, owner, own)
            if record is not None:
                with records_lock:
                    records.append(record)
        with records_lock:
            stats.update(own)

    with ThreadPoolExecutor(POOL_THREADS) as pool:
        # More tasks than threads: each thread serves several in turn.
        futures = [pool.submit(pool_thread, number) for number in range(1, 2 * POOL_THREADS + 1)]
        interrupts = _Interrupts()
        rng = random.Random(f"{spec.seed}-{base}-main")
        main: Counter[str] = Counter()
        for index in range(OPS):
            record = _request(locks, rng, base, f"main-{base}-{index}", main, interrupts)
            if record is not None:
                with records_lock:
                    records.append(record)
        for future in futures:
            future.result()
    stats.update(main)
    stats["fired"] = interrupts.fired
    manager.close()
    lines = [json.dumps({"summary": dict(stats)})] + [json.dumps(record) for record in records]
    path = spec.out_dir / f"worker-{spec.index}-{child}.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _wait_for(children: list[int]) -> None:
    deadline = time.monotonic() + CHILD_TIMEOUT
    for pid in children:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGUSR1)  # its threads' stacks, into its .stacks file
                time.sleep(1)
                os.kill(pid, signal.SIGKILL)
                raise AssertionError(f"child {pid} did not finish in time")
            time.sleep(0.05)
        if os.waitstatus_to_exitcode(status) != 0:
            raise AssertionError(f"child {pid} failed: status {status}")


def hostile_worker(spec: WorkerSpec, barrier: Barrier) -> None:
    """Spawned: use a manager, hold a lease, fork the children, wait for
    them, check the lease survived them."""
    _start_worker(spec)
    try:
        manager = PathLockManager(spec.database_url, node_id=f"hostile-{spec.index}", ttl=60)
        manager.for_customer(spec.customer_id).list_locks()
        # Of another customer: under "/" of the workload, it would block it.
        own = manager.for_customer(spec.customer_id + 1).lock_paths(
            f"/parents/{spec.index}", reason="held across fork()"
        )
        barrier.wait(START_TIMEOUT)
        children = []
        for child in range(CHILDREN):
            with warnings.catch_warnings():  # fork() with threads running: on purpose
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
            if pid == 0:
                code = 0
                stacks = (spec.out_dir / f"worker-{spec.index}-{child}.stacks").open("w")
                faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
                try:
                    _child(spec, child, manager, own)
                except BaseException:  # noqa: BLE001 - reported to the parent
                    error = spec.out_dir / f"worker-{spec.index}-{child}.error"
                    error.write_text(traceback.format_exc(), encoding="utf-8")
                    code = 1
                finally:
                    os._exit(code)
            children.append(pid)
        _wait_for(children)
        own.ensure_held(verify=True)  # the children neither released nor stopped renewing it
        own.release()
        manager.close()
    except BaseException:
        _record_failure(spec, barrier)
        raise


@pytest.mark.stress
@pytest.mark.timeout(CHILD_TIMEOUT + 200)
def test_forked_pooled_and_interrupted_workers_never_overlap(
    database_url: str, raw_engine: Engine, customer_id: int, tmp_path: Path
) -> None:
    specs = [
        WorkerSpec(database_url, customer_id, index, OPS, tmp_path, seed=SEED)
        for index in range(WORKERS)
    ]
    elapsed = run_workers(hostile_worker, specs, tmp_path, CHILD_TIMEOUT + 60)
    summaries, records = read_results(tmp_path)
    totals: Counter[str] = Counter()
    for summary in summaries:
        totals.update(summary)
    print(
        f"\nhostile stress seed={SEED} workers={WORKERS}x{CHILDREN} forked children, "
        f"{1 + 2 * POOL_THREADS} request streams each, {OPS} requests per stream, "
        f"{elapsed:.1f} s: {dict(totals)}",
        file=sys.stderr,
    )
    assert len(summaries) == WORKERS * CHILDREN
    assert totals["inherited_lost"] == WORKERS * CHILDREN
    assert totals["grants"] == len(records)
    assert_safe([Hold.from_record(record) for record in records])
    assert remaining_rows(raw_engine, customer_id) == 0, describe_rows(raw_engine, customer_id)
    # The run meant something: grants and contention, and interrupts that
    # landed inside requests.
    assert len(records) >= WORKERS * CHILDREN * OPS
    assert totals["try_none"] > 0
    assert totals["interrupted"] >= WORKERS * CHILDREN * OPS // 10
