"""Which database errors a transaction can simply be tried again after."""

from __future__ import annotations

from sqlalchemy.exc import DBAPIError

# Error codes after which the same attempt can simply run again: the failed
# transaction was rolled back (or its outcome is checked, see try_grant).
TRANSIENT_ERRORS = frozenset(
    {
        1205,  # lock wait timeout
        1213,  # deadlock (and a cluster's certification failure)
        1047,  # a cluster node outside the primary component (Galera)
        1053,  # server shutdown in progress
        1180,  # error during COMMIT (a Galera node that lost the primary component)
        1927,  # connection killed (MariaDB)
        2003,  # cannot connect (server restarting)
        2006,  # server has gone away
        2013,  # lost connection during query
        2014,  # commands out of sync (a broken connection)
        4031,  # disconnected by the server for inactivity (MySQL 8)
    }
)


# Errors that say the node is gone or cannot serve (as opposed to the
# transaction having lost a race): a manager with several nodes moves on.
NODE_FAILURES = frozenset({1047, 1053, 1180, 2003, 2006, 2013, 2014, 4031})

# A lost race with another transaction of the same customer: on one server a
# deadlock, on a cluster mostly a certification failure. Retried for as long
# as the caller may wait, not a fixed number of times (see transactions.py).
CONTENTION = 1213


def error_code(error: DBAPIError) -> int | None:
    args = getattr(error.orig, "args", ())
    if args and isinstance(args[0], int):
        return args[0]
    return None


# SQLite's primary result codes (the low byte of the extended code) when the
# database is locked by another connection for longer than the busy timeout.
_SQLITE_BUSY = 5
_SQLITE_LOCKED = 6


def is_transient(error: DBAPIError) -> bool:
    """Deadlocks, lock-wait timeouts and lost connections: worth another try."""
    if error.connection_invalidated or error_code(error) in TRANSIENT_ERRORS:
        return True
    sqlite_code = getattr(error.orig, "sqlite_errorcode", None)
    return isinstance(sqlite_code, int) and sqlite_code & 0xFF in (_SQLITE_BUSY, _SQLITE_LOCKED)


def is_node_failure(error: DBAPIError) -> bool:
    """The node is gone, restarting or outside its cluster's primary component."""
    return error_code(error) in NODE_FAILURES


_NO_SUCH_TABLE = 1146


def is_missing_table(error: DBAPIError) -> bool:
    return error_code(error) == _NO_SUCH_TABLE or "no such table" in str(error.orig)


def hint(error: DBAPIError) -> str:
    if is_missing_table(error):
        return (
            "the pathlock tables are missing: run `pathlock db upgrade` (or the Alembic "
            "migrations, or manager.create_schema())"
        )
    return ""
