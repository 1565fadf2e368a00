"""``pathlock bench``: the benchmark suite that writes ``docs/BENCHMARKS.md``.

Seven experiments, each measured beside its baseline in the same run (the
machines are shared and noisy, so ratios count, not absolute times): the cost
of one uncontended lock against two durable commits, throughput, fairness on
one path, a parent folder among busy children, hand-off latency, scale with
100,000 live locks, and reaping expired rows under load. The baseline of the
contention experiments is the seed's literal algorithm (:mod:`pathlock.bench.seed`).

This module only names things, so that the command line can describe
``pathlock bench`` without importing the suite; :mod:`pathlock.bench.suite`
runs it.
"""

from __future__ import annotations

from pathlock.errors import PathLockError

DEFAULT_URL = "mysql+pymysql://root@127.0.0.1:3306/test"
DEFAULT_OUTPUT = "docs/BENCHMARKS.md"
PLOT_NAME = "benchmarks-fairness.png"

EXPERIMENTS: dict[int, str] = {
    1: "Uncontended acquire + release of one path",
    2: "Throughput of 8 processes, each on its own customer",
    3: "Fairness: 1, 3 and 5 processes on one path",
    4: "A parent folder while 4 processes keep locking its children",
    5: "Hand-off latency",
    6: "Acquire beside many live locks of the same customer",
    7: "Reaping expired rows while clients acquire",
}


class BenchError(PathLockError):
    """The benchmark could not run (a worker process failed, the server is
    not MySQL/MariaDB, ...); the message says why."""
