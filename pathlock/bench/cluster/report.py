"""The markdown report of a run (default ``docs/BENCHMARKS-CLUSTER.md``) and
the sentences that read its figures."""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

from pathlock.bench.stats import mean, percentile, times

from .figures import milliseconds
from .settings import BUSY_BEFORE, CUSTOMERS, HOT_CUSTOMER, HOT_PATH, SEPARATOR, TREE

if TYPE_CHECKING:
    from datetime import datetime
    from pathlib import Path

    from .figures import Run, Solo, Variant

DASH = "\N{EN DASH}"

WRITTEN_BY = (
    "Written by `pathlock/bench/cluster/` (run it from the root of a checkout of the "
    "repository to refresh this page: `.venv/bin/python -m pathlock.bench.cluster`; "
    "`--quick` is a smoke test whose figures mean little). It starts a private 3-node "
    "MariaDB Galera cluster on 127.0.0.1 (`servers/galera_cluster.py`), migrates "
    "pathlock's schema through node 1, runs the experiments below and stops the cluster. "
    "Every comparison is measured side by side in the same run, its variants alternating "
    "in rounds; the ratios count more than the absolute times."
)
HOW = (
    "How: six client processes (spawned, started once), client *i* lists the nodes "
    "starting from node *i* mod 3 (two clients per node: an app server lists its nearest "
    "node first). For each round every client builds its own "
    "`PathLockManager(nodes, node_id=f'bench-{i}', affinity=..., ttl=30)`, opens its "
    "connections, waits at a barrier with the others, runs for the round's time and "
    "closes the manager. A request is `with locks.lock_paths(..., timeout=30): "
    "time.sleep(0.001)`. Grants count when granted before the round's end; the latency "
    "is from the call to the grant. *Lost races* are the certification failures and "
    "deadlocks (error 1213) pathlock retried, counted from its WARNING lines on "
    "`pathlock.store` (`lost a race`; in brackets the number of lines: pathlock logs the "
    "first five of one request, then the 8th, 16th, ..., and the figure outside the "
    "brackets adds those up from the counts in the lines)."
)
OVERLAPPING_HOLDS = (
    "*Overlapping holds*: over every hold of the path in a round (from the grant to just "
    "before the release, by the system-wide monotonic clock), how many began before an "
    "earlier one ended. Must be 0."
)
SOLO_HOW = (
    "One client, one customer: `with locks.lock_paths(fresh_path): pass`, timed "
    "around the whole acquire + release, the variants alternating in rounds. "
    "*causal reads off* is pathlock on an engine of the benchmark's own, made like "
    "pathlock's (READ COMMITTED, two statements per round trip, no reset on return to "
    "the pool) but with `init_command` `SET SESSION wsrep_sync_wait=0`; pathlock uses "
    "an engine passed in as it is. The wsrep_sync_wait column is what the sessions "
    "actually had."
)


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines.extend("| " + " | ".join(row) + " |" for row in rows)
    return "\n".join(lines)


def variant_table(variants: Sequence[Variant], *, check: bool) -> str:
    header = [
        "variant",
        "grants/s",
        "grants per client (nodes 1, 2, 3, 1, 2, 3 first)",
        f"min{DASH}max",
        "p50 acquire",
        "p99 acquire",
        "LockTimeout",
        "BackendError",
        "lost races (log lines)",
        "cores busy",
    ]
    others = any(variant.other_errors() for variant in variants)
    if others:
        header.append("other errors")
    if check:
        header.append("overlapping holds")
    rows = []
    for variant in variants:
        row = [
            variant.name,
            f"{variant.rate:.0f}",
            SEPARATOR.join(map(str, variant.per_client)),
            f"{min(variant.per_client)}{DASH}{max(variant.per_client)}",
            milliseconds(percentile(variant.latencies, 0.5)),
            milliseconds(percentile(variant.latencies, 0.99)),
            str(variant.errors_of("LockTimeout")),
            str(variant.errors_of("BackendError")),
            f"{variant.races} ({variant.race_lines})",
            f"{mean(variant.cpu):.0%}" if variant.cpu else "n/a",
        ]
        if others:
            row.append(
                ", ".join(
                    f"{count} {name}"
                    for name, count in variant.errors.items()
                    if not name.startswith(("LockTimeout", "BackendError"))
                )
                or "0"
            )
        if check:
            row.append(str(variant.overlaps))
        rows.append(row)
    return table(header, rows)


