"""The ``pathlock`` command line: lock around a command, list, release, reap,
migrate, benchmark.

What it accepts is :mod:`pathlock.cli.arguments`; each subcommand here is a thin
layer over :class:`PathLockManager` (``lock`` over :mod:`pathlock.cli.runner`,
``ls`` over :mod:`pathlock.cli.listing`). Results go to
stdout; everything else goes through logging to stderr, one line per message
starting with ``pathlock:``, so an error is one line, never a traceback. This
module is the one place in pathlock that configures logging.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import logging
import os
import shlex
import signal
import socket
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import NoReturn

from sqlalchemy import Engine, distinct, func, make_url, select
from sqlalchemy.exc import SQLAlchemyError

from pathlock import bench, dialects
from pathlock._backends import URL_ENV_VAR, default_database, open_engine
from pathlock._core.limits import REASON_LENGTH
from pathlock._embedded import upgrade_on_open
from pathlock._owners import process_user
from pathlock._statements.common import now
from pathlock.bench.stats import count
from pathlock.cli import listing
from pathlock.cli.arguments import EXIT_ERROR, build_parser, version
from pathlock.cli.runner import LockRequest, run_locked
from pathlock.errors import BackendError, CaseRuleMismatch, PathLockError, SchemaMismatch
from pathlock.manager import PathLockManager
from pathlock.schema import REVISION, REVISIONS, path_lock_waiters, path_locks
from pathlock.settings import DEFAULT as DEFAULT_SETTINGS
from pathlock.settings import Settings

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_INTERRUPTED = 128 + signal.SIGINT

# The command line's own loggers: their messages read as sentences on stderr;
# records of the library and of other packages carry their level.
_OWN_LOGGERS = frozenset({__name__, "pathlock.cli.runner"})
# What --verbose shows: pathlock's progress (each reaper run, with what it
# deleted) and each migration step; not Alembic's set-up, nor APScheduler's
# account of running a job, which says nothing of what the run did.
_MIGRATION_LOGGER = "alembic.runtime.migration"
_VERBOSE_LOGGERS = ("pathlock", _MIGRATION_LOGGER)
_ALEMBIC_SET_UP = ("Context impl ", "Will assume ")


class _Formatter(logging.Formatter):
    """``pathlock: ...`` on one line: errors say ``error:``, the command
    line's own messages need no more, other records say their level."""

    def format(self, record: logging.LogRecord) -> str:
        if record.levelno >= logging.ERROR:
            level = "error: "
        elif record.name in _OWN_LOGGERS:
            level = ""
        else:
            level = f"{record.levelname.lower()}: "
        # One line per message: Alembic's step lines quote a revision's
        # docstring, which may wrap.
        message = " ".join(record.getMessage().splitlines())
        text = f"pathlock: {level}{message}"
        if record.exc_info:  # only the library's unexpected failures (bugs) carry one
            text += "\n" + self.formatException(record.exc_info)
        return text


# -- the subcommands -----------------------------------------------------------------


def _databases(args: argparse.Namespace) -> tuple[list[str], str]:
    """The URLs of the database (one, or a cluster's nodes) and what chose
    them: --database-url, else the manager's default (the environment, the
    configuration file or the user's embedded SQLite file)."""
    urls: list[str] | None = args.database_url
    if urls:
        return urls, "--database-url"
    default = default_database()
    return [default.url], default.chosen_by


