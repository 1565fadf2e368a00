"""``pathlock bench``: the benchmark suite that writes ``docs/BENCHMARKS.md``.

Ten experiments, each measured beside its baseline in the same run (the
machines are shared and noisy, so ratios count, not absolute times): the cost
of one uncontended lock and throughput, against two durable commits, fairness on
one path, a parent folder among busy children, hand-off latency, scale with
100,000 live locks, reaping expired rows under load, and the asyncio API: the
event loop's lag while tasks take turns on one path (beside the idle loop) and
an uncontended lock beside the synchronous API's (:mod:`pathlock.bench.asyncio_api`,
on the server and on a temporary SQLite file), and what a WebDAV server asks of
detached leases (grant and release, renewal, a lease by id, the locks around a
path) with 100,000 live locks beside. Beside pathlock in experiments
1 to 5 runs the naive algorithm from the original blog post
(``SELECT ... FOR UPDATE``, reverse exponential backoff; :mod:`pathlock.bench.naive`).

This module only names things, so that the command line can describe
``pathlock bench`` without importing the suite; :mod:`pathlock.bench.suite`
runs it. Every benchmark takes its percentiles, medians and means from
:mod:`pathlock.bench.stats`, the suite's and the two beside it:

- :mod:`pathlock.bench.cluster` (``python -m pathlock.bench.cluster``): pathlock
  on a private 3-node Galera cluster, written to ``docs/BENCHMARKS-CLUSTER.md``.
  It starts the cluster with ``servers/galera_cluster.py``, so it runs from a
  checkout of the repository only (it imports on its own).
- :mod:`pathlock.bench.heartbeat` (``python -m pathlock.bench.heartbeat``): what
  held leases cost a manager, printed only.
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
    6: "Acquire beside one, a thousand and many live locks of the same customer",
    7: "Reaping expired rows while clients acquire",
    8: "Event-loop lag while asyncio tasks take turns on one path",
    9: "Uncontended acquire + release, asyncio API beside the synchronous API",
    10: "Detached leases and lookups beside many live locks",
}


class BenchError(PathLockError):
    """The benchmark could not run (a worker process failed, the server is
    not MySQL, MariaDB or PostgreSQL, ...); the message says why."""
