"""What a lock costs without contention: experiments 1 (one acquire +
release), 2 (throughput of 8 processes), 6 (100,000 live locks), 7 (reaping
under load) and 10 (detached leases and lookups beside 100,000 live locks)."""

from __future__ import annotations

import cProfile
import os
import pstats
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import TypeVar

from pathlock import CustomerLocks, DetachedLease
from pathlock.bench import BenchError
from pathlock.bench.database import (
    COUNTED_DRIVERS,
    Floor,
    Server,
    floor_engine,
    insert_bulk_rows,
    round_trips,
    server_cpu_seconds,
)
from pathlock.bench.harness import Bench, alternate
from pathlock.bench.naive import NaiveLocks
from pathlock.bench.report import Section, goal_met
from pathlock.bench.stats import count, mean, ms, percentile, ratio, times
from pathlock.bench.workers import STUCK, Algorithm, Job, Sample, churn

PATH = "/Shared/bench/file.txt"
WARM_UP = 50  # operations of each kind before the first timed round
WARM_UP_SECONDS = 0.5  # of the clients of experiment 7 before the baseline counts
ROUND_TRIP_CYCLES = 20  # untimed acquire + release cycles of each kind whose commands are counted
NAIVE_NODE = "pathlock-bench-naive"  # the node id of the naive algorithm's rows in this process

UNCONTENDED_GOAL = 1.5
# What the uncontended acquire + release may cost the client and the server
# beside the floor, and the Python calls it may make.
UNCONTENDED_CPU_GOAL = 2.0
UNCONTENDED_CALLS_GOAL = 600
THROUGHPUT_GOAL = 0.5
THROUGHPUT_CPU_GOAL = 2.0
SCALE_GOAL = 1.5
REAP_GOAL = 0.050

K = TypeVar("K")


def _timed(operation: Callable[[], None], count: int) -> list[float]:
    samples = []
    for _ in range(count):
        started = time.monotonic()
        operation()
        samples.append(time.monotonic() - started)
    return samples


def _side_by_side(
    operations: Mapping[K, Callable[[], None]],
    rounds: int,
    per_round: int,
    cpu: dict[K, list[float | None]] | None = None,
    server: Server | None = None,
) -> dict[K, list[float]]:
    """Time each operation in alternating rounds, after a warm-up of each.
    With ``cpu``, also add up per kind this process's CPU time and the
    database ``server``'s (``None`` when its processes cannot be read here)."""
    for operation in operations.values():
        _timed(operation, WARM_UP)
    samples: dict[K, list[float]] = {kind: [] for kind in operations}
    for _, kind in alternate(rounds, *operations):
        client, before = time.process_time(), None if server is None else server_cpu_seconds(server)
        samples[kind] += _timed(operations[kind], per_round)
        if cpu is not None:
            spent = cpu.setdefault(kind, [0.0, 0.0])
            spent[0] = (spent[0] or 0.0) + time.process_time() - client
            after = None if server is None else server_cpu_seconds(server)
            if before is None or after is None or spent[1] is None:
                spent[1] = None
            else:
                spent[1] += after - before
    return samples


def _latency_row(name: str, samples: list[float]) -> tuple[str, ...]:
    return (name, ms(percentile(samples, 0.5)), ms(percentile(samples, 0.99)), ms(mean(samples)))


def _python_calls(operation: Callable[[], None], cycles: int) -> float:
    """Python calls per call of ``operation``, over ``cycles`` calls:
    cProfile's count of the calls this thread makes (Python functions and
    built-in ones alike), which does not depend on the machine."""
    profile = cProfile.Profile()
    profile.enable()
    try:
        for _ in range(cycles):
            operation()
    finally:
        profile.disable()
    calls: int = pstats.Stats(profile).total_calls  # type: ignore[attr-defined]
    return calls / cycles


def _per_cycle(total: float | None, cycles: int) -> float | None:
    return None if total is None or not cycles else total / cycles


def _cpu(seconds: float | None) -> str:
    return "n/a" if seconds is None else ms(seconds)


def _trips(value: float | None) -> str:
    """Round trips per acquire + release: ``4``, or ``4.05`` if some cycles
    sent more."""
    if value is None:
        return "n/a"
    return f"{value:g}" if value == round(value) else f"{value:.2f}"


