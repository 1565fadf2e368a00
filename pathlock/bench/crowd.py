"""Many waiters on one customer: what a grant costs while hundreds wait.

    python -m pathlock.bench.crowd [--url URL] [--processes N[,N...]]
                                   [--waiters N[,N...]] [--grants N] [--api sync|asyncio]
                                   [--hold SECONDS] [--timeout SECONDS] [--profile]
                                   [--pool-size N --max-overflow N]

Each of ``--processes`` worker processes runs ``--waiters`` threads (or
asyncio tasks with ``--api asyncio``), each its own owner, on one customer,
until the run has made ``--grants`` grants in all (the same number at every
size, so the sizes compare). A request moves a folder of one of six
source/target pairs (both exclusive); one in 20 locks the pair's common
parent instead, one in 30 ``/Shared``; each is held ``--hold`` seconds.

Printed per size: grants per second, the wait's median and 99th percentile,
the client CPU per grant (all worker processes), requests that timed out,
leases lost, and the ratio of grants per second to the smallest size's in
the same run. ``--profile`` also prints the Python calls per grant of the
first worker process (cProfile's count, which does not depend on the
machine) and the functions called most often (with the environment
variable ``PATHLOCK_CROWD_FUNCTIONS=name,name``: the calls of those
functions instead; with ``PATHLOCK_CROWD_DUMP=FILE``: the profile is also
written to FILE, for :mod:`pstats`). ``--pool-size`` and
``--max-overflow`` size each process's connection pool (default: the
manager's own, see docs/DEPLOYING.md).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import multiprocessing
import os
import pstats
import random
import secrets
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from pathlock import AsyncPathLockManager, LockTimeout, PathLockManager
from pathlock.bench import DEFAULT_URL
from pathlock.bench.stats import median, percentile

PAIRS = 6


def _request(rng: random.Random) -> list[str]:
    pair = rng.randrange(PAIRS)
    draw = rng.random()
    if draw < 1 / 30:
        return ["/Shared"]
    if draw < 1 / 30 + 1 / 20:
        return [f"/Shared/pair{pair}"]
    return [f"/Shared/pair{pair}/source", f"/Shared/pair{pair}/target"]


@dataclass
class _Tally:
    """What one worker process measured."""

    grants: int = 0
    waits: list[float] = field(default_factory=list)
    timeouts: int = 0
    lost: int = 0
    cpu: float = 0.0
    calls: int = 0
    top: list[tuple[str, int]] = field(default_factory=list)


def _sync_worker(job: dict[str, Any]) -> _Tally:
    tally = _Tally()
    quota = [job["grants"]]
    guard = threading.Lock()
    manager = PathLockManager(
        job["url"], node_id=f"crowd-{job['index']}", engine_options=job["pool"]
    )
    locks = manager.for_customer(job["customer_id"])

    profiles: list[cProfile.Profile] = []

    def one(seed: int) -> None:
        if job["profile"]:
            profile = cProfile.Profile()
            profiles.append(profile)
            profile.enable()
        try:
            loop(seed)
        finally:
            if job["profile"]:
                profile.disable()

    def loop(seed: int) -> None:
        rng = random.Random(seed)  # noqa: S311 - a workload, not a secret
        while True:
            with guard:
                if quota[0] <= 0:
                    return
                quota[0] -= 1
            paths = _request(rng)
            asked = time.monotonic()
            try:
                lease = locks.lock_paths(*paths, timeout=job["timeout"])
            except LockTimeout:
                with guard:
                    tally.timeouts += 1
                continue
            waited = time.monotonic() - asked
            time.sleep(job["hold"])
            lease.release()
            with guard:
                tally.grants += 1
                tally.waits.append(waited)
                tally.lost += lease.lost

    _start_together(job["start_at"])
    started = time.process_time()
    threads = [
        threading.Thread(target=one, args=(job["index"] * 100_000 + n,))
        for n in range(job["waiters"])
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if profiles:
        _profiled(tally, *profiles)
    tally.cpu = time.process_time() - started
    manager.close()
    return tally


def _async_worker(job: dict[str, Any]) -> _Tally:
    return asyncio.run(_async_main(job))


async def _async_main(job: dict[str, Any]) -> _Tally:
    tally = _Tally()
    quota = [job["grants"]]
    manager = AsyncPathLockManager(
        job["url"], node_id=f"crowd-{job['index']}", engine_options=job["pool"]
    )
    locks = manager.for_customer(job["customer_id"])

    async def one(seed: int) -> None:
        rng = random.Random(seed)  # noqa: S311 - a workload, not a secret
        while quota[0] > 0:
            quota[0] -= 1
            paths = _request(rng)
            asked = time.monotonic()
            try:
                lease = await locks.lock_paths(*paths, timeout=job["timeout"])
            except LockTimeout:
                tally.timeouts += 1
                continue
            waited = time.monotonic() - asked
            await asyncio.sleep(job["hold"])
            await lease.release()
            tally.grants += 1
            tally.waits.append(waited)
            tally.lost += lease.lost

    _start_together(job["start_at"])
    profile = cProfile.Profile() if job["profile"] else None
    started = time.process_time()
    if profile is not None:
        profile.enable()
    await asyncio.gather(*(one(job["index"] * 100_000 + n) for n in range(job["waiters"])))
    if profile is not None:
        profile.disable()
        _profiled(tally, profile)
    tally.cpu = time.process_time() - started
    await manager.aclose()
    return tally


def _start_together(start_at: float) -> None:
    delay = start_at - time.time()
    if delay > 0:
        time.sleep(delay)


def _profiled(tally: _Tally, *profiles: cProfile.Profile) -> None:
    stats = pstats.Stats(*profiles)
    if os.environ.get("PATHLOCK_CROWD_DUMP"):
        stats.dump_stats(os.environ["PATHLOCK_CROWD_DUMP"])
    entries = stats.stats  # type: ignore[attr-defined]
    tally.calls = sum(entry[1] for entry in entries.values())
    most = sorted(entries.items(), key=lambda item: item[1][1], reverse=True)[:12]
    if os.environ.get("PATHLOCK_CROWD_FUNCTIONS"):
        wanted = os.environ["PATHLOCK_CROWD_FUNCTIONS"].split(",")
        most = [item for item in entries.items() if item[0][2] in wanted]
    tally.top = [(f"{name[2]} ({name[0].rsplit('/', 1)[-1]}:{name[1]})", e[1]) for name, e in most]


def _run(job: dict[str, Any], processes: int) -> tuple[float, list[_Tally]]:
    worker = _async_worker if job["api"] == "asyncio" else _sync_worker
    context = multiprocessing.get_context("spawn")
    jobs = []
    for index in range(processes):
        share = job["grants"] // processes + (index < job["grants"] % processes)
        jobs.append(
            {**job, "index": index, "grants": share, "profile": job["profile"] and not index}
        )
    with context.Pool(processes) as pool:
        start_at = time.time() + 2.0
        for each in jobs:
            each["start_at"] = start_at
        tallies = pool.map(worker, jobs)
    elapsed = time.time() - start_at
    return elapsed, tallies


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pathlock.bench.crowd", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--url", default=DEFAULT_URL)
    parser.add_argument("--processes", default="2")
    parser.add_argument("--waiters", default="4,100")
    parser.add_argument("--grants", type=int, default=800)
    parser.add_argument("--api", choices=("sync", "asyncio"), default="sync")
    parser.add_argument("--hold", type=float, default=0.002)
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--pool-size", type=int)
    parser.add_argument("--max-overflow", type=int)
    options = parser.parse_args(argv)
    sizes = (("pool_size", options.pool_size), ("max_overflow", options.max_overflow))
    pool = {name: value for name, value in sizes if value is not None}

    with PathLockManager(options.url) as manager:
        manager.create_schema()
    print(  # noqa: T201 - the benchmark's output
        f"{options.api}, {options.grants} grants, hold {options.hold * 1000:g} ms"
    )
    print(  # noqa: T201 - the benchmark's output
        "processes x waiters | grants/s | ratio | wait p50 | wait p99 | CPU/grant | timeouts | lost"
    )
    first: float | None = None
    for processes in [int(n) for n in options.processes.split(",")]:
        for waiters in [int(n) for n in options.waiters.split(",")]:
            job = {
                "url": options.url,
                "customer_id": secrets.randbelow(2**62) + 1,
                "waiters": waiters,
                "grants": options.grants,
                "api": options.api,
                "hold": options.hold,
                "timeout": options.timeout,
                "profile": options.profile,
                "pool": pool,
            }
            elapsed, tallies = _run(job, processes)
            grants = sum(t.grants for t in tallies)
            waits = [w for t in tallies for w in t.waits]
            rate = grants / elapsed
            first = rate if first is None else first
            cpu = sum(t.cpu for t in tallies) / max(grants, 1)
            print(  # noqa: T201 - the benchmark's output
                f"{processes} x {waiters} | {rate:.1f} | {rate / first:.2f}x"
                f" | {median(waits) * 1000:.0f} ms | {percentile(waits, 0.99) * 1000:.0f} ms"
                f" | {cpu * 1000:.2f} ms | {sum(t.timeouts for t in tallies)}"
                f" | {sum(t.lost for t in tallies)}",
                flush=True,
            )
            if options.profile:
                profiled = tallies[0]
                print(  # noqa: T201 - the benchmark's output
                    f"  calls per grant (process 0): {profiled.calls / max(profiled.grants, 1):.0f}"
                )
                for name, calls in profiled.top:
                    print(  # noqa: T201 - the benchmark's output
                        f"    {calls:>9} {name}"
                    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
