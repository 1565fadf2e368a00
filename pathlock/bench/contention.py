"""Who gets a contended path, and when: experiments 3 (fairness on one
path), 4 (a parent folder among busy children) and 5 (hand-off latency), each
for pathlock beside the naive algorithm from the original blog post (``SELECT ... FOR
UPDATE``, reverse exponential backoff) in the same run."""

from __future__ import annotations

import math

from pathlock.bench.harness import Bench, alternate
from pathlock.bench.report import Row, Section, Trace, goal_met
from pathlock.bench.settings import Settings
from pathlock.bench.stats import count, mean, median, ms, percentile, ratio, times
from pathlock.bench.team import Team
from pathlock.bench.workers import Algorithm, Job, churn, hand_off, request_once

ALGORITHMS: tuple[Algorithm, ...] = ("pathlock", "naive")
PATH = "/Shared/bench/file.txt"
PARENT = "/Shared/parent"
# How long after the holder's grant the waiter asks, so it surely waits.
WAITER_DELAY = 0.020

# The goals: fairness for free (the naive algorithm's throughput at least),
# and a parent folder granted within 20 ms among busy children (the goal of
# "Cost that does not grow with the crowd"; 50 ms before it).
FAIRNESS_MAX_GOAL = 0.050
FAIRNESS_SPREAD_GOAL = 1.2
PARENT_GOAL = 0.020
HANDOFF_GOAL = 0.010

Waits = dict[int, list[float]]
"""Per worker process, the wait of each of its grants."""


# -- 3. fairness ----------------------------------------------------------------------


def _run_fairness(bench: Bench) -> tuple[dict[tuple[int, str], Waits], Trace]:
    """Every round of experiment 3: the waits per (process count, algorithm),
    and the grants of the first round at the largest count, for the plot."""
    settings = bench.settings
    team = bench.team()
    phases = len(settings.fairness_processes) * len(ALGORITHMS) * settings.fairness_rounds
    most = max(settings.fairness_processes)
    waits: dict[tuple[int, str], Waits] = {}
    trace: Trace = {}
    with bench.customers(phases) as customers:
        fresh = iter(customers)
        for processes in settings.fairness_processes:
            for _, algorithm in alternate(settings.fairness_rounds, *ALGORITHMS):
                start = team.start_at()
                job = {
                    "algorithm": algorithm,
                    "customer_id": next(fresh),
                    "path": PATH,
                    "hold": settings.fairness_hold,
                    "start_at": start,
                    "until": start + settings.fairness_seconds,
                }
                results = team.run(dict.fromkeys(range(processes), (churn, job)))
                per_process = waits.setdefault((processes, algorithm), {})
                for index, samples in results.items():
                    per_process.setdefault(index, []).extend(
                        granted - requested for requested, granted, _ in samples
                    )
                if processes == most and algorithm not in trace:
                    trace[algorithm] = [
                        (index, granted - start, granted - requested)
                        for index, samples in results.items()
                        for requested, granted, _ in samples
                    ]
    return waits, trace


def _spread(waits: Waits) -> float:
    """Max over min of the per-process average waits."""
    averages = [mean(process) for process in waits.values()]
    return ratio(max(averages), min(averages)) if averages else math.nan


def _longest(waits: Waits) -> float:
    return max((wait for process in waits.values() for wait in process), default=math.nan)


def _fairness_row(processes: int, algorithm: str, waits: Waits) -> Row:
    every = [wait for process in waits.values() for wait in process]
    averages = [mean(process) for process in waits.values()]
    grants = [len(process) for process in waits.values()]
    return (
        str(processes),
        algorithm,
        f"{len(every):,}",
        f"{min(grants):,}–{max(grants):,}",
        ms(mean(every)),
        ms(_longest(waits)),
        f"{ms(min(averages))} – {ms(max(averages))}",
        times(_spread(waits)),
    )


def _grants(waits: Waits) -> int:
    return sum(map(len, waits.values()))


def _fairness_met(ours: Waits, naive: Waits) -> bool:
    return (
        goal_met(_longest(ours), FAIRNESS_MAX_GOAL)
        and goal_met(_spread(ours), FAIRNESS_SPREAD_GOAL)
        and _grants(ours) >= _grants(naive)
    )


