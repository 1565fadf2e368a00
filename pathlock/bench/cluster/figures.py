"""The figures of a run: the clients' results summed up per variant, the
safety check on the holds, and the helpers that read them (milliseconds; the
percentiles are :func:`pathlock.bench.stats.percentile`)."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from pathlock.bench.stats import percentile

from .settings import CLIENTS, SEPARATOR, Result


def milliseconds(seconds: float) -> str:
    if math.isnan(seconds):
        return "n/a"
    return f"{seconds * 1000:.1f} ms" if seconds >= 0.1 else f"{seconds * 1000:.2f} ms"  # noqa: PLR2004


def check_holds(holds: list[tuple[float, float, int]]) -> tuple[int, int]:
    """Overlapping holds and fencing tokens out of grant order, among the holds
    of one path in one round (every client's, by the system-wide monotonic clock)."""
    overlaps = disorder = 0
    latest_end = float("-inf")
    last_token = None
    for granted, released, token in sorted(holds):
        if granted < latest_end:
            overlaps += 1
        latest_end = max(latest_end, released)
        if last_token is not None and token <= last_token:
            disorder += 1
        last_token = token
    return overlaps, disorder


class Variant:
    """The figures of one variant of experiment 1 or 2, over all its rounds."""

    def __init__(self, name: str, affinity: bool, same_order: bool) -> None:
        self.name = name
        self.affinity = affinity
        self.same_order = same_order
        self.window = 0.0
        self.per_client = [0] * CLIENTS
        self.latencies: list[float] = []
        self.errors: Counter[str] = Counter()
        self.race_lines = 0
        self.races = 0
        self.warnings: Counter[str] = Counter()
        self.samples: list[str] = []
        self.overlaps = 0
        self.disorder = 0
        self.drain = 0.0
        self.cpu: list[float] = []  # per round: the machine's cores busy, 0 to 1

    def add(self, results: list[Result], seconds: float, *, check: bool) -> None:
        self.window += seconds
        holds: list[tuple[float, float, int]] = []
        for result in results:
            self.per_client[result["client"]] += result["granted_in_window"]
            self.latencies.extend(result["latencies"])
            self.errors.update(result["errors"])
            self.race_lines += result["race_lines"]
            self.races += result["races"]
            self.warnings.update(result["warnings"])
            self.samples.extend(result["samples"][: 3 - len(self.samples)])
            holds.extend(tuple(hold) for hold in result["holds"])
            self.drain = max(self.drain, result["finished"] - result["deadline"])
        if check:
            overlaps, disorder = check_holds(holds)
            self.overlaps += overlaps
            self.disorder += disorder

    @property
    def grants(self) -> int:
        return sum(self.per_client)

    @property
    def rate(self) -> float:
        return self.grants / self.window if self.window else 0.0

    def errors_of(self, kind: str) -> int:
        return sum(count for name, count in self.errors.items() if name.startswith(kind))

    def other_errors(self) -> int:
        return sum(
            count
            for name, count in self.errors.items()
            if not name.startswith(("LockTimeout", "BackendError"))
        )

    def summary(self) -> str:
        return (
            f"{self.name}: {self.rate:.0f} grants/s, per client "
            f"{SEPARATOR.join(map(str, self.per_client))}, p50 "
            f"{milliseconds(percentile(self.latencies, 0.5))}, p99 "
            f"{milliseconds(percentile(self.latencies, 0.99))}, "
            f"{self.errors_of('LockTimeout')} LockTimeout, "
            f"{self.errors_of('BackendError')} BackendError, {self.races} lost races "
            f"({self.race_lines} log lines)"
        )


SOLO_LABELS = {
    "plain": "plain MariaDB server (port 3306)",
    "galera": "Galera node 1, causal reads (pathlock's default)",
    "galera-nocausal": "Galera node 1, causal reads off",
}


class Solo:
    """Experiment 3's figures."""

    def __init__(self, result: dict[str, Any], labels: dict[str, str]) -> None:
        self.samples: dict[str, list[float]] = result["samples"]
        self.sync_wait: dict[str, str] = result["sync_wait"]
        self.labels = labels

    def p(self, name: str, fraction: float) -> float:
        return percentile(self.samples.get(name, []), fraction)

    def ratio(self, top: str, bottom: str, fraction: float) -> float:
        below = self.p(bottom, fraction)
        return self.p(top, fraction) / below if below > 0 else float("nan")


class Run:
    """Everything one run measured, for the report."""

    def __init__(self) -> None:
        self.hot = [
            Variant("without affinity", affinity=False, same_order=False),
            Variant("with affinity", affinity=True, same_order=False),
        ]
        self.many = [
            Variant("without affinity", affinity=False, same_order=False),
            Variant("with affinity", affinity=True, same_order=False),
            Variant("single writer", affinity=False, same_order=True),
        ]
        self.solo: Solo | None = None
        self.solo_note = ""
        self.environment: list[tuple[str, str]] = []
        self.homes = ("", "")
        self.cluster_start = 0.0
        self.busy_before = 0.0  # how busy the cores were in the second before the run
