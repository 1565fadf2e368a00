"""How many database connections do threads that lock at once take?

Runs ``--threads`` threads that lock and release paths of one customer (or
more) for
``--seconds``, on a manager whose connection pool has ``--pool-size`` connections
(plus ``--max-overflow``), and prints the grants per second and the most
connections of the pool that were in use at the same time::

    python pool_sizing.py --threads 32 --pool-size 5 --database-url mysql+pymysql://app@db/test

By default every thread locks a path of its own (the paths do not conflict,
but the requests of one customer still take turns at the database);
``--same-path`` makes every thread lock the same path, so all but one wait;
``--customers N`` spreads the threads over N customers, which never wait for
each other.
Without ``--database-url`` it runs on the default database (``pathlock info``
says which). It creates pathlock's tables if they are missing and leaves
nothing locked behind it.
"""

from __future__ import annotations

import argparse
import random
import statistics
import threading
import time

from sqlalchemy import event

from pathlock import PathLockError, PathLockManager


class PoolWatch:
    """The number of connections checked out of an engine's pool, and its maximum."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.in_use = 0
        self.most = 0

    def checked_out(self, *_: object) -> None:
        with self._lock:
            self.in_use += 1
            self.most = max(self.most, self.in_use)

    def checked_in(self, *_: object) -> None:
        with self._lock:
            self.in_use -= 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", help="default: the default database")
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--pool-size", type=int, default=5)
    parser.add_argument("--max-overflow", type=int, default=0)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--same-path", action="store_true", help="every thread locks one path")
    parser.add_argument("--customers", type=int, default=1, help="spread the threads over N")
    args = parser.parse_args()

    manager = PathLockManager(
        args.database_url,
        node_id="pool-sizing",
        engine_options={"pool_size": args.pool_size, "max_overflow": args.max_overflow},
    )
    manager.create_schema()
    watch = PoolWatch()
    event.listen(manager.engine, "checkout", watch.checked_out)
    event.listen(manager.engine, "checkin", watch.checked_in)
    first = random.randrange(10**6, 10**9)  # noqa: S311 - customers of its own
    customers = [manager.for_customer(first + n) for n in range(args.customers)]
    waits: list[float] = []
    failures: list[str] = []
    ends = time.monotonic() + args.seconds

    def work(number: int) -> None:
        locks = customers[number % len(customers)]
        path = "/Shared/one" if args.same_path else f"/Shared/{number}"
        while time.monotonic() < ends:
            asked = time.monotonic()
            try:
                with locks.lock_paths(path, timeout=10):
                    waits.append(time.monotonic() - asked)
            except PathLockError as error:
                failures.append(type(error).__name__)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(args.threads)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - started
    manager.close()

    waits.sort()
    p99 = waits[int(len(waits) * 0.99)] if waits else 0.0
    print(  # noqa: T201 - the script's answer
        f"threads={args.threads:<3} customers={args.customers:<3} "
        f"pool={args.pool_size}+{args.max_overflow:<3} "
        f"{'same path' if args.same_path else 'own paths'}  "
        f"grants/s={len(waits) / elapsed:7.1f}  most connections in use={watch.most:<3} "
        f"wait p50={statistics.median(waits) * 1000 if waits else 0:6.1f} ms "
        f"p99={p99 * 1000:6.1f} ms  failed={len(failures)}"
        + (f" ({', '.join(sorted(set(failures)))})" if failures else "")
    )


if __name__ == "__main__":
    main()