def _fairness_meaning(most: int, ours: Waits, naive: Waits) -> str:
    longest, spread = _longest(ours), _spread(ours)
    missed = []
    if not goal_met(longest, FAIRNESS_MAX_GOAL):
        missed.append(f"the longest wait is over {ms(FAIRNESS_MAX_GOAL)}")
    if not goal_met(spread, FAIRNESS_SPREAD_GOAL):
        missed.append("some processes wait far longer than others")
    if _grants(ours) < _grants(naive):
        missed.append("fewer grants than the naive algorithm")
    verdict = (
        "Not met: " + " and ".join(missed) + "."
        if missed
        else "Every process gets its turn within the goal."
    )
    granted = {"ours": _grants(ours), "naive": _grants(naive)}
    return (
        f"At {most} processes the longest wait was {ms(longest)} with pathlock and "
        f"{ms(_longest(naive))} with the naive algorithm; the per-process average waits "
        f"spread {times(spread)} with pathlock and {times(_spread(naive))} with the naive "
        f"algorithm. {verdict} In the same time pathlock granted the path "
        f"{granted['ours']:,} times and the naive algorithm {granted['naive']:,} times"
        + (
            ": taking turns costs a hand-off per grant (experiment 5), while under the naive "
            "algorithm the last holder, asking again at once, mostly wins."
            if granted["ours"] < granted["naive"]
            else "."
        )
    )


def fairness(bench: Bench) -> Section:
    """3: n processes take one path in turn (hold 1 ms, release, ask again at
    once); the wait of every grant, for pathlock and the naive algorithm."""
    settings = bench.settings
    waits, trace = _run_fairness(bench)
    most = max(settings.fairness_processes)
    ours = waits[most, "pathlock"]
    longest, spread = _longest(ours), _spread(ours)
    return Section(
        number=3,
        method="The waiting-time experiment of the Cassandra lock thesis: "
        + ", ".join(map(str, settings.fairness_processes))
        + " worker processes take the same path of one customer in turn: request, hold "
        f"{settings.fairness_hold * 1000:g} ms once granted, release, request again at once, "
        f"for {settings.fairness_seconds:g} s per round; pathlock and the naive algorithm "
        "from the original blog post (`SELECT ... FOR UPDATE`, reverse exponential backoff) "
        f"alternate, {count(settings.fairness_rounds, 'round')} each, each round on a fresh "
        "customer. The wait is the time from request to grant; the spread is the largest "
        "per-process average wait over the smallest.",
        header=(
            "processes",
            "algorithm",
            "grants",
            "grants per process",
            "average wait",
            "max wait",
            "per-process average",
            "spread",
        ),
        rows=[
            _fairness_row(processes, algorithm, waits[processes, algorithm])
            for processes in settings.fairness_processes
            for algorithm in ALGORITHMS
        ],
        goal=f"at {most} processes max wait ≤ {ms(FAIRNESS_MAX_GOAL)}, spread ≤ "
        f"{FAIRNESS_SPREAD_GOAL}× and as many grants as the naive algorithm",
        result=f"max {ms(longest)}, spread {times(spread)}, "
        f"{times(ratio(_grants(ours), _grants(waits[most, 'naive'])))} the naive algorithm's "
        "grants",
        met=_fairness_met(ours, waits[most, "naive"]),
        meaning=_fairness_meaning(most, ours, waits[most, "naive"]),
        trace=trace,
    )


# -- 4. a parent folder among busy children ---------------------------------------------


