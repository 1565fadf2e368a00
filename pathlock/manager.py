"""The public entry point: PathLockManager (CustomerLocks is in :mod:`pathlock.customer`).

A request flows one way: ``CustomerLocks.lock_paths`` -> ``paths`` normalize ->
:func:`pathlock._acquire.acquire`, which runs the steps of
:class:`pathlock._flow.AcquireFlow`: loop {``Grants.try_grant`` -> granted: a
:class:`Lease`; blocked: queued, then watch the customer's version until an
attempt can succeed} -> ``Lease.release`` -> ``Releases.release`` (wakes this
process's waiters of the same customer).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import URL, Connection, Engine, inspect
from sqlalchemy.exc import SQLAlchemyError

from pathlock import _deadlines as deadlines
from pathlock import _interrupts as interrupts
from pathlock import _lifecycle as lifecycle
from pathlock import _owners as owners
from pathlock import _reaper as reaper
from pathlock import _validation as validation
from pathlock import dialects, events, otel
from pathlock._acquire import acquire
from pathlock._backends import open_engines, open_renewal_engines
from pathlock._embedded import upgrade_on_open
from pathlock._heartbeat import Heartbeat, Stragglers
from pathlock._records import GrantRequest, lease_data
from pathlock._routing import Router
from pathlock._settling import Expiring, InDoubt
from pathlock._store import Store
from pathlock._transactions import THREAD, Runner, Transactions
from pathlock._upkeep import LeaseRows, Upkeep
from pathlock.customer import CustomerLocks
from pathlock.dialects.base import is_async
from pathlock.errors import (
    ArgumentTypeError,
    BackendError,
    ContentionTimeout,
    DeadlockDetected,
    InvalidArgument,
    LeaseLost,
    LockTimeout,
    ManagerClosed,
    PathLockError,
    SchemaMismatch,
)
from pathlock.lease import Lease, LostCallback
from pathlock.paths import normalize, normalize_request, normalize_shallow
from pathlock.schema import REVISION, REVISIONS, create_tables, metadata
from pathlock.settings import Settings
from pathlock.settings import checked as checked_settings
from pathlock.types import (
    Cancel,
    DetachedLease,
    LeaseInfo,
    LockInfo,
    Owner,
    PathMode,
    WaiterInfo,
)
from pathlock.waiting import ExponentialBackoff, Hearing, LocalWakeups, WaitPolicy

if TYPE_CHECKING:
    from apscheduler.job import Job
    from apscheduler.schedulers.base import BaseScheduler

    from pathlock._aio import TaskHeartbeat

T = TypeVar("T")

log = logging.getLogger(__name__)

_NONE_SHALLOW: frozenset[str] = frozenset()  # a request with no path at depth 0

CLOSED_WHILE_HELD = "the PathLockManager was closed while the lease was held"
RELEASED_BY_OWNER = "release_locks() of its owner released it while it was held"
_BUSY_CUSTOMER = (
    "the database answered, but another transaction held its customer's row, and every "
    "renewal that waits for such a row was busy"
)


def _several(database: object) -> bool:
    """Whether ``database`` names several nodes (see :func:`open_engines`)."""
    listed = isinstance(database, (list, tuple)) and not isinstance(database, URL)
    return listed and len(database) > 1  # type: ignore[arg-type]


def _check_flags(
    database: object,
    node_id: str | None,
    *,
    cleanup_on_start: object,
    case_insensitive: object,
    heartbeat: object,
    affinity: object,
) -> None:
    """The manager's flags: bools, and the combinations that make sense."""
    for name, flag in (
        ("cleanup_on_start", cleanup_on_start),
        ("case_insensitive", case_insensitive),
        ("heartbeat", heartbeat),
        ("affinity", affinity),
    ):
        validation.flag(name, flag)
    if cleanup_on_start and node_id is None:
        # The default (the host name) is shared by every process on the
        # host: cleaning up after it would delete the live locks of the
        # other processes.
        raise InvalidArgument(
            "cleanup_on_start needs an explicit node_id that no other running "
            "process uses (the default, the host name, is shared by all "
            "processes on this host)"
        )
    if affinity and not _several(database):
        raise InvalidArgument(
            "affinity=True chooses among the nodes of a cluster: give several "
            "database nodes, or leave it off with one database"
        )


def _renewal_rows(leases: list[Lease]) -> list[tuple[int, str, int]]:
    return [(lease.customer_id, lease.lease_id, len(lease.paths)) for lease in leases]


def _renewed(lease: Lease, held: bool, started: float) -> None:
    """Record the outcome of a renewal that began at ``started`` (the lease clock)."""
    if held:
        lease._extend(started)
    else:
        lease._mark_lost(
            "its rows were gone when it was renewed (expired, reaped, or deleted by an operator)"
        )


def _requester(requested_by: object) -> str:
    """``, requested by X`` for the audit line of an operator action."""
    checked = validation.reason(requested_by, "requested_by")
    return f", requested by {checked}" if checked else ""


def _paths(count: int) -> str:
    return f"{count} path" if count == 1 else f"{count} paths"


