"""What a lock costs without contention: experiments 1 (one acquire +
release), 2 (throughput of 8 processes), 6 (100,000 live locks) and 7
(reaping under load)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from pathlock import CustomerLocks
from pathlock.bench.database import Floor, insert_bulk_rows, server_cpu_seconds
from pathlock.bench.harness import Bench, alternate
from pathlock.bench.report import Section, goal_met
from pathlock.bench.stats import count, mean, ms, percentile, ratio, times
from pathlock.bench.workers import Algorithm, Job, Sample, churn

PATH = "/Shared/bench/file.txt"
WARM_UP = 50  # operations of each kind before the first timed round
WARM_UP_SECONDS = 0.5  # of the clients of experiment 7 before the baseline counts

UNCONTENDED_GOAL = 2.5
THROUGHPUT_GOAL = 0.5
SCALE_GOAL = 1.5
REAP_GOAL = 0.050


def _timed(operation: Callable[[], None], count: int) -> list[float]:
    samples = []
    for _ in range(count):
        started = time.monotonic()
        operation()
        samples.append(time.monotonic() - started)
    return samples


def _side_by_side(
    operations: dict[str, Callable[[], None]],
    rounds: int,
    per_round: int,
    cpu: dict[str, list[float | None]] | None = None,
) -> dict[str, list[float]]:
    """Time each operation in alternating rounds, after a warm-up of each.
    With ``cpu``, also add up per kind this process's CPU time and the
    database server's (``None`` when its process cannot be read here)."""
    for operation in operations.values():
        _timed(operation, WARM_UP)
    samples: dict[str, list[float]] = {kind: [] for kind in operations}
    for _, kind in alternate(rounds, *operations):
        client, server = time.process_time(), server_cpu_seconds()
        samples[kind] += _timed(operations[kind], per_round)
        if cpu is not None:
            spent = cpu.setdefault(kind, [0.0, 0.0])
            spent[0] = (spent[0] or 0.0) + time.process_time() - client
            server_after = server_cpu_seconds()
            if server is None or server_after is None or spent[1] is None:
                spent[1] = None
            else:
                spent[1] += server_after - server
    return samples


def _cpu_row(name: str, spent: list[float | None], operations: int) -> tuple[str, ...]:
    def per_operation(total: float | None) -> str:
        return "n/a" if total is None else ms(total / operations)

    return (name, *(per_operation(total) for total in spent))


def _latency_row(name: str, samples: list[float]) -> tuple[str, ...]:
    return (name, ms(percentile(samples, 0.5)), ms(percentile(samples, 0.99)), ms(mean(samples)))


def _lock_and_release(locks: CustomerLocks) -> Callable[[], None]:
    def operation() -> None:
        locks.lock_paths(PATH).release()

    return operation


def uncontended(bench: Bench) -> Section:
    """1: ``locks.lock_paths(p).release()`` beside two durable commits."""
    settings = bench.settings
    floor = Floor(bench.engine)
    with bench.customers(1) as customers:
        lock_and_release = _lock_and_release(bench.manager.for_customer(customers.start))

        def two_commits() -> None:
            floor.release(floor.acquire(PATH, 0))

        cpu: dict[str, list[float | None]] = {}
        samples = _side_by_side(
            {"floor": two_commits, "lock": lock_and_release},
            settings.uncontended_rounds,
            settings.uncontended_per_round,
            cpu,
        )
    lock, base = samples["lock"], samples["floor"]
    p50 = ratio(percentile(lock, 0.5), percentile(base, 0.5))
    p99 = ratio(percentile(lock, 0.99), percentile(base, 0.99))
    return Section(
        number=1,
        method=f"One thread, one customer: `locks.lock_paths({PATH!r}).release()`, beside its "
        "floor: two single-row durable commits (an INSERT and a DELETE, each committed) on a "
        f"scratch table of the same server over the same driver; {len(lock):,} samples of each, "
        "in alternating rounds. Both engines skip the pool's rollback when a connection is "
        "returned (pathlock's own engines do; each operation ends its transaction itself), so "
        "the floor is four round trips: INSERT, COMMIT, DELETE, COMMIT.",
        header=("", "p50", "p99", "mean"),
        rows=[
            _latency_row("floor (2 commits)", base),
            _latency_row("acquire + release", lock),
            ("ratio", times(p50), times(p99), ""),
        ],
        goal=f"≤ {UNCONTENDED_GOAL}× the floor at p50",
        result=times(p50),
        met=goal_met(p50, UNCONTENDED_GOAL),
        meaning=f"One uncontended acquire + release costs {times(p50)} two durable commits at "
        f"the median ({ms(percentile(lock, 0.5))} against {ms(percentile(base, 0.5))}): what "
        "pathlock adds to writing and removing a row is the customer's sentinel write and the "
        "conflict check, in the same transactions. Where the time goes, per operation "
        "(CPU of this client process, and of the database server's process when it runs on "
        "this machine; both measured over the same rounds):\n\n"
        + "| | client CPU | server CPU |\n|---|---|---|\n"
        + "\n".join(
            "| " + " | ".join(_cpu_row(name, cpu[kind], len(samples[kind]))) + " |"
            for name, kind in (("floor (2 commits)", "floor"), ("acquire + release", "lock"))
        ),
    )


