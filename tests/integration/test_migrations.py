"""The Alembic migrations create exactly the schema of ``pathlock/schema.py``.

Every test works in databases of its own (``pathlock_mig_<hex>``), created on
the test server (MariaDB, or PostgreSQL for the tests that say so) and
dropped afterwards, so the shared test database is never touched.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import secrets
import shutil
import subprocess
import sys
from argparse import Namespace
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pymysql
import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import (
    URL,
    Column,
    Engine,
    MetaData,
    String,
    Table,
    create_engine,
    inspect,
    make_url,
    text,
)
from sqlalchemy.pool import NullPool
from sqlalchemy.schema import CreateTable

from pathlock import InvalidArgument, PathLockManager, SchemaMismatch, cli, dialects, migrate
from pathlock.schema import REVISION, REVISIONS, compare_server_default, metadata
from tests.conftest import POSTGRESQL_URL

ROOT = Path(__file__).resolve().parents[2]
ALEMBIC_INI = ROOT / "alembic.ini"
SERVER_URL = make_url(
    os.environ.get("PATHLOCK_TEST_MYSQL_URL", "mysql+pymysql://root@127.0.0.1:3306/test")
)
PG_SERVER_URL = make_url(POSTGRESQL_URL)
VERSION_TABLE = "pathlock_alembic_version"
SERVERS = ("mysql", "mariadb")
TABLES = ("customer_locks", "path_locks", "path_lock_waiters", "path_lock_waiter_paths")

NewDatabase = Callable[[], URL]


@pytest.fixture(scope="module")
def server() -> Iterator[Engine]:
    engine = create_engine(SERVER_URL, poolclass=NullPool)
    yield engine
    engine.dispose()


@pytest.fixture(scope="module")
def server_version(server: Engine) -> str:
    """The test server's VERSION()."""
    with server.connect() as conn:
        return str(conn.exec_driver_sql("SELECT VERSION()").scalar())


@pytest.fixture
def on_mariadb(server_version: str) -> None:
    """Skips a test of SQL printed for MariaDB (or of its refusal) on MySQL."""
    if "MariaDB" not in server_version:
        pytest.skip(f"the test server is not MariaDB but {server_version}")


@pytest.fixture
def new_database(server: Engine) -> Iterator[NewDatabase]:
    """Create empty databases on the test server; drop them all afterwards."""
    created: list[str] = []

    def create() -> URL:
        name = f"pathlock_mig_{secrets.token_hex(6)}"
        with server.begin() as conn:
            conn.exec_driver_sql(f"CREATE DATABASE `{name}`")
        created.append(name)
        return SERVER_URL.set(database=name)

    yield create
    with server.begin() as conn:
        for name in created:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS `{name}`")


@pytest.fixture(scope="module")
def pg_server() -> Iterator[Engine]:
    """The PostgreSQL test server, in autocommit: CREATE and DROP DATABASE
    cannot run inside a transaction."""
    engine = create_engine(PG_SERVER_URL, poolclass=NullPool, isolation_level="AUTOCOMMIT")
    yield engine
    engine.dispose()


@pytest.fixture
def new_pg_database(pg_server: Engine) -> Iterator[NewDatabase]:
    """Create empty databases on the PostgreSQL test server; drop them all
    afterwards (with the sessions still in them)."""
    created: list[str] = []

    def create() -> URL:
        name = f"pathlock_mig_{secrets.token_hex(6)}"
        with pg_server.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        created.append(name)
        return PG_SERVER_URL.set(database=name)

    yield create
    with pg_server.connect() as conn:
        for name in created:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def empty_db_url(new_database: NewDatabase) -> URL:
    return new_database()


def _url_text(url: URL) -> str:
    return url.render_as_string(hide_password=False)


def _config(url: URL) -> Config:
    """The repository's alembic.ini, as `alembic -c alembic.ini -x url=...` sees it."""
    config = Config(str(ALEMBIC_INI), cmd_opts=Namespace(x=[f"url={_url_text(url)}"]))
    # pytest owns logging here; the ini's logging sections are for the command line.
    config.attributes["configure_logger"] = False
    return config


