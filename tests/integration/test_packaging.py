"""The built wheel carries the migrations, so they run after ``pip install``
from any directory (not only from a checkout of the repository)."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from pathlock import migrate
from pathlock.schema import REVISION

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from this tree, unpacked as site-packages would hold it."""
    dist = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(ROOT)],
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


def test_schema_revision_is_the_newest_migration() -> None:
    # The SQLite check on open compares with this constant instead of loading
    # Alembic: it must move with every new revision.
    assert migrate.head_revision() == REVISION
