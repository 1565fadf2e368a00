"""The benchmark suite runs end to end and writes its report.

A smoke test only: ``pathlock bench --quick`` against the MariaDB test server,
as a real process (its workers are spawned processes). Nothing here looks at a
timed figure: those come from the suite's report, never from timed assertions.
What is no matter of speed is checked: the rows each section must have, and
the round trips an acquire + release sends, which are counts.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import psycopg
import pymysql.connections
import pytest
from sqlalchemy import create_engine, func, inspect, select, text

from pathlock import PathLockManager
from pathlock.bench import EXPERIMENTS, PLOT_NAME, BenchError
from pathlock.bench.costs import NAMES
from pathlock.bench.database import (
    FLOOR_TABLE,
    Floor,
    create_floor_table,
    customers_of,
    drop_floor_table,
    floor_engine,
    round_trips,
)
from pathlock.bench.naive import NaiveLocks
from pathlock.bench.stats import times
from pathlock.schema import path_lock_waiters, path_locks

pytestmark = pytest.mark.timeout(150)

ROOT = Path(__file__).resolve().parents[2]
# The console script installed beside this interpreter (`pip install -e .`).
PATHLOCK_SCRIPT = Path(sys.executable).with_name("pathlock")


def test_bench_help_from_the_command_and_python_m_pathlock() -> None:
    command = subprocess.run(
        [str(PATHLOCK_SCRIPT), "bench", "--help"], capture_output=True, text=True, check=False
    )
    assert command.returncode == 0, command.stderr
    assert "--quick" in command.stdout
    module = subprocess.run(
        [sys.executable, "-m", "pathlock", "bench", "--help"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert module.returncode == 0, module.stderr
    assert module.stdout == command.stdout


@pytest.mark.parametrize(
    "module", ["pathlock.bench.cluster", "pathlock.bench.heartbeat", "pathlock.bench.notices"]
)
def test_the_other_benchmarks_help(module: str) -> None:
    """The cluster and heartbeat benchmarks live in the one tree too: their
    command lines answer ``--help`` without a database."""
    run = subprocess.run(
        [sys.executable, "-m", module, "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert f"python -m {module}" in run.stdout


def test_the_notices_benchmark_compares_both_ways_of_waiting(postgresql_url: str) -> None:
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pathlock.bench.notices",
            f"--url={postgresql_url}",
            "--rounds=2",
            "--holds=0.005",
            "--processes=2",
            "--seconds=0.3",
            "--blocks=2",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert "### Hand-off" in run.stdout
    assert "### Hot path" in run.stdout
    rows = [line for line in run.stdout.splitlines() if line.startswith(("| notices", "| polling"))]
    assert len(rows) == 4


def _quick_run(url: str, report: Path, *more: str) -> tuple[subprocess.CompletedProcess[str], str]:
    """``pathlock bench --quick`` against ``url``, as a real process, its
    report written to ``report``: the run (which must have succeeded) and
    the report's text."""
    run = subprocess.run(
        [
            *(sys.executable, "-m", "pathlock", "bench", "--quick", *more),
            *("--url", url, "--output", str(report)),
        ],
        capture_output=True,
        text=True,
        timeout=140,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr
    return run, report.read_text(encoding="utf-8")


def test_quick_run_reports_every_experiment_and_cleans_up(mariadb_url: str, tmp_path: Path) -> None:
    report = tmp_path / "docs" / "BENCHMARKS.md"
    run, text = _quick_run(mariadb_url, report)
    for number, title in EXPERIMENTS.items():
        heading = f"## {number}. {title}"
        assert heading in text
        assert heading in run.stdout
    assert "innodb_flush_log_at_trx_commit" in text
    # The asyncio API's experiments ran on the server and on their SQLite
    # file, not skipped for want of the asyncio drivers (the test extra has them).
    for number in (8, 9):
        section = text.split(f"\n## {number}. ")[1].split("\n## ", maxsplit=1)[0]
        assert "| MariaDB |" in section or "| MySQL |" in section, section
        assert "| SQLite |" in section, section
    # Beside the SQLite file's default (a worker thread), aiosqlite for comparison.
    assert "| SQLite, aiosqlite |" in text.split("\n## 9. ")[1], text
    _check_floor_naive_and_pathlock(text)
    # The plot needs the optional matplotlib: drawn and linked, or said to be skipped.
    plotted = (report.parent / PLOT_NAME).is_file()
    assert plotted == (f"]({PLOT_NAME})" in text)
    assert plotted or "plot was skipped" in text

    engine = create_engine(mariadb_url)
    try:
        with engine.connect() as connection:
            for table in (path_locks, path_lock_waiters):
                left = connection.execute(
                    select(func.count()).where(table.c.node_id.like("pathlock-bench%"))
                ).scalar_one()
                assert left == 0, f"{table.name} keeps {left} rows of the benchmark"
        assert not inspect(engine).has_table(FLOOR_TABLE)
    finally:
        engine.dispose()


def test_quick_run_on_postgresql(postgresql_url: str, tmp_path: Path) -> None:
    """The suite on PostgreSQL: what differs from MariaDB (the floor's table,
    round trips through psycopg, the server's processes and durability
    setting, the asyncio driver), in the experiments that use it."""
    report = tmp_path / "BENCHMARKS-POSTGRESQL.md"
    _, text = _quick_run(postgresql_url, report, "--only", "1,2,9")
    assert text.startswith("# Benchmarks on PostgreSQL\n")
    assert "| **synchronous_commit** |" in text
    assert "| **psycopg** |" in text
    _check_floor_naive_and_pathlock(text)
    assert "| PostgreSQL |" in text.split("\n## 9. ")[1]
    engine = create_engine(postgresql_url)
    try:
        assert not inspect(engine).has_table(FLOOR_TABLE)
    finally:
        engine.dispose()


def _table(text: str, number: int) -> dict[str, dict[str, str]]:
    """Section ``number``'s table of the report: its rows by their first
    cell, each a dict from column heading to cell."""
    section = text.split(f"\n## {number}. ")[1].split("\n## ", maxsplit=1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[2:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        rows[cells[0]] = dict(zip(header, cells, strict=True))
    return rows


def _check_floor_naive_and_pathlock(text: str) -> None:
    """Experiments 1 and 2 measure the floor, the naive algorithm and
    pathlock side by side; 1 counts each one's round trips (the figures of
    speed are the report's business, not this test's)."""
    uncontended = _table(text, 1)
    assert list(uncontended) == list(NAMES.values()), uncontended
    trips = {name: row["round trips"] for name, row in uncontended.items()}
    assert trips[NAMES["floor"]] == "2", trips
    assert trips[NAMES["pathlock"]] == "2", trips
    assert float(trips[NAMES["naive"]]) > 2, trips
    for row in uncontended.values():
        assert row["p50"].endswith(" ms"), row
        assert row["client CPU"].endswith(" ms"), row
        assert row["server CPU"] == "n/a" or row["server CPU"].endswith(" ms"), row
    assert uncontended[NAMES["floor"]]["p50 ÷ floor"] == times(1.0)
    throughput = _table(text, 2)
    assert list(throughput) == list(NAMES.values()), throughput
    for row in throughput.values():
        assert int(row["cycles"].replace(",", "")) > 0, row
        assert row["server CPU per cycle"] == "n/a" or row["server CPU per cycle"].endswith(
            " ms"
        ), row
    assert throughput[NAMES["floor"]]["cycles/s ÷ floor"] == times(1.0)


@pytest.mark.parametrize("server", ["mariadb", "postgresql"])
def test_round_trips_per_acquire_and_release(server: str, request: pytest.FixtureRequest) -> None:
    """What experiment 1 counts: the floor's acquire + release is two
    autocommit UPDATEs, one round trip each and both committed; pathlock's is
    two round trips on its own engine; the naive algorithm's, more. The
    driver is as it was afterwards, after a failure too."""
    url: str = request.getfixturevalue(f"{server}_url")
    engine = create_engine(url, isolation_level="READ COMMITTED", pool_reset_on_return=None)
    floors = floor_engine(url)
    driver = engine.dialect.driver
    exchanges = {
        "pymysql": (pymysql.connections.Connection, "_execute_command"),
        "psycopg": (psycopg.Connection, "wait"),
    }
    owner, name = exchanges[driver]
    create_floor_table(engine)
    try:
        with (
            PathLockManager(url, node_id="pathlock-bench-test") as manager,
            customers_of(engine, 2) as (ours, theirs),
        ):
            floor = Floor(floors)
            naive = NaiveLocks(engine, theirs, node_id="pathlock-bench-test")
            locks = manager.for_customer(ours)

            def floor_cycle() -> None:
                floor.release(floor.acquire("/a", 0))

            def naive_cycle() -> None:
                lease_id = naive.acquire("/a", timeout=10)
                assert lease_id is not None
                naive.release(lease_id)

            def pathlock_cycle() -> None:
                locks.lock_paths("/a").release()

            cycles: list[Callable[[], None]] = [floor_cycle, naive_cycle, pathlock_cycle]
            for cycle in cycles:
                cycle()  # the customers' rows exist, the connections are open
            send = getattr(owner, name)
            assert round_trips(floor_cycle, 5, driver) == 2
            assert round_trips(pathlock_cycle, 5, driver) == 2
            assert round_trips(naive_cycle, 5, driver) > 2
            assert getattr(owner, name) is send

            def fails() -> None:
                raise RuntimeError("boom")

            with pytest.raises(RuntimeError, match="boom"):
                round_trips(fails, 1, driver)
            assert getattr(owner, name) is send
            assert locks.list_locks() == []
        # Every UPDATE of the floor was committed: another connection sees the 12.
        with engine.connect() as connection:
            bumps = connection.execute(
                text(f"SELECT n FROM {FLOOR_TABLE} WHERE id = :k"), {"k": floor.key}
            ).scalar_one()
        assert bumps == 2 * (1 + 5)
        # The floor refuses an engine that would not commit each UPDATE.
        with pytest.raises(BenchError, match="autocommit"):
            Floor(engine)
    finally:
        drop_floor_table(engine)
        floors.dispose()
        engine.dispose()
