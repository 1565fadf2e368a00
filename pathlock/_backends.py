"""Which database pathlock uses, and opening it: the default database, the
nodes of a cluster, the heartbeat's own engines. Each database family sets
its engines up itself (:mod:`pathlock.dialects`):

- **MySQL / MariaDB** (``mysql+pymysql://...``): the production backend. Every
  transaction runs in READ COMMITTED (see :mod:`pathlock._store`).
- **SQLite** (``sqlite:///path/to/file``): the embedded default, for one host.
  Every transaction that writes starts with ``BEGIN IMMEDIATE``, which takes
  the database's single write lock up front: writers are serialized across all processes that
  open the file, which is what the per-customer sentinel gives on a server
  (only coarser). The file is in WAL mode, so readers never wait. Database time
  is the host's clock, shared by every process on it. pathlock owns such a
  file: the manager brings its schema up to date when it opens it.

With no database given, :func:`default_database` applies:
``$PATHLOCK_DATABASE_URL`` if set, else ``database_url`` in the configuration
file (``$PATHLOCK_CONFIG``, else ``/etc/pathlock.toml`` if it exists), else a
SQLite file of the user's own at ``$XDG_STATE_HOME/pathlock/locks.sqlite3``
(``~/.local/state/pathlock/...``). The configuration file is how processes of
different users on one host (an app server as ``www-data``, a cron job as
root) find one shared database.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any, NamedTuple

from sqlalchemy import URL, Engine, make_url
from sqlalchemy.exc import SQLAlchemyError

from pathlock import dialects
from pathlock._owners import process_user
from pathlock._routing import node_name
from pathlock.dialects.base import ASYNC_DRIVERS, is_async
from pathlock.errors import ArgumentTypeError, InvalidArgument, PathLockError
from pathlock.settings import DEFAULT, Settings

URL_ENV_VAR = "PATHLOCK_DATABASE_URL"
CONFIG_ENV_VAR = "PATHLOCK_CONFIG"
SYSTEM_CONFIG = Path("/etc/pathlock.toml")


def default_sqlite_path() -> Path:
    """Where the embedded default database lives: under the XDG state
    directory, ``~/.local/state`` unless ``$XDG_STATE_HOME`` says otherwise."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "pathlock" / "locks.sqlite3"


class DefaultDatabase(NamedTuple):
    """The database used when none is given, and what chose it."""

    url: str
    chosen_by: str


def default_database() -> DefaultDatabase:
    """``$PATHLOCK_DATABASE_URL`` if set, else the configuration file's
    ``database_url``, else the user's embedded SQLite file."""
    url = os.environ.get(URL_ENV_VAR)
    if url:
        return DefaultDatabase(url, f"${URL_ENV_VAR}")
    # $PATHLOCK_CONFIG set but empty: no configuration file, not even /etc's.
    named = os.environ.get(CONFIG_ENV_VAR)
    config = SYSTEM_CONFIG if named is None else Path(named)
    if named or (named is None and config.exists()):
        return DefaultDatabase(_configured_url(config), str(config))
    files = f"no {SYSTEM_CONFIG}" if named is None else f"${CONFIG_ENV_VAR} empty"
    return DefaultDatabase(
        f"sqlite:///{default_sqlite_path()}",
        f"the embedded default of user {process_user()} (no ${URL_ENV_VAR}, {files})",
    )


def default_database_url() -> str:
    """The URL of :func:`default_database`."""
    return default_database().url


def _configured_url(config: Path) -> str:
    """``database_url`` from the TOML file ``config``."""
    try:
        with config.open("rb") as file:
            settings = tomllib.load(file)
    except OSError as error:
        raise InvalidArgument(
            f"cannot read pathlock's configuration file {config}: {error.strerror}"
        ) from error
    except tomllib.TOMLDecodeError as error:
        raise InvalidArgument(f"{config} is not valid TOML: {error}") from error
    url = settings.get("database_url")
    if not isinstance(url, str) or not url:
        raise InvalidArgument(
            f"{config} must set database_url to a URL string, such as "
            'database_url = "sqlite:////var/lib/pathlock/locks.sqlite3"'
        )
    return url


POOL_OPTIONS = ("poolclass", "pool", "pool_size", "max_overflow")
"""The ``engine_options`` that configure a pool: given any, pathlock sets
none of its own."""

MAIN_POOL = {"pool_size": 15, "max_overflow": 0}
"""The main pool of an engine pathlock creates: up to 15 connections, each
opened when a call needs one, and kept. SQLAlchemy's default of 5 kept and
10 more closed when given back made a process with many threads waiting on
one customer open and close a connection for every third grant; keeping them
cut its CPU per grant by 45% (docs/DEPLOYING.md)."""


def open_engine(
    database: object,
    engine_options: dict[str, Any],
    settings: Settings = DEFAULT,
    *,
    asynchronous: bool = False,
) -> tuple[Engine, bool]:
    """The engine to use for ``database`` (a URL, a URL string, an Engine or
    ``None`` for the default) and whether pathlock created it (and disposes it).
    The database's dialect sets the engine up (:mod:`pathlock.dialects`).

    ``asynchronous``: for the asyncio API, whose engines use the family's
    asyncio driver (a URL naming the synchronous one is read with it; an
    ``AsyncEngine`` is taken through its synchronous face)."""
    if database is None:
        database = default_database_url()
    database = _unwrapped(database, asynchronous=asynchronous)
    if isinstance(database, Engine):
        if engine_options:
            raise ArgumentTypeError("engine_options only apply when pathlock creates the engine")
        if is_async(database) != asynchronous:
            raise ArgumentTypeError(_wrong_api(asynchronous))
        return dialects.for_name(database.dialect.name).adopt(database, settings)
    if isinstance(database, (str, URL)):
        url = engine_url(database, asynchronous=asynchronous)
        dialect = dialects.for_name(url.get_backend_name())
        options = dict(engine_options)
        if not any(key in options for key in POOL_OPTIONS):
            options.update(MAIN_POOL)
        return dialect.open_engine(url, options, settings), True
    kind = type(database).__name__
    raise ArgumentTypeError(
        f"database must be a URL string, a sqlalchemy URL, an Engine or None, got {kind}"
    )


