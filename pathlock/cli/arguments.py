"""The command line's arguments: the parser, its help texts and the checks
of option values.

It only describes what ``pathlock`` accepts; :mod:`pathlock.cli.commands` does the work.
Each subcommand's parser records its name in ``args.subcommand``, the exit
status for a failure of pathlock itself in ``args.failure_status`` and its own
``error`` method in ``args.usage_error``, for usage errors found after parsing.
"""

from __future__ import annotations

import argparse
import math
import textwrap
from importlib import metadata
from typing import NoReturn

from pathlock import _reaper as reaper
from pathlock import bench, dialects
from pathlock._backends import CONFIG_ENV_VAR, SYSTEM_CONFIG, URL_ENV_VAR, default_sqlite_path
from pathlock._core import validation
from pathlock.cli.runner import (
    EXIT_FAILURE,
    EXIT_LEASE_LOST,
    EXIT_NOT_EXECUTABLE,
    EXIT_NOT_FOUND,
    EXIT_TIMEOUT,
    FENCING_TOKEN_VAR,
    LEASE_ID_VAR,
)
from pathlock.errors import PathLockError

EXIT_ERROR = 1
EXIT_USAGE = 2
DEFAULT_KILL_GRACE = 5.0

MAIN_EPILOG = f"""\
examples:
  pathlock lock --customer 42 /Shared/reports -- ./rebuild-reports.sh
  pathlock ls --tree
  pathlock release 5f0c3e0d9b6a4c1e8a2f7d3b1c9e6a40
  pathlock reap --quiet                  # from cron
  pathlock db upgrade --sql --dialect mariadb > pathlock.sql
  pathlock bench --quick --no-report

The database is --database-url URL (e.g. mysql+pymysql://user:password@db-host/app),
else ${URL_ENV_VAR}, else database_url in ${CONFIG_ENV_VAR} or {SYSTEM_CONFIG},
else the embedded SQLite file {default_sqlite_path()},
for locks among this user's processes. `pathlock info` says which one is used.
Every subcommand has --help, with examples.
"""

LOCK_EPILOG = f"""\
examples:
  pathlock lock --customer 42 /Shared/target --shared /Shared/source -- cp -r src dst
  pathlock lock --timeout 10 --reason "nightly export" /exports -- ./export.sh --all

The command runs without a shell, with {LEASE_ID_VAR} and {FENCING_TOKEN_VAR}
in its environment (pass the token to storage that fences stale writers).
SIGHUP, SIGINT and SIGTERM stop the wait for the locks, or are forwarded to the
command's process group while it runs. The locks are released once the command
exited and every process it started is gone: processes left behind are stopped
(SIGTERM, then SIGKILL after --kill-grace seconds), also if pathlock is killed.

exit status:
  N    the command's own exit status (128+N if it died of signal N)
  {EXIT_LEASE_LOST}  the lease was lost while the command ran; the command was stopped
       (SIGTERM, then SIGKILL after --kill-grace seconds)
  {EXIT_TIMEOUT}  the locks were busy: not granted within --timeout
  {EXIT_FAILURE}  pathlock itself failed (invalid path, database unreachable or not
       answering within --timeout, ...)
  {EXIT_NOT_EXECUTABLE}  the command was found but could not be run
  {EXIT_NOT_FOUND}  the command was not found
  128+N  pathlock received signal N while waiting for the locks
"""

INFO_EPILOG = f"""\
examples:
  pathlock info
  sudo -u www-data pathlock info      # the database another user's processes use
  pathlock info --json | jq -r .databases[0]

The database is --database-url, else ${URL_ENV_VAR}, else database_url in
${CONFIG_ENV_VAR} or {SYSTEM_CONFIG} (e.g.
database_url = "sqlite:////var/lib/pathlock/locks.sqlite3"), else the user's own
embedded SQLite file. Processes of different users share locks only through
one database: give them all the same one, in the configuration file.
"""

