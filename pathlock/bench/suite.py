"""Run the benchmark suite: the selected experiments in order, each printed
as it completes, then the report (``docs/BENCHMARKS.md``) and its plot."""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

from sqlalchemy import create_engine, make_url
from sqlalchemy.exc import SQLAlchemyError

from pathlock import PathLockManager
from pathlock.bench import EXPERIMENTS, PLOT_NAME, BenchError, asyncio_api, contention, costs
from pathlock.bench.database import Server, create_floor_table, describe_server, drop_floor_table
from pathlock.bench.harness import Bench
from pathlock.bench.plot import plot_fairness
from pathlock.bench.report import Section, render_report, render_section
from pathlock.bench.settings import FULL, QUICK

RUNS: dict[int, Callable[[Bench], Section]] = {
    1: costs.uncontended,
    2: costs.throughput,
    3: contention.fairness,
    4: contention.parent_folder,
    5: contention.hand_off_latency,
    6: costs.scale,
    7: costs.reaping,
    8: asyncio_api.event_loop_lag,
    9: asyncio_api.async_against_sync,
    10: costs.detached,
}


def run(
    *,
    url: str,
    only: Sequence[int] = (),
    quick: bool = False,
    output: Path | None,
    write: Callable[[str], None],
) -> None:
    """Run the experiments ``only`` names (all by default), printing each
    section through ``write``; write the report to ``output`` (and the plot
    beside it) unless it is ``None``."""
    settings = QUICK if quick else FULL
    selected = sorted(set(only)) if only else sorted(EXPERIMENTS)
    engine = create_engine(url, isolation_level="READ COMMITTED", pool_reset_on_return=None)
    if engine.dialect.name not in {"mysql", "mariadb", "postgresql"}:
        engine.dispose()
        raise BenchError(
            "the benchmarks measure a MySQL, MariaDB or PostgreSQL server, not "
            f"{engine.dialect.name}"
        )
    date = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    try:
        server = describe_server(engine)
        create_floor_table(engine)
        try:
            with PathLockManager(url, node_id="pathlock-bench") as manager:
                manager.create_schema()
                bench = Bench(
                    url, settings, engine, manager, server, write, settings.workers(selected)
                )
                try:
                    sections = [_run_one(bench, number, output) for number in selected]
                finally:
                    bench.close()
        finally:
            drop_floor_table(engine)
    except SQLAlchemyError as error:
        # The driver's own message: one line, without SQLAlchemy's statement dump.
        raise BenchError(f"database error: {getattr(error, 'orig', None) or error}") from error
    finally:
        engine.dispose()
    if output is not None:
        report = render_report(
            date=date,
            environment=_environment(url, server),
            settings=settings,
            sections=sections,
            server=server.name,
        )
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(report, encoding="utf-8")
        write(f"-- report written to {output}")


def _run_one(bench: Bench, number: int, output: Path | None) -> Section:
    """Run experiment ``number`` and print its section (with the plot's note)."""
    bench.say(f"-- experiment {number}: {EXPERIMENTS[number]}")
    started = time.monotonic()
    section = RUNS[number](bench)
    if section.trace is not None:
        section.notes.append(_plot(section, output, bench.settings.fairness_hold))
    bench.say(render_section(section))
    bench.say(f"-- experiment {number} took {time.monotonic() - started:.1f} s\n")
    return section


def plot_name(output: Path) -> str:
    """The fairness plot's file name beside the report ``output``: the
    suite's own for a report named as ``docs/BENCHMARKS.md``, else one named
    after the report (a PostgreSQL page beside it keeps its own plot)."""
    if output.name == "BENCHMARKS.md":
        return PLOT_NAME
    return f"{output.stem.lower()}-fairness.png"


def _plot(section: Section, output: Path | None, hold: float) -> str:
    """The section's note on the plot: a link, or why there is none."""
    if output is None:
        return "The fairness plot was skipped: no report is written (`--no-report`)."
    if section.trace is None:
        return "No fairness plot: no trace."
    processes = len({grant[0] for grants in section.trace.values() for grant in grants})
    name = plot_name(output)
    skipped = plot_fairness(section.trace, output.parent / name, processes=processes, hold=hold)
    if skipped is not None:
        return f"The fairness plot was skipped: {skipped}."
    return (
        f"![Wait of every grant over time, {processes} processes, pathlock beside the naive "
        "algorithm]"
        f"({name})\n\nEach dot is one grant at {processes} processes, placed at its time "
        "in the round and its wait; one colour per process. Fair waiting shows as bands of "
        "the same height for every colour."
    )


def _memory() -> str:
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):  # not every system names these
        return "unknown RAM"
    return f"{total / 2**30:.1f} GiB RAM"


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "not installed"


def _environment(url: str, server: Server) -> list[tuple[str, str]]:
    where = make_url(url)
    return [
        ("machine", f"{os.cpu_count()} cores, {_memory()}, {platform.platform()}"),
        ("Python", f"{platform.python_implementation()} {platform.python_version()}"),
        ("SQLAlchemy", _version("SQLAlchemy")),
        *_drivers(server),
        ("pathlock", _version("pathlock")),
        ("server", f"{server.name} {server.version} at {where.host}:{server.port}"),
        server.durability,
    ]


def _drivers(server: Server) -> list[tuple[str, str]]:
    if server.name == "PostgreSQL":
        return [("psycopg", _version("psycopg")), ("aiosqlite", _version("aiosqlite"))]
    return [
        ("PyMySQL", _version("PyMySQL")),
        ("asyncmy, aiosqlite", f"{_version('asyncmy')}, {_version('aiosqlite')}"),
    ]