def _shown(url: str) -> str:
    """``url`` without its password."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - not a URL: the manager will say so
        return url


def _said(urls: list[str], chosen_by: str) -> list[str]:
    """``urls``, once -v has said which database they are: the default
    depends on the user and the host."""
    for url in urls:
        log.info("database: %s (from %s)", _shown(url), chosen_by)
    return urls


def _manager(args: argparse.Namespace, settings: Settings | None = None) -> PathLockManager:
    urls = _said(*_databases(args))
    database = urls if len(urls) > 1 else urls[0]
    return PathLockManager(
        database,
        node_id=getattr(args, "node_id", None),
        case_insensitive=getattr(args, "case_insensitive", False),
        settings=settings,
    )


def _bounded_by(timeout: float | None) -> Settings | None:
    """The manager's settings for a lock whose --timeout counts from the
    start, opening the database included: the schema check gets half of it,
    no more than the usual 2 s, and no less than the grace a last attempt
    has anyway (below that it would hardly ever get an answer, and the lock
    would go ahead unchecked); close() gets no more than a second to delete
    what an attempt that got no reply may have granted (left to expire,
    within --ttl, otherwise)."""
    if timeout is None:
        return None
    return dataclasses.replace(
        DEFAULT_SETTINGS,
        schema_check_time=min(
            DEFAULT_SETTINGS.schema_check_time, max(timeout / 2, DEFAULT_SETTINGS.grace)
        ),
        close_time=min(DEFAULT_SETTINGS.close_time, DEFAULT_SETTINGS.resolve_time),
    )


def _first_url(args: argparse.Namespace) -> str | None:
    """The first --database-url: enough where one node will do (a cluster
    replicates schema changes to every node)."""
    urls: list[str] | None = args.database_url
    return urls[0] if urls else None


def _one_database(args: argparse.Namespace) -> str:
    """The database of a ``db`` command: the first --database-url, else the
    default, said by -v as the other commands say theirs."""
    urls, chosen_by = _databases(args)
    return _said(urls[:1], chosen_by)[0]


def _default_reason(command: Sequence[str]) -> str:
    """The command line, as a shell would quote it, cut to the column's size.
    Arguments that are not valid UTF-8 show their bytes escaped."""
    text = (
        shlex.join(command).encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    )
    return text if len(text) <= REASON_LENGTH else text[: REASON_LENGTH - 1] + "…"


def _lock(args: argparse.Namespace) -> int:
    started = time.monotonic()  # --timeout counts from here
    if not args.command:
        args.usage_error("give the command to run after --")
    if not args.paths and not args.shared and not args.shallow:
        args.usage_error("give at least one PATH, --shared PATH or --shallow PATH to lock")
    request = LockRequest(
        exclusive=args.paths,
        shared=args.shared,
        shallow=args.shallow,
        timeout=args.timeout,
        deadline=None if args.timeout is None else started + args.timeout,
        ttl=args.ttl,
        reason=_default_reason(args.command) if args.reason is None else args.reason,
        command=args.command,
        kill_grace=args.kill_grace,
    )
    with _manager(args, _bounded_by(args.timeout)) as manager:
        try:
            return run_locked(manager.for_customer(args.customer), request)
        except CaseRuleMismatch as error:
            # The library's advice names its Python option; say the flag.
            rule, advice = (
                ("case-insensitive", "add --case-insensitive")
                if error.recorded
                else ("case-sensitive", "leave out --case-insensitive")
            )
            raise PathLockError(
                f"customer {error.customer_id}'s paths are {rule}, as the database recorded "
                f"at their first lock: {advice} (every process that locks them must agree)"
            ) from error


def _ls(args: argparse.Namespace) -> int:
    with _manager(args) as manager:
        locks = manager.list_locks(args.customer, include_expired=args.expired)
        waiters = manager.list_waiters(args.customer)
        # Read after the rows, so no age is negative.
        now = manager.database_time()
    rows = listing.entries(locks, waiters, now)
    if args.json:
        _write(listing.as_json(rows, now))
    elif not rows:
        scope = "" if args.customer is None else f" for customer {args.customer}"
        _write(f"no locks{scope}" + (" (expired ones included)" if args.expired else ""))
    else:
        _write(*(listing.tree(rows, now) if args.tree else listing.table(rows, now)))
    return EXIT_OK


def _requested_by() -> str:
    return f"{process_user()} on {socket.gethostname()}"


def _release(args: argparse.Namespace) -> int:
    if args.node is not None and not args.yes:
        args.usage_error(
            f"--node releases every lock of node {args.node!r} for every customer; "
            "add --yes to confirm"
        )
    # The library logs the audit record (a WARNING naming who asked).
    with _manager(args) as manager:
        if args.lease_id is not None:
            released = manager.release_lease(args.lease_id, requested_by=_requested_by())
        else:
            released = manager.release_node(args.node, requested_by=_requested_by())
    return EXIT_OK if released else EXIT_ERROR


def _reap(args: argparse.Namespace) -> int:
    with _manager(args) as manager:
        started = time.monotonic()
        deleted = manager.reap_expired(batch_size=args.batch_size)
        elapsed = time.monotonic() - started
    if not args.quiet:
        _write(f"pathlock reap: deleted {count(deleted, 'expired row')} in {elapsed:.2f} s")
    return EXIT_OK


def _reaper(args: argparse.Namespace) -> int:
    stop = {signal.SIGINT, signal.SIGTERM}
    # Block the stop signals before the scheduler starts its threads, which
    # inherit the mask: only sigwait() below receives them, so a stop never
    # strikes in the middle of a run, and close() lets a run in progress end.
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, stop)
    try:
        with _manager(args) as manager:
            manager.start_reaper(args.interval, batch_size=args.batch_size)
            log.info("reaping every %g s until SIGTERM or SIGINT", args.interval)
            received = signal.sigwait(stop)
            log.info("%s received: stopping", signal.Signals(received).name)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    return EXIT_OK


def _sql_url(args: argparse.Namespace) -> str:
    """The URL whose dialect --sql prints for: --dialect, else --database-url
    or $PATHLOCK_DATABASE_URL; the embedded default is never guessed at. (The
    migrations print which server that is, first.)"""
    url = _first_url(args) or os.environ.get(URL_ENV_VAR)
    usage_error: Callable[[str], NoReturn] = args.usage_error
    if args.dialect is not None:
        # A URL without a server, for the dialect alone.
        url = dialects.for_name(args.dialect).offline_url(args.dialect)
    elif url is None:
        usage_error("--sql needs --dialect or --database-url: which server is the SQL for?")
    return url


def _db_change(args: argparse.Namespace, verb: str) -> int:
    """``db upgrade``, ``downgrade`` or ``stamp``: print the SQL (``--sql``),
    or run it and say what changed."""
    from pathlock import migrate  # noqa: PLC0415 - Alembic is slow to import; only db needs it

    run: Callable[..., None] = getattr(migrate, verb)
    if args.dialect is not None and not args.sql:
        args.usage_error("--dialect goes with --sql (a connection knows its server)")
    if args.sql:
        run(_sql_url(args), sql=True, revision=args.revision, output=sys.stdout)
        return EXIT_OK
    url = _one_database(args)
    before = migrate.current(url)
    run(url, revision=args.revision, output=sys.stdout)
    after = migrate.current(url)
    if verb == "stamp":
        _write(f"pathlock db stamp: the database records revision {after}")
    elif before == after and verb == "upgrade" and _past(args.revision, after):
        _write(
            f"pathlock db upgrade: the database is past revision {args.revision} "
            f"(at {after}); `pathlock db downgrade {args.revision}` goes back"
        )
    elif before == after:
        _write(f"pathlock db {verb}: already at revision {after or 'none'}; nothing to do")
    else:
        _write(f"pathlock db {verb}: {verb}d from revision {before or 'none'} to {after or 'none'}")
    return EXIT_OK


def _past(target: str, recorded: str | None) -> bool:
    """Whether a database at revision ``recorded`` is past ``target``."""
    if target not in REVISIONS or recorded not in REVISIONS:
        return False
    return REVISIONS.index(target) < REVISIONS.index(recorded)


def _schema_state(current: str | None, tables: Sequence[str]) -> tuple[bool, str]:
    """Whether a database whose tables record revision ``current`` (and of
    whose tables ``tables`` exist) is at this pathlock's revision, and a
    sentence on it."""
    if current == REVISION:
        return True, f"at revision {current}, the newest this pathlock ships"
    if current is None and tables:
        return False, str(SchemaMismatch(None, REVISION))
    if current is None:
        return False, (
            "no revision recorded; `pathlock db upgrade` creates the tables "
            f"(revision {REVISION}), or, for tables made by hand, "
            "`pathlock db stamp REV` records theirs"
        )
    if current in REVISIONS:
        return False, (
            f"at revision {current}, behind this pathlock's {REVISION}: run `pathlock db upgrade`"
        )
    return False, (
        f"at revision {current}, which this pathlock does not know (it ships up to "
        f"{REVISION}): a newer pathlock migrated it"
    )


def _info(args: argparse.Namespace) -> int:
    """Which database the other subcommands use, who chose it, and what is in it."""
    from pathlock import migrate  # noqa: PLC0415

    urls, chosen_by = _databases(args)
    shown = [_shown(url) for url in urls]
    if not args.json:  # before anything can fail: which database, at least
        _write(
            f"pathlock:   {version()}",
            *(f"database:   {url}" for url in shown),
            f"chosen by:  {chosen_by}",
        )
    engine, owned = open_engine(urls[0], {})
    try:
        server, (revision, tables) = _server_and_state(engine, migrate)
        at_head, state = _schema_state(revision, tables)
        counts = _counts(engine) if at_head else {}
    finally:
        if owned:
            engine.dispose()
    if args.json:
        facts = {
            "pathlock": version(),
            "databases": shown,
            "chosen_by": chosen_by,
            "server": server,
            "revision": revision,
            "schema": state,
            **counts,
        }
        _write(json.dumps(facts, indent=2))
        return EXIT_OK
    lines = [f"server:     {server}", f"schema:     {state}"]
    if counts:
        held = count(counts["locks"], "path")
        if counts["locks"]:
            held += " of " + count(counts["customers"], "customer")
        lines.append(f"locks:      {held} locked, {count(counts['waiting'], 'request')} waiting")
    _write(*lines)
    return EXIT_OK


def _server_and_state(
    engine: Engine, migrate: ModuleType
) -> tuple[str, tuple[str | None, Sequence[str]]]:
    """The server's name and version, and the revision its tables record and
    which of them exist. The embedded SQLite file is brought up to date first,
    as every subcommand that uses it does."""
    try:
        dialect = dialects.for_name(engine.dialect.name)
        if dialect.upgrades_on_open:
            upgrade_on_open(engine)
        with engine.connect() as connection:
            server = dialect.server_version(connection)
            revision, tables = migrate.schema_state(connection)
            connection.rollback()
    except SQLAlchemyError as error:
        raise BackendError("reading the database's version", error) from error
    return server, (revision, tables)


def _counts(engine: Engine) -> dict[str, int]:
    """Live locks, the customers holding them, and waiting requests."""
    try:
        with engine.connect() as connection:
            alive = path_locks.c.expires_at > now()
            locks, customers = connection.execute(
                select(func.count(), func.count(distinct(path_locks.c.customer_id))).where(alive)
            ).one()
            waiting = connection.execute(
                select(func.count()).where(path_lock_waiters.c.expires_at > now())
            ).scalar_one()
            connection.rollback()
    except SQLAlchemyError as error:
        raise BackendError("counting the locks", error) from error
    return {"locks": int(locks), "customers": int(customers), "waiting": int(waiting)}


def _db_current(args: argparse.Namespace) -> int:
    _db_check(args)
    return EXIT_OK


def _db_check(args: argparse.Namespace) -> int:
    from pathlock import migrate  # noqa: PLC0415

    at_head, state = _schema_state(*migrate.state(_one_database(args)))
    _write(state)
    return EXIT_OK if at_head else EXIT_ERROR


def _bench(args: argparse.Namespace) -> int:
    # Only the benchmarks need multiprocessing, matplotlib and the experiments.
    from pathlock.bench import suite  # noqa: PLC0415

    suite.run(
        # Not the embedded default: the figures are about a server.
        url=_bench_url(args),
        only=args.only,
        quick=args.quick,
        output=None if args.no_report else Path(args.output),
        write=_write,
    )
    return EXIT_OK


def _bench_url(args: argparse.Namespace) -> str:
    """The server to measure, its URL checked as every subcommand checks its
    database: a one-line error, not the suite's traceback, for a URL that
    pathlock cannot use or whose driver is missing. Nothing connects."""
    from pathlock import migrate  # noqa: PLC0415

    url = _first_url(args) or bench.DEFAULT_URL
    # An embedded file is refused by the suite; opening one would create it.
    if not dialects.for_name(migrate.sql_dialect(url)).upgrades_on_open:
        migrate.engine_for(url).dispose()
    return url


# -- running it -----------------------------------------------------------------------


_SUBCOMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "lock": _lock,
    "ls": _ls,
    "release": _release,
    "reap": _reap,
    "reaper": _reaper,
    "db upgrade": functools.partial(_db_change, verb="upgrade"),
    "db downgrade": functools.partial(_db_change, verb="downgrade"),
    "info": _info,
    "db current": _db_current,
    "db check": _db_check,
    "db stamp": functools.partial(_db_change, verb="stamp"),
    "bench": _bench,
}


def _write(*lines: str) -> None:
    """The one place results are printed: stdout, a line each."""
    sys.stdout.write("".join(line + "\n" for line in lines))
    sys.stdout.flush()


def _split_command(argv: list[str]) -> tuple[list[str], list[str]]:
    """pathlock's arguments, and the command after the first ``--`` (argparse's
    REMAINDER would take a command's own options for pathlock's)."""
    if "--" not in argv:
        return argv, []
    split = argv.index("--")
    return argv[:split], argv[split + 1 :]


def _alembic_news(record: logging.LogRecord) -> bool:
    """Whether a record is worth showing: not Alembic's account of its own
    set-up ("Context impl MySQLImpl.", "Will assume non-transactional DDL."),
    which it logs at INFO beside each migration step."""
    return record.name != _MIGRATION_LOGGER or not str(record.msg).startswith(_ALEMBIC_SET_UP)


def _logging_handler(verbose: bool, quiet: bool) -> logging.Handler:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Formatter())
    handler.addFilter(_alembic_news)
    if quiet:  # for cron: a failure is one line, without the retries before it
        handler.setLevel(logging.ERROR)
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    if verbose:
        for name in _VERBOSE_LOGGERS:
            logging.getLogger(name).setLevel(logging.INFO)
    return handler


def main(argv: list[str] | None = None) -> int:
    """Run the command line; return its exit status."""
    arguments, command = _split_command(sys.argv[1:] if argv is None else list(argv))
    parser = build_parser()
    args = parser.parse_args(arguments)
    args.command = command
    if command and args.subcommand != "lock":
        parser.error("only `pathlock lock` takes a command after --")
    handler = _logging_handler(args.verbose, getattr(args, "quiet", False))
    try:
        status = _SUBCOMMANDS[args.subcommand](args)
    except PathLockError as error:
        log.error("%s", error)  # noqa: TRY400 - one line, no traceback, is the point
        return int(args.failure_status)
    except KeyboardInterrupt:
        log.error("interrupted")  # noqa: TRY400
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader of stdout went away (`pathlock ls | head`): nothing more
        # to say to anyone; keep Python from complaining at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_ERROR
    finally:
        logging.getLogger().removeHandler(handler)
    return status
