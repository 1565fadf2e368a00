"""The asyncio API, :class:`pathlock.AsyncPathLockManager`: experiments 8
(how late the event loop runs while many tasks take turns on one path) and 9
(an uncontended acquire + release beside the synchronous API's).

The asyncio API runs the synchronous API's code on the event loop, so two
things have to be shown rather than assumed: that tasks waiting for a lock
and handing it on leave the loop free for the rest of the application (a
loop kept busy delays every other request it serves, so the figure is the
lag of a timer on the same loop), and that an application that moves to
asyncio does not pay much more per lock than one thread did (so both APIs
run the same operations in alternating rounds of one run).

Both experiments run in the suite's own process, with no worker processes:
the point is one loop. Each runs on the suite's server and on a temporary
SQLite file, the two database families the asyncio API has drivers for
(asyncmy and aiosqlite, ``pip install 'pathlock[async]'``).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import math
import os
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from importlib.util import find_spec
from pathlib import Path
from typing import Literal

from pathlock import AsyncCustomerLocks, AsyncPathLockManager, PathLockManager
from pathlock.bench.costs import PATH, WARM_UP
from pathlock.bench.database import Server
from pathlock.bench.harness import Bench, alternate
from pathlock.bench.report import Row, Section, goal_met
from pathlock.bench.settings import Settings
from pathlock.bench.stats import count, mean, ms, percentile, ratio, times

LAG_GOAL = 0.005
# Experiment 9's SQLite through aiosqlite: measured beside the goal, not in it.
AIOSQLITE = "SQLite, aiosqlite"
ASYNC_GOAL = 1.2

SYNC_NODE = "pathlock-bench-sync"
ASYNC_NODE = "pathlock-bench-async"
# What the asyncio API needs besides pathlock's own dependencies, and on
# MySQL and MariaDB its driver (psycopg has its own asyncio connection).
DRIVERS = ("greenlet", "aiosqlite")
MYSQL_DRIVER = "asyncmy"
# A request's timeout: no round comes near it, so reaching it means the run broke.
WAIT_LIMIT = 600.0
# Tasks of the untimed round that opens the connections and compiles the
# statements a contended request uses, before the first timed round.
WARM_UP_TASKS = 10
# The part of a round in which a lag counts as the round's start (see _early).
EARLY = 0.1
FULL_COLLECTION = 2  # the garbage collector's oldest generation

Api = Literal["synchronous", "asyncio"]
APIS: tuple[Api, ...] = ("synchronous", "asyncio")


@dataclass(frozen=True, slots=True)
class Database:
    """One database both experiments run on: its name in the report, its
    URL (the synchronous form: the asyncio API maps it to its driver) and a
    customer of its own; ``async_url``, if given, is the asyncio API's URL
    (another way to reach the same database)."""

    name: str
    url: str
    customer_id: int
    async_url: str | None = None

    @property
    def asyncio_url(self) -> str:
        return self.async_url or self.url


def _missing_drivers(server: Server) -> list[str]:
    needed = DRIVERS if server.name == "PostgreSQL" else (*DRIVERS, MYSQL_DRIVER)
    return [name for name in needed if find_spec(name) is None]


def _server_drivers(server: Server) -> tuple[str, str]:
    """The drivers of the synchronous and the asyncio API on ``server``."""
    if server.name == "PostgreSQL":
        return "psycopg", "psycopg's asyncio connection"
    return "PyMySQL", MYSQL_DRIVER


def _skipped(number: int, goal: str, missing: list[str]) -> Section:
    """The section of an experiment that could not run: the report says why
    instead of the whole suite failing after its other experiments."""
    return Section(
        number=number,
        method=f"Not run: the asyncio API needs {', '.join(missing)} "
        "(`pip install 'pathlock[async]'`).",
        header=("missing package",),
        rows=[(f"`{name}`",) for name in missing],
        goal=goal,
        result="not run",
        met=None,
        meaning="Install the asyncio drivers and run the experiment again.",
    )


@contextlib.contextmanager
def databases(bench: Bench) -> Iterator[list[Database]]:
    """The suite's server (a fresh customer, deleted afterwards) and a
    temporary SQLite file (its tables created when a manager first opens it,
    removed with its directory)."""
    server = bench.server.name
    with (
        bench.customers(1) as customers,
        tempfile.TemporaryDirectory(prefix="pathlock-bench-") as directory,
    ):
        yield [
            Database(server, bench.url, customers.start),
            Database("SQLite", f"sqlite:///{Path(directory) / 'locks.sqlite3'}", 1),
        ]


# -- 8. event-loop lag --------------------------------------------------------------


@contextlib.asynccontextmanager
async def probing(
    interval: float, lags: list[float], woke: list[float] | None = None
) -> AsyncIterator[None]:
    """While the block runs, a task of the same loop sleeps ``interval``
    again and again and appends to ``lags`` how late each wake-up came (the
    actual time minus the time it was due), and to ``woke`` when it came
    (``time.monotonic()``, the loop's clock). A timer fires only when the
    step in progress and the steps already due have run, so the lag is how
    long the loop was kept from everything else it serves."""

    async def probe() -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + interval
            await asyncio.sleep(interval)
            now = loop.time()
            lags.append(now - due)
            if woke is not None:
                woke.append(now)

    task = asyncio.create_task(probe())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@contextlib.contextmanager
def full_collections(durations: list[float]) -> Iterator[None]:
    """While the block runs, append to ``durations`` how long each of
    Python's full garbage collections (generation 2) took. A collection
    stops the whole process, its event loop included, for as long as it
    walks every object of the heap: the report tells such pauses apart from
    the locks' own work."""
    started: list[float] = []

    def callback(phase: str, info: dict[str, int]) -> None:
        if info.get("generation") != FULL_COLLECTION:
            return
        if phase == "start":
            started.append(time.monotonic())
        elif started:
            durations.append(time.monotonic() - started.pop())

    gc.callbacks.append(callback)
    try:
        yield
    finally:
        gc.callbacks.remove(callback)


async def take_turns(locks: AsyncCustomerLocks, tasks: int, hold: float) -> None:
    """``tasks`` tasks request the same path exclusively at once; each holds
    it ``hold`` seconds once granted and releases it, so the others wait and
    get it one after another."""

    async def one() -> None:
        lease = await locks.lock_paths(PATH, timeout=WAIT_LIMIT)
        try:
            await asyncio.sleep(hold)
        finally:
            await lease.release()

    await asyncio.gather(*(one() for _ in range(tasks)))


@dataclass(slots=True)
class LoopFigures:
    """One database's figures of experiment 8."""

    idle: list[float] = field(default_factory=list)
    """Lags of the probe alone on the loop: the floor this machine allows."""
    busy: list[float] = field(default_factory=list)
    """Lags of the probe while the tasks took turns."""
    grants: int = 0
    seconds: float = 0.0
    cpu: float = 0.0
    """CPU time of this process over the rounds (every thread of it)."""
    longest_at: float = math.nan
    """When the longest lag of all rounds ended, in seconds since its round began."""
    collections: list[float] = field(default_factory=list)
    """How long each full garbage collection during the rounds took."""

    @property
    def rate(self) -> float:
        return self.grants / self.seconds if self.seconds > 0 else math.nan


async def loop_lag(database: Database, settings: Settings) -> LoopFigures:
    """Experiment 8 on one database: an untimed warm-up round, then rounds
    of the probe on the idle loop followed by the probe during a round of
    the tasks taking turns (the idle figure, measured between the rounds,
    is what the machine's own noise does to the probe)."""
    figures = LoopFigures()
    async with AsyncPathLockManager(database.url, node_id=ASYNC_NODE) as manager:
        locks = manager.for_customer(database.customer_id)
        await take_turns(locks, min(WARM_UP_TASKS, settings.loop_tasks), settings.loop_hold)
        for _ in range(settings.loop_rounds):
            async with probing(settings.loop_interval, figures.idle):
                await asyncio.sleep(settings.loop_idle_seconds)
            lags: list[float] = []
            woke: list[float] = []
            with full_collections(figures.collections):
                async with probing(settings.loop_interval, lags, woke):
                    started, cpu = time.monotonic(), time.process_time()
                    await take_turns(locks, settings.loop_tasks, settings.loop_hold)
                    figures.seconds += time.monotonic() - started
                    figures.cpu += time.process_time() - cpu
            if lags and (not figures.busy or max(lags) > max(figures.busy)):
                figures.longest_at = woke[lags.index(max(lags))] - started
            figures.busy += lags
            figures.grants += settings.loop_tasks
    return figures


def _lag_row(name: str, loop: str, lags: list[float]) -> tuple[str, str, str, str, str, str]:
    return (
        name,
        loop,
        f"{len(lags):,}",
        ms(percentile(lags, 0.5)),
        ms(percentile(lags, 0.99)),
        ms(max(lags, default=math.nan)),
    )


def _lag_meaning(settings: Settings, figures: dict[str, LoopFigures], busy_machine: bool) -> str:
    def each(value: Callable[[LoopFigures], str]) -> str:
        return " and ".join(f"{value(mine)} on {name}" for name, mine in figures.items())

    text = (
        f"While {settings.loop_tasks} tasks waited for one path and took turns, a timer due "
        f"every {settings.loop_interval * 1000:g} ms on the same event loop woke late by "
        + each(lambda mine: ms(percentile(mine.busy, 0.99)))
        + " at p99, and by "
        + each(lambda mine: ms(max(mine.busy, default=math.nan)))
        + " at most; with the loop idle, by "
        + each(lambda mine: ms(percentile(mine.idle, 0.99)))
        + " at p99. The tasks were granted the path "
        + each(lambda mine: f"{mine.rate:,.0f} times a second")
        + "; the CPU time of this process per grant was "
        + each(lambda mine: ms(mine.cpu / mine.grants if mine.grants else math.nan))
        + ". "
    )
    return text + (
        "A waiting task itself costs the loop nothing: it holds no thread and sleeps until a "
        "release wakes it. "
        "The lag comes from the work of the grants, which runs on the loop in steps between "
        "two database calls: a timer that falls due waits for the step in progress and every "
        "step due before it. The longest lag ended "
        + each(
            lambda mine: (
                f"{ms(mine.longest_at)} into its round"
                + (", at its start," if _early(settings, mine) else "")
            )
        )
        + (
            f"; a round starts with all {settings.loop_tasks} requests at once, and each makes "
            "its first step before the timer's turn"
            if any(_early(settings, mine) for mine in figures.values())
            else ""
        )
        + ". Python's full garbage collections, which stop the whole process, ran "
        + each(_collections)
        + " during the rounds."
        + (
            " The machine's cores were busy with other work too (see its load above): the "
            "process is not always running when a step is due."
            if busy_machine
            else ""
        )
    )


def _collections(figures: LoopFigures) -> str:
    """``2 times (the longest 61.0 ms)``, or ``0 times``."""
    spent = figures.collections
    return count(len(spent), "time") + (f" (the longest {ms(max(spent))})" if spent else "")


def _early(settings: Settings, figures: LoopFigures) -> bool:
    """Whether the longest lag came in the first tenth of its round, when
    the requests are made."""
    return figures.longest_at <= EARLY * figures.seconds / settings.loop_rounds


def _load() -> float | None:
    """The load average of the last minute: how busy the machine was with
    other work, which delays every timer (``None`` where the system does
    not tell)."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def _describe_load(load: float | None) -> str:
    if load is None:
        return "unknown"
    return f"{load:.2f} (load average, 1 minute) on {os.cpu_count()} cores"


def event_loop_lag(bench: Bench) -> Section:
    """8: the lag of a timer on the loop while tasks take turns on one path."""
    settings = bench.settings
    goal = f"p99 lag ≤ {ms(LAG_GOAL)} on both databases"
    missing = _missing_drivers(bench.server)
    if missing:
        return _skipped(8, goal, missing)
    load = _load()
    with databases(bench) as chosen:
        figures = {database.name: asyncio.run(loop_lag(database, settings)) for database in chosen}
    rows: list[Row] = []
    for name, mine in figures.items():
        rows.append((*_lag_row(name, "idle", mine.idle), "", ""))
        rows.append(
            (
                *_lag_row(name, f"{settings.loop_tasks} tasks on one path", mine.busy),
                f"{mine.rate:,.0f}/s",
                ms(mine.cpu / mine.grants if mine.grants else math.nan),
            )
        )
    p99s = {name: percentile(mine.busy, 0.99) for name, mine in figures.items()}
    met = all(goal_met(p99, LAG_GOAL) for p99 in p99s.values())
    return Section(
        number=8,
        method=f"One process, one `AsyncPathLockManager`, one event loop: {settings.loop_tasks} "
        f"tasks request `{PATH}` of one customer at once, exclusively; each holds it "
        f"{settings.loop_hold * 1000:g} ms once granted (`await asyncio.sleep`) and releases "
        "it, so they wait and take turns. Meanwhile another task of the loop sleeps "
        f"{settings.loop_interval * 1000:g} ms again and again; its lag is how late each "
        "wake-up comes (actual time minus due time). "
        f"{count(settings.loop_rounds, 'round')} per database after an untimed warm-up round, "
        f"each round after {settings.loop_idle_seconds:g} s of the same timer on the idle loop "
        "(the lag this machine causes by itself). On the suite's server "
        f"({_server_drivers(bench.server)[1]}) and on a "
        "temporary SQLite file (each transaction on the loop's thread, on a worker thread "
        "while the file is busy); CPU is this process's "
        "(every thread) per grant. "
        f"The machine's load when the experiment began: {_describe_load(load)}.",
        header=(
            "database",
            "event loop",
            "wake-ups",
            "p50 lag",
            "p99 lag",
            "max lag",
            "grants/s",
            "CPU per grant",
        ),
        rows=rows,
        goal=goal,
        result=", ".join(f"{name} {ms(p99)}" for name, p99 in p99s.items()),
        met=met,
        meaning=_lag_meaning(
            settings, figures, busy_machine=load is not None and load >= (os.cpu_count() or 1)
        ),
    )


# -- 9. asyncio against the synchronous API -------------------------------------------


def _timed(operation: Callable[[], None], number: int) -> list[float]:
    samples = []
    for _ in range(number):
        started = time.monotonic()
        operation()
        samples.append(time.monotonic() - started)
    return samples


async def _timed_async(locks: AsyncCustomerLocks, number: int) -> list[float]:
    samples = []
    for _ in range(number):
        started = time.monotonic()
        lease = await locks.lock_paths(PATH)
        await lease.release()
        samples.append(time.monotonic() - started)
    return samples


@dataclass(slots=True)
class VersusFigures:
    """One database's figures of experiment 9, per API."""

    samples: dict[Api, list[float]] = field(default_factory=lambda: {api: [] for api in APIS})
    cpu: dict[Api, float] = field(default_factory=lambda: dict.fromkeys(APIS, 0.0))
    """CPU time of this process (every thread of it) over the timed rounds."""

    def cpu_per_operation(self, api: Api) -> float:
        done = len(self.samples[api])
        return self.cpu[api] / done if done else math.nan


def versus(database: Database, settings: Settings) -> VersusFigures:
    """Experiment 9 on one database: the same acquire + release of one path
    of one customer through a ``PathLockManager`` and an
    ``AsyncPathLockManager``, each warmed up, then in alternating rounds.

    The synchronous rounds run with no event loop running, as in a threaded
    application; the asyncio rounds run on one loop kept between rounds
    (``asyncio.Runner``), as in an asyncio application. Each operation is
    timed where its caller sees it: around the call, and inside the loop."""
    figures = VersusFigures()
    with (
        PathLockManager(database.url, node_id=SYNC_NODE) as manager,
        asyncio.Runner() as runner,
    ):
        synchronous = manager.for_customer(database.customer_id)
        asynchronous = AsyncPathLockManager(database.asyncio_url, node_id=ASYNC_NODE)
        try:
            async_locks = asynchronous.for_customer(database.customer_id)

            def sync_operation() -> None:
                synchronous.lock_paths(PATH).release()

            operations: dict[Api, Callable[[int], list[float]]] = {
                "synchronous": lambda number: _timed(sync_operation, number),
                "asyncio": lambda number: runner.run(_timed_async(async_locks, number)),
            }
            for operation in operations.values():
                operation(WARM_UP)
            for _, api in alternate(settings.versus_rounds, *APIS):
                cpu = time.process_time()
                figures.samples[api] += operations[api](settings.versus_per_round)
                figures.cpu[api] += time.process_time() - cpu
        finally:
            runner.run(asynchronous.aclose())
    return figures


def _versus_rows(name: str, figures: VersusFigures) -> list[Row]:
    def row(api: Api, label: str) -> Row:
        samples = figures.samples[api]
        return (
            name,
            label,
            ms(percentile(samples, 0.5)),
            ms(percentile(samples, 0.99)),
            ms(mean(samples)),
            ms(figures.cpu_per_operation(api)),
        )

    sync, aio = figures.samples["synchronous"], figures.samples["asyncio"]
    return [
        row("synchronous", "synchronous: `PathLockManager`"),
        row("asyncio", "asyncio: `AsyncPathLockManager`"),
        (
            name,
            "ratio asyncio / synchronous",
            times(ratio(percentile(aio, 0.5), percentile(sync, 0.5))),
            times(ratio(percentile(aio, 0.99), percentile(sync, 0.99))),
            times(ratio(mean(aio), mean(sync))),
            times(
                ratio(
                    figures.cpu_per_operation("asyncio"), figures.cpu_per_operation("synchronous")
                )
            ),
        ),
    ]


def _versus_meaning(figures: dict[str, VersusFigures], ratios: dict[str, float], met: bool) -> str:
    each = [
        f"{times(ratios[name])} the synchronous API's time on {name} "
        f"({ms(percentile(mine.samples['asyncio'], 0.5))} against "
        f"{ms(percentile(mine.samples['synchronous'], 0.5))})"
        for name, mine in figures.items()
    ]
    text = (
        "At the median, an uncontended acquire + release through the asyncio API took "
        + (", ".join(each[:-1]) + " and " + each[-1] if len(each) > 1 else each[0])
        + ". "
    )
    if met:
        return text + (
            "An application that moves to asyncio pays little more per lock than a thread did."
        )
    return text + (
        "Both APIs run the same code and the same SQL; the asyncio API adds the "
        "event loop's work around each database call (a request and a release each run in a "
        "task of the manager's own, and every call into the driver goes through the loop); "
        "both send the same two round trips to the server. On SQLite each "
        "transaction runs whole on the loop's own thread (on a worker thread only while the "
        "file is busy). Through aiosqlite (the last rows, beside the goal, not part of it), "
        "which runs SQLite on a thread of its own, every call of the driver (cursor, "
        "execute, fetch, close, commit, the pool's rollback) is a hand-off of its own."
    )


def async_against_sync(bench: Bench) -> Section:
    """9: an uncontended acquire + release, asyncio API beside synchronous API."""
    settings = bench.settings
    goal = f"asyncio ≤ {ASYNC_GOAL}× the synchronous API at p50 on both databases"
    missing = _missing_drivers(bench.server)
    if missing:
        return _skipped(9, goal, missing)
    with databases(bench) as chosen:
        sqlite = chosen[-1]
        through_aiosqlite = Database(
            AIOSQLITE,
            sqlite.url,
            sqlite.customer_id,
            async_url=sqlite.url.replace("sqlite://", "sqlite+aiosqlite://", 1),
        )
        figures = {
            database.name: versus(database, settings) for database in [*chosen, through_aiosqlite]
        }
    ratios = {
        name: ratio(
            percentile(mine.samples["asyncio"], 0.5),
            percentile(mine.samples["synchronous"], 0.5),
        )
        for name, mine in figures.items()
    }
    met = all(goal_met(value, ASYNC_GOAL) for name, value in ratios.items() if name != AIOSQLITE)
    samples = len(next(iter(figures.values())).samples["asyncio"])
    sync_driver, async_driver = _server_drivers(bench.server)
    return Section(
        number=9,
        method="One thread, one customer: `locks.lock_paths("
        f"{PATH!r}).release()` through a `PathLockManager`, beside `lease = await "
        f"locks.lock_paths({PATH!r}); await lease.release()` through an "
        "`AsyncPathLockManager` on one event loop (the synchronous rounds run with no loop "
        "running); both managers with default settings, on the same customer. "
        f"{samples:,} samples of each per database, in alternating rounds after a warm-up "
        f"of each. On the suite's server ({sync_driver} beside {async_driver}) and on a "
        "temporary SQLite file (the standard library's sqlite3 in both APIs, each asyncio "
        "transaction on the loop's thread); then the same SQLite file with the asyncio API "
        "through aiosqlite (a `sqlite+aiosqlite://` URL), for comparison. CPU is this "
        "process's (every thread) per operation.",
        header=("database", "API", "p50", "p99", "mean", "CPU per operation"),
        rows=[row for name, mine in figures.items() for row in _versus_rows(name, mine)],
        goal=goal,
        result=", ".join(
            f"{name} {times(value)}" for name, value in ratios.items() if name != AIOSQLITE
        ),
        met=met,
        meaning=_versus_meaning(figures, ratios, met),
    )