LS_EPILOG = """\
examples:
  pathlock ls                       # every customer's locks, as a table
  pathlock ls --customer 42 --tree  # one customer's locked paths as a tree
  pathlock ls --json | jq '.[] | select(.expires_in_seconds < 5)'

Ages and times left are measured by the database's clock.
"""

RELEASE_EPILOG = """\
examples:
  pathlock release 5f0c3e0d9b6a4c1e8a2f7d3b1c9e6a40   # one lease, id from `pathlock ls`
  pathlock release --node web-3 --yes                 # everything a dead node held

The holder learns that its lease is lost at its next renewal. Each release is
logged with the user and host that asked for it. Exit status: 0 if something
was released, 1 if nothing matched.
"""

REAP_EPILOG = f"""\
examples:
  pathlock reap
  */5 * * * *  pathlock reap --quiet --database-url mysql+pymysql://pathlock@db/app

Deletes expired lock rows and dead waiter rows, {reaper.BATCH_SIZE} per transaction by
default; expired rows block nobody, this only keeps the tables small. Exit
status: 0, or 1 on failure.
"""

REAPER_EPILOG = """\
examples:
  pathlock reaper --interval 60 -v

Runs `pathlock reap` every --interval seconds (with 10 % jitter, the first run
at once) until SIGTERM or SIGINT, then exits 0. Any number of nodes may reap
at once.
"""

# {notes}: filled in by _add_db(), with the databases pathlock runs on.
DB_UPGRADE_EPILOG = """\
examples:
  pathlock db upgrade --database-url mysql+pymysql://admin@db-host/app
  pathlock db upgrade --sql --dialect mariadb > pathlock.sql

{notes}
"""

DB_EPILOG = """\
examples:
  pathlock db current                     # the revision the database records
  pathlock db check || pathlock db upgrade
  pathlock db upgrade --database-url mysql+pymysql://admin@db-host/app
  pathlock db upgrade --sql --dialect mariadb > pathlock.sql
  pathlock db stamp 0006                  # tables made by hand: record their revision
  pathlock db downgrade 0004

{notes}
"""

DB_CHECK_NOTE = (
    "`db check` exits 0 when the database is at the newest revision this pathlock ships, "
    "1 otherwise."
)


def _sql_note() -> str:
    """What --dialect does, naming the databases pathlock runs on: those of
    every registered family."""
    *others, last = dialects.SUPPORTED
    one_of = f"{', '.join(others)} or {last}" if others else last
    return (
        f"With --sql nothing connects: --dialect ({one_of}), else the URL's dialect, "
        "says which server the SQL is for; a mysql+pymysql:// URL means MySQL 8, so for "
        "MariaDB give --dialect mariadb. The SQL for MySQL or MariaDB begins with a statement "
        "that stops it, before it creates anything, on any other server."
    )


BENCH_EPILOG = (
    f"""\
examples:
  pathlock bench                          # everything; writes {bench.DEFAULT_OUTPUT}
  pathlock bench --only 3,5 --no-report   # fairness and hand-off, printed only
  pathlock bench --quick --output /tmp/bench.md   # a smoke test, in well under a minute

experiments:
"""
    + "".join(f"  {number}  {title}\n" for number, title in bench.EXPERIMENTS.items())
    + f"""
Each figure is printed beside its baseline, measured in the same run. The
report goes to --output, the fairness plot ({bench.PLOT_NAME}, or named
after another report) beside it (it needs matplotlib: pip install
'pathlock[bench]'). The suite needs a
MySQL, MariaDB or PostgreSQL server of its own: it adds and deletes many
rows, and experiment 7 reaps every expired row of the database.
"""
)


