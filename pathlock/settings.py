"""Every tunable of pathlock's timing in one frozen, checked object.

The defaults are what production wants; a test, or a deployment with unusual
needs, builds its own and gives it to the manager::

    from pathlock import PathLockManager, Settings

    manager = PathLockManager(url, settings=Settings(call_time=3.0, try_time=3.0))

Times are in seconds. :class:`Settings` checks every value when it is built
(:class:`ArgumentTypeError` for a wrong type, :class:`InvalidArgument` for a
value out of range), and a manager's settings cannot change afterwards.
``dataclasses.replace(manager.settings, ...)`` makes a changed copy for
another manager.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from pathlock._core import validation
from pathlock.clock import SYSTEM, Clock
from pathlock.errors import ArgumentTypeError, InvalidArgument

_MAX_SECONDS = 24 * 3600.0  # a day: any longer is a mistake, not a timing
_MAX_COUNT = 86_400  # whole seconds, or renewals at once


@dataclass(frozen=True, kw_only=True)
class Settings:
    """pathlock's timing: every field, its unit and its default. Times are in
    seconds; each field is described in full below.

    Bounds of calls:

    - ``call_time`` (seconds, default 10.0): how long an operation may take
      when its caller gives no time of its own (listings, releases, the
      reaper's batches, renewals, a lock request without a timeout).
    - ``grace`` (seconds, default 0.5): how long past its time an operation
      may still spend finding out whether a COMMIT that got no reply took
      effect.
    - ``try_time`` (seconds, default 10.0): how long a try-lock may take, plus
      ``grace``.
    - ``try_patience`` (seconds, default 1.0): how long a try-lock retries
      attempts that lose races before :class:`ContentionTimeout`.
    - ``close_time`` (seconds, default 10.5): how long ``close()`` may spend
      releasing what the manager holds.
    - ``close_wait`` (seconds, default 5.0): how long ``close()`` waits for
      calls still running in other threads.
    - ``resolve_time`` (seconds, default 1.0): how long an interrupted request
      spends deleting the rows it may have left before a background thread
      takes that over.
    - ``schema_check_time`` (seconds, default 2.0): how long the manager's
      constructor spends checking the tables' revision.

    Waiting:

    - ``recheck`` (seconds, default 1.0): time between attempts of a waiting
      request that sees no lock released (it notices locks that expired);
      a request of a thread or a task (not of an ``owner=`` name) waits
      without rechecks while older requests in its way are still queued.
    - ``hand_over_check`` (seconds, default 0.001): time between the checks
      of the next request in line for paths a release handed to it.
    - ``hand_over_window`` (seconds, default 0.05): how long the next request
      in line checks that often after it became next (or attempted); then as
      the wait policy says.
    - ``shared_check`` (seconds, default 0.01): while several requests of one
      process (its threads, or the tasks of an asyncio API's loop) wait on a
      customer, the shortest time between two reads of that customer's queue
      for their checks (one read answers all of them).
    - ``waiter_ttl`` (seconds, default 5.0): how soon a waiting request that
      died stops blocking the requests behind it.

    Retries and cluster nodes:

    - ``contention_delay`` (seconds, default 0.005): the longest sleep before
      the first retry after a lost race; each further sleep may be twice as
      long.
    - ``contention_delay_cap`` (seconds, default 0.1): the longest sleep
      between retries after lost races.
    - ``set_aside`` (seconds, default 5.0): how long a cluster node that
      failed is passed over.
    - ``ping_time`` (seconds, default 1.0): how long a node that let an
      attempt time out has to answer a ping.
    - ``shortest_ping`` (seconds, default 0.4): with less time left than this
      for the ping, such a node is kept for the rest of the operation.

    Renewals and losses:

    - ``lease_margin`` (a fraction of the ttl, default 0.1): how long before
      its expiry a lease that could not be renewed counts as lost.
    - ``max_lease_margin`` (seconds, default 5.0): the longest such margin.
    - ``renewal_retry`` (seconds, default 1.0): how soon renewals are tried
      again after a round failed.
    - ``skipped_retry`` (seconds, default 0.05): how soon a round tries again
      the leases of a customer whose lock row another transaction held.
    - ``stragglers`` (renewals, default 4): renewals that wait for such a
      customer's row, at once at most.
    - ``settle_retry`` (seconds, default 1.0): time between the background
      attempts to delete the rows of a grant or release that was interrupted,
      or whose COMMIT got no reply.

    The database connection:

    - ``socket_timeout`` (seconds, default 30.0): how long the driver waits
      for a MySQL or MariaDB server's reply before the connection counts as
      lost.
    - ``lock_wait_timeout`` (whole seconds, default 10): how long the server
      lets a statement wait for a row lock (``innodb_lock_wait_timeout``).
    - ``idle_transaction_timeout`` (whole seconds, default 5): how long a
      MariaDB or PostgreSQL server lets a transaction of pathlock's sit idle
      before it ends the session (``idle_transaction_timeout``,
      ``idle_in_transaction_session_timeout``): a frozen client holds its
      customer's row no longer.
    - ``sqlite_busy_timeout`` (seconds, default 10.0): how long a SQLite
      connection waits for the file's write lock.
    - ``clock`` (a :class:`~pathlock.clock.Clock`, default the machine's
      clock, :class:`~pathlock.clock.SystemClock`): where the time comes from.
    """

    call_time: float = 10.0
    """How long an operation may take when its caller gives no time of its
    own (listings, releases, the reaper's batches, renewals, a lock request
    without a timeout): connecting, every statement, retries and sleeps. Lost
    races (error 1213) are retried for as long, then ``ContentionTimeout``; an
    operation that got no answer in time raises ``DatabaseTimeout``."""

    grace: float = 0.5
    """How long past its time an operation may still spend finding out
    whether a COMMIT that got no reply took effect (one more attempt, which
    looks for its own rows first)."""

    try_time: float = 10.0
    """How long a try-lock may take (connecting, its attempt, retries), plus
    ``grace``. It never waits for conflicting locks; this bounds only the
    database's own waits, which under load include the write lock of a busy
    SQLite file and, on a cluster, the seconds it takes to evict a dead node:
    at 1.5 s, try-locks failed with ``DatabaseTimeout`` under such ordinary
    load."""

    try_patience: float = 1.0
    """How long a try-lock keeps retrying attempts that lose races (on a
    cluster, certification failures against writes through other nodes)
    before ``ContentionTimeout``. A blocking request retries them until its
    timeout."""

    recheck: float = 1.0
    """Time between attempts of a waiter whose version watch sees nothing:
    it notices a conflicting lock that expired without a release."""

    hand_over_check: float = 0.001
    """Time between the checks of the next request in line for paths a
    release handed to it (on one MySQL or MariaDB server, where releases grant
    their paths to the head of the queue): it notices within about this long,
    at the cost of a primary-key read each time, for ``hand_over_window``
    seconds after it became next (or attempted). The others in line, and the
    next one after that, check as the wait policy says."""

    hand_over_window: float = 0.05
    """How long the next request in line checks every ``hand_over_check``
    after it became next in line or attempted: a request behind a lock held
    for minutes read the database a thousand times a second for minutes.
    Afterwards it notices paths handed to it within the wait policy's gaps
    (10 ms at most by default), which a hold that long hardly feels."""

    shared_check: float = 0.01
    """While several threads of one process wait on one customer, the
    shortest time between two reads of that customer's queue made for
    different waiting requests: the checks that come due meanwhile wait for
    the next read, and one read answers all of them, so the process reads
    the customer about once per this interval, however many of its threads wait
    (docs/BENCHMARKS-CROWD.md). A request that waits alone in its process
    checks when it is due; the asyncio API's requests check by themselves."""

    waiter_ttl: float = 5.0
    """How long a queued request's row lives without a refresh (a waiter
    refreshes it three times as often): a waiter that died stops blocking the
    requests queued behind it within this time."""

    set_aside: float = 5.0
    """How long a cluster node that failed is passed over before it is tried
    first again."""

    contention_delay: float = 0.005
    """The longest sleep before the first retry after a lost race (full
    jitter); each further retry sleeps up to twice as long as the one before,
    to at most ``contention_delay_cap``."""

    contention_delay_cap: float = 0.1
    """The longest sleep between retries after lost races."""

    ping_time: float = 1.0
    """How long a node that let an attempt time out has to answer ``SELECT 1``
    on another connection (at most half the time left): one that answers was
    only slow, one that does not is passed over."""

    shortest_ping: float = 0.4
    """With less time than this for the ping, a node that let an attempt time
    out is kept for the rest of the operation: a shorter ping proves nothing.
    On a loaded 2-core machine a healthy Galera node's ping took up to 0.2 s,
    and pings of about 0.1 s set healthy nodes aside."""

    close_time: float = 10.5
    """How long ``close()`` may spend releasing what it holds, however many
    leases: those it could not release in time are left to expire."""

    resolve_time: float = 1.0
    """How long an interrupted request spends deleting the rows it may have
    left before handing that to a background thread."""

    close_wait: float = 5.0
    """How long ``close()`` waits for calls still running in other threads
    before it disposes the engine (within ``close_time``)."""

    schema_check_time: float = 2.0
    """How long the manager's constructor spends checking the schema's
    revision; a database that does not answer in time is not checked."""

    stragglers: int = 4
    """Renewals of customers whose row another transaction holds, each in a
    transaction of its own, at once at most."""

    renewal_retry: float = 1.0
    """How soon the heartbeat tries again after a renewal round failed."""

    skipped_retry: float = 0.05
    """How soon a renewal round tries again, at most a twentieth of the ttl,
    the leases of a customer whose sentinel another transaction held and that
    no renewal of their own could take on (one runs already, or
    ``stragglers`` run)."""

    settle_retry: float = 1.0
    """Seconds between the background attempts to delete the rows of leases
    left in doubt (an interrupted grant or release, a COMMIT without reply)."""

    lease_margin: float = 0.1
    """The fraction of its ttl, at most ``max_lease_margin``, before its expiry
    at which a lease that could not be renewed counts as lost: the holder
    stops before anyone else may be granted its paths."""

    max_lease_margin: float = 5.0
    """The longest margin, in seconds."""

    socket_timeout: float = 30.0
    """How long the driver waits for a server's reply, on engines pathlock
    creates, before the connection counts as lost. Keep it above a Galera
    node's eviction time (``evs.suspect_timeout`` + 1 s) and row-lock waits:
    every wait is also cut to the time its call has left."""

    lock_wait_timeout: int = 10
    """Whole seconds the server lets a statement wait for a row lock
    (``innodb_lock_wait_timeout``), on engines pathlock creates; a smaller
    value the session already has is kept. The server does not notice a
    client that gave up while its statement waits."""

    idle_transaction_timeout: int = 5
    """Whole seconds a MariaDB or PostgreSQL server lets a transaction of
    pathlock's sit idle, between statements, before it ends the session
    (``idle_transaction_timeout``, MariaDB 10.3+, where a smaller value the
    session already has is kept; ``idle_in_transaction_session_timeout`` on
    PostgreSQL), on engines pathlock creates. pathlock's own transactions
    last milliseconds, but a client stopped inside one (SIGSTOP, a paused VM,
    a silent network) held its customer's sentinel row, and so every grant,
    release and renewal of that customer, until MariaDB's ``wait_timeout``
    (8 hours by default) or, on PostgreSQL, for as long as its connection
    stayed up. MySQL has no such setting: there a frozen client holds the row
    until ``wait_timeout`` ends its session (set it lower on the server) or
    an operator kills it."""

    sqlite_busy_timeout: float = 10.0
    """How long a SQLite connection waits for the file's write lock."""

    clock: Clock = SYSTEM
    """Where the time comes from: ``now()`` for lease deadlines and renewals,
    ``monotonic()`` for a lock request's timeout and waits (see
    :class:`pathlock.clock.Clock`). Tests give one that jumps or stands still."""

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name == "clock":
                for method in ("now", "monotonic"):
                    if not callable(getattr(value, method, None)):
                        raise ArgumentTypeError(
                            f"clock must have now() and monotonic() methods, "
                            f"got {type(value).__name__}"
                        )
                continue
            if field.type == "int":
                count = validation.positive_int(field.name, value)
                if count > _MAX_COUNT:
                    raise InvalidArgument(f"{field.name} must be at most {_MAX_COUNT}, got {count}")
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ArgumentTypeError(
                    f"{field.name} must be a number, got {type(value).__name__}"
                )
            number = float(value) if abs(value) < _MAX_SECONDS * 2 else math.inf
            if not 0 < number <= _MAX_SECONDS:  # NaN fails too
                raise InvalidArgument(
                    f"{field.name} must be more than 0 and at most {_MAX_SECONDS:g}, got {value!r}"
                )
            object.__setattr__(self, field.name, number)
        if self.lease_margin >= 1:
            raise InvalidArgument(
                f"lease_margin is a fraction of the ttl, below 1, got {self.lease_margin:g}"
            )
        for short, long in (
            ("contention_delay", "contention_delay_cap"),
            ("shortest_ping", "ping_time"),
            ("try_patience", "try_time"),
        ):
            if getattr(self, short) > getattr(self, long):
                raise InvalidArgument(
                    f"{short} ({getattr(self, short):g}) must not be more than "
                    f"{long} ({getattr(self, long):g})"
                )

    @property
    def waiter_refresh(self) -> float:
        """Time between refreshes of a waiter's queue row."""
        return self.waiter_ttl / 3


def checked(value: object) -> Settings:
    """``value`` if it is a :class:`Settings`, the defaults for ``None``."""
    if value is None:
        return DEFAULT
    if not isinstance(value, Settings):
        raise ArgumentTypeError(f"settings must be a pathlock.Settings, got {type(value).__name__}")
    return value


DEFAULT = Settings()
