"""What held leases cost a manager: grants while thousands are held, and one
renewal round over many leases and customers.

    python -m pathlock.bench.heartbeat [--url URL] [--held N[,N...]] [--grants N]
                                       [--customers N[,N...]] [--rounds N]

Each figure is the median (:func:`pathlock.bench.stats.median`) of
``--rounds`` runs on a fresh customer (MySQL or MariaDB only: the embedded
SQLite file serializes every writer anyway). The ttl is long enough that no
renewal falls due while grants are timed, so the grants measure only what
registering a lease with the heartbeat costs.
"""

from __future__ import annotations

import argparse
import inspect
import secrets
import sys
import time

from pathlock import Lease, PathLockManager
from pathlock.bench import DEFAULT_URL
from pathlock.bench.stats import median

LONG_TTL = 600.0


def _grants(manager: PathLockManager, held: int, grants: int) -> float:
    """Seconds for ``grants`` lock + release pairs while ``held`` leases stay held."""
    locks = manager.for_customer(secrets.randbelow(2**62) + 1)
    kept = [locks.lock_paths(f"/held/{number}", ttl=LONG_TTL) for number in range(held)]
    try:
        started = time.perf_counter()
        for number in range(grants):
            locks.lock_paths(f"/busy/{number % 10}", ttl=LONG_TTL).release()
        return time.perf_counter() - started
    finally:
        for lease in kept:
            lease.release()


def _renewal_round(manager: PathLockManager, customers: int, per_customer: int) -> float:
    """Seconds for one renewal of ``customers`` x ``per_customer`` leases."""
    base = secrets.randbelow(2**61) + 1
    kept: list[Lease] = [
        manager.for_customer(base + customer).lock_paths(f"/r/{number}", ttl=LONG_TTL)
        for customer in range(customers)
        for number in range(per_customer)
    ]
    try:
        # The heartbeat's own way (its pool, sentinels claimed skipping locked
        # ones) where this version of pathlock has one.
        options = {"heartbeat": True} if _has_heartbeat_renewals(manager) else {}
        started = time.perf_counter()
        manager._renew_leases(kept, **options)
        spent = time.perf_counter() - started
        assert not any(lease.lost for lease in kept)  # noqa: S101 - a broken run must not count
        return spent
    finally:
        for lease in kept:
            lease.release()


def _has_heartbeat_renewals(manager: PathLockManager) -> bool:
    return "heartbeat" in inspect.signature(manager._renew_leases).parameters


def _numbers(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pathlock.bench.heartbeat", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--url", default=DEFAULT_URL)
    parser.add_argument("--held", default="0,1000,4000", help="held leases while granting")
    parser.add_argument("--grants", type=int, default=1000)
    parser.add_argument("--customers", default="1,100,1000", help="customers per renewal round")
    parser.add_argument("--rounds", type=int, default=3)
    arguments = parser.parse_args(argv)
    with PathLockManager(arguments.url, node_id="pathlock-bench-heartbeat") as manager:
        for held in _numbers(arguments.held):
            spent = [_grants(manager, held, arguments.grants) for _ in range(arguments.rounds)]
            print(  # noqa: T201 - the benchmark's output
                f"{arguments.grants} grants + releases with {held} leases held: "
                f"{median(spent):.2f} s"
            )
        for customers in _numbers(arguments.customers):
            spent = [_renewal_round(manager, customers, 4) for _ in range(arguments.rounds)]
            print(  # noqa: T201
                f"one renewal round of {customers * 4} leases of {customers} customers: "
                f"{median(spent) * 1000:.1f} ms"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