class PathLockManager:
    """Hierarchical path locks shared by every process that uses one database.

    ``database`` is a SQLAlchemy URL (``mysql+pymysql://user@host/db``), a
    :class:`sqlalchemy.URL` or an :class:`~sqlalchemy.Engine`. An engine passed
    in is used as it is (transactions run in READ COMMITTED) and is not disposed
    by :meth:`close`; one created from a URL is. ``sqlite:///path/to/file``
    selects the embedded backend for processes of one host (pathlock creates
    and upgrades its tables; a SQLite engine passed in is reopened with
    pathlock's settings). With no ``database``: ``$PATHLOCK_DATABASE_URL``, else
    the embedded default file (see :mod:`pathlock._backends`).

    ``database`` may also be a list of the nodes of one multi-master cluster
    (MariaDB Galera; URLs or engines, spelled the same way on every app
    server): an operation runs on one node and moves to the next at once when
    that node is lost or leaves the cluster's primary component, so callers
    notice a node failure only as latency (see :mod:`pathlock._routing` and
    docs/CLUSTER.md). :attr:`engines` are the nodes' engines, :attr:`engine`
    the first one. On a Galera node, pathlock's own engines turn on causal
    reads (``wsrep_sync_wait``) unless the server already has them on.

    Options (keyword-only), checked here (:class:`ArgumentTypeError` for a
    wrong type, :class:`InvalidArgument` for a wrong value) and read-only
    afterwards:

    - ``node_id``: this app server's name, stored with every lock for operators
      and node clean-up; default: the host name.
    - ``ttl``: default lease duration in seconds (30): how long the paths of a
      crashed holder stay locked. Held leases are renewed (``heartbeat``).
    - ``case_insensitive``: case-fold paths, for file systems that ignore case.
      A customer's first lock records the setting in the database; a manager
      with the other one gets :class:`CaseRuleMismatch` for that customer.
    - ``backoff``: how long a blocked request sleeps between checks of its
      customer's version (default: :class:`ExponentialBackoff`, 2 ms growing to
      10 ms; :class:`ReverseExponentialBackoff`, the original blog post's, is
      the other one shipped). Any object with ``start()`` returning ``next() -> seconds``
      will do. Fairness comes from the queue, not from the policy.
    - ``max_attempts``: how often one transaction is tried on transient database
      errors (lock-wait timeout, lost connection, a cluster node that cannot
      serve) before :class:`BackendError`. Lost races (deadlocks; on a cluster,
      certification failures) are retried by time instead: a blocking request
      until its timeout, a try-lock for a second, anything else for 10 s
      (:class:`ContentionTimeout`).
    - ``heartbeat``: renew held leases from a background thread (default); a
      lease is renewed a third of its ttl after its grant or last renewal, and
      declared lost (``on_lost``, :attr:`Lease.lost`) when it is found gone or
      could not be renewed until shortly before it may have expired.
    - ``on_lost``: called with the :class:`Lease` when any lease of this manager
      is lost, on the manager's callback thread (see :data:`LostCallback`).
    - ``cleanup_on_start``: delete every lock and waiter row of ``node_id`` first:
      what a crashed earlier run of this node left behind (but the detached
      leases it granted: see :meth:`CustomerLocks.lock_detached`). It needs an explicit
      ``node_id`` that no other running process uses (one per process, stable
      across restarts, e.g. ``"web-1.worker-3"``); with the default node id,
      shared by every process of the host, it is refused.
    - ``affinity``: with several nodes, send each customer's operations to a
      home node of its own (rendezvous hashing over the nodes' addresses,
      with failover) instead of every operation to the first healthy node: a
      customer's conflicts stay row-lock waits on one node, and customers
      spread over the nodes. With one database it is refused.
    - ``engine_options``: extra keyword arguments for ``create_engine`` (for
      every node), such as ``pool_size`` and ``max_overflow`` (default 15
      and 0: up to 15 connections, opened as needed and kept) or
      ``pool_recycle`` (default 3600 s on MySQL and MariaDB). Renewals
      have a pool of their own (1 and 5); options that set the pool
      (``pool_size``, ``max_overflow``, ``poolclass``, ``pool``) set that one
      too. Refused with an ``Engine`` passed in. docs/DEPLOYING.md says how
      to size the pool.
    - ``settings``: the timing of every operation, a :class:`Settings`
      (default: ``Settings()``): how long a call without a timeout may take,
      how long a try-lock may take, how soon a dead waiter stops blocking, and
      the rest.
    - ``hooks``: objects told what happens (grants, waits, timeouts, retries,
      failovers, renewals, losses, releases, reaper runs): a list of
      :class:`Hooks` subclasses (see :mod:`pathlock.events`).
    - ``meter_provider``, ``tracer_provider``: where OpenTelemetry metrics and
      request spans go (see docs/METRICS.md); default: the global providers
      when ``opentelemetry-api`` is installed (``pip install 'pathlock[otel]'``),
      else none.
    """

    # The asyncio API's manager (pathlock.aio) runs this one's code in
    # greenlets on its loop: engines of asyncio drivers, waits handed to the
    # loop, no database call before it opens (see pathlock._aio).
    _asynchronous = False

    def __init__(
        self,
        database: str | URL | Engine | Sequence[str | URL | Engine] | None = None,
        /,
        *,
        node_id: str | None = None,
        ttl: float = 30.0,
        case_insensitive: bool = False,
        backoff: WaitPolicy | None = None,
        max_attempts: int = 5,
        heartbeat: bool = True,
        on_lost: LostCallback | None = None,
        cleanup_on_start: bool = False,
        affinity: bool = False,
        engine_options: dict[str, Any] | None = None,
        settings: Settings | None = None,
        hooks: Iterable[events.Hooks] = (),
        meter_provider: object = None,
        tracer_provider: object = None,
    ) -> None:
        _check_flags(
            database,
            node_id,
            cleanup_on_start=cleanup_on_start,
            case_insensitive=case_insensitive,
            heartbeat=heartbeat,
            affinity=affinity,
        )
        self._node_id = validation.node_id(socket.gethostname() if node_id is None else node_id)
        self._ttl = validation.ttl(ttl)
        self._case_insensitive = case_insensitive
        policy = ExponentialBackoff() if backoff is None else backoff
        self._backoff: WaitPolicy = validation.wait_policy(policy)
        if on_lost is not None and not callable(on_lost):
            raise ArgumentTypeError(
                f"on_lost must be a function that takes the lost Lease, or None; "
                f"got {type(on_lost).__name__}"
            )
        validation.positive_int("max_attempts", max_attempts)
        self._settings = timing = checked_settings(settings)
        runner = self._new_runner()
        self._wakeups = self._new_wakeups()
        told: list[events.Hooks] = [events.LoggingHooks(max_attempts)]
        metrics = otel.metrics_hooks(
            meter_provider=meter_provider,
            tracer_provider=tracer_provider,
            local_waiters=self._queued_here,
        )
        if metrics is not None:
            told.append(metrics)
        self._events = emitter = events.Emitter([*told, *events.checked(hooks)])
        # Checked before anything is opened: dict() and create_engine(**options)
        # would raise a bare TypeError, or one for each node of a cluster.
        if engine_options is not None and not isinstance(engine_options, Mapping):
            raise ArgumentTypeError(
                "engine_options must be a dict of create_engine() keyword arguments, or None; "
                f"got {type(engine_options).__name__}"
            )
        for key in engine_options or {}:
            if not isinstance(key, str):
                raise ArgumentTypeError(
                    "engine_options' keys must be names of create_engine() arguments (str), "
                    f"got {type(key).__name__}"
                )
        opened = open_engines(
            database, dict(engine_options or {}), timing, asynchronous=self._asynchronous
        )
        self.engines = tuple(engine for engine, _ in opened)
        self.engine = self.engines[0]
        self._owned = [engine for engine, owned in opened if owned]
        self._cleanup_on_start = cleanup_on_start
        try:

            def transactions(engines: Sequence[Engine]) -> Transactions:
                return Transactions(
                    Router(engines, affinity=affinity, set_aside=timing.set_aside, emitter=emitter),
                    max_attempts=max_attempts,
                    case_insensitive=case_insensitive,
                    settings=timing,
                    emitter=emitter,
                    runner=runner,
                )

            main = transactions(self.engines)
            self._store = Store(main)
            self._upkeep = Upkeep(main)
            # The heartbeat's own pool: threads waiting for locks can never
            # take every connection while a renewal is due.
            renewal = open_renewal_engines(opened, dict(engine_options or {}), timing)
            self._owned += [engine for engine, owned in renewal if owned]
            self._renewals = Store(transactions([engine for engine, _ in renewal]))
            self._prepare([engine for engine, _ in [*opened, *renewal]])
        except PathLockError:
            if not self._asynchronous:
                self._dispose()
            raise
        self._renews = heartbeat
        self._keeper = _Keeper(self)
        self._on_lost = () if on_lost is None else (on_lost,)
        self._closed = False
        self._close_done = False
        self._start_process_state()
        if not self._asynchronous:
            # The asyncio API's manager belongs to its event loop: closed by
            # its owner on that loop, and not carried into forked children.
            lifecycle.track(self)

    def _new_runner(self) -> Runner:
        """How transactions run: on the caller's thread, or on the asyncio
        API's loop (see :mod:`pathlock._aio`)."""
        if not self._asynchronous:
            return THREAD
        from pathlock._aio import LoopRunner  # noqa: PLC0415 - the async extra

        self._loop_runner = LoopRunner()
        return self._loop_runner

    def _prepare(self, engines: list[Engine]) -> None:
        """Open the database now (the synchronous API), or get the asyncio
        API's engines ready for when it opens on its loop."""
        if not self._asynchronous:
            self._open()
            return
        from pathlock._aio import (  # noqa: PLC0415
            watch_cancellations,
            watch_commits,
            watch_connects,
        )

        for engine in engines:
            if is_async(engine):
                watch_commits(engine)
                watch_connects(engine, self._loop_runner)
            else:  # a synchronous driver's, whose attempts run on threads
                watch_cancellations(engine)

    def _open(self) -> None:
        """What opening the database takes (the first database calls): bring
        an embedded database's tables up to date, check the schema's revision,
        clean up after an earlier run of this node (``cleanup_on_start``)."""
        if dialects.for_name(self.engine.dialect.name).upgrades_on_open:
            upgrade_on_open(self.engine)
        self._check_schema()
        if self._cleanup_on_start:
            self._clean_up_node()

    def _new_heartbeat(self) -> Heartbeat | TaskHeartbeat:
        """The renewals' driver: a thread, or a task of the asyncio API's loop."""
        renew = functools.partial(self._renew_leases, heartbeat=True)
        if self._asynchronous:
            from pathlock._aio import TaskHeartbeat  # noqa: PLC0415 - the async extra

            return TaskHeartbeat(
                self._loop_runner,
                renew,
                retry_after=self._settings.renewal_retry,
                clock=self._settings.clock,
            )
        return Heartbeat(
            renew,
            retry_after=self._settings.renewal_retry,
            name=f"pathlock-heartbeat-{self.node_id}",
            clock=self._settings.clock,
        )

    def _new_wakeups(self) -> LocalWakeups:
        if self._asynchronous:
            return LocalWakeups(self._loop_runner.waker, listen=self._listen)
        return LocalWakeups(listen=self._listen)

    def _listen(self, heard: Callable[[int, int], None]) -> Hearing | None:
        """Hear the database's notices of hand-overs (see
        :meth:`LocalWakeups.told`), where it has them."""
        store = self._store
        return store.dialect.listen(store.router.nodes[0].engine, heard)

    # Read-only: the manager's leases, waiters and renewals were made with them.

    @property
    def node_id(self) -> str:
        """This app server's name, stored with every lock."""
        return self._node_id

    @property
    def ttl(self) -> float:
        """The default lease duration in seconds."""
        return self._ttl

    @property
    def case_insensitive(self) -> bool:
        """Whether paths are case-folded."""
        return self._case_insensitive

    @property
    def settings(self) -> Settings:
        """The timing of every operation (see :class:`Settings`)."""
        return self._settings

    @property
    def backoff(self) -> WaitPolicy:
        """How a blocked request paces its checks."""
        return self._backoff

    def _check_schema(self) -> None:
        """Refuse tables at another revision than this pathlock's (an older one
        may lock wrongly: at 0002, trailing spaces did not count), and tables
        that record no revision and lack columns this pathlock writes (what an
        older pathlock's ``create_schema()`` left: the first lock would fail on
        a missing column). No tables yet pass (``create_schema()`` or the
        migrations come next; until then a call says to run them); so does a
        database that does not answer within ``settings.schema_check_time``
        (its calls will say so)."""
        if dialects.for_name(self.engine.dialect.name).upgrades_on_open:
            return  # upgraded when opened
        seconds = self._settings.schema_check_time

        def lacks_columns(connection: Connection, _number: int) -> bool:
            """Whether a table of pathlock's lacks a column this pathlock has."""
            inspector = inspect(connection)
            existing = set(inspector.get_table_names())
            lacking = any(
                set(table.columns.keys())
                - {column["name"] for column in inspector.get_columns(table.name)}
                for table in metadata.sorted_tables
                if table.name in existing
            )
            connection.rollback()
            return lacking

        try:
            answered, recorded = self._upkeep.recorded_revision(seconds)
            if answered and recorded is None:
                # Tables with every column pass: another process's
                # create_schema() may be between creating them and recording
                # their revision, and they lock as they should.
                answered, lacking = self._upkeep._tx.once(lacks_columns, seconds=seconds)
                if lacking:
                    raise SchemaMismatch(None, REVISION)
        except BackendError as error:  # access denied, say: the calls will say so
            log.debug("could not check the schema's revision: %s", error)
            return
        if not answered:
            log.debug("could not check the schema's revision: no database node answered")
        elif recorded is not None and recorded != REVISION:
            raise SchemaMismatch(recorded, REVISION, recorded in REVISIONS)

    def _start_process_state(self) -> None:
        """Everything that belongs to one process: the owner identity, the
        leases, the threads and the internal locks. Made at construction and
        made anew in a forked child (:meth:`_after_fork`)."""
        self._pid = os.getpid()
        self._identity = owners.new_identity()
        self._leases: dict[str, Lease] = {}
        self._leases_lock = threading.Lock()
        # Leases whose release failed, until their rows have surely expired.
        self._abandoned: Expiring[str] = Expiring()
        self._in_doubt = InDoubt(
            self._settle_release,
            lambda: self._close_done,
            name=f"pathlock-settle-{self.node_id}",
            retry_every=self._settings.settle_retry,
        )
        self._calls = _Calls()
        self._reaper = reaper.ReaperJobs(
            lambda batch_size: self.reap_expired(batch_size=batch_size),
            name=f"pathlock reaper ({self.node_id})",
        )
        # Always there: it also runs the on_lost callbacks (a lease renewed
        # only by Lease.renew() can be lost too); it renews only if asked.
        self._heartbeat = self._new_heartbeat()
        self._stragglers = Stragglers(
            self._renew_stragglers,
            limit=self._settings.stragglers,
            name=f"pathlock-renew-{self.node_id}",
        )

    def _after_fork(self) -> None:
        """Run in a child forked from a process that used this manager: the
        child gets fresh connection pools (the parent's sockets are left
        alone, neither used nor closed), a new owner identity, no leases (the
        parent's stay the parent's: here they count as lost, and nothing can
        release or renew them), and its own threads and internal locks."""
        inherited = list(self._leases.values())
        for store in (self._store, self._renewals):
            store.after_fork()
            for node in store.router.nodes:
                node.engine.dispose(close=False)
        self._wakeups = self._new_wakeups()
        parent = self._pid
        self._start_process_state()
        for lease in inherited:
            lease._disown(
                f"it belongs to process {parent}; this process (pid {self._pid}) "
                f"is a fork() of it and does not hold it"
            )

    # -- public API ---------------------------------------------------------------

    def for_customer(self, customer_id: int) -> CustomerLocks:
        """The locks of one customer (tenant); customers never block each other."""
        customer_id = validation.customer_id(customer_id)
        self._check_open("lock paths")
        return CustomerLocks(self, customer_id)

    def create_schema(self) -> None:
        """Create the tables that do not exist yet (quick starts and tests;
        production runs the Alembic migrations). Never alters existing tables.
        On a database without pathlock's tables it also records their revision,
        as the migrations would, so ``pathlock db upgrade`` afterwards has
        nothing to do. Safe to call from many processes at once."""
        with self._call("create the schema"):
            try:
                create_tables(self.engine)
            except SQLAlchemyError as error:
                raise BackendError("creating the schema", error) from error

    def list_locks(
        self, customer_id: int | None = None, *, include_expired: bool = False
    ) -> list[LockInfo]:
        """Locked paths of one customer (or of all), sorted by customer and path.

        Expired rows that the reaper has not deleted yet are left out unless
        ``include_expired``.
        """
        if customer_id is not None:
            customer_id = validation.customer_id(customer_id)
        with self._call("list locks"):
            return self._upkeep.list_locks(customer_id, include_expired=include_expired)

    def database_time(self) -> datetime:
        """The database's clock (UTC), by which every lease expires: compare
        :attr:`LockInfo.expires_at` with this, not with the local clock."""
        with self._call("read the database's clock"):
            return self._upkeep.database_time()

    def list_waiters(self, customer_id: int | None = None) -> list[WaiterInfo]:
        """Queued requests of one customer (or of all) that are still alive,
        oldest first."""
        if customer_id is not None:
            customer_id = validation.customer_id(customer_id)
        with self._call("list waiters"):
            return self._upkeep.list_waiters(customer_id)

    def reap_expired(self, *, batch_size: int = reaper.BATCH_SIZE) -> int:
        """Delete expired lock rows and dead waiter rows; return how many.

        Expired rows already block nobody; deleting them keeps the table small.
        Rows go in transactions of ``batch_size`` rows (never one long DELETE
        that would stall acquirers), picked along the ``expires_at`` index and
        judged by the database's clock. Any number of nodes may reap at once.
        Each run also counts the rows of the customers whose counts are not
        trusted (customers locked before revision 0008, or by an older
        pathlock during a rolling upgrade; see docs/MIGRATIONS.md), and of
        those without rows whose counts say otherwise (left too high by an
        interrupted grant or release), so that their grants can skip the
        conflict search again.
        """
        batch_size = validation.positive_int("batch_size", batch_size)
        started = time.monotonic()
        with self._call("reap expired locks"):
            # close() stops a run between batches.
            locks, waiters = self._upkeep.reap(batch_size, lambda: self._closed)
        self._events.reaped(events.Reaped(locks, waiters, time.monotonic() - started))
        return locks + waiters

    def start_reaper(
        self, interval: float = reaper.INTERVAL, *, batch_size: int = reaper.BATCH_SIZE
    ) -> None:
        """Run :meth:`reap_expired` every ``interval`` seconds (first run now)
        on an APScheduler background scheduler that this manager owns and
        shuts down in :meth:`close`."""
        self._check_open("start the reaper")
        self._reaper.start(interval, batch_size)

    def add_reaper_job(
        self,
        scheduler: BaseScheduler,
        *,
        interval: float = reaper.INTERVAL,
        batch_size: int = reaper.BATCH_SIZE,
        job_id: str = reaper.JOB_ID,
    ) -> Job:
        """Add the reaper to an application's own APScheduler 3 scheduler: every
        ``interval`` seconds (with 10 % jitter, so many nodes spread out; the
        first run as soon as the scheduler runs), one run at a time, missed runs
        coalesced. An existing job ``job_id`` is replaced. Failures are logged
        as WARNINGs, never raised into the scheduler. :meth:`close` removes the
        job. The job calls this manager, so it needs the scheduler's in-memory
        job store (it cannot be pickled into a persistent one).
        """
        self._check_open("add a reaper job")
        return self._reaper.add(scheduler, interval, batch_size, job_id)

    def release_lease(self, lease_id: str, *, requested_by: str = "") -> int:
        """Delete the rows of any lease, by its id: the operator's escape hatch
        for a holder that hangs. Returns the number of paths released (0 if the
        lease does not exist). Logged as a WARNING naming ``requested_by`` (who
        asked). The holder finds out at its next renewal (its lease is lost) and
        must not rely on the lock after."""
        lease_id = validation.lease_id(lease_id)
        who = _requester(requested_by)
        with self._call("release a lease"):
            customer_id = self._upkeep.lease_customer(lease_id)
            if customer_id is None:
                log.warning("nothing released: no lease %s%s", lease_id, who)
                return 0
            try:
                deleted = self._store.releases.release(customer_id, lease_id)
            finally:
                self._wakeups.notify(customer_id)
        if deleted is None:  # a retry found the rows gone: the first attempt took them
            log.warning(
                "released lease %s (customer %d; how many paths was lost with the connection)%s",
                lease_id,
                customer_id,
                who,
            )
            return 0
        log.warning(
            "released %s of lease %s (customer %d)%s", _paths(deleted), lease_id, customer_id, who
        )
        return deleted

    def release_node(self, node_id: str, *, requested_by: str = "") -> int:
        """Delete every lock and waiter row of ``node_id``: clean-up after a
        node that died. Returns the number of paths released; logged as a
        WARNING naming ``requested_by``. Live holders on that node lose their
        leases. Detached leases that the node granted stay: no process of
        the node holds them (see :meth:`CustomerLocks.lock_detached`)."""
        node_id = validation.node_id(node_id)
        who = _requester(requested_by)
        with self._call("release a node's locks"):
            deleted = self._release_node(node_id)
        log.warning("released %s of node %r%s", _paths(deleted), node_id, who)
        return deleted

    def close(self) -> None:
        """Stop the heartbeat and the reaper, release every lease this manager
        still holds, and dispose the engine if the manager created it.

        Requests waiting in other threads wake and raise
        :class:`ManagerClosed`; nothing is granted after the close. A holder
        whose lease the close released finds it lost: :meth:`Lease.ensure_held`
        raises :class:`LeaseLost`, and so does leaving its ``with`` block
        (``on_lost`` callbacks do not run). Every later call raises
        :class:`ManagerClosed`. Calls still running in other threads get
        ``settings.close_wait`` seconds to finish before the engine is disposed.
        Idempotent; if an interrupt stops it midway, calling it again (or the
        interpreter's exit) finishes it. Nothing of the manager is left running
        afterwards. Managers still open when the interpreter exits are closed
        then."""
        closing = self._begin_close()
        if closing is None:
            return
        first, leases = closing
        if first:
            self._stop_background()
        # One bound for all of them: a database that does not answer costs
        # close() settings.close_time, not that much per lease.

        def release_all(_limit: deadlines.Limit) -> None:
            for lease in leases:
                lease._end(CLOSED_WHILE_HELD)
                lease.release()
            self._calls.wait_idle(self._settings.close_wait)
            self._in_doubt.settle()

        deadlines.within(time.monotonic() + self._settings.close_time, release_all)
        self._finish_close()

    def _begin_close(self) -> tuple[bool, list[Lease]] | None:
        """The first step of :meth:`close`: nothing is granted from now on
        and local waiters wake. Whether this is the first close, and the
        leases to release; ``None`` when a close finished already."""
        with self._leases_lock:
            first = not self._closed
            self._closed = True
            leases = list(self._leases.values())
        if self._close_done:
            return None
        if first:
            self._wakeups.close()
        return first, leases

    def _stop_background(self) -> None:
        """Stop the reaper, the renewals and their threads (waits for them)."""
        self._reaper.stop()
        self._heartbeat.stop()
        # Each ends by the time its leases would count as lost; the
        # releases of close() wait for the same rows anyway.
        self._stragglers.stop(0.0)

    def _finish_close(self) -> None:
        self._close_done = True
        lifecycle.forget(self)
        self._dispose()

    def __enter__(self) -> PathLockManager:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        url = self.engine.url.render_as_string(hide_password=True)
        more = f" (+{len(self.engines) - 1} more nodes)" if len(self.engines) > 1 else ""
        return f"<PathLockManager {url}{more} node_id={self.node_id!r}>"

    # -- internals used by CustomerLocks and Lease -------------------------------

    def _release_node(self, node_id: str) -> int:
        released = self._upkeep.release_node(node_id)
        for customer_id in released:
            self._wakeups.notify(customer_id)
        return sum(released.values())

    def _clean_up_node(self) -> None:
        deleted = self._release_node(self.node_id)
        if deleted:
            log.warning(
                "cleanup_on_start: deleted %d locked paths left by an earlier run of node %r",
                deleted,
                self.node_id,
            )

    def _dispose(self) -> None:
        for engine in self._owned:
            engine.dispose()

    def _check_open(self, action: str) -> None:
        if self._closed:
            raise ManagerClosed(action)
        if os.getpid() != self._pid:
            # Forked without os.fork()'s hooks (from C, say): catch up now.
            self._after_fork()

    def _call(self, action: str | None) -> contextlib.AbstractContextManager[None]:
        """One call that may use the database, counted while its block runs;
        ``action`` names it for :class:`ManagerClosed` (``None``: allowed
        after close, such as the release of a lease that close() releases
        anyway)."""
        if action is not None:
            self._check_open(action)
        return self._calls.running()

    def _owner(self, name: object) -> Owner:
        return owners.current(self._identity, self.node_id, name)

    def _acquire(
        self,
        customer_id: int,
        exclusive: Iterable[str],
        shared: Iterable[str],
        *,
        timeout: object,
        reason: object,
        ttl: object,
        blocking: bool,
        on_lost: LostCallback | None,
        owner: object,
        cancel: object = None,
        holder: Owner | None = None,
        data: object = None,
        shallow: object = (),
    ) -> Lease | None:
        """A request (see :meth:`CustomerLocks.lock_paths`); ``holder``: the
        owner, found by the caller already (the asyncio API finds it in the
        caller's task)."""
        paths, depth_0 = self._request_paths(exclusive, shared, shallow)
        wait_limit = validation.timeout(timeout) if blocking else 0.0
        event = validation.cancel(cancel)
        request = GrantRequest(
            customer_id=customer_id,
            lease_id=secrets.token_hex(16),
            paths=paths,
            owner=self._owner(owner) if holder is None else holder,
            reason=validation.reason(reason),
            ttl=self.ttl if ttl is None else validation.ttl(ttl),
            abandoned=self._abandoned_leases(),
            data=lease_data(validation.data(data)),
            shallow=depth_0,
        )
        callbacks = () if on_lost is None else (on_lost,)

        def register(token: int, started: float, term: float | None) -> Lease:
            return self._register(request, token, started, callbacks, term)

        try:
            return self._grant(
                request, register, blocking=blocking, wait_limit=wait_limit, cancel=event
            )
        except BaseException:
            # Raised after the lease was registered, on the way out of the
            # call (a signal held back while the call counted itself out
            # raises there; a hook): the caller never gets the lease, so
            # nobody would release it, and its rows would make this owner's
            # next request fail as one that waits for itself.
            self._undelivered(request)
            raise

    def _request_paths(
        self, exclusive: object, shared: object, shallow: object
    ) -> tuple[tuple[PathMode, ...], frozenset[str]]:
        """A request's normalized (path, mode) pairs and those of its paths
        locked at depth 0 (see :meth:`CustomerLocks.lock_paths`)."""
        folded = self.case_insensitive
        depth_0 = _NONE_SHALLOW
        if shallow != ():  # given (the default is the empty tuple)
            depth_0 = normalize_shallow(shallow, case_insensitive=folded)
        paths = normalize_request(exclusive, shared, shallow=depth_0, case_insensitive=folded)
        return paths, depth_0

    def _acquire_detached(
        self,
        customer_id: int,
        exclusive: Iterable[str],
        shared: Iterable[str],
        *,
        ttl: object,
        timeout: object,
        reason: object,
        blocking: bool,
        cancel: object = None,
        data: object = None,
        shallow: object = (),
    ) -> DetachedLease | None:
        """A request for a detached lease (see
        :meth:`CustomerLocks.lock_detached`): granted as every request is,
        then kept by nobody."""
        paths, depth_0 = self._request_paths(exclusive, shared, shallow)
        wait_limit = validation.timeout(timeout) if blocking else 0.0
        event = validation.cancel(cancel)
        lease_id = secrets.token_hex(16)
        request = GrantRequest(
            customer_id=customer_id,
            lease_id=lease_id,
            paths=paths,
            # An owner of its own: it waits for nobody's locks as its own,
            # and nobody waits for it as theirs.
            owner=owners.detached(self.node_id, lease_id),
            reason=validation.reason(reason),
            ttl=validation.ttl(ttl),
            abandoned=frozenset(),
            data=lease_data(validation.data(data)),
            shallow=depth_0,
        )

        granted: list[DetachedLease] = []

        def detached(token: int, _started: float, _term: float | None) -> DetachedLease:
            granted.append(
                DetachedLease(
                    customer_id, lease_id, paths, token, request.ttl, request.reason, depth_0
                )
            )
            return granted[0]

        try:
            return self._grant(
                request,
                detached,
                blocking=blocking,
                wait_limit=wait_limit,
                cancel=event,
                take_up_later=False,
            )
        except BaseException:
            # Raised on the way out of the call after the grant (see
            # _acquire): nobody has the lease id, and nobody would release
            # it before its ttl, hours maybe.
            if granted:
                self._resolve(customer_id, lease_id, request.ttl)
            raise

    def _lease_info(self, customer_id: int, lease_id: str) -> LeaseInfo | None:
        """The live lease ``lease_id`` of ``customer_id``, if any (see
        :meth:`CustomerLocks.get_lease`)."""
        with self._call("look up a lease"):
            read = self._upkeep.lease_rows(customer_id, lease_id)
        return _lease_info(read)

    def _locks_on(
        self,
        customer_id: int,
        path: object,
        *,
        ancestors: object,
        descendants: object,
        include_expired: object,
    ) -> list[LockInfo]:
        """See :meth:`CustomerLocks.locks_on`."""
        normalized = normalize(path, case_insensitive=self.case_insensitive)
        flags = {
            name: validation.flag(name, value)
            for name, value in (
                ("ancestors", ancestors),
                ("descendants", descendants),
                ("include_expired", include_expired),
            )
        }
        with self._call("look up locks"):
            return self._upkeep.locks_on(customer_id, normalized, **flags)

    def _renew_detached(self, customer_id: int, lease_id: str, ttl: float) -> LeaseInfo:
        """Renew a detached lease (see :meth:`CustomerLocks.renew_detached`)."""
        with self._call("renew a detached lease"):
            started = time.monotonic()
            rows = self._upkeep.lease_rows(customer_id, lease_id).rows
            live = [row for row, alive in rows if alive]
            if rows:
                _check_detached(rows[0][0], "renewed")
            if not live:
                raise LeaseLost(lease_id, "it expired" if rows else "no such lease")
            held, _ = self._store.renewals.renew([(customer_id, lease_id, len(live))], ttl)
            self._events.renewed(
                events.Renewed(
                    len(held), 1 - len(held), time.monotonic() - started, background=False
                )
            )
            if lease_id not in held:
                raise LeaseLost(lease_id, "it expired or was released before it was renewed")
            read = self._upkeep.lease_rows(customer_id, lease_id)
        renewed = _lease_info(read)
        if renewed is None:  # released right after its renewal
            raise LeaseLost(lease_id, "it was released after it was renewed")
        return renewed

    def _release_detached(self, customer_id: int, lease_id: str) -> int:
        """Release a detached lease (see :meth:`CustomerLocks.release_detached`)."""
        with self._call("release a detached lease"):
            read = self._upkeep.lease_rows(customer_id, lease_id)
            rows, database_now = read.rows, read.database_now
            if not rows:
                return 0
            assert database_now is not None  # noqa: S101 - read with the rows
            first = rows[0][0]
            _check_detached(first, "released")
            paths = tuple((row.path, row.mode) for row, _ in rows)
            try:
                deleted = self._store.releases.release(customer_id, lease_id, paths=paths)
            except BaseException:
                # Failed or interrupted, its DELETE may or may not have
                # landed: the rows go from the background, soon (as an
                # interrupted release of a lease of this manager's), not
                # at the lease's timeout, hours away maybe.
                left = max(row.expires_at for row, _ in rows) - database_now
                self._in_doubt.add(customer_id, lease_id, max(1.0, left.total_seconds()))
                self._in_doubt.settle_soon()
                raise
            finally:
                self._wakeups.notify(customer_id)
        live = sum(1 for _, alive in rows if alive)
        if deleted == 0 or not live:
            return 0  # released meanwhile by another call, or expired
        held = (database_now - first.created_at).total_seconds()
        self._events.released(events.Released(customer_id, lease_id, paths, max(0.0, held)))
        return live

    def _undelivered(self, request: GrantRequest) -> None:
        """``request`` ended with an exception: if its lease is registered,
        nobody has it, and it goes as a lease in doubt does."""
        with self._leases_lock:
            registered = request.lease_id in self._leases
        if registered:
            self._resolve(request.customer_id, request.lease_id, request.ttl)

    def _grant(
        self,
        request: GrantRequest,
        deliver: Callable[[int, float, float | None], T],
        *,
        blocking: bool,
        wait_limit: float | None,
        cancel: Cancel | None,
        take_up_later: bool | None = None,
    ) -> T | None:
        """Carry out ``request`` (see :meth:`_acquire`): what ``deliver``
        makes of its grant (its fencing token, when its granting attempt
        started and how long its rows last from then if not its ttl: see
        :func:`pathlock._acquire.acquire`), or ``None`` for a try-lock that
        was denied. Paths handed to it are taken up by the lease's first
        renewal where the manager renews leases, unless ``take_up_later`` is
        false; else before this returns. Whatever raises after the grant,
        ``deliver`` included, leaves nothing of it."""
        called = time.monotonic()
        # The request's limit, to tell afterwards whether any of its attempts
        # got as far as a connection: if none did, nothing can have been
        # granted or queued, whatever stopped it (a database that never
        # answers a new connection, say), and there is nothing to clean up.
        scope: list[deadlines.Limit] = []

        def reached_database() -> bool:
            return not scope or scope[0].connected

        with self._told(request, called, blocking=blocking), self._call("lock paths"):
            try:
                granted = acquire(
                    self._store,
                    self._wakeups,
                    self.backoff,
                    request,
                    blocking=blocking,
                    wait_limit=wait_limit,
                    closed=lambda: self._closed,
                    cancel=cancel,
                    left_behind=self._leave_later,
                    take_up_later=self._renews if take_up_later is None else take_up_later,
                    limits=scope,
                )
                if granted is None:
                    self._events.timed_out(self._denied(request, called))
                    return None
                token, started, term = granted
                lease = deliver(token, started, term)
                # In the try: an interrupt in a hook must not leave the lease
                # registered and unknown to the caller.
                self._events.granted(
                    events.Granted(
                        request.customer_id,
                        request.lease_id,
                        request.paths,
                        request.owner,
                        token,
                        time.monotonic() - called,
                        blocking,
                    )
                )
                return lease  # noqa: TRY300 - see above
            except (BackendError, LockTimeout) as error:
                if isinstance(error, BackendError) and self._store.tables_missing(error):
                    raise  # without the tables nothing can have been granted
                if not reached_database():
                    raise
                if isinstance(error, BackendError) or error.contended or error.unanswered:
                    # An attempt whose COMMIT went out but whose reply never
                    # came may have granted the rows after all, and no later
                    # attempt found out. They block this owner like any
                    # abandoned lease until they are deleted by their lease id
                    # (soon, from a background thread, once the database
                    # answers) or expire within the ttl.
                    self._abandon(request.lease_id, request.ttl)
                    self._in_doubt.add(request.customer_id, request.lease_id, request.ttl)
                    self._in_doubt.settle_soon()
                if isinstance(error, ContentionTimeout) and not blocking:
                    # A try-lock that could not be granted without waiting.
                    self._events.timed_out(self._denied(request, called))
                    return None
                raise
            except PathLockError:
                raise  # denied for good (deadlock, closed): nothing was granted
            except BaseException:
                # Interrupted (Ctrl-C, an exception raised by a signal
                # handler, ...) at any point: the last attempt's COMMIT may
                # have landed, or the lease may be registered already. Its
                # rows must not outlive the call unknown to anyone.
                if reached_database():
                    self._resolve(request.customer_id, request.lease_id, request.ttl)
                raise

    @contextlib.contextmanager
    def _told(self, request: GrantRequest, called: float, *, blocking: bool) -> Iterator[None]:
        """Tell the hooks how a request that did not return ended."""
        try:
            yield
        except LockTimeout as error:
            waited = time.monotonic() - called
            self._events.timed_out(
                events.TimedOut(
                    request.customer_id,
                    request.lease_id,
                    request.paths,
                    waited,
                    blocking,
                    error.unanswered,
                )
            )
            raise
        except DeadlockDetected:
            waited = time.monotonic() - called
            self._events.deadlocked(
                events.Deadlocked(request.customer_id, request.lease_id, request.paths, waited)
            )
            raise
        except BaseException as error:
            self._events.failed(self._failure(request, called, error, blocking=blocking))
            raise

    @staticmethod
    def _denied(request: GrantRequest, called: float) -> events.TimedOut:
        """A try-lock that found a conflict."""
        waited = time.monotonic() - called
        return events.TimedOut(
            request.customer_id, request.lease_id, request.paths, waited, False, False
        )

    @staticmethod
    def _failure(
        request: GrantRequest, called: float, error: BaseException, *, blocking: bool
    ) -> events.Failed:
        waited = time.monotonic() - called
        return events.Failed(
            request.customer_id, request.lease_id, request.paths, waited, error, blocking
        )

    def _queued_here(self) -> int:
        # Not the bound method: a forked child gets new wakeups.
        return self._wakeups.queued()

    def _resolve(self, customer_id: int, lease_id: str, ttl: float) -> None:
        """Delete whatever rows ``lease_id`` may have, now if possible, else
        soon after from a background thread (and at close)."""
        # Until they are gone, its rows make this owner wait, not fail as a
        # request that waits for itself.
        self._abandon(lease_id, ttl)
        self._in_doubt.add(customer_id, lease_id, ttl)
        with self._leases_lock:
            lease = self._leases.pop(lease_id, None)
        if lease is not None:
            lease._mark_released()
        settled = False
        try:
            # Briefly: the caller is on its way out (an interrupt, a close).
            settled = deadlines.within(
                time.monotonic() + self._settings.resolve_time,
                lambda _limit: self._in_doubt.settle(first=lease_id),
            )
        finally:
            if not settled:
                self._in_doubt.settle_soon()

    def _leave_later(self, customer_id: int, lease_id: str) -> None:
        """A request gave up but could not delete its queue row in time: it is
        deleted from the background, with the leases in doubt, rather than
        make the requests behind it wait until it lapses."""
        # Dropped after waiter_ttl: by then the row has lapsed anyway.
        self._in_doubt.add(customer_id, lease_id, self._settings.waiter_ttl / 2)
        self._in_doubt.settle_soon()

    def _settle_release(self, customer_id: int, lease_id: str) -> None:
        try:
            self._store.queue.forget(customer_id, lease_id)
        finally:
            self._wakeups.notify(customer_id)

    def _renew_leases(self, leases: list[Lease], *, heartbeat: bool = False) -> None:
        """Renew ``leases`` (one transaction per distinct ttl and home node);
        mark the ones found gone as lost. Raises :class:`BackendError` if the
        database cannot be reached.

        The heartbeat's renewals (``heartbeat``) use connections of their own
        and, on servers that can skip locked rows, pass over a customer whose
        sentinel another transaction holds: that customer's leases are renewed
        by a transaction of their own that waits for its row (see
        :class:`~pathlock._heartbeat.Stragglers`), so a client frozen in the
        middle of a grant endangers its own customer's leases only."""
        store = self._renewals if heartbeat else self._store
        sent = self._settings.clock.now()
        for lease in leases:
            lease.renewals.sent_at = sent
        # One transaction per ttl and home node: with customer affinity on a
        # cluster, each customer's renewals go where its grants go.
        groups: dict[tuple[float, str], list[Lease]] = {}
        for lease in leases:
            key = (lease.ttl, store.home(lease.customer_id))
            groups.setdefault(key, []).append(lease)
        for (ttl, _home), group in groups.items():
            started = self._settings.clock.now()
            held, skipped = store.renewals.renew(_renewal_rows(group), ttl, wait=not heartbeat)
            self._tell_renewed(
                group, held, skipped, self._settings.clock.now() - started, heartbeat
            )
            skipped_leases: dict[int, list[Lease]] = {}
            for lease in group:
                if lease.customer_id in skipped:
                    skipped_leases.setdefault(lease.customer_id, []).append(lease)
                else:
                    _renewed(lease, lease.lease_id in held, started)
            for customer_id, waiting in skipped_leases.items():
                if self._stragglers.start((customer_id, ttl), waiting):
                    # Watched for loss only, until that renewal is back.
                    for lease in waiting:
                        lease.renew_due = lease.lost_at
                else:
                    for lease in waiting:
                        now = self._settings.clock.now()
                        lease.renewals.failed(now, _BUSY_CUSTOMER)
                        lease.renew_due = now + min(self._settings.skipped_retry, ttl / 20)

    def _tell_renewed(
        self,
        leases: list[Lease],
        held: Collection[str],
        skipped: Collection[int],
        seconds: float,
        background: bool,
    ) -> None:
        renewed = sum(1 for lease in leases if lease.lease_id in held)
        gone = sum(
            1 for lease in leases if lease.lease_id not in held and lease.customer_id not in skipped
        )
        if renewed or gone:
            self._events.renewed(events.Renewed(renewed, gone, seconds, background))

    def _renew_stragglers(self, leases: list[Lease]) -> None:
        """Renew one customer's ``leases`` (of one ttl), waiting for its row
        until they must be presumed lost."""
        started = self._settings.clock.now()
        for lease in leases:
            lease.renewals.sent_at = started
        deadline = time.monotonic() + max(0.0, min(lease.lost_at for lease in leases) - started)
        held, _ = self._renewals.renewals.renew(
            _renewal_rows(leases), leases[0].ttl, wait=True, deadline=deadline
        )
        self._tell_renewed(leases, held, (), self._settings.clock.now() - started, True)
        for lease in leases:
            _renewed(lease, lease.lease_id in held, started)
            if lease.lease_id in held:
                self._heartbeat.add(lease)  # its next renewal, not its old deadline

    def _register(
        self,
        request: GrantRequest,
        token: int,
        started: float,
        on_lost: tuple[LostCallback, ...],
        term: float | None = None,
    ) -> Lease:
        lease = Lease(
            self._keeper,
            customer_id=request.customer_id,
            lease_id=request.lease_id,
            paths=request.paths,
            fencing_token=token,
            owner=request.owner,
            reason=request.reason,
            ttl=request.ttl,
            attempt_started=started,
            first_term=term,
            on_lost=(*on_lost, *self._on_lost),
            emitter=self._events,
            shallow=request.shallow,
        )
        with self._leases_lock:
            closed = self._closed
            if not closed:
                self._leases[lease.lease_id] = lease
        if closed:
            # close() ran while this grant was on its way: it must not hold.
            self._resolve(request.customer_id, request.lease_id, request.ttl)
            raise ManagerClosed("lock paths")
        if self._renews:
            self._heartbeat.add(lease)
        return lease

    def _verify(self, lease: Lease) -> bool:
        with self._call("verify a lease"):
            return self._store.renewals.lease_alive(
                lease.customer_id, lease.lease_id, len(lease.paths)
            )

    def _release(self, lease: Lease) -> int | None:
        with self._calls.running():
            with self._leases_lock:
                self._leases.pop(lease.lease_id, None)
            try:
                return self._store.releases.release(
                    lease.customer_id, lease.lease_id, paths=lease.paths
                )
            except BackendError:
                # Its rows stay until they expire. A request of the same owner
                # that they block waits for that instead of failing as a
                # request that waits for itself.
                self._abandon(lease.lease_id, lease.ttl)
                raise
            finally:
                # Only requests that conflict with its paths can follow it.
                self._wakeups.notify(lease.customer_id, lease.paths)

    def _release_interrupted(self, lease: Lease) -> None:
        """An interrupt stopped ``lease``'s release (see :meth:`Lease.release`):
        the DELETE may or may not have happened. (Not recorded before the
        release: settling it from another thread while the release runs
        would make the release find nothing.)"""
        # Until the rows are gone they make the owner wait, not fail as a
        # request that waits for itself.
        self._abandon(lease.lease_id, lease.ttl)
        self._in_doubt.add(lease.customer_id, lease.lease_id, lease.ttl)
        with self._leases_lock:
            self._leases.pop(lease.lease_id, None)
        self._in_doubt.settle_soon()

    def _abandon(self, lease_id: str, ttl: float) -> None:
        # Its rows, if any, expire within a ttl of now (nobody renews them);
        # the entry is kept twice that long to be sure.
        self._abandoned.add(lease_id, 2 * ttl)

    def _abandoned_leases(self) -> frozenset[str]:
        """Leases whose release failed and whose rows may not have expired yet."""
        return frozenset(self._abandoned.current())

    def _release_owner(self, customer_id: int, name: object, holder: Owner | None = None) -> int:
        owner = self._owner(name) if holder is None else holder
        mine: list[Lease] = []
        with self._call("release locks"):
            try:
                with self._leases_lock:
                    mine.extend(
                        lease
                        for lease in self._leases.values()
                        if lease.customer_id == customer_id and lease.owner.key == owner.key
                    )
                    for lease in mine:
                        del self._leases[lease.lease_id]
                for lease in mine:
                    _take_away(lease)
                released = self._store.releases.release_owner(customer_id, owner)
            except BaseException:
                # Failed or interrupted: the rows may stay. They make the
                # owner wait, and are deleted by lease id, soon.
                for lease in mine:
                    _take_away(lease)
                    self._release_interrupted(lease)
                raise
            finally:
                self._wakeups.notify(customer_id)
        for lease in mine:
            lease._tell_released()
        return released


