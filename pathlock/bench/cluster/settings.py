"""The fixed numbers of a run, shared by the coordinator and the clients."""

from __future__ import annotations

from pathlib import Path
from typing import Any

DEFAULT_OUTPUT = Path("docs") / "BENCHMARKS-CLUSTER.md"  # from the current directory
GALERA_DATABASE = "pathlock_bench"
PLAIN_SERVER = "mysql+pymysql://root@127.0.0.1:3306/test"
PLAIN_DATABASE = "pathlock_bench_cluster"

CLIENTS = 6
NODES = 3
ROUNDS = 2  # rounds per variant in experiments 1 and 2, alternating with the others
HOLD = 0.001  # seconds a granted lock is held
TIMEOUT = 30.0  # lock_paths(timeout=...)
TTL = 30.0
HOT_CUSTOMER = 1
HOT_PATH = "/Shared/hot"
CUSTOMERS = tuple(range(100, 160))  # experiment 2: 60 customers
TREE = tuple(f"/d{a}/f{b}" for a in range(4) for b in range(4))
SOLO_CUSTOMER = 7  # experiment 3
SOLO_WARMUP = 20
# pymysql.constants.CLIENT.MULTI_STATEMENTS: pathlock's own engines set it, so
# they send two statements per round trip; an engine of our own needs it too
# for a like-for-like comparison.
MULTI_STATEMENTS = 1 << 16

BUSY_BEFORE = 0.25  # cores busier than this just before the run: a note in the report
SETUP_TIMEOUT = 120.0  # seconds the clients get to reach the start barrier
DRAIN_TIMEOUT = TIMEOUT + 90.0  # after the end of a round, for the last acquires

SEPARATOR = " / "

Result = dict[str, Any]
Command = dict[str, Any]
