"""The figures as markdown: one section per experiment, and the page
``docs/BENCHMARKS.md`` around them."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from pathlock.bench import EXPERIMENTS
from pathlock.bench.settings import Settings

Row = tuple[str, ...]
Trace = dict[str, list[tuple[int, float, float]]]
"""Per algorithm, every grant as (process, seconds since the round began, wait)."""

INTRO = """\
Figures come from the benchmark suite, `pathlock bench` (also
`python -m pathlock bench`), never from timed assertions in tests. Each figure is measured
beside its baseline in the same run, in alternating rounds where that makes sense, and the
ratio is what counts: these machines are shared and noisy. The suite writes this page; run it
again to refresh it (`pathlock bench --help`; `--quick` is a smoke test whose figures mean
nothing). Many requests waiting on one customer are measured by `python -m pathlock.bench.crowd`,
beside the suite: `docs/BENCHMARKS-CROWD.md`; waiters woken by PostgreSQL's notices by
`python -m pathlock.bench.notices`: `docs/BENCHMARKS-NOTICES.md`. The suite measures a
MySQL, MariaDB or PostgreSQL server: `docs/BENCHMARKS.md` is MariaDB's page,
`docs/BENCHMARKS-POSTGRESQL.md` PostgreSQL's (`pathlock bench --url
postgresql+psycopg://... --output docs/BENCHMARKS-POSTGRESQL.md`).

How the figures are taken:

- Concurrent clients are worker processes started with the `spawn` method (fresh interpreters,
  like app servers' processes), started once before the first experiment. Each has its own
  `PathLockManager` with default settings and its own connections.
- Experiments 8 and 9 measure the asyncio API, `AsyncPathLockManager`
  (`pip install 'pathlock[async]'`), in the suite's own process, on the server (through asyncmy
  on MySQL and MariaDB, psycopg's asyncio connection on PostgreSQL) and on a temporary SQLite
  file (each transaction on the loop's thread; experiment 9 also through aiosqlite), each
  beside its baseline on the same database: the idle event loop, and the synchronous
  `PathLockManager`.
- Times that cross processes (a request in one, a release in another) are `time.monotonic()`:
  on Linux `CLOCK_MONOTONIC` is one clock for the whole system, so they compare directly.
- Every experiment works in fresh random customer ids and deletes its rows afterwards, bulk
  rows included. Experiment 7 reaps every expired row of the database, as `pathlock reap`
  does: run the suite against a database of its own.
- The floor of experiments 1 and 2 is what an acquire + release cannot cost less than: two
  single-row `UPDATE`s in autocommit mode on a scratch table of the same server, over the same
  driver, each one round trip and one durable commit.
- Beside pathlock in experiments 1 to 5, *naive* is the naive algorithm from the original blog
  post (`SELECT ... FOR UPDATE`, reverse exponential backoff; `pathlock/bench/naive.py`) on the
  same tables and conflict query: one transaction per attempt that locks the customer's
  sentinel row (`SELECT ... FOR UPDATE`), looks for conflicting live rows and inserts its rows
  or rolls back; a denied request sleeps the original blog post's reverse exponential backoff
  (250 ms, 15.8 ms, then 10 ms, no jitter) and tries again. No queue, no version watch, no
  wake-ups. A release deletes the rows and commits.
"""


@dataclass(slots=True)
class Section:
    """One experiment's figures, its goal and what they mean."""

    number: int
    method: str
    header: Row
    rows: list[Row]
    goal: str
    result: str
    met: bool | None
    meaning: str
    notes: list[str] = field(default_factory=list)
    trace: Trace | None = None

    @property
    def title(self) -> str:
        return EXPERIMENTS[self.number]


def verdict(met: bool | None) -> str:
    return "—" if met is None else ("met" if met else "**not met**")


def goal_met(value: float, limit: float, *, at_least: bool = False) -> bool:
    """Whether ``value`` is within ``limit`` (a NaN, from no samples, is not)."""
    if math.isnan(value):
        return False
    return value >= limit if at_least else value <= limit


def table(header: Row, rows: Sequence[Row]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines.extend("| " + " | ".join(row) + " |" for row in rows)
    return lines


def render_section(section: Section) -> str:
    lines = [
        f"## {section.number}. {section.title}",
        "",
        section.method,
        "",
        *table(section.header, section.rows),
        "",
        f"Goal: {section.goal}. Result: {section.result}, {verdict(section.met)}.",
        "",
        section.meaning,
    ]
    for note in section.notes:
        lines.extend(["", note])
    return "\n".join(lines) + "\n"


def render_report(
    *,
    date: str,
    environment: list[tuple[str, str]],
    settings: Settings,
    sections: list[Section],
    server: str = "MariaDB",
) -> str:
    """The page: its title names ``server`` where it is not MySQL or MariaDB
    (the page of ``docs/BENCHMARKS.md``)."""
    numbers = [section.number for section in sections]
    summary = [(str(s.number), s.title, s.goal, s.result, verdict(s.met)) for s in sections]
    title = "# Benchmarks" if server in {"MariaDB", "MySQL"} else f"# Benchmarks on {server}"
    parts = [
        title,
        "",
        INTRO,
        f"## The run of {date}",
        "",
        *table(("", ""), [(f"**{name}**", value) for name, value in environment]),
        "",
        "Sizes"
        + (" (`--quick`: a smoke test, the figures mean nothing):" if settings.quick else ":"),
        "",
        *settings.describe(),
        "",
    ]
    if numbers != sorted(EXPERIMENTS):
        parts += [f"Only experiments {', '.join(map(str, numbers))} ran (`--only`).", ""]
    parts += [
        "## Summary",
        "",
        *table(("#", "experiment", "goal", "result", "goal met"), summary),
        "",
    ]
    return "\n".join(parts) + "\n" + "\n".join(render_section(s) for s in sections)
