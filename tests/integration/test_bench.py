"""The benchmark suite runs end to end and writes its report.

A smoke test only: ``pathlock bench --quick`` against the MariaDB test server,
as a real process (its workers are spawned processes). Nothing here looks at a
figure: figures come from the suite's report, never from timed assertions.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import create_engine, func, inspect, select

from pathlock.bench import EXPERIMENTS, PLOT_NAME
from pathlock.bench.database import FLOOR_TABLE
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


@pytest.mark.parametrize("module", ["pathlock.bench.cluster", "pathlock.bench.heartbeat"])
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


def test_quick_run_reports_every_experiment_and_cleans_up(mariadb_url: str, tmp_path: Path) -> None:
    report = tmp_path / "docs" / "BENCHMARKS.md"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pathlock",
            "bench",
            "--quick",
            "--url",
            mariadb_url,
            "--output",
            str(report),
        ],
        capture_output=True,
        text=True,
        timeout=140,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr
    text = report.read_text(encoding="utf-8")
    for number, title in EXPERIMENTS.items():
        heading = f"## {number}. {title}"
        assert heading in text
        assert heading in run.stdout
    assert "innodb_flush_log_at_trx_commit" in text
    # The asyncio API's experiments ran on the server and on their SQLite
    # file, not skipped for want of the asyncio drivers (the test extra has them).
    for number in (8, 9):
        section = text.split(f"\n## {number}. ")[1].split("\n## ")[0]
        assert "| MariaDB |" in section or "| MySQL |" in section, section
        assert "| SQLite |" in section, section
    # Beside the SQLite file's default (a worker thread), aiosqlite for comparison.
    assert "| SQLite, aiosqlite |" in text.split("\n## 9. ")[1], text
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