def _lock_and_release(locks: CustomerLocks) -> Callable[[], None]:
    def operation() -> None:
        locks.lock_paths(PATH).release()

    return operation


def _floor_cycle(floor: Floor) -> Callable[[], None]:
    def operation() -> None:
        floor.release(floor.acquire(PATH, 0))

    return operation


def _naive_cycle(naive: NaiveLocks) -> Callable[[], None]:
    def operation() -> None:
        lease_id = naive.acquire(PATH, timeout=STUCK)
        if lease_id is None:
            raise BenchError(f"{PATH} not granted within {STUCK:g} s, uncontended")
        naive.release(lease_id)

    return operation


KINDS: tuple[Algorithm, ...] = ("floor", "naive", "pathlock")
"""What experiments 1 and 2 measure side by side, in this order."""
NAMES: dict[Algorithm, str] = {
    "floor": "floor (2 autocommit UPDATEs)",
    "naive": "naive algorithm",
    "pathlock": "pathlock",
}


@dataclass(frozen=True, slots=True)
class _Uncontended:
    samples: dict[Algorithm, list[float]]
    """Per kind, the timed acquire + release cycles."""
    cpu: dict[Algorithm, tuple[float | None, float | None]]
    """Per kind, this process's and the server's CPU per cycle (``None``:
    the server's process cannot be read here)."""
    trips: dict[Algorithm, float | None]
    """Per kind, round trips per cycle (``None``: its driver's are not
    counted)."""
    calls: dict[Algorithm, float]
    """Per kind, Python calls per cycle (see :func:`_python_calls`)."""


def _run_uncontended(bench: Bench) -> _Uncontended:
    settings = bench.settings
    engine = floor_engine(bench.url)
    try:
        floor = Floor(engine)
        with bench.customers(2) as customers:
            ours, theirs = customers
            operations: dict[Algorithm, Callable[[], None]] = {
                "floor": _floor_cycle(floor),
                "naive": _naive_cycle(NaiveLocks(bench.engine, theirs, node_id=NAIVE_NODE)),
                "pathlock": _lock_and_release(bench.manager.for_customer(ours)),
            }
            drivers = {
                "floor": engine.dialect.driver,
                "naive": bench.engine.dialect.driver,
                "pathlock": bench.manager.engine.dialect.driver,
            }
            spent: dict[Algorithm, list[float | None]] = {}
            samples = _side_by_side(
                operations,
                settings.uncontended_rounds,
                settings.uncontended_per_round,
                spent,
                bench.server,
            )
            # Untimed, after the timed rounds: counting costs a little CPU.
            trips = {
                kind: round_trips(operations[kind], ROUND_TRIP_CYCLES, drivers[kind])
                if drivers[kind] in COUNTED_DRIVERS
                else None
                for kind in KINDS
            }
            calls = {kind: _python_calls(operations[kind], ROUND_TRIP_CYCLES) for kind in KINDS}
    finally:
        engine.dispose()
    return _Uncontended(
        samples={kind: samples[kind] for kind in KINDS},
        cpu={
            kind: (
                _per_cycle(spent[kind][0], len(samples[kind])),
                _per_cycle(spent[kind][1], len(samples[kind])),
            )
            for kind in KINDS
        },
        trips=trips,
        calls=calls,
    )