def _completed(samples: list[Sample], until: float) -> list[Sample]:
    return [sample for sample in samples if sample[2] <= until]


def _each_on_its_own(
    algorithm: Algorithm, customers: range, start: float, until: float | None = None
) -> dict[int, Job]:
    """Jobs for ``len(customers)`` workers: each repeats acquire + release of
    one path of its own customer, with no hold, from ``start`` until ``until``
    (or until the team's stop event)."""
    return {
        index: (
            churn,
            {
                "algorithm": algorithm,
                "customer_id": customer_id,
                "path": PATH,
                "hold": 0.0,
                "start_at": start,
                "until": until,
            },
        )
        for index, customer_id in enumerate(customers)
    }


def throughput(bench: Bench) -> Section:
    """2: 8 processes, each on its own customer, acquire + release for a
    fixed time, beside the floor's 8 processes."""
    settings = bench.settings
    team = bench.team()
    processes = settings.throughput_processes
    done: dict[Algorithm, list[Sample]] = {"floor": [], "pathlock": []}
    with bench.customers(processes) as customers:
        for _, kind in alternate(settings.throughput_rounds, *done):
            start = team.start_at()
            until = start + settings.throughput_seconds
            for samples in team.run(_each_on_its_own(kind, customers, start, until)).values():
                done[kind] += _completed(samples, until)
    seconds = settings.throughput_seconds * settings.throughput_rounds
    rates = {kind: len(samples) / seconds for kind, samples in done.items()}
    share = ratio(rates["pathlock"], rates["floor"])

    def row(name: str, kind: Algorithm) -> tuple[str, ...]:
        latencies = [released - requested for requested, _, released in done[kind]]
        return (
            name,
            f"{len(done[kind]):,}",
            f"{rates[kind]:,.0f}/s",
            f"{rates[kind] / processes:,.0f}/s",
            ms(percentile(latencies, 0.5)),
        )

    return Section(
        number=2,
        method=f"{processes} worker processes, each on its own customer, repeat acquire + "
        "release of one path (no hold) for a fixed time; beside them the floor: the same "
        f"{processes} processes repeat two durable commits. "
        f"{count(settings.throughput_rounds, 'round')} of {settings.throughput_seconds:g} s "
        "each, alternating.",
        header=("", "operations", "throughput", "per process", "p50 per operation"),
        rows=[
            row("floor (2 commits)", "floor"),
            row("acquire + release", "pathlock"),
            ("ratio", "", times(share), "", ""),
        ],
        goal=f"≥ {THROUGHPUT_GOAL}× the floor's throughput",
        result=times(share),
        met=goal_met(share, THROUGHPUT_GOAL, at_least=True),
        meaning=f"With {processes} clients at once, each on its own customer, pathlock completed "
        f"{times(share)} as many acquire + release cycles as the floor completed pairs of "
        "commits"
        + (
            ": customers do not hold each other up, so the server bounds both."
            if goal_met(share, THROUGHPUT_GOAL, at_least=True)
            else f", below the goal. Customers do not wait for each other here; with "
            f"{processes} clients and the server sharing {os.cpu_count()} cores the run is "
            "bound by CPU, and an acquire + release costs the client and the server about "
            "twice the CPU of two plain commits (experiment 1's table): the sentinel "
            "write, the conflict check and five index trees per row instead of one."
        ),
    )


