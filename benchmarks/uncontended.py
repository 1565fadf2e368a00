"""Uncontended acquire + release of one path, beside its floor.

The floor is two single-row durable commits on the same server over the same
driver (an INSERT and a DELETE, each committed, on a scratch table): the least a
lock that is written and then removed can cost. Both are measured in
alternating rounds in one run, so machine noise hits them alike; the figure
that matters is the ratio.

    python benchmarks/uncontended.py [--url URL] [--rounds N] [--per-round N]
"""

from __future__ import annotations

import argparse
import platform
import secrets
import statistics
import time
from collections.abc import Callable

import pymysql
import sqlalchemy
from sqlalchemy import Engine, create_engine, text

from pathlock import PathLockManager

SCRATCH = "pathlock_bench_floor"


def _timed(operation: Callable[[], None], count: int) -> list[float]:
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        operation()
        samples.append(time.perf_counter() - started)
    return samples


def _floor(engine: Engine) -> Callable[[], None]:
    def two_commits() -> None:
        with engine.connect() as connection:
            key = secrets.randbelow(2**62)
            connection.execute(text(f"INSERT INTO {SCRATCH} (id) VALUES (:k)"), {"k": key})
            connection.commit()
            connection.execute(text(f"DELETE FROM {SCRATCH} WHERE id = :k"), {"k": key})
            connection.commit()

    return two_commits


def _percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="mysql+pymysql://root@127.0.0.1:3306/test")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--per-round", type=int, default=200)
    args = parser.parse_args()

    engine = create_engine(args.url, isolation_level="READ COMMITTED")
    with engine.begin() as connection:
        connection.execute(text(f"CREATE TABLE IF NOT EXISTS {SCRATCH} (id BIGINT PRIMARY KEY)"))
    manager = PathLockManager(args.url, node_id="bench")
    manager.create_schema()
    locks = manager.for_customer(secrets.randbelow(2**62) + 1)

    def lock_and_release() -> None:
        locks.lock_paths("/Shared/bench/file.txt").release()

    floor_operation = _floor(engine)
    for operation in (floor_operation, lock_and_release):  # warm pools and caches
        _timed(operation, 50)
    floor: list[float] = []
    lock: list[float] = []
    for _ in range(args.rounds):
        floor += _timed(floor_operation, args.per_round)
        lock += _timed(lock_and_release, args.per_round)

    with engine.connect() as connection:
        server = connection.execute(text("SELECT VERSION()")).scalar_one()
        flush = connection.execute(text("SELECT @@innodb_flush_log_at_trx_commit")).scalar_one()
    with engine.begin() as connection:
        connection.execute(text(f"DROP TABLE {SCRATCH}"))
    manager.close()
    engine.dispose()

    print(
        f"python {platform.python_version()}, sqlalchemy {sqlalchemy.__version__}, "
        f"pymysql {pymysql.__version__}, server {server}, "
        f"innodb_flush_log_at_trx_commit={flush}, {len(lock)} samples each"
    )
    for name, samples in (("floor (2 commits)", floor), ("acquire+release", lock)):
        print(
            f"{name:>18}: p50 {_percentile(samples, 0.5) * 1000:6.3f} ms   "
            f"p99 {_percentile(samples, 0.99) * 1000:6.3f} ms   "
            f"mean {statistics.fmean(samples) * 1000:6.3f} ms"
        )
    print(
        f"{'ratio':>18}: p50 {_percentile(lock, 0.5) / _percentile(floor, 0.5):.2f}x   "
        f"p99 {_percentile(lock, 0.99) / _percentile(floor, 0.99):.2f}x"
    )


if __name__ == "__main__":
    main()