def _parent_round(
    team: Team, settings: Settings, algorithm: Algorithm, customer_id: int
) -> tuple[float | None, int]:
    """One request of the parent while the children churn: its time to
    grant (``None``: not within the cap) and how many grants the children got."""
    children = settings.parent_children
    team.stop.clear()
    start = team.start_at()
    jobs: dict[int, Job] = {
        index: (
            churn,
            {
                "algorithm": algorithm,
                "customer_id": customer_id,
                "path": f"{PARENT}/c{index + 1}",
                "hold": settings.parent_hold,
                "start_at": start,
            },
        )
        for index in range(children)
    }
    requester = children  # the worker after the children's
    jobs[requester] = (
        request_once,
        {
            "algorithm": algorithm,
            "customer_id": customer_id,
            "path": PARENT,
            "settle": settings.parent_settle,
            "cap": settings.parent_cap,
            "start_at": start,
        },
    )
    team.send(jobs)
    try:
        wait = team.collect([requester])[requester]
    finally:
        team.stop.set()
    results = team.collect(list(range(children)))
    return wait, sum(len(samples) for samples in results.values())


def _time_to_grant(wait: float, cap: float) -> str:
    """A time to grant; infinite stands for "not granted within the cap"."""
    return f"not granted within {cap:g} s" if math.isinf(wait) else ms(wait)


def parent_folder(bench: Bench) -> Section:
    """4: how long a lock on a parent folder waits while processes keep
    locking its children, for pathlock and the naive algorithm."""
    settings = bench.settings
    team = bench.team()
    cap = settings.parent_cap
    # Not granted counts as infinitely long, so the median and max say so.
    waits: dict[str, list[float]] = {algorithm: [] for algorithm in ALGORITHMS}
    child_grants = dict.fromkeys(ALGORITHMS, 0)
    with bench.customers(len(ALGORITHMS) * settings.parent_repeats) as customers:
        fresh = iter(customers)
        for _, algorithm in alternate(settings.parent_repeats, *ALGORITHMS):
            wait, grants = _parent_round(team, settings, algorithm, next(fresh))
            waits[algorithm].append(math.inf if wait is None else wait)
            child_grants[algorithm] += grants

    def row(algorithm: Algorithm) -> Row:
        mine = waits[algorithm]
        return (
            algorithm,
            ", ".join(_time_to_grant(wait, cap) for wait in mine),
            _time_to_grant(median(mine), cap),
            _time_to_grant(max(mine), cap),
            f"{child_grants[algorithm]:,}",
        )

    longest = max(waits["pathlock"])
    met = goal_met(longest, PARENT_GOAL)
    naive_granted = sum(not math.isinf(wait) for wait in waits["naive"])
    return Section(
        number=4,
        method=f"{settings.parent_children} worker processes keep locking children of "
        f"`{PARENT}` (`{PARENT}/c1` …, each its own, hold {settings.parent_hold * 1000:g} ms, "
        f"release, again at once); after {settings.parent_settle:g} s another process requests "
        f"`{PARENT}` (waiting {cap:g} s at most) and releases it once granted. "
        f"{count(settings.parent_repeats, 'request')} per algorithm, pathlock and the naive "
        "algorithm from the original blog post (`SELECT ... FOR UPDATE`, reverse exponential "
        "backoff) alternating, each on a fresh customer.",
        header=("algorithm", "time to grant of the parent", "median", "max", "children's grants"),
        rows=[row(algorithm) for algorithm in ALGORITHMS],
        goal=f"≤ {ms(PARENT_GOAL)}",
        result=_time_to_grant(longest, cap),
        met=met,
        meaning=f"The parent needs a moment when none of the {settings.parent_children} "
        "children is held, unless the children's new requests queue behind it. "
        + ("pathlock granted it within the goal every time" if met else "pathlock did not")
        + f"; the naive algorithm granted {naive_granted} of {len(waits['naive'])} requests "
        f"within {cap:g} s"
        + (
            ", since a poll every 10 ms seldom finds every child free at once."
            if naive_granted < len(waits["naive"])
            else "."
        ),
    )


# -- 5. hand-off latency ------------------------------------------------------------------


def _hold(seconds: float) -> str:
    return f"{seconds * 1000:g} ms"