def uncontended(bench: Bench) -> Section:
    """1: one acquire + release of one path, uncontended, with pathlock and
    with the naive algorithm, beside two durable commits."""
    settings = bench.settings
    run = _run_uncontended(bench)
    p50 = {kind: percentile(run.samples[kind], 0.5) for kind in KINDS}
    share = {kind: ratio(p50[kind], p50["floor"]) for kind in KINDS}
    ahead = p50["pathlock"] < p50["naive"]
    met = goal_met(share["pathlock"], UNCONTENDED_GOAL) and ahead and not _costs_over(run)

    def row(kind: Algorithm) -> tuple[str, ...]:
        samples = run.samples[kind]
        client, server = run.cpu[kind]
        return (
            NAMES[kind],
            ms(p50[kind]),
            ms(percentile(samples, 0.99)),
            ms(mean(samples)),
            times(share[kind]),
            _trips(run.trips[kind]),
            f"{run.calls[kind]:,.0f}",
            _cpu(client),
            _cpu(server),
        )

    return Section(
        number=1,
        method="One thread, no contention: acquire + release of one path "
        f"(`{PATH}`) with pathlock (`locks.lock_paths(path).release()`) and with the naive "
        "algorithm of the original blog post (one transaction per attempt: `SELECT ... FOR "
        "UPDATE` of the customer's row, a `SELECT` for conflicting locks, `INSERT`, `COMMIT`; "
        "release: `DELETE`, `COMMIT`), each on a customer of its own, beside the floor: two "
        "single-row `UPDATE`s in autocommit mode (`UPDATE ... SET n = n + 1 WHERE id = ?` of "
        "a row of its own in a scratch table of the same server), each one round trip and "
        "one durable commit, over the same driver. No engine sends anything when a "
        f"connection goes back to its pool. {len(run.samples['pathlock']):,} timed samples "
        f"of each, in {count(settings.uncontended_rounds, 'round')} of "
        f"{settings.uncontended_per_round} per kind that take turns, after a warm-up of "
        f"{WARM_UP} of each. Round trips are the commands the driver sent per acquire + "
        f"release, counted over {ROUND_TRIP_CYCLES} more of each, untimed (several "
        "statements sent in one query count as one); Python calls are cProfile's count of "
        "the calls this thread made per acquire + release (Python functions and built-in "
        "ones alike), over as many more, untimed. CPU is per acquire + release, over the "
        "timed rounds: client CPU is this benchmark process's, server CPU the database "
        "server process's (n/a when the server does not run on this machine).",
        header=(
            "",
            "p50",
            "p99",
            "mean",
            "p50 ÷ floor",
            "round trips",
            "Python calls",
            "client CPU",
            "server CPU",
        ),
        rows=[row(kind) for kind in KINDS],
        goal=f"≤ {UNCONTENDED_GOAL}× the floor at p50, ahead of the naive algorithm; at most "
        f"{UNCONTENDED_CALLS_GOAL} Python calls, and client and server CPU ≤ "
        f"{UNCONTENDED_CPU_GOAL:g}× the floor's",
        result=f"{times(share['pathlock'])} (naive algorithm {times(share['naive'])}); "
        f"{run.calls['pathlock']:,.0f} calls; CPU {_cpu_share(run, 0)} (client), "
        f"{_cpu_share(run, 1)} (server)",
        met=met,
        meaning=_uncontended_meaning(run, p50, share, met=met, ahead=ahead),
    )


def _cpu_ratio(run: _Uncontended, side: int) -> float | None:
    """Pathlock's CPU per acquire + release over the floor's: ``side`` 0 the
    client's, 1 the server's (``None`` where not measured)."""
    ours, floor = run.cpu["pathlock"][side], run.cpu["floor"][side]
    return None if ours is None or floor is None else ratio(ours, floor)


def _cpu_share(run: _Uncontended, side: int) -> str:
    share = _cpu_ratio(run, side)
    return "n/a" if share is None else times(share)


def _costs_over(run: _Uncontended) -> list[str]:
    """The costs of experiment 1 over their goals, as the verdict says them."""
    over = []
    if run.calls["pathlock"] > UNCONTENDED_CALLS_GOAL:
        over.append(f"over {UNCONTENDED_CALLS_GOAL} Python calls")
    for side, name in ((0, "client"), (1, "server")):
        share = _cpu_ratio(run, side)
        if share is not None and not goal_met(share, UNCONTENDED_CPU_GOAL):
            over.append(f"over {UNCONTENDED_CPU_GOAL:g}× the floor's {name} CPU")
    return over