def engine_url(database: str | URL, *, asynchronous: bool) -> URL:
    """The URL pathlock creates the engine for ``database`` from, by the one
    rule of both APIs: a database pathlock runs on, through one of its
    family's :attr:`~pathlock.dialects.base.Dialect.drivers` (the asyncio API
    reads it with the family's asyncio driver), or through an asyncio driver,
    which serves the asyncio API only. Anything else is an
    :class:`InvalidArgument` that says what to write, the same from either
    API and whatever drivers happen to be installed."""
    try:
        url = make_url(database)
    except (SQLAlchemyError, ValueError) as error:
        raise InvalidArgument(f"not a database URL: {error}") from error
    backend = url.get_backend_name()
    dialect = dialects.for_name(backend)  # first: SQLAlchemy knows the driver of these only
    driver = url.get_driver_name()
    if driver in ASYNC_DRIVERS:
        if not asynchronous:
            raise InvalidArgument(
                f"{url.drivername}:// is an asyncio driver: use AsyncPathLockManager, "
                f"or a URL of a synchronous driver with PathLockManager"
            )
        return url
    if dialect.drivers and driver not in dialect.drivers:
        raise InvalidArgument(
            f"pathlock reaches {backend} through {dialect.drivers[0]}, not {driver}: write "
            f"{backend}+{dialect.drivers[0]}://... instead of {url.drivername}://..."
        )
    if asynchronous and not dialect.async_on_threads:
        return dialect.async_url(url)
    return url


def _unwrapped(database: object, *, asynchronous: bool) -> object:
    """The synchronous face of an ``AsyncEngine`` given to the asyncio API."""
    if type(database).__name__ != "AsyncEngine":
        return database
    if not asynchronous:
        raise ArgumentTypeError(_wrong_api(asynchronous))
    return database.sync_engine  # type: ignore[attr-defined]


def _wrong_api(asynchronous: bool) -> str:
    if asynchronous:
        return (
            "AsyncPathLockManager needs an AsyncEngine (asyncmy or aiosqlite) or a URL, "
            "not an engine of a synchronous driver"
        )
    return "PathLockManager needs an engine of a synchronous driver: use AsyncPathLockManager"


def open_engines(
    database: object,
    engine_options: dict[str, Any],
    settings: Settings = DEFAULT,
    *,
    asynchronous: bool = False,
) -> list[tuple[Engine, bool]]:
    """:func:`open_engine` for one database, or for each node of a cluster
    given as a list or tuple of URLs and engines (MySQL or MariaDB only)."""
    # A sqlalchemy URL is a named tuple: one node.
    if not isinstance(database, (list, tuple)) or isinstance(database, URL):
        return [open_engine(database, engine_options, settings, asynchronous=asynchronous)]
    if not database:
        raise InvalidArgument("no database node given: the list is empty")
    opened: list[tuple[Engine, bool]] = []
    try:
        for node in database:
            if node is None:
                raise ArgumentTypeError("a database node must be a URL or an Engine, got None")
            opened.append(
                open_engine(node, dict(engine_options), settings, asynchronous=asynchronous)
            )
        _check_nodes([engine for engine, _ in opened])
    except PathLockError:
        for engine, owned in opened:
            if owned:
                engine.dispose()
        raise
    return opened


def open_renewal_engines(
    opened: list[tuple[Engine, bool]], engine_options: dict[str, Any], settings: Settings = DEFAULT
) -> list[tuple[Engine, bool]]:
    """The engines of a manager's renewals, one per engine in ``opened``
    (what :func:`open_engines` returned). For an engine pathlock created, a
    second engine on the same database with a small pool of its own
    (one connection for the renewal round and one for each of
    ``settings.stragglers`` renewals that wait for a busy customer's row,
    unless ``engine_options`` configure the pool): many
    threads waiting for locks may hold every connection of the main pool, and
    a renewal that waited behind them could come too late. An engine passed
    in is shared as it is: renewals take their connections from its pool."""
    options = dict(engine_options)
    if not any(key in options for key in POOL_OPTIONS):
        options.update(pool_size=1, max_overflow=settings.stragglers + 1)
    renewal: list[tuple[Engine, bool]] = []
    try:
        for engine, owned in opened:
            renewal.append(
                open_engine(engine.url, dict(options), settings, asynchronous=is_async(engine))
                if owned
                else (engine, False)
            )
    except PathLockError:
        for engine, owned in renewal:
            if owned:
                engine.dispose()
        raise
    return renewal


def _check_nodes(engines: list[Engine]) -> None:
    if len(engines) == 1:
        return
    if not all(dialects.for_name(engine.dialect.name).several_nodes for engine in engines):
        raise InvalidArgument(
            "several database nodes make sense for a MySQL or MariaDB cluster only, not SQLite"
        )
    names = [node_name(engine) for engine in engines]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise InvalidArgument(f"database node given twice: {', '.join(repeated)}")