def _take_away(lease: Lease) -> None:
    """``release_locks()`` releases ``lease``: its holder may still be in its
    ``with`` block (another task whose calls ran on the same pool thread, the
    holder itself), and must hear that the lock is gone, as after close()."""
    lease._end(RELEASED_BY_OWNER)
    lease._mark_released()


class _Keeper:
    """What the manager's leases may ask of it (:class:`~pathlock.lease.Keeper`)."""

    __slots__ = ("_manager",)

    def __init__(self, manager: PathLockManager) -> None:
        self._manager = manager

    @property
    def settings(self) -> Settings:
        return self._manager.settings

    def release(self, lease: Lease) -> int | None:
        return self._manager._release(lease)

    def release_interrupted(self, lease: Lease) -> None:
        self._manager._release_interrupted(lease)

    def renew(self, leases: list[Lease]) -> None:
        self._manager._renew_leases(leases)

    def run_callbacks(self, lease: Lease, callbacks: tuple[LostCallback, ...]) -> None:
        self._manager._heartbeat.run_callbacks(lease, callbacks)

    def verify(self, lease: Lease) -> bool:
        return self._manager._verify(lease)


class _Calls:
    """The calls of a manager that are using the database right now, so that
    close() can let them finish before it disposes the engine."""

    def __init__(self) -> None:
        # Each running call by a token of its own. Adding one and discarding
        # one are single operations of a C set, which a signal handler's
        # exception (raised between bytecodes) cannot cut in half, and which
        # take no lock it could leave held (CPython issue 29988): counting a
        # call needs no interrupts held back, which cost more than the rest
        # of the counting. The condition is only for close() to wait on.
        self._running: set[object] = set()
        self._condition = threading.Condition()
        self._waiting = 0  # wait_idle() calls under way

    @property
    def _count(self) -> int:
        return len(self._running)

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        token = object()
        try:
            # In the try: an interrupt right after the token is added still
            # takes it away again. (One that ends __enter__ after this yield
            # does too, as the generator is finalized.)
            self._running.add(token)
            yield
        finally:
            self._running.discard(token)
            if self._waiting:
                self._wake()

    def _wake(self) -> None:
        """Tell wait_idle() a call ended (only while one waits)."""
        # Interrupts held back while the condition's lock is taken (see
        # pathlock._interrupts).
        with interrupts.held_back(), self._condition:
            self._condition.notify_all()

    def wait_idle(self, timeout: float) -> None:
        """Wait until no call is running, at most ``timeout`` seconds and
        never past the limit in force (close()'s bound)."""
        timeout = deadlines.capped(timeout)
        with self._condition:
            # Counted before the look: a call that ends after it sees the
            # count and wakes this one (see running()).
            self._waiting += 1
            try:
                self._condition.wait_for(lambda: not self._running, timeout)
            finally:
                self._waiting -= 1


def _lease_info(read: LeaseRows) -> LeaseInfo | None:
    """The lease whose rows ``read`` found, if live (``None``: none)."""
    rows = [row for row, live in read.rows if live]
    if not rows:
        return None
    first = rows[0]
    return LeaseInfo(
        customer_id=first.customer_id,
        lease_id=first.lease_id,
        paths=tuple((row.path, row.mode) for row in rows),
        fencing_token=first.fencing_token,
        owner=first.owner,
        reason=first.reason,
        created_at=first.created_at,
        expires_at=min(row.expires_at for row in rows),
        data=read.data,
        shallow=frozenset(row.path for row in rows if row.shallow),
    )


def _check_detached(row: LockInfo, done: str) -> None:
    """Refuse to renew or release by its id a lease that a manager holds."""
    if not row.owner.detached:
        raise InvalidArgument(
            f"lease {row.lease_id} is not detached, and is {done} only by the manager that"
            " holds it (an operator may release it: PathLockManager.release_lease)"
        )