def _hand_off_round(
    team: Team, algorithm: Algorithm, customer_id: int, hold: float
) -> tuple[float, float] | None:
    """One hand-off from worker 0 to worker 1: the waiter's grant minus the
    moment the holder called its release, and minus the moment the release
    returned (negative if the waiter had it first: the release grants it);
    ``None`` if the holder came late (no hand-off)."""
    start = team.start_at()
    asks = start + WAITER_DELAY
    job = {
        "algorithm": algorithm,
        "customer_id": customer_id,
        "path": PATH,
        "release_at": asks + hold,
    }
    results = team.run(
        {
            0: (hand_off, {**job, "role": "holder", "acquire_at": start}),
            1: (hand_off, {**job, "role": "waiter", "acquire_at": asks}),
        }
    )
    held, called, released = results[0]
    asked, granted = results[1]
    if held > asked or granted < called:
        return None
    return float(granted - called), float(granted - released)


def _latency_rows(algorithm: str, latencies: dict[float, list[tuple[float, float]]]) -> list[Row]:
    def row(hold: str, samples: list[tuple[float, float]]) -> Row:
        called = [since_call for since_call, _ in samples]
        return (
            algorithm,
            hold,
            str(len(samples)),
            ms(percentile(called, 0.5)),
            ms(percentile(called, 0.99)),
            ms(max(called, default=math.nan)),
            ms(percentile([returned for _, returned in samples], 0.5)),
        )

    every = [value for samples in latencies.values() for value in samples]
    return [row("all", every), *(row(_hold(hold), samples) for hold, samples in latencies.items())]


def hand_off_latency(bench: Bench) -> Section:
    """5: from the holder's release to the waiter's grant, across processes."""
    settings = bench.settings
    team = bench.team()
    holds = settings.handoff_holds
    latencies = {
        algorithm: {hold: list[tuple[float, float]]() for hold in holds} for algorithm in ALGORITHMS
    }
    dropped = 0
    with bench.customers(len(ALGORITHMS)) as customers:
        customer = dict(zip(ALGORITHMS, customers, strict=False))
        for number, algorithm in alternate(settings.handoff_rounds, *ALGORITHMS):
            hold = holds[number % len(holds)]
            latency = _hand_off_round(team, algorithm, customer[algorithm], hold)
            if latency is None:
                dropped += 1
            else:
                latencies[algorithm][hold].append(latency)
    medians = {
        algorithm: percentile([v for samples in by_hold.values() for v, _ in samples], 0.5)
        for algorithm, by_hold in latencies.items()
    }
    after_return = {
        algorithm: percentile([v for samples in by_hold.values() for _, v in samples], 0.5)
        for algorithm, by_hold in latencies.items()
    }
    return Section(
        number=5,
        method="One worker process holds a path while another requests it "
        f"{WAITER_DELAY * 1000:g} ms after the grant; the holder releases after holding "
        + " or ".join(map(_hold, holds))
        + " (in turn) past that request. Latency is the waiter's grant time minus the "
        "moment the holder called `release()` (`time.monotonic()` in both processes). "
        f"{count(settings.handoff_rounds, 'round')} per algorithm, pathlock and the naive "
        "algorithm from the original blog post (`SELECT ... FOR UPDATE`, reverse exponential "
        "backoff) alternating"
        + (f"; {count(dropped, 'round')} where the holder came late dropped" if dropped else "")
        + ". With this many rounds p99 is close to the maximum. The last column counts from "
        "the moment `release()` returned instead, without the release itself.",
        header=("algorithm", "hold", "rounds", "p50", "p99", "max", "p50 after the return"),
        rows=[
            row
            for algorithm in ALGORITHMS
            for row in _latency_rows(algorithm, latencies[algorithm])
        ],
        goal=f"p50 ≤ {ms(HANDOFF_GOAL)}",
        result=ms(medians["pathlock"]),
        met=goal_met(medians["pathlock"], HANDOFF_GOAL),
        meaning=f"A released path reaches a waiter in another process after "
        f"{ms(medians['pathlock'])} at the median with pathlock and {ms(medians['naive'])} "
        "with the naive algorithm, counted from the call of `release()` "
        f"({ms(after_return['pathlock'])} and {ms(after_return['naive'])} after it "
        "returned). The naive algorithm's "
        "waiter notices a release at its next poll, so its wait schedule, not the database, "
        "sets its figure. Pathlock's release grants the path to the waiter itself, in a second "
        "round trip before it returns, and the waiter, next in line, checks every millisecond "
        "for what was handed to it.",
    )