def reading_hot(without: Variant, with_: Variant) -> str:
    def spread(variant: Variant) -> str:
        low, high = min(variant.per_client), max(variant.per_client)
        return f"{low} to {high} grants per client"

    if without.rate:
        text_ = (
            f"With affinity the six clients got {with_.rate:.0f} grants/s against "
            f"{without.rate:.0f} without ({times(with_.rate / without.rate)}); "
        )
    else:
        text_ = f"With affinity the six clients got {with_.rate:.0f} grants/s, without none; "
    text_ += f"{spread(with_)} with affinity, {spread(without)} without."
    if with_.rate < without.rate and min(with_.per_client) > min(without.per_client):
        text_ += (
            " Affinity bought fairness and an end to lost races here, not throughput: "
            "with it every client waits its turn in the queue on one node, without it "
            "the clients listing the winning node first took most of the grants."
        )
    text_ += (
        f" Without affinity the clients lost {without.races} races "
        f"({without.race_lines} log lines) and failed "
        f"{without.errors_of('LockTimeout')} times with LockTimeout and "
        f"{without.errors_of('BackendError')} times with BackendError; with affinity "
        f"{with_.races} races ({with_.race_lines} lines), "
        f"{with_.errors_of('LockTimeout')} LockTimeout and "
        f"{with_.errors_of('BackendError')} BackendError."
    )
    text_ += (
        f" Acquire latency p50/p99: {milliseconds(percentile(without.latencies, 0.5))} / "
        f"{milliseconds(percentile(without.latencies, 0.99))} without, "
        f"{milliseconds(percentile(with_.latencies, 0.5))} / "
        f"{milliseconds(percentile(with_.latencies, 0.99))} with affinity."
    )
    overlaps = without.overlaps + with_.overlaps
    disorder = without.disorder + with_.disorder
    text_ += (
        f" Safety check over {without.grants + with_.grants} holds (and those granted just "
        f"after the end of a round): {overlaps} overlapping holds, {disorder} fencing tokens "
        "out of grant order."
    )
    return text_


def reading_many(variants: Sequence[Variant]) -> str:
    without, with_, single = variants
    best = max(variants, key=lambda variant: variant.rate)
    sentences = [
        f"Throughput: {without.rate:.0f} grants/s without affinity, {with_.rate:.0f} with, "
        f"{single.rate:.0f} through a single writer; the most is {best.name}.",
        f"Lost races: {without.races} without affinity, {with_.races} with, {single.races} "
        "through a single writer (on one node a conflict is a row-lock wait, not a race).",
        f"p99 acquire: {milliseconds(percentile(without.latencies, 0.99))} without, "
        f"{milliseconds(percentile(with_.latencies, 0.99))} with, "
        f"{milliseconds(percentile(single.latencies, 0.99))} single writer.",
    ]
    failures = sum(v.errors_of("LockTimeout") + v.errors_of("BackendError") for v in variants)
    sentences.append(
        "No request failed."
        if failures == 0
        else f"{failures} requests failed in all (see the table for which variant)."
    )
    return " ".join(sentences)


def reading_solo(solo: Solo) -> str:
    parts = []
    galera_plain = solo.ratio("galera", "plain", 0.5)
    if not math.isnan(galera_plain):
        parts.append(
            f"An uncontended acquire + release through a Galera node takes "
            f"{times(galera_plain)} as long as on the plain server at the median "
            f"({milliseconds(solo.p('galera', 0.5))} against "
            f"{milliseconds(solo.p('plain', 0.5))}): every commit is replicated to and "
            "certified by the other two nodes first."
        )
    causal = solo.ratio("galera", "galera-nocausal", 0.5)
    if not math.isnan(causal):
        parts.append(
            f"Causal reads on cost {times(causal)} of causal reads off at the median "
            f"({milliseconds(solo.p('galera', 0.5))} against "
            f"{milliseconds(solo.p('galera-nocausal', 0.5))}), "
            f"{times(solo.ratio('galera', 'galera-nocausal', 0.99))} at p99."
        )
    return " ".join(parts)


def introduction() -> list[str]:
    return [
        "# Benchmarks on a Galera cluster",
        "",
        WRITTEN_BY,
        "",
        f"**The three nodes, the plain server and the client processes all share the "
        f"machine's {os.cpu_count()} cores**: a real cluster has a machine per node and "
        "network round trips between them, so absolute figures here are not a deployment's. "
        "What they do show is how the variants compare under the same load.",
        "",
    ]