def scale(bench: Bench) -> Section:
    """6: acquire + release p50 on a customer with many live locks, beside
    one with none."""
    settings = bench.settings
    with bench.customers(2) as customers:
        crowded, empty = customers
        started = time.monotonic()
        bench.say(f"inserting {settings.live_rows:,} live locks")
        insert_bulk_rows(
            bench.engine,
            range(crowded, crowded + 1),
            settings.live_rows,
            expires_in=timedelta(hours=1),
            prefix="/Bulk/d",
        )
        inserted = time.monotonic() - started
        samples = _side_by_side(
            {
                "empty": _lock_and_release(bench.manager.for_customer(empty)),
                "crowded": _lock_and_release(bench.manager.for_customer(crowded)),
            },
            settings.scale_rounds,
            settings.scale_per_round,
        )
    slower = ratio(percentile(samples["crowded"], 0.5), percentile(samples["empty"], 0.5))
    return Section(
        number=6,
        method=f"One thread: acquire + release of `{PATH}` on a customer that holds "
        f"{settings.live_rows:,} live locks in other subtrees (`/Bulk/d*/*`, bulk-inserted "
        f"in {inserted:.1f} s, expiring in an hour), beside the same on a customer with no "
        f"rows; {len(samples['empty']):,} samples each, in alternating rounds. The bulk rows are "
        "deleted afterwards.",
        header=("customer", "p50", "p99", "mean"),
        rows=[
            _latency_row("no rows", samples["empty"]),
            _latency_row(f"{settings.live_rows:,} live locks", samples["crowded"]),
            ("ratio", times(slower), "", ""),
        ],
        goal=f"≤ {SCALE_GOAL}× at p50",
        result=times(slower),
        met=goal_met(slower, SCALE_GOAL),
        meaning=f"{settings.live_rows:,} live locks of the same customer elsewhere made its "
        f"requests {times(slower)} as slow at the median"
        + (
            ": the conflict check reads only the index ranges of the requested path's "
            "ancestors and descendants, not the customer's other rows."
            if goal_met(slower, SCALE_GOAL)
            else ", over the goal: the conflict check reads more than the requested path's "
            "ancestors and descendants (see EXPLAIN of the grant statement)."
        ),
    )


@dataclass(frozen=True, slots=True)
class _Reap:
    inserted: float
    """Seconds the bulk insert took."""
    reaped: int
    """Rows deleted by the reap."""
    took: float
    """Seconds the reap took."""
    before: list[float]
    """The clients' acquire + release latencies in the baseline."""
    during: list[float]
    """... and while the reap ran."""


def _run_reap(bench: Bench) -> _Reap:
    settings = bench.settings
    team = bench.team()
    with bench.customers(settings.reap_clients) as customers, bench.customers(1000) as others:
        bench.say(f"inserting {settings.reap_rows:,} expired rows")
        started = time.monotonic()
        insert_bulk_rows(
            bench.engine,
            others,
            settings.reap_rows,
            expires_in=-timedelta(hours=2),
            prefix="/Bulk/d",
        )
        inserted = time.monotonic() - started
        team.stop.clear()
        start = team.start_at()
        team.send(_each_on_its_own("pathlock", customers, start))
        try:
            baseline_from = start + WARM_UP_SECONDS
            time.sleep(max(0.0, baseline_from + settings.reap_baseline_seconds - time.monotonic()))
            reap_from = time.monotonic()
            reaped = bench.manager.reap_expired()
            reap_until = time.monotonic()
        finally:
            team.stop.set()
        results = team.collect(list(range(len(customers))))
    samples = [sample for client in results.values() for sample in client]
    return _Reap(
        inserted=inserted,
        reaped=reaped,
        took=reap_until - reap_from,
        before=[
            done - asked
            for asked, _, done in samples
            if baseline_from <= asked and done <= reap_from
        ],
        during=[
            done - asked for asked, _, done in samples if reap_from <= asked and done <= reap_until
        ],
    )


def reaping(bench: Bench) -> Section:
    """7: the clients' p99 while ``reap_expired()`` deletes many expired
    rows, beside their p99 just before, with the same rows in the table."""
    settings = bench.settings
    run = _run_reap(bench)
    before, during, took, reaped = run.before, run.during, run.took, run.reaped
    p99 = percentile(during, 0.99)

    def row(name: str, latencies: list[float]) -> tuple[str, ...]:
        return (
            name,
            f"{len(latencies):,}",
            ms(percentile(latencies, 0.5)),
            ms(percentile(latencies, 0.99)),
            ms(max(latencies, default=float("nan"))),
        )

    return Section(
        number=7,
        method=f"{settings.reap_rows:,} expired rows of 1,000 other customers are "
        f"bulk-inserted (in {run.inserted:.1f} s); {settings.reap_clients} worker processes, "
        "each on its own "
        "customer, repeat acquire + release; after "
        f"{settings.reap_baseline_seconds:g} s (the baseline, same table) the parent runs "
        "`manager.reap_expired()` (batches of 1,000 rows, one transaction each) while they "
        "go on. Latency is one acquire + release.",
        header=("clients' acquire + release", "operations", "p50", "p99", "max"),
        rows=[row("before the reap", before), row("during the reap", during)],
        goal=f"p99 during the reap ≤ {ms(REAP_GOAL)}",
        result=ms(p99),
        met=goal_met(p99, REAP_GOAL),
        meaning=f"The reap deleted {reaped:,} rows in {took:.1f} s "
        f"({reaped / took if took > 0 else 0:,.0f} rows/s); meanwhile the clients' p99 was "
        f"{times(ratio(p99, percentile(before, 0.99)))} their p99 before it"
        + (
            ": short batches keep the reaper's row locks and transactions brief."
            if goal_met(p99, REAP_GOAL)
            else ", over the goal: the reap holds the clients up."
        ),
    )