def _uncontended_meaning(
    run: _Uncontended,
    p50: dict[Algorithm, float],
    share: dict[Algorithm, float],
    *,
    met: bool,
    ahead: bool,
) -> str:
    trips = {kind: _trips(run.trips[kind]) for kind in KINDS}
    client = {kind: _cpu(run.cpu[kind][0]) for kind in KINDS}
    server = {kind: _cpu(run.cpu[kind][1]) for kind in KINDS}
    if met:
        verdict = "Within the goal, ahead of the naive algorithm, within its costs."
    else:
        missed = []
        if not goal_met(share["pathlock"], UNCONTENDED_GOAL):
            missed.append(f"over {UNCONTENDED_GOAL:g}× the floor")
        if not ahead:
            missed.append("not ahead of the naive algorithm")
        missed += _costs_over(run)
        verdict = "Not met: " + ", ".join(missed) + "."
    return (
        f"An uncontended acquire + release took {ms(p50['pathlock'])} at the median with "
        f"pathlock, {times(share['pathlock'])} the floor's {ms(p50['floor'])}, and "
        f"{ms(p50['naive'])} ({times(share['naive'])}) with the naive algorithm. {verdict} "
        f"Per acquire + release pathlock sent {trips['pathlock']} round trips to the server, "
        f"the floor {trips['floor']} and the naive algorithm {trips['naive']}, and made "
        f"{run.calls['pathlock']:,.0f} Python calls, the floor {run.calls['floor']:,.0f} and "
        f"the naive algorithm {run.calls['naive']:,.0f}. Pathlock used "
        f"{client['pathlock']} of client CPU and {server['pathlock']} of server CPU, the "
        f"floor {client['floor']} and {server['floor']}, the naive algorithm "
        f"{client['naive']} and {server['naive']}. Where the floor updates one row per "
        "commit, pathlock's acquire writes the customer's row, only if the customer holds "
        "nothing and has nobody queued (its row counts them: then no conflicting lock can "
        "exist, and there is nothing to search), and inserts the lock's row; its release "
        "deletes that row and counts it down on the customer's row. The naive algorithm's "
        "acquire locks the customer's row, searches for conflicting locks and inserts; its "
        "release deletes."
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


@dataclass(frozen=True, slots=True)
class _Throughput:
    done: dict[Algorithm, list[Sample]]
    """Per kind, the cycles completed within their rounds."""
    server_cpu: dict[Algorithm, float | None]
    """Per kind, the server's CPU per cycle (``None``: not readable here)."""


def _run_throughput(bench: Bench) -> _Throughput:
    settings = bench.settings
    team = bench.team()
    processes = settings.throughput_processes
    done: dict[Algorithm, list[Sample]] = {kind: [] for kind in KINDS}
    # Per kind, the server's CPU over its rounds, and every cycle those rounds
    # completed (a process's last one may end just after its round).
    server: dict[Algorithm, float | None] = dict.fromkeys(KINDS, 0.0)
    cycles = dict.fromkeys(KINDS, 0)
    # A block of customers per kind: each process of each kind has its own
    # customer (for the floor, its own row of that id).
    with bench.customers(processes * len(KINDS)) as customers:
        mine = {
            kind: customers[index * processes : (index + 1) * processes]
            for index, kind in enumerate(KINDS)
        }
        for _, kind in alternate(settings.throughput_rounds, *KINDS):
            start = team.start_at()
            until = start + settings.throughput_seconds
            before = server_cpu_seconds(bench.server)
            results = team.run(_each_on_its_own(kind, mine[kind], start, until))
            after = server_cpu_seconds(bench.server)
            spent = server[kind]
            server[kind] = (
                None if spent is None or before is None or after is None else spent + after - before
            )
            for samples in results.values():
                done[kind] += _completed(samples, until)
                cycles[kind] += len(samples)
    return _Throughput(
        done=done, server_cpu={kind: _per_cycle(server[kind], cycles[kind]) for kind in KINDS}
    )


def throughput(bench: Bench) -> Section:
    """2: 8 processes, each on its own customer, acquire + release for a
    fixed time with pathlock and with the naive algorithm, beside the floor's
    8 processes."""
    settings = bench.settings
    processes = settings.throughput_processes
    run = _run_throughput(bench)
    seconds = settings.throughput_seconds * settings.throughput_rounds
    rates = {kind: len(run.done[kind]) / seconds for kind in KINDS}
    share = {kind: ratio(rates[kind], rates["floor"]) for kind in KINDS}
    cpu = run.server_cpu
    floor_cpu = cpu["floor"]
    cpu_share = {
        kind: None if value is None or floor_cpu is None else ratio(value, floor_cpu)
        for kind, value in cpu.items()
    }
    ours, ours_cpu = share["pathlock"], cpu_share["pathlock"]
    # Where the server's CPU cannot be read, throughput alone decides.
    met = goal_met(ours, THROUGHPUT_GOAL, at_least=True) and (
        ours_cpu is None or goal_met(ours_cpu, THROUGHPUT_CPU_GOAL)
    )

    def row(kind: Algorithm) -> tuple[str, ...]:
        latencies = [released - requested for requested, _, released in run.done[kind]]
        relative = cpu_share[kind]
        return (
            NAMES[kind],
            f"{len(run.done[kind]):,}",
            f"{rates[kind]:,.0f}/s",
            f"{rates[kind] / processes:,.0f}/s",
            times(share[kind]),
            ms(percentile(latencies, 0.5)),
            _cpu(cpu[kind]),
            "n/a" if relative is None else times(relative),
        )

    return Section(
        number=2,
        method=f"{processes} worker processes, each on a customer of its own, repeat acquire "
        "+ release of one path (no hold) for a fixed time, with pathlock and with the naive "
        f"algorithm; beside them the floor: the same {processes} processes repeat two "
        "single-row `UPDATE`s in autocommit mode, each process on a row of its own. "
        f"{count(settings.throughput_rounds, 'round')} of {settings.throughput_seconds:g} s "
        "per kind, taking turns. A cycle is one acquire + release (for the floor, its two "
        "commits); server CPU per cycle is the database server process's CPU over the "
        "rounds divided by the cycles they completed (n/a when the server does not run on "
        "this machine).",
        header=(
            "",
            "cycles",
            "cycles/s",
            "per process",
            "cycles/s ÷ floor",
            "p50 per cycle",
            "server CPU per cycle",
            "server CPU ÷ floor",
        ),
        rows=[row(kind) for kind in KINDS],
        goal=f"≥ {THROUGHPUT_GOAL}× the floor's throughput, and server CPU per cycle ≤ "
        f"{THROUGHPUT_CPU_GOAL:g}× the floor's",
        result=f"{times(ours)} the throughput, "
        + ("server CPU n/a" if ours_cpu is None else f"{times(ours_cpu)} the server CPU"),
        met=met,
        meaning=_throughput_meaning(processes, run, rates, share, cpu_share, met=met),
    )


def _throughput_meaning(
    processes: int,
    run: _Throughput,
    rates: dict[Algorithm, float],
    share: dict[Algorithm, float],
    cpu_share: dict[Algorithm, float | None],
    *,
    met: bool,
) -> str:
    cpu = run.server_cpu
    text = (
        f"With {processes} clients at once, each on its own customer, pathlock completed "
        f"{rates['pathlock']:,.0f} acquire + release cycles a second, "
        f"{times(share['pathlock'])} the floor's {rates['floor']:,.0f}, and the naive "
        f"algorithm {rates['naive']:,.0f} ({times(share['naive'])})."
    )
    ours_cpu, naive_cpu = cpu_share["pathlock"], cpu_share["naive"]
    if ours_cpu is None or naive_cpu is None:
        text += " The server's CPU could not be read here (it runs on another machine)."
    else:
        text += (
            f" Each cycle cost the server {_cpu(cpu['pathlock'])} of CPU with pathlock, "
            f"{times(ours_cpu)} the floor's {_cpu(cpu['floor'])}, and "
            f"{_cpu(cpu['naive'])} ({times(naive_cpu)}) with the naive algorithm."
        )
    if met:
        return text + " Within the goal: customers do not hold each other up."
    missed = []
    if not goal_met(share["pathlock"], THROUGHPUT_GOAL, at_least=True):
        missed.append(f"under {THROUGHPUT_GOAL:g}× the floor's throughput")
    if ours_cpu is not None and not goal_met(ours_cpu, THROUGHPUT_CPU_GOAL):
        missed.append(f"over {THROUGHPUT_CPU_GOAL:g}× the floor's server CPU")
    text += " Not met: " + " and ".join(missed) + "."
    cores = os.cpu_count() or 1
    if cores <= processes:
        text += (
            f" Customers do not wait for each other here; with {processes} clients and the "
            f"server sharing {cores} cores the run is bound by CPU, so what each cycle costs "
            "the server and the clients sets the throughput."
        )
    return text


def _crowd(bench: Bench, customer: int, rows: int | None = None) -> float:
    """Give ``customer`` ``rows`` live locks (default: the settings' number)
    in other subtrees (``/Bulk/d*/*``, expiring in an hour); the seconds it
    took."""
    rows = bench.settings.live_rows if rows is None else rows
    started = time.monotonic()
    bench.say(f"inserting {_locks_named(rows)}")
    insert_bulk_rows(
        bench.engine,
        range(customer, customer + 1),
        rows,
        expires_in=timedelta(hours=1),
        prefix="/Bulk/d",
    )
    return time.monotonic() - started


SCALE_MIDDLE = 1_000  # live locks of the size between one and the settings' number


def _scale_sizes(live_rows: int) -> list[int]:
    """The numbers of live locks experiment 6 measures: one, a thousand (if
    fewer than the settings' number) and the settings' number."""
    return sorted({1, min(SCALE_MIDDLE, live_rows), live_rows})


def _locks_named(count: int) -> str:
    return "1 live lock" if count == 1 else f"{count:,} live locks"


def scale(bench: Bench) -> Section:
    """6: acquire + release p50 on customers with one, a thousand and many
    live locks elsewhere, beside one with none."""
    settings = bench.settings
    sizes = _scale_sizes(settings.live_rows)
    with bench.customers(len(sizes) + 1) as customers:
        by_size = dict(zip([0, *sizes], customers, strict=True))  # 0: the one with none
        inserted = {size: _crowd(bench, by_size[size], size) for size in sizes}
        samples = _side_by_side(
            {
                size: _lock_and_release(bench.manager.for_customer(customer))
                for size, customer in by_size.items()
            },
            settings.scale_rounds,
            settings.scale_per_round,
        )
    p50 = {size: percentile(taken, 0.5) for size, taken in samples.items()}
    named = {0: "no rows", **{size: _locks_named(size) for size in sizes}}
    most = sizes[-1]
    slower = ratio(p50[most], p50[1])
    lean = ratio(p50[0], p50[1])
    return Section(
        number=6,
        method=f"One thread: acquire + release of `{PATH}` on customers that hold "
        + ", ".join(f"{size:,}" for size in sizes)
        + f" live locks in other subtrees (`/Bulk/d*/*`, bulk-inserted, the {most:,} in "
        f"{inserted[most]:.1f} s, expiring in an hour), beside the same on a customer with no "
        f"rows; {len(samples[0]):,} samples each, in alternating rounds. The bulk rows are "
        "deleted afterwards. The goal compares the customer with the most locks with the one "
        "with one lock: the cost of a request must not grow with the locks its customer holds "
        "elsewhere. A customer with no lock at all is the case of experiment 1: nothing to "
        "search.",
        header=("customer", "p50", "p99", "mean", "p50 ÷ 1 live lock"),
        rows=[
            (*_latency_row(name, samples[size]), times(ratio(p50[size], p50[1])))
            for size, name in named.items()
        ],
        goal=f"{_locks_named(most)} ≤ {SCALE_GOAL}× 1 live lock at p50",
        result=times(slower),
        met=goal_met(slower, SCALE_GOAL),
        meaning=f"{_locks_named(most)} of the same customer elsewhere made its requests "
        f"{times(slower)} as slow at the median as one live lock did"
        + (
            ": the conflict check reads only the index ranges of the requested path's "
            "ancestors and descendants, not the customer's other rows."
            if goal_met(slower, SCALE_GOAL)
            else ", over the goal: the conflict check reads more than the requested path's "
            "ancestors and descendants (see EXPLAIN of the grant statement)."
        )
        + f" A customer with no lock at all took {times(lean)} the time of "
        "one with one lock: its request is granted without a search for conflicts (its row "
        "counts no lock and no request queued), where one live lock of the customer, "
        "anywhere, makes its requests search.",
    )


DETACHED_GOAL = 1.5
DETACHED_TTL = 3600.0  # seconds: a WebDAV lock's hour
LISTINGS = 3  # reads of a whole customer's locks, the naive lookup: seconds each
_DETACHED_OPERATIONS = (
    ("lock_detached + release_detached", "grant and release"),
    ("renew_detached", "renew"),
    ("get_lease", "lease by id"),
    ("locks_on(path, descendants=True)", "locks around"),
)


def _detached_operations(
    locks: CustomerLocks, held: DetachedLease
) -> dict[str, Callable[[], None]]:
    """What a WebDAV server does with detached leases, on ``locks``; ``held``
    is held throughout, for the renewals and the reads."""

    def grant_and_release() -> None:
        locks.release_detached(locks.lock_detached(PATH, ttl=DETACHED_TTL).lease_id)

    def renew() -> None:
        locks.renew_detached(held.lease_id, ttl=DETACHED_TTL)

    def lease_by_id() -> None:
        if locks.get_lease(held.lease_id) is None:
            raise BenchError(f"lease {held.lease_id} not found")

    def locks_around() -> None:
        locks.locks_on(PATH, descendants=True)

    return {
        "grant and release": grant_and_release,
        "renew": renew,
        "lease by id": lease_by_id,
        "locks around": locks_around,
    }


def detached(bench: Bench) -> Section:
    """10: detached leases granted, renewed, released and looked up on a
    customer with many live locks, beside one with none; and the lookup
    against a read of the customer's every lock (``list_locks()``)."""
    settings = bench.settings
    with bench.customers(2) as customers:
        crowded, empty = customers
        inserted = _crowd(bench, crowded)
        held = {
            customer: bench.manager.for_customer(customer).lock_detached(
                "/Shared/held.docx", ttl=DETACHED_TTL
            )
            for customer in customers
        }
        sides = {
            side: _detached_operations(bench.manager.for_customer(customer), held[customer])
            for side, customer in (("empty", empty), ("crowded", crowded))
        }
        samples = _side_by_side(
            {(side, name): sides[side][name] for side in sides for _, name in _DETACHED_OPERATIONS},
            settings.detached_rounds,
            settings.detached_per_round,
        )
        crowd = bench.manager.for_customer(crowded)

        def list_everything() -> None:
            crowd.list_locks()

        listed = _timed(list_everything, LISTINGS)
        for customer, lease in held.items():
            bench.manager.for_customer(customer).release_detached(lease.lease_id)
    rows: list[tuple[str, ...]] = []
    worst = 0.0
    for shown, name in _DETACHED_OPERATIONS:
        empty_p50 = percentile(samples["empty", name], 0.5)
        crowded_p50 = percentile(samples["crowded", name], 0.5)
        slower = ratio(crowded_p50, empty_p50)
        worst = max(worst, slower)
        rows.append((f"`{shown}`", ms(empty_p50), ms(crowded_p50), times(slower)))
    lookup = percentile(samples["crowded", "locks around"], 0.5)
    listing = percentile(listed, 0.5)
    rows.append(
        (
            "`list_locks()` of the customer (the naive lookup)",
            "",
            ms(listing),
            f"{times(ratio(listing, lookup))} the lookup",
        )
    )
    met = goal_met(worst, DETACHED_GOAL)
    return Section(
        number=10,
        method="One thread, what a WebDAV server does with detached leases: grant one on "
        f"`{PATH}` (ttl {DETACHED_TTL:g} s) and release it by its id; renew a lease held "
        "throughout, by its id; read that lease by its id (`get_lease`); look up the locks "
        f"on `{PATH}`, its ancestors and below it (`locks_on`). Each on a customer that holds "
        f"{settings.live_rows:,} live locks in other subtrees (`/Bulk/d*/*`, bulk-inserted in "
        f"{inserted:.1f} s, expiring in an hour), beside the same on a customer with none; "
        f"{len(samples['empty', 'renew']):,} samples of each kind and customer, in "
        f"alternating rounds. Last, {LISTINGS} reads of the crowded customer's every lock "
        "(`list_locks()`), what a lookup costs without an index of its own (a storage that "
        "reads its locks and filters them).",
        header=(
            "operation",
            "no other locks (p50)",
            f"{settings.live_rows:,} live locks (p50)",
            "ratio",
        ),
        rows=rows,
        goal=f"≤ {DETACHED_GOAL}× at p50 for each operation",
        result=f"worst {times(worst)}",
        met=met,
        meaning=f"With {settings.live_rows:,} live locks of the same customer, the slowest of "
        f"these operations took {times(worst)} its time on a customer with none at the median"
        + (
            ": each reads one lease's rows, or the index ranges of one path's ancestors and "
            "descendants, never the customer's other locks"
            if met
            else ", over the goal: an operation reads more than its lease's rows or its path's "
            "index ranges"
        )
        + f"; reading the customer's every lock instead took {times(ratio(listing, lookup))} "
        "the lookup's time.",
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