class _Parser(argparse.ArgumentParser):
    """An argparse parser whose usage errors are one line, like every error."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"pathlock: error: {message} (see '{self.prog} --help')\n")


# -- argument types -----------------------------------------------------------------


def _number(text: str) -> float:
    try:
        number = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(number):
        raise argparse.ArgumentTypeError(f"not a finite number of seconds: {text!r}")
    return number


def _seconds(text: str) -> float:
    number = _number(text)
    if number < 0:
        raise argparse.ArgumentTypeError(f"must be 0 seconds or more, got {text}")
    return number


def _positive_seconds(text: str) -> float:
    number = _number(text)
    if number <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, got {text}")
    return number


def _count(text: str) -> int:
    try:
        count = int(text)
    except ValueError:
        count = 0
    if count < 1:
        raise argparse.ArgumentTypeError(f"not a count of 1 or more: {text!r}")
    return count


def _experiments(text: str) -> tuple[int, ...]:
    chosen = []
    for part in text.split(","):
        try:
            number = int(part)
        except ValueError:
            number = 0
        if number not in bench.EXPERIMENTS:
            raise argparse.ArgumentTypeError(
                f"not a list of experiments {min(bench.EXPERIMENTS)} to "
                f"{max(bench.EXPERIMENTS)}: {text!r}"
            )
        chosen.append(number)
    return tuple(chosen)


def _customer(text: str) -> int:
    try:
        return validation.customer_id(int(text))
    except (ValueError, PathLockError):
        raise argparse.ArgumentTypeError(
            f"not a customer id (0 to {validation.MAX_CUSTOMER_ID}): {text!r}"
        ) from None


# -- the parser -----------------------------------------------------------------------


DATABASE_URL_HELP = (
    f"SQLAlchemy URL of the database (default: ${URL_ENV_VAR}, else database_url in "
    f"{SYSTEM_CONFIG}, else the user's embedded SQLite file: `pathlock info` tells); "
    "given again for each node of a Galera cluster, which pathlock fails over between"
)


def _common_options(
    parser: argparse.ArgumentParser, *, defaults: bool, url_help: str = DATABASE_URL_HELP
) -> None:
    """The options every subcommand takes, before or after its name. Only the
    top-level parser has defaults: a subcommand's would overwrite a value
    given before the subcommand's name."""
    parser.add_argument(
        "--database-url",
        metavar="URL",
        action="append",
        default=None if defaults else argparse.SUPPRESS,
        help=url_help,
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=False if defaults else argparse.SUPPRESS,
        help="log progress to stderr; by default only warnings and errors",
    )


def _subcommand(
    subparsers: argparse._SubParsersAction[_Parser],
    name: str,
    *,
    summary: str,
    epilog: str,
    url_help: str = DATABASE_URL_HELP,
) -> _Parser:
    parser = subparsers.add_parser(
        name,
        help=summary,
        description=summary[0].upper() + summary[1:] + ".",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    _common_options(parser, defaults=False, url_help=url_help)
    parser.set_defaults(subcommand=name, usage_error=parser.error, failure_status=EXIT_ERROR)
    return parser


def _node_id_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--node-id",
        metavar="ID",
        help="this node's name, stored with its locks (default: the host name)",
    )


def _batch_size_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--batch-size",
        type=_count,
        default=reaper.BATCH_SIZE,
        metavar="N",
        help=f"rows per transaction (default: {reaper.BATCH_SIZE})",
    )


