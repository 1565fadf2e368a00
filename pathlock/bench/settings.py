"""The sizes of one run: full (the figures of docs/BENCHMARKS.md, a few
minutes on 2 cores) or quick (tiny, a smoke test of the whole suite)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from pathlock.bench.stats import count


@dataclass(frozen=True, slots=True)
class Settings:
    quick: bool
    # 1. uncontended: alternating rounds of floor, naive and pathlock operations
    uncontended_rounds: int
    uncontended_per_round: int
    # 2. throughput: alternating timed rounds of floor, naive and pathlock
    throughput_processes: int
    throughput_seconds: float
    throughput_rounds: int
    # 3. fairness: every process count, each algorithm, alternating rounds
    fairness_processes: tuple[int, ...]
    fairness_hold: float
    fairness_seconds: float
    fairness_rounds: int
    # 4. a parent folder among busy children
    parent_children: int
    parent_hold: float
    parent_repeats: int
    parent_cap: float
    parent_settle: float
    # 5. hand-off: rounds per algorithm, holds taken in turn
    handoff_rounds: int
    handoff_holds: tuple[float, ...]
    # 6. scale
    live_rows: int
    scale_rounds: int
    scale_per_round: int
    # 7. reaping
    reap_rows: int
    reap_clients: int
    reap_baseline_seconds: float
    # 8. asyncio: tasks taking turns on one path while a timer measures the loop
    loop_tasks: int
    loop_hold: float
    loop_interval: float
    loop_rounds: int
    loop_idle_seconds: float
    # 9. asyncio against synchronous: alternating rounds per database
    versus_rounds: int
    versus_per_round: int
    # 10. detached leases and lookups beside live_rows live locks
    detached_rounds: int
    detached_per_round: int

    def describe(self) -> list[str]:
        """The settings, one markdown bullet per experiment."""
        return [
            f"- 1: {count(self.uncontended_rounds, 'round')} of "
            f"{self.uncontended_per_round} operations each, floor, naive and pathlock "
            "alternating",
            f"- 2: {self.throughput_processes} processes, {count(self.throughput_rounds, 'round')} "
            f"of {self.throughput_seconds:g} s each, floor, naive and pathlock alternating",
            f"- 3: {', '.join(map(str, self.fairness_processes))} processes, hold "
            f"{self.fairness_hold * 1000:g} ms, {count(self.fairness_rounds, 'round')} of "
            f"{self.fairness_seconds:g} s per process count and algorithm, alternating",
            f"- 4: {self.parent_children} children held {self.parent_hold * 1000:g} ms each, "
            f"the parent requested {count(self.parent_repeats, 'time')} per algorithm, "
            f"{self.parent_settle:g} s after the children began, waiting "
            f"{self.parent_cap:g} s at most",
            f"- 5: {count(self.handoff_rounds, 'round')} per algorithm (alternating), holds of "
            + " and ".join(f"{hold * 1000:g} ms" for hold in self.handoff_holds)
            + " in turn",
            f"- 6: {self.live_rows:,} live rows, {count(self.scale_rounds, 'round')} of "
            f"{self.scale_per_round} operations, alternating",
            f"- 7: {self.reap_rows:,} expired rows, {self.reap_clients} client processes, "
            f"{self.reap_baseline_seconds:g} s measured before the reap",
            f"- 8: {self.loop_tasks} tasks, hold {self.loop_hold * 1000:g} ms, a timer every "
            f"{self.loop_interval * 1000:g} ms, {count(self.loop_rounds, 'round')} per database, "
            f"each after {self.loop_idle_seconds:g} s of the idle loop",
            f"- 9: {count(self.versus_rounds, 'round')} of {self.versus_per_round} operations "
            "per API and database, synchronous and asyncio alternating",
            f"- 10: {self.live_rows:,} live rows, {count(self.detached_rounds, 'round')} of "
            f"{self.detached_per_round} operations per kind and customer, alternating",
        ]

    def workers(self, experiments: Iterable[int]) -> int:
        """How many worker processes ``experiments`` need at most (1, 6, 8
        and 9 run in the parent alone)."""
        needs = {
            2: self.throughput_processes,
            3: max(self.fairness_processes),
            4: self.parent_children + 1,
            5: 2,
            7: self.reap_clients,
        }
        return max((needs.get(number, 0) for number in experiments), default=0)


FULL = Settings(
    quick=False,
    uncontended_rounds=10,
    uncontended_per_round=200,
    throughput_processes=8,
    throughput_seconds=3.0,
    throughput_rounds=2,
    fairness_processes=(1, 3, 5),
    fairness_hold=0.001,
    fairness_seconds=3.0,
    fairness_rounds=2,
    parent_children=4,
    parent_hold=0.005,
    parent_repeats=3,
    parent_cap=10.0,
    parent_settle=0.5,
    handoff_rounds=40,
    handoff_holds=(0.005, 0.2),
    live_rows=100_000,
    scale_rounds=10,
    scale_per_round=100,
    reap_rows=1_000_000,
    reap_clients=4,
    reap_baseline_seconds=5.0,
    loop_tasks=100,
    loop_hold=0.001,
    loop_interval=0.001,
    loop_rounds=5,
    loop_idle_seconds=0.5,
    versus_rounds=10,
    versus_per_round=100,
    detached_rounds=10,
    detached_per_round=50,
)

# The smoke test's sizes: the same experiments, briefly (figures mean nothing).
QUICK = replace(
    FULL,
    quick=True,
    uncontended_rounds=2,
    uncontended_per_round=25,
    throughput_processes=3,  # each process starts an interpreter: seconds on 2 cores
    throughput_seconds=0.5,
    throughput_rounds=1,
    fairness_processes=(1, 3),
    fairness_seconds=0.5,
    fairness_rounds=1,
    parent_repeats=1,
    parent_cap=1.0,
    parent_settle=0.2,
    handoff_rounds=4,
    live_rows=5_000,
    scale_rounds=2,
    scale_per_round=25,
    reap_rows=10_000,
    reap_baseline_seconds=0.5,
    loop_tasks=20,
    loop_rounds=1,
    loop_idle_seconds=0.2,
    versus_rounds=2,
    versus_per_round=25,
    detached_rounds=2,
    detached_per_round=10,
)
