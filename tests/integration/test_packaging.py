"""The built wheel carries the migrations, so they run after ``pip install``
from any directory (not only from a checkout of the repository)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import pathlock
from pathlock import migrate
from pathlock.schema import REVISION

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from this tree, unpacked as site-packages would hold it."""
    dist = tmp_path_factory.mktemp("dist")
    # From a copy: pip builds in the source tree, and a build/ directory left
    # there by an earlier build would put its stale files into this wheel.
    source = tmp_path_factory.mktemp("source") / "pathlock"
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns(
            ".git", ".ci", ".venv", "build", "dist", "*.egg-info", "__pycache__"
        ),
    )
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(source)],
        check=True,
        capture_output=True,
    )
    (wheel,) = dist.glob("pathlock-*.whl")
    site = tmp_path_factory.mktemp("site")
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    return site


def test_wheel_ships_the_migrations(installed: Path) -> None:
    package = installed / "pathlock"
    assert (package / "migrations" / "env.py").is_file()
    assert (package / "migrations" / "script.py.mako").is_file()
    assert (package / "migrations" / "versions" / "0001_initial.py").is_file()
    assert (package / "py.typed").is_file()


def test_wheel_ships_every_module_of_the_package(installed: Path) -> None:
    # A subpackage missing from pyproject's list is missing from the wheel,
    # and the tests below would not notice: the editable install's finder
    # supplies it from the checkout (pathlock.dialects was missing so).
    source = ROOT / "pathlock"
    modules = {path.relative_to(source) for path in source.rglob("*.py")}
    shipped = {path.relative_to(installed / "pathlock") for path in installed.rglob("*.py")}
    assert sorted(modules - shipped) == []


def test_installed_package_migrates_from_any_directory(installed: Path, tmp_path: Path) -> None:
    # Elsewhere, with only the unpacked wheel (and the test venv's dependencies)
    # on the path: the checkout's pathlock and migrations must not be found.
    database = tmp_path / "fresh.sqlite3"
    script = (
        "import pathlock, pathlock.migrate as m; "
        "print(pathlock.__file__); print(m.script_location()); "
        f"m.upgrade('sqlite:///{database}')"
    )
    environment = {**os.environ, "PYTHONPATH": str(installed)}
    result = subprocess.run(
        [sys.executable, "-P", "-c", script],
        cwd=tmp_path,
        env=environment,
        check=True,
        capture_output=True,
        text=True,
    )
    module_file, location = result.stdout.split()[:2]
    assert module_file.startswith(str(installed))
    assert location == str(installed / "pathlock" / "migrations")
    assert database.is_file()


def test_installed_cluster_benchmark_imports_without_the_servers_harness(
    installed: Path, tmp_path: Path
) -> None:
    # The benchmarks are one tree in the package; the cluster benchmark's
    # harness (servers/) is not shipped: importing it must work anyway, and a
    # run says what it needs before it measures or creates anything.
    assert (installed / "pathlock" / "bench" / "cluster" / "__main__.py").is_file()
    assert (installed / "pathlock" / "bench" / "heartbeat.py").is_file()
    assert not (installed / "servers").exists()
    environment = {**os.environ, "PYTHONPATH": str(installed)}
    imported = subprocess.run(
        [
            sys.executable,
            "-P",
            "-c",
            "import pathlock.bench.cluster.__main__, pathlock.bench.cluster.clients, "
            "pathlock.bench.heartbeat; print(pathlock.bench.cluster.__file__)",
        ],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        check=False,
    )
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.startswith(str(installed))
    run = subprocess.run(
        [sys.executable, "-P", "-m", "pathlock.bench.cluster", "--no-report"],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 2, run.stdout + run.stderr
    assert "run it from a checkout of the pathlock repository" in run.stderr
    assert "servers/galera_cluster.py" in run.stderr


def test_schema_revision_is_the_newest_migration() -> None:
    # The SQLite check on open compares with this constant instead of loading
    # Alembic: it must move with every new revision.
    assert migrate.head_revision() == REVISION


def test_the_readme_imports_every_public_name() -> None:
    # The README's import list is the one place a reader sees the whole API.
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    imported = re.search(r"from pathlock import \(([^)]*)\)", text)
    assert imported is not None
    names = {name.strip() for name in imported[1].split(",")}
    assert names == set(pathlock.__all__)