def _add_lock(subparsers: argparse._SubParsersAction[_Parser]) -> None:
    parser = _subcommand(
        subparsers,
        "lock",
        summary="run a command while holding locks on paths, like flock(1)",
        epilog=LOCK_EPILOG,
    )
    parser.usage = (
        "%(prog)s [options] [PATH ...] [--shared PATH ...] [--shallow PATH ...]"
        " -- COMMAND [ARG ...]"
    )
    parser.set_defaults(failure_status=EXIT_FAILURE)
    parser.add_argument("paths", nargs="*", metavar="PATH", help="a path to lock exclusive")
    parser.add_argument(
        "--shared",
        action="append",
        default=[],
        metavar="PATH",
        help="a path to lock shared (repeatable)",
    )
    parser.add_argument(
        "--shallow",
        action="append",
        default=[],
        metavar="PATH",
        help="a path to lock at depth 0: the path alone, not what is below it; shared if "
        "also given with --shared, else exclusive (repeatable)",
    )
    parser.add_argument(
        "--customer", type=_customer, default=0, metavar="N", help="the customer id (default: 0)"
    )
    parser.add_argument(
        "--case-insensitive",
        action="store_true",
        help="case-fold the paths (/Shared/Foo locks /shared/foo), for file systems that "
        "ignore case; every process that locks the customer's paths must agree, and the "
        "database records the setting at the customer's first lock",
    )
    parser.add_argument(
        "--timeout",
        type=_seconds,
        metavar="S",
        help=f"give up (exit {EXIT_TIMEOUT}) if the locks are not granted within S seconds "
        "of pathlock's start, opening the database included; exit "
        f"{EXIT_FAILURE} if the database did not answer in that time "
        "(default: wait without limit)",
    )
    parser.add_argument(
        "--ttl",
        type=_positive_seconds,
        metavar="S",
        help="lease duration: how long the paths stay locked if this machine dies "
        "(default: 30; renewed while the command runs)",
    )
    parser.add_argument(
        "--reason",
        metavar="TEXT",
        help="shown to operators by `pathlock ls` (default: the command line)",
    )
    parser.add_argument(
        "--kill-grace",
        type=_seconds,
        default=DEFAULT_KILL_GRACE,
        metavar="S",
        help="seconds between SIGTERM and SIGKILL when the command's processes are stopped "
        "(lease lost, processes left behind, pathlock killed) "
        f"(default: {DEFAULT_KILL_GRACE:g})",
    )
    _node_id_option(parser)


def _add_ls(subparsers: argparse._SubParsersAction[_Parser]) -> None:
    parser = _subcommand(
        subparsers, "ls", summary="list held locks and waiting requests", epilog=LS_EPILOG
    )
    parser.add_argument(
        "--customer", type=_customer, metavar="N", help="only this customer (default: all)"
    )
    shape = parser.add_mutually_exclusive_group()
    shape.add_argument("--tree", action="store_true", help="draw each customer's paths as a tree")
    shape.add_argument("--json", action="store_true", help="a JSON array, for scripts")
    parser.add_argument(
        "--expired", action="store_true", help="include expired locks not yet reaped"
    )


def _add_info(subparsers: argparse._SubParsersAction[_Parser]) -> None:
    parser = _subcommand(
        subparsers,
        "info",
        summary="say which database pathlock uses, what chose it, and what is in it",
        epilog=INFO_EPILOG,
    )
    parser.add_argument("--json", action="store_true", help="a JSON object, for scripts")


def _add_release(subparsers: argparse._SubParsersAction[_Parser]) -> None:
    parser = _subcommand(
        subparsers,
        "release",
        summary="release a lease, or every lock of a node, on an operator's request",
        epilog=RELEASE_EPILOG,
    )
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("lease_id", nargs="?", metavar="LEASE_ID", help="the lease to release")
    which.add_argument("--node", metavar="NODE_ID", help="release every lock of this node")
    parser.add_argument("--yes", action="store_true", help="confirm --node")


def _add_reap(subparsers: argparse._SubParsersAction[_Parser]) -> None:
    parser = _subcommand(
        subparsers, "reap", summary="delete expired locks once", epilog=REAP_EPILOG
    )
    _batch_size_option(parser)
    parser.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="print nothing unless it fails, and then only the error",
    )


def _add_reaper(subparsers: argparse._SubParsersAction[_Parser]) -> None:
    parser = _subcommand(
        subparsers,
        "reaper",
        summary="delete expired locks periodically, in the foreground",
        epilog=REAPER_EPILOG,
    )
    parser.add_argument(
        "--interval",
        type=_positive_seconds,
        default=reaper.INTERVAL,
        metavar="S",
        help=f"seconds between runs (default: {reaper.INTERVAL:g})",
    )
    _batch_size_option(parser)
    _node_id_option(parser)