def _alembic(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run the installed `alembic` command with the repository's ini file."""
    script = Path(sys.executable).with_name("alembic")
    program = [str(script)] if script.exists() else [sys.executable, "-m", "alembic"]
    return subprocess.run(
        [*program, "-c", str(ALEMBIC_INI), *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def _environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PATHLOCK_DATABASE_URL"}
    env.update(extra)
    return env


def _table_names(url: URL) -> set[str]:
    engine = create_engine(url, poolclass=NullPool)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def _versions(url: URL) -> list[str]:
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            return list(conn.exec_driver_sql(f"SELECT version_num FROM {VERSION_TABLE}").scalars())
    finally:
        engine.dispose()


def _show_create_tables(url: URL) -> dict[str, list[str]]:
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            return {
                table: _key_order_insensitive(
                    conn.exec_driver_sql(f"SHOW CREATE TABLE `{table}`").one()[1]
                )
                for table in TABLES
            }
    finally:
        engine.dispose()


def _key_order_insensitive(ddl: str) -> list[str]:
    """The lines of SHOW CREATE TABLE, with the secondary keys in sorted order.

    The server lists secondary keys in the order they were created, and
    metadata.create_all() creates them in the iteration order of Table.indexes, a
    Python set that changes from run to run. Only that order is normalized; every
    line, including each key's columns and prefix length, must still match.
    """
    lines = ddl.splitlines()
    keys = sorted(line.rstrip(",") for line in lines if line.startswith("  KEY "))
    rest = iter(line.rstrip(",") for line in lines if not line.startswith("  KEY "))
    ordered = iter(keys)
    return [next(ordered) if line.startswith("  KEY ") else next(rest) for line in lines]


def _differences(url: URL) -> list[Any]:
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(
                conn,
                opts={
                    # The version table belongs to the migrations, not to metadata.
                    "version_table": VERSION_TABLE,
                    "compare_type": True,
                    "compare_server_default": compare_server_default,
                },
            )
            return list(compare_metadata(context, metadata))
    finally:
        engine.dispose()


def test_upgrade_matches_metadata(empty_db_url: URL) -> None:
    command.upgrade(_config(empty_db_url), "head")

    assert _differences(empty_db_url) == []


def test_comparison_sees_changes(empty_db_url: URL) -> None:
    """The comparison above is not blind: real differences are reported."""
    command.upgrade(_config(empty_db_url), "head")
    engine = create_engine(empty_db_url, poolclass=NullPool)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql("ALTER TABLE path_locks ALTER reason SET DEFAULT 'x'")
            conn.exec_driver_sql("ALTER TABLE path_locks MODIFY mode VARCHAR(10) NOT NULL")
            conn.exec_driver_sql("ALTER TABLE customer_locks ALTER version SET DEFAULT 1")
            conn.exec_driver_sql("DROP INDEX ix_path_lock_waiters_lease_id ON path_lock_waiters")
    finally:
        engine.dispose()

    found = {
        (diff[0][0], diff[0][2], diff[0][3]) if isinstance(diff, list) else diff[:1]
        for diff in _differences(empty_db_url)
    }

    assert found == {
        ("modify_default", "path_locks", "reason"),
        ("modify_type", "path_locks", "mode"),
        ("modify_default", "customer_locks", "version"),
        ("add_index",),
    }


def test_autogenerate_through_env(empty_db_url: URL) -> None:
    """env.py's own autogenerate options find nothing to do after the upgrade."""
    config = _config(empty_db_url)
    command.upgrade(config, "head")

    command.check(config)  # raises AutogenerateDiffsDetected on any difference


def test_upgrade_creates_the_same_tables_as_create_all(new_database: NewDatabase) -> None:
    migrated, created = new_database(), new_database()
    command.upgrade(_config(migrated), "head")
    engine = create_engine(created, poolclass=NullPool)
    try:
        metadata.create_all(engine)
    finally:
        engine.dispose()

    expected = _show_create_tables(created)
    actual = _show_create_tables(migrated)
    for table in TABLES:
        assert actual[table] == expected[table], table
    # Trailing spaces count: the server's NO PAD binary collation (revision 0003).
    options = actual["path_locks"][-1]
    assert "COLLATE=utf8mb4_nopad_bin" in options or "COLLATE=utf8mb4_0900_bin" in options


def test_mariadb_urls_make_the_same_tables(new_database: NewDatabase) -> None:
    # SQLAlchemy's "mariadb" dialect reads only mariadb_* table and index
    # options: without them a mariadb:// URL made a case-insensitive table, or
    # failed at the path index's prefix length.
    reference, created, migrated = new_database(), new_database(), new_database()
    command.upgrade(_config(reference), "head")
    as_mariadb = [url.set(drivername="mariadb+pymysql") for url in (created, migrated)]
    engine = create_engine(as_mariadb[0], poolclass=NullPool)
    try:
        metadata.create_all(engine)
    finally:
        engine.dispose()
    command.upgrade(_config(as_mariadb[1]), "head")
    expected = _show_create_tables(reference)
    for url in (created, migrated):
        actual = _show_create_tables(url)
        for table in TABLES:
            assert actual[table] == expected[table], (url, table)


def test_only_pathlocks_own_tables_get_the_no_pad_collation() -> None:
    collate = {"mysql_collate": "utf8mb4_bin", "mariadb_collate": "utf8mb4_bin"}
    other = Table("app_files", MetaData(), Column("path", String(100)), **collate)
    mysql, mariadb = (make_url(f"{name}+pymysql://").get_dialect()() for name in SERVERS)
    for dialect in (mysql, mariadb):
        assert "COLLATE utf8mb4_bin" in str(CreateTable(other).compile(dialect=dialect))
    ours = CreateTable(metadata.tables["path_locks"])
    assert "COLLATE utf8mb4_nopad_bin" in str(ours.compile(dialect=mariadb))
    assert "COLLATE utf8mb4_0900_bin" in str(ours.compile(dialect=mysql))


def test_version_table_is_pathlocks_own(empty_db_url: URL) -> None:
    command.upgrade(_config(empty_db_url), "head")

    tables = _table_names(empty_db_url)
    assert tables == {*TABLES, VERSION_TABLE}
    assert "alembic_version" not in tables
    assert _versions(empty_db_url) == [REVISION]


def test_downgrade_removes_everything_and_upgrade_again(empty_db_url: URL) -> None:
    config = _config(empty_db_url)
    command.upgrade(config, "head")

    command.downgrade(config, "base")
    assert _table_names(empty_db_url) == {VERSION_TABLE}
    assert _versions(empty_db_url) == []

    command.upgrade(config, "head")
    assert _table_names(empty_db_url) == {*TABLES, VERSION_TABLE}
    assert _versions(empty_db_url) == [REVISION]


def test_offline_sql(tmp_path: Path) -> None:
    # A URL in the environment too: -x url=... must win over it.
    env = _environment(PATHLOCK_DATABASE_URL="sqlite://")
    url = _url_text(SERVER_URL.set(database="nowhere"))

    result = _alembic("-x", f"url={url}", "upgrade", "head", "--sql", env=env, cwd=tmp_path)

    assert result.returncode == 0, result.stderr
    sql = result.stdout
    for table in (*TABLES, VERSION_TABLE):
        assert f"CREATE TABLE {table} (" in sql
    assert "ENGINE=InnoDB CHARSET=utf8mb4 COLLATE utf8mb4_bin" in sql  # MySQL, not SQLite
    # Then the NO PAD collation; offline, a mysql:// URL means MySQL 8.
    assert "CONVERT TO CHARACTER SET utf8mb4 COLLATE utf8mb4_0900_bin" in sql
    assert "ON path_locks (customer_id, path(700))" in sql
    assert f"INSERT INTO {VERSION_TABLE} (version_num) VALUES ('0001')" in sql
    assert f"SET version_num='{REVISION}'" in sql
    assert "alembic_version " not in sql.replace(VERSION_TABLE, "")


def test_url_from_environment(empty_db_url: URL, tmp_path: Path) -> None:
    env = _environment(PATHLOCK_DATABASE_URL=_url_text(empty_db_url))

    result = _alembic("upgrade", "head", env=env, cwd=tmp_path)

    assert result.returncode == 0, result.stderr
    assert _table_names(empty_db_url) == {*TABLES, VERSION_TABLE}
    assert _versions(empty_db_url) == [REVISION]


def test_missing_url_is_a_clear_error(tmp_path: Path) -> None:
    result = _alembic("upgrade", "head", "--sql", env=_environment(), cwd=tmp_path)

    assert result.returncode != 0
    assert "PATHLOCK_DATABASE_URL" in result.stderr
    assert "-x url=" in result.stderr
    assert "Traceback" not in result.stderr


def test_url_from_ini(empty_db_url: URL, monkeypatch: pytest.MonkeyPatch) -> None:
    # Neither -x url=... nor the environment: the ini's sqlalchemy.url is the last resort.
    monkeypatch.delenv("PATHLOCK_DATABASE_URL", raising=False)
    config = Config(str(ALEMBIC_INI))
    config.attributes["configure_logger"] = False
    config.set_main_option("sqlalchemy.url", _url_text(empty_db_url).replace("%", "%%"))

    command.upgrade(config, "head")

    assert _versions(empty_db_url) == [REVISION]


# -- the schema's lifecycle from the command line and create_schema() ---------------


def _db(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """Run ``pathlock db ...`` in this process: its exit status and output."""
    status = cli.main(["db", *args])
    return status, capsys.readouterr().out.strip()


def test_db_commands_walk_the_revisions(
    empty_db_url: URL, capsys: pytest.CaptureFixture[str]
) -> None:
    url = ("--database-url", _url_text(empty_db_url))
    status, out = _db(capsys, "current", *url)
    assert (status, out.split(";")[0]) == (0, "no revision recorded")
    assert _db(capsys, "check", *url)[0] == 1

    assert _db(capsys, "upgrade", "--revision", "0002", *url) == (
        0,
        "pathlock db upgrade: upgraded from revision none to 0002",
    )
    status, out = _db(capsys, "check", *url)
    assert status == 1
    assert out == f"at revision 0002, behind this pathlock's {REVISION}: run `pathlock db upgrade`"

    assert _db(capsys, "upgrade", *url) == (
        0,
        f"pathlock db upgrade: upgraded from revision 0002 to {REVISION}",
    )
    assert _db(capsys, "upgrade", *url) == (
        0,
        f"pathlock db upgrade: already at revision {REVISION}; nothing to do",
    )
    assert _db(capsys, "check", *url) == (
        0,
        f"at revision {REVISION}, the newest this pathlock ships",
    )
    assert _db(capsys, "downgrade", "0003", *url) == (
        0,
        f"pathlock db downgrade: downgraded from revision {REVISION} to 0003",
    )
    assert _versions(empty_db_url) == ["0003"]
    assert _db(capsys, "downgrade", "base", *url) == (
        0,
        "pathlock db downgrade: downgraded from revision 0003 to none",
    )
    assert _table_names(empty_db_url) == {VERSION_TABLE}


def test_db_stamp_records_a_revision_and_check_refuses_an_unknown_one(
    empty_db_url: URL, capsys: pytest.CaptureFixture[str]
) -> None:
    url = ("--database-url", _url_text(empty_db_url))
    command.upgrade(_config(empty_db_url), "0003")
    assert _db(capsys, "stamp", "0003", *url) == (
        0,
        "pathlock db stamp: the database records revision 0003",
    )
    engine = create_engine(empty_db_url, poolclass=NullPool)
    with engine.begin() as connection:
        connection.exec_driver_sql(f"UPDATE {VERSION_TABLE} SET version_num = '9999'")
    engine.dispose()
    status, out = _db(capsys, "check", *url)
    assert status == 1
    assert out.startswith("at revision 9999, which this pathlock does not know"), out


def test_create_schema_records_its_revision(
    empty_db_url: URL, capsys: pytest.CaptureFixture[str]
) -> None:
    """The quick start's create_schema(), then the production command: the
    second finds nothing to do (it used to fail with 1050, table exists)."""
    with PathLockManager(_url_text(empty_db_url), heartbeat=False) as manager:
        manager.create_schema()
        manager.create_schema()  # again: nothing changes
    assert _versions(empty_db_url) == [REVISION]
    url = ("--database-url", _url_text(empty_db_url))
    assert _db(capsys, "upgrade", *url) == (
        0,
        f"pathlock db upgrade: already at revision {REVISION}; nothing to do",
    )
    # And it is the schema the migrations make.
    assert _differences(empty_db_url) == []


def test_upgrade_to_a_revision_the_database_is_past_says_so(
    empty_db_url: URL, capsys: pytest.CaptureFixture[str]
) -> None:
    """It used to say "already at revision 0005; nothing to do"."""
    url = ("--database-url", _url_text(empty_db_url))
    command.upgrade(_config(empty_db_url), "head")
    assert _db(capsys, "upgrade", "--revision", "0003", *url) == (
        0,
        f"pathlock db upgrade: the database is past revision 0003 (at {REVISION}); "
        "`pathlock db downgrade 0003` goes back",
    )
    assert _versions(empty_db_url) == [REVISION]


def _tables_of_an_older_create_schema(url: URL) -> None:
    """Tables at revision 0003 without a recorded revision: what
    create_schema() made before it recorded one."""
    command.upgrade(_config(url), "0003")
    engine = create_engine(url, poolclass=NullPool)
    with engine.begin() as connection:
        connection.exec_driver_sql(f"DROP TABLE {VERSION_TABLE}")
    engine.dispose()


UNRECORDED = "pathlock's tables exist but record no revision"
WAY_OUT = r"`pathlock db stamp REV`.*then run `pathlock db upgrade`"


def test_tables_without_a_recorded_revision_are_refused_with_the_way_out(
    empty_db_url: URL, capsys: pytest.CaptureFixture[str]
) -> None:
    """The manager used to open them and fail at the first lock (1054, unknown
    column customer_locks.case_insensitive), `db upgrade` with 1050 (table
    exists), and `db current` said that `db upgrade` creates the tables."""
    _tables_of_an_older_create_schema(empty_db_url)
    url = ("--database-url", _url_text(empty_db_url))
    with pytest.raises(SchemaMismatch, match=f"{UNRECORDED}.*{WAY_OUT}") as refused:
        PathLockManager(_url_text(empty_db_url), heartbeat=False)
    assert refused.value.recorded is None
    for action, status in (("current", 0), ("check", 1)):
        code, out = _db(capsys, action, *url)
        assert code == status
        assert out.startswith(UNRECORDED), out
        assert "creates the tables" not in out
    assert cli.main(["db", "upgrade", *url]) == 1
    captured = capsys.readouterr()
    assert captured.err.startswith(f"pathlock: error: {UNRECORDED}"), captured.err
    assert "1050" not in captured.err
    assert _table_names(empty_db_url) == set(TABLES[:3])  # nothing changed: revision 0003's tables

    # The way out, as the message says.
    assert _db(capsys, "stamp", "0003", *url)[0] == 0
    assert _db(capsys, "upgrade", *url)[0] == 0
    with PathLockManager(_url_text(empty_db_url), heartbeat=False) as manager:
        manager.for_customer(1).lock_paths("/a").release()


def test_complete_tables_without_a_recorded_revision_open(empty_db_url: URL) -> None:
    """What another process's create_schema() shows between creating the
    tables and recording their revision: they lock as they should, so the
    manager opens; `db upgrade` still refuses them (it would create them again)."""
    engine = create_engine(empty_db_url, poolclass=NullPool)
    metadata.create_all(engine)
    engine.dispose()
    with PathLockManager(_url_text(empty_db_url), heartbeat=False) as manager:
        manager.for_customer(1).lock_paths("/a").release()
    with pytest.raises(SchemaMismatch, match=UNRECORDED):
        migrate.upgrade(empty_db_url)


def _create_schema_at_once(url: str, barrier: Any) -> None:
    manager = PathLockManager(url, heartbeat=False)
    barrier.wait(60)
    manager.create_schema()
    manager.close()


def test_create_schema_from_many_processes_at_once(empty_db_url: URL) -> None:
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(6)
    processes = [
        context.Process(target=_create_schema_at_once, args=(_url_text(empty_db_url), barrier))
        for _ in range(6)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(120)
    assert [process.exitcode for process in processes] == [0] * 6
    assert _table_names(empty_db_url) == {*TABLES, VERSION_TABLE}
    assert _versions(empty_db_url) == [REVISION]


def test_every_shipped_revision_is_known_to_the_library() -> None:
    script = ScriptDirectory.from_config(migrate.alembic_config())
    shipped = [revision.revision for revision in script.walk_revisions("base", "heads")]
    assert tuple(reversed(shipped)) == REVISIONS
    assert REVISIONS[-1] == REVISION


def test_a_manager_refuses_tables_at_another_revision(empty_db_url: URL) -> None:
    url = _url_text(empty_db_url)
    # No tables yet: create_schema() comes next.
    PathLockManager(url, heartbeat=False).close()
    command.upgrade(_config(empty_db_url), "0003")
    with pytest.raises(SchemaMismatch, match=r"revision 0003.*run `pathlock db upgrade`"):
        PathLockManager(url, heartbeat=False)
    command.upgrade(_config(empty_db_url), "head")
    PathLockManager(url, heartbeat=False).close()
    engine = create_engine(empty_db_url, poolclass=NullPool)
    with engine.begin() as connection:
        connection.exec_driver_sql(f"UPDATE {VERSION_TABLE} SET version_num = '9999'")
    engine.dispose()
    with pytest.raises(SchemaMismatch, match="a newer pathlock migrated it"):
        PathLockManager(url, heartbeat=False)


def _run_the_client(url: URL, sql: str) -> subprocess.CompletedProcess[str]:
    """Pipe ``sql`` into the ``mariadb`` command-line client, as a DBA would."""
    return subprocess.run(
        [
            "mariadb",
            "--protocol=tcp",
            "-h",
            str(url.host),
            "-P",
            str(url.port or 3306),
            "-u",
            str(url.username),
            str(url.database),
        ],
        input=sql,
        text=True,
        check=False,
        capture_output=True,
        timeout=60,
    )


def _apply_with_the_client(url: URL, sql: str) -> None:
    """Apply ``sql`` with the ``mariadb`` client; it must run to the end."""
    applied = _run_the_client(url, sql)
    assert applied.returncode == 0, applied.stderr


# The driver of each dialect's URLs, and a dialect other than each.
_DRIVERS = {"mysql": "pymysql", "mariadb": "pymysql", "postgresql": "psycopg"}
_OTHER = {"mysql": "mariadb", "mariadb": "mysql", "postgresql": "mariadb"}


def _printed_sql(how: str, url: URL, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """The SQL of ``db upgrade --sql`` for the database at ``url``, asked for
    ``how`` (``"HOW NAME"``): with ``--dialect NAME`` and a URL of another
    dialect (the option wins), with a ``NAME+driver://`` URL, or with that
    URL through the `alembic` command."""
    how, name = how.split()
    named = _OTHER[name] if how == "--dialect" else name
    where = _url_text(url.set(drivername=f"{named}+{_DRIVERS[named]}"))
    if how == "alembic":
        printed = _alembic(
            "-x", f"url={where}", "upgrade", "head", "--sql", env=_environment(), cwd=tmp_path
        )
        assert printed.returncode == 0, printed.stderr
        return printed.stdout
    option = ["--dialect", name] if how == "--dialect" else []
    assert cli.main(["db", "upgrade", "--sql", "--database-url", where, *option]) == 0
    return capsys.readouterr().out


@pytest.mark.usefixtures("on_mariadb")
@pytest.mark.parametrize("how", ["--dialect mariadb", "url mariadb", "alembic mariadb"])
def test_the_dbas_sql_makes_what_db_upgrade_makes(
    how: str, new_database: NewDatabase, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    by_hand, by_upgrade = new_database(), new_database()
    sql = _printed_sql(how, by_hand, tmp_path, capsys)
    assert sql.startswith("-- pathlock's tables, for MariaDB 10.5 and later.")
    _apply_with_the_client(by_hand, sql)
    assert cli.main(["db", "upgrade", "--database-url", _url_text(by_upgrade)]) == 0
    assert _show_create_tables(by_hand) == _show_create_tables(by_upgrade)
    assert _versions(by_hand) == _versions(by_upgrade) == [REVISION]
    # The server's own tables: the printed SQL was for this server.
    assert cli.main(["db", "check", "--database-url", _url_text(by_hand)]) == 0


def _postgresql_program(name: str) -> str:
    """A PostgreSQL client program (``psql``, ``pg_dump``): on the PATH, else
    the newest of those Debian installs beside the server."""
    found = shutil.which(name)
    if found is not None:
        return found
    installed = Path("/usr/lib/postgresql").glob(f"*/bin/{name}")
    newest = max(installed, key=lambda path: int(path.parts[-3]), default=None)
    return str(newest) if newest is not None else name


def _postgresql_client(program: str, url: URL, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``psql`` or ``pg_dump`` on the database at ``url``."""
    env = _environment()
    if url.password is not None:
        env["PGPASSWORD"] = str(url.password)
    where = ["-h", str(url.host), "-p", str(url.port or 5432), "-U", str(url.username)]
    return subprocess.run(
        [_postgresql_program(program), *where, *args, "-d", str(url.database)],
        env=env,
        text=True,
        check=False,
        capture_output=True,
        timeout=60,
    )


def _postgresql_schema(url: URL) -> list[str]:
    """What ``pg_dump --schema-only`` shows of the database at ``url``: every
    table, column, type, collation, default, constraint, index and sequence,
    and their owners."""
    dumped = _postgresql_client("pg_dump", url, "--schema-only")
    assert dumped.returncode == 0, dumped.stderr
    # Without the lines that fence the dump (pg_dump 15.14 and later): their key is random.
    fences = ("\\restrict ", "\\unrestrict ")
    return [line for line in dumped.stdout.splitlines() if not line.startswith(fences)]


@pytest.mark.parametrize("how", ["--dialect postgresql", "url postgresql", "alembic postgresql"])
def test_the_dbas_sql_makes_what_db_upgrade_makes_on_postgresql(
    how: str, new_pg_database: NewDatabase, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The SQL printed for PostgreSQL, applied by ``psql`` as a DBA would
    (stopping at the first error), makes exactly the schema ``db upgrade``
    makes, and records the same revision."""
    by_hand, by_upgrade = new_pg_database(), new_pg_database()
    sql = _printed_sql(how, by_hand, tmp_path, capsys)
    assert sql.startswith("-- pathlock's tables, for PostgreSQL.")
    (tmp_path / "pathlock.sql").write_text(sql)
    applied = _postgresql_client(
        "psql", by_hand, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", str(tmp_path / "pathlock.sql")
    )
    assert applied.returncode == 0, applied.stderr
    assert cli.main(["db", "upgrade", "--database-url", _url_text(by_upgrade)]) == 0
    made = _postgresql_schema(by_hand)
    assert made == _postgresql_schema(by_upgrade)
    # Not two empty dumps: the tables of the newest revision (0011's paths).
    for table in TABLES:
        assert f"CREATE TABLE public.{table} (" in made
    assert '    path character varying(4000) NOT NULL COLLATE pg_catalog."C",' in made
    assert _versions(by_hand) == _versions(by_upgrade) == [REVISION]
    assert cli.main(["db", "check", "--database-url", _url_text(by_hand)]) == 0


@pytest.mark.usefixtures("on_mariadb")
def test_the_sql_for_postgresql_stops_on_mariadb_before_creating_anything(
    new_database: NewDatabase, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It created pathlock_alembic_version and customer_locks, then failed
    at path_locks' BIGSERIAL, and left them there, half made."""
    url = new_database()
    sql = _printed_sql("--dialect postgresql", url, tmp_path, capsys)
    applied = _run_the_client(url, sql)
    assert applied.returncode == 1
    assert "ERROR 4081 (HY000) at line 4: Unknown structured system variable" in applied.stderr
    assert (
        "'PostgreSQL: print the SQL for MySQL or MariaDB with --dialect mysql or --dialect mariadb'"
    ) in applied.stderr
    assert _table_names(url) == set()


@pytest.mark.parametrize("name", SERVERS)
def test_the_sql_for_mysql_and_mariadb_stops_on_postgresql_before_creating_anything(
    name: str, new_pg_database: NewDatabase, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = new_pg_database()
    (tmp_path / "pathlock.sql").write_text(_printed_sql(f"--dialect {name}", url, tmp_path, capsys))
    applied = _postgresql_client(
        "psql", url, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", str(tmp_path / "pathlock.sql")
    )
    assert applied.returncode == 3  # psql: a script stopped at an error
    # At the first statement, the one that stops it on any other server.
    assert 'ERROR:  syntax error at or near "CASE"' in applied.stderr
    assert "LINE 1: SET SESSION sql_mode = CASE" in applied.stderr
    assert _table_names(url) == set()


@pytest.mark.usefixtures("on_mariadb")
@pytest.mark.parametrize("how", ["--dialect mysql", "url mysql", "alembic mysql"])
def test_the_sql_for_mysql_stops_on_mariadb_before_creating_anything(
    how: str,
    server_version: str,
    new_database: NewDatabase,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """It created four tables, then failed at the first NO PAD collation
    (utf8mb4_0900_bin, MySQL's), and left them there, half made."""
    url = new_database()
    sql = _printed_sql(how, url, tmp_path, capsys)
    assert sql.startswith("-- pathlock's tables, for MySQL 8.0 and later.")
    applied = _run_the_client(url, sql)
    assert applied.returncode == 1
    assert "ERROR 1231 (42000) at line 4: Variable 'sql_mode' can't be set to the value of " in (
        applied.stderr
    )
    assert (
        "'pathlock: this SQL is for MySQL 8.0 or later and the server is "
        f"{server_version}: print the SQL for it with --dialect mariadb'"
    ) in applied.stderr
    assert _table_names(url) == set()


@pytest.mark.usefixtures("on_mariadb")
@pytest.mark.parametrize("verb", ["stamp", "downgrade"])
def test_every_sql_for_mysql_stops_on_mariadb(
    verb: str, new_database: NewDatabase, capsys: pytest.CaptureFixture[str]
) -> None:
    url = new_database()
    migrate.upgrade(url)
    revision = {"stamp": "0005", "downgrade": f"{REVISION}:0005"}[verb]
    assert cli.main(["db", verb, revision, "--sql", "--dialect", "mysql"]) == 0
    sql = capsys.readouterr().out
    assert "'0005'" in sql  # what it would have done
    applied = _run_the_client(url, sql)
    assert applied.returncode == 1
    assert "pathlock: this SQL is for MySQL 8.0 or later" in applied.stderr
    assert _versions(url) == [REVISION]
    assert _show_create_tables(url) == _show_create_tables(_upgraded(new_database()))


def _upgraded(url: URL) -> URL:
    migrate.upgrade(url)
    return url


# Servers other than the test server: the first statement of each SQL runs on
# the test server as if VERSION() were theirs. True: the SQL must go on there.
_VERSIONS = {
    "8.0.36": {"mysql": True, "mariadb": False},
    "8.4.3-log": {"mysql": True, "mariadb": False},
    "9.1.0": {"mysql": True, "mariadb": False},
    "5.7.44-log": {"mysql": False, "mariadb": False},
    "10.4.34-MariaDB": {"mysql": False, "mariadb": False},
    "10.5.0-MariaDB": {"mysql": False, "mariadb": True},
    "10.11.19-MariaDB-0+deb12u1": {"mysql": False, "mariadb": True},
    "11.4.4-MariaDB-log": {"mysql": False, "mariadb": True},
}
_FOR = {"mysql": "MySQL 8.0 or later", "mariadb": "MariaDB 10.5 or later"}


@pytest.mark.parametrize("version", list(_VERSIONS))
@pytest.mark.parametrize("name", SERVERS)
def test_the_first_statement_lets_only_its_own_server_go_on(
    name: str, version: str, server: Engine
) -> None:
    header = dialects.sql_header(name)
    statement = "\n".join(line for line in header.splitlines() if not line.startswith("--"))
    assert statement.startswith("SET SESSION sql_mode = CASE")
    assert statement.endswith(";")
    assert "VERSION()" in statement
    as_if = statement.replace("VERSION()", f"'{version}'")
    with server.connect() as conn:
        cursor = conn.connection.driver_connection.cursor()  # no %-formatting: the raw driver
        cursor.execute("SELECT @@SESSION.sql_mode")
        before = cursor.fetchone()
        if _VERSIONS[version][name]:
            cursor.execute(as_if)
        else:
            with pytest.raises(pymysql.err.OperationalError) as refused:
                cursor.execute(as_if)
            code, message = refused.value.args
            assert code == 1231
            assert f"'pathlock: this SQL is for {_FOR[name]} and the server is {version}" in message
        cursor.execute("SELECT @@SESSION.sql_mode")
        assert cursor.fetchone() == before


def test_the_dbas_sql_says_which_server_it_is_for(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["db", "upgrade", "--sql", "--database-url", "mysql+pymysql://db/app"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("-- pathlock's tables, for MySQL 8.0 and later. For MariaDB")
    assert "utf8mb4_0900_bin" in out
    assert cli.main(["db", "upgrade", "--sql", "--dialect", "mariadb"]) == 0
    assert "utf8mb4_0900_bin" not in capsys.readouterr().out


@pytest.mark.parametrize("url", ["oracle://db/app", "mssql+pyodbc://db/app", "foo://db"])
def test_sql_for_a_database_pathlock_does_not_run_on_is_refused(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """It used to print portable DDL (exit 0), for tables pathlock refuses
    to use; or a traceback."""
    assert cli.main(["db", "upgrade", "--sql", "--database-url", url]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("pathlock: error: unsupported database"), captured.err
    assert len(captured.err.splitlines()) == 1
    with pytest.raises(InvalidArgument, match="unsupported database"):
        migrate.upgrade(url, sql=True, output=sys.stdout)
    assert capsys.readouterr().out == ""


def test_sql_without_a_server_is_refused(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """It used to print SQLite's DDL for the embedded default, silently."""
    monkeypatch.delenv("PATHLOCK_DATABASE_URL", raising=False)
    with pytest.raises(SystemExit) as exited:
        cli.main(["db", "upgrade", "--sql"])
    assert exited.value.code == 2
    assert "--sql needs --dialect or --database-url" in capsys.readouterr().err


@pytest.mark.parametrize("backend", ["mariadb", "sqlite"])
def test_0007_gives_the_requests_queued_before_it_rows_of_their_paths(
    backend: str, empty_db_url: URL, tmp_path: Path
) -> None:
    """Requests queued under revision 0006 (an upgrade while requests wait)
    get the rows that later requests find them by; a row pathlock could not
    have written gets none; the rows go with their request's row."""
    url = empty_db_url if backend == "mariadb" else make_url(f"sqlite:///{tmp_path / 'q.db'}")
    migrate.upgrade(_url_text(url), revision="0006")
    engine = create_engine(url, poolclass=NullPool)
    columns = "customer_id, lease_id, paths, node_id, pid, thread, reason, created_at, expires_at"
    queued = [
        (7, [["/a", "exclusive"], ["/b/c", "shared"]]),
        (8, [["/x", "shared"]]),
        (7, "not a request"),
    ]
    try:
        with engine.begin() as connection:
            for customer_id, paths in queued:
                connection.execute(
                    text(
                        f"INSERT INTO path_lock_waiters ({columns}) VALUES (:c, :l, :p, 'n',"
                        " 1, 't', '', '2026-01-01', '2099-01-01')"
                    ),
                    {"c": customer_id, "l": secrets.token_hex(16), "p": json.dumps(paths)},
                )
        migrate.upgrade(_url_text(url))
        with engine.begin() as connection:
            rows = connection.execute(
                text(
                    "SELECT w.customer_id, p.customer_id, p.path, p.mode"
                    " FROM path_lock_waiter_paths p JOIN path_lock_waiters w"
                    " ON w.ticket = p.ticket ORDER BY p.ticket, p.path"
                )
            ).all()
            assert [tuple(row) for row in rows] == [
                (7, 7, "/a", "exclusive"),
                (7, 7, "/b/c", "shared"),
                (8, 8, "/x", "shared"),
            ]
        # The foreign key deletes a request's paths with it (SQLite: where
        # the connection enforces foreign keys, as pathlock's do).
        with engine.begin() as connection:
            if backend == "sqlite":
                connection.exec_driver_sql("PRAGMA foreign_keys=ON")
            connection.execute(text("DELETE FROM path_lock_waiters WHERE customer_id = 7"))
            left = connection.execute(text("SELECT path FROM path_lock_waiter_paths")).all()
            assert [row[0] for row in left] == ["/x"]
        migrate.downgrade(_url_text(url), revision="0006")
        assert "path_lock_waiter_paths" not in inspect(engine).get_table_names()
    finally:
        engine.dispose()