def run_section(
    run: Run,
    *,
    started: datetime,
    elapsed: float,
    settings: list[tuple[str, str]],
    environment: list[tuple[str, str]],
) -> list[str]:
    """When and where the run was, with what settings, and how it measures."""
    busy = [
        f"Other work was running when the run began (the cores were "
        f"{run.busy_before:.0%} busy in the second before the cluster started): "
        "the rounds are noisy; compare the variants, each measured in alternating "
        "rounds.",
        "",
    ]
    return [
        f"## The run of {started:%Y-%m-%d %H:%M} UTC ({elapsed:.0f} s in all)",
        "",
        *(busy if run.busy_before > BUSY_BEFORE else []),
        table(["", ""], [(f"**{name}**", value) for name, value in environment]),
        "",
        "Settings:",
        "",
        *(f"- {name}: {value}" for name, value in settings),
        "",
        HOW,
        "",
    ]


def hot_section(run: Run) -> list[str]:
    return [
        "## 1. Hot path: six clients, one path of one customer",
        "",
        f"All six clients lock `{HOT_PATH}` of customer {HOT_CUSTOMER} over and over. "
        f"{run.homes[0]}.",
        "",
        variant_table(run.hot, check=True),
        "",
        OVERLAPPING_HOLDS,
        "",
        reading_hot(*run.hot),
        "",
    ]


def many_section(run: Run) -> list[str]:
    return [
        "## 2. Many customers",
        "",
        f"Each client picks a random customer out of {len(CUSTOMERS)} and locks 1 or 2 "
        f"random paths out of {len(TREE)} (`/d0/f0` to `/d3/f3`) of it. *single writer*: "
        "every client lists the nodes in the same order (node 1 first), without affinity, so "
        f"all traffic goes through node 1. {run.homes[1]}.",
        "",
        variant_table(run.many, check=False),
        "",
        reading_many(run.many),
        "",
    ]


def solo_section(run: Run) -> list[str]:
    lines = ["## 3. Uncontended latency", ""]
    if run.solo is not None:
        lines += [
            SOLO_HOW,
            "",
            solo_table(run.solo),
            "",
            solo_ratios(run.solo),
            "",
            reading_solo(run.solo),
        ]
    if run.solo_note:
        lines += ["", run.solo_note]
    return lines


def solo_table(solo: Solo) -> str:
    rows = []
    for name, label in solo.labels.items():
        if name not in solo.samples:
            continue
        values = solo.samples[name]
        rows.append(
            [
                label,
                solo.sync_wait.get(name, "n/a"),
                str(len(values)),
                milliseconds(percentile(values, 0.5)),
                milliseconds(percentile(values, 0.99)),
                milliseconds(mean(values)),
            ]
        )
    return table(["variant", "wsrep_sync_wait", "samples", "p50", "p99", "mean"], rows)


def solo_ratios(solo: Solo) -> str:
    comparisons = [
        ("Galera node (causal reads) / plain server", "galera", "plain"),
        ("Galera node without causal reads / plain server", "galera-nocausal", "plain"),
        ("causal reads on / off (Galera node)", "galera", "galera-nocausal"),
    ]
    return table(
        ["ratio", "p50", "p99"],
        [
            [
                label,
                times(solo.ratio(top, bottom, 0.5)),
                times(solo.ratio(top, bottom, 0.99)),
            ]
            for label, top, bottom in comparisons
        ],
    )


def warnings_section(run: Run) -> list[str]:
    """pathlock's warnings other than lost races, if there were any."""
    warnings = Counter[str]()
    samples: list[str] = []
    for variant in (*run.hot, *run.many):
        warnings.update(variant.warnings)
        samples.extend(variant.samples)
    if not warnings:
        return []
    return [
        "",
        "## Other warnings",
        "",
        "pathlock WARNING lines other than lost races, by message, over experiments 1 and 2:",
        "",
        table(["message", "count"], [[f"`{m}`", str(n)] for m, n in warnings.most_common()]),
        "",
        "Examples:",
        "",
        *(f"- `{sample}`" for sample in samples[:3]),
    ]


def write_report(
    path: Path,
    *,
    started: datetime,
    elapsed: float,
    settings: list[tuple[str, str]],
    environment: list[tuple[str, str]],
    run: Run,
) -> None:
    lines = [
        *introduction(),
        *run_section(
            run, started=started, elapsed=elapsed, settings=settings, environment=environment
        ),
        *hot_section(run),
        *many_section(run),
        *solo_section(run),
        *warnings_section(run),
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