def _add_db(subparsers: argparse._SubParsersAction[_Parser]) -> None:
    sql_note = _sql_note()
    db_epilog = DB_EPILOG.format(notes=textwrap.fill(f"{DB_CHECK_NOTE} {sql_note}", width=78))
    upgrade_epilog = DB_UPGRADE_EPILOG.format(notes=textwrap.fill(sql_note, width=78))
    db = subparsers.add_parser(
        "db",
        help="manage pathlock's tables",
        description="Manage pathlock's tables.",
        epilog=db_epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = db.add_subparsers(title="actions", required=True, metavar="ACTION")
    # (action, summary, takes --sql, its revision argument's help: None for none)
    specs = (
        ("upgrade", "create or upgrade pathlock's tables (Alembic migrations)", True, None),
        (
            "downgrade",
            "downgrade pathlock's tables to an older revision",
            True,
            "target revision (base: drop the tables; with --sql, FROM:TO)",
        ),
        ("current", "print the revision the database records", False, None),
        ("check", "exit 0 if the database is at the newest revision, 1 if not", False, None),
        (
            "stamp",
            "record a revision as the database's without migrating",
            True,
            "the revision the tables are at (or head)",
        ),
    )
    for action, summary, sql, revision in specs:
        epilog = upgrade_epilog if action == "upgrade" else db_epilog
        parser = _subcommand(actions, action, summary=summary, epilog=epilog)
        parser.set_defaults(subcommand=f"db {action}")
        if sql:
            _sql_option(parser)
        if action == "upgrade":
            parser.add_argument(
                "--revision", default="head", metavar="REV", help="target revision (default: head)"
            )
        elif revision is not None:
            parser.add_argument("revision", metavar="REV", help=revision)


def _sql_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sql", action="store_true", help="print the SQL instead of running it")
    parser.add_argument(
        "--dialect",
        choices=dialects.SUPPORTED,
        help="with --sql: the server the SQL is for (default: that of --database-url, "
        "where mysql means MySQL 8); MySQL and MariaDB need different collations",
    )


def _add_bench(subparsers: argparse._SubParsersAction[_Parser]) -> None:
    parser = _subcommand(
        subparsers,
        "bench",
        summary="run the benchmark suite and write its report",
        epilog=BENCH_EPILOG,
        url_help="the MySQL, MariaDB or PostgreSQL server to measure "
        f"(default: {bench.DEFAULT_URL}, not ${URL_ENV_VAR})",
    )
    parser.add_argument(
        "--url",
        dest="database_url",
        metavar="URL",
        action="append",
        default=argparse.SUPPRESS,
        help="the same as --database-url",
    )
    parser.add_argument(
        "--only",
        type=_experiments,
        default=(),
        metavar="N[,N...]",
        help="run only these experiments (default: all)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="tiny sizes: a smoke test whose figures mean nothing"
    )
    report = parser.add_mutually_exclusive_group()
    report.add_argument(
        "--output",
        default=bench.DEFAULT_OUTPUT,
        metavar="PATH",
        help=f"where the markdown report goes (default: {bench.DEFAULT_OUTPUT}, from the "
        "current directory)",
    )
    report.add_argument(
        "--no-report", action="store_true", help="only print the figures; write no file"
    )


def build_parser() -> argparse.ArgumentParser:
    """The whole command line (``pathlock --help`` shows it)."""
    parser = _Parser(
        prog="pathlock",
        description="Hierarchical path locks kept in your MySQL/MariaDB or PostgreSQL database "
        "(or, on one host, in an embedded SQLite file).",
        epilog=MAIN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"pathlock {version()}")
    _common_options(parser, defaults=True)
    subparsers = parser.add_subparsers(
        title="subcommands", required=True, metavar="SUBCOMMAND", parser_class=_Parser
    )
    adders = (_add_lock, _add_ls, _add_info, _add_release, _add_reap, _add_reaper, _add_db)
    for add in (*adders, _add_bench):
        add(subparsers)
    return parser


def version() -> str:
    """This installation's version."""
    try:
        return metadata.version("pathlock")
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "(not installed)"
