"""The public entry point: PathLockManager (CustomerLocks is in :mod:`pathlock.customer`).

The manager's public calls, its lifecycle (``close()``, a forked child's
fresh start) and the state of one process are here; its other jobs are one
module each, which it inherits over the state they share
(:mod:`pathlock._manager_state`): opening the database
(:mod:`pathlock._opening`), lock requests (:mod:`pathlock._requesting`), the
leases held and those in doubt (:mod:`pathlock._holding`), detached leases
(:mod:`pathlock._detached`) and renewals (:mod:`pathlock._renewal`).

A request flows one way: ``CustomerLocks.lock_paths`` -> ``paths`` normalize ->
:func:`pathlock._acquire.acquire`, which runs the steps of
:class:`pathlock._core.flow.AcquireFlow`: loop {``Grants.try_grant`` -> granted: a
:class:`Lease`; blocked: queued, then watch the customer's version until an
attempt can succeed} -> ``Lease.release`` -> ``Releases.release`` (wakes this
process's waiters of the same customer).
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

from sqlalchemy import URL, Engine
from sqlalchemy.exc import SQLAlchemyError

from pathlock import _deadlines as deadlines
from pathlock import _lifecycle as lifecycle
from pathlock import _owners as owners
from pathlock import _reaper as reaper
from pathlock import events, otel
from pathlock._calls import Calls
from pathlock._core import validation
from pathlock._detached import DetachedLeases
from pathlock._heartbeat import Heartbeat, Stragglers
from pathlock._opening import check_engine_options, check_flags
from pathlock._operating import Operating
from pathlock._renewal import Renewing
from pathlock._settling import Expiring, InDoubt
from pathlock.customer import CustomerLocks
from pathlock.errors import (
    ArgumentTypeError,
    BackendError,
)
from pathlock.lease import Lease, LostCallback
from pathlock.schema import create_tables
from pathlock.settings import Settings
from pathlock.settings import checked as checked_settings
from pathlock.waiting import ExponentialBackoff, Hearing, LocalWakeups, WaitPolicy

if TYPE_CHECKING:
    from pathlock._aio import TaskHeartbeat

log = logging.getLogger(__name__)

CLOSED_WHILE_HELD = "the PathLockManager was closed while the lease was held"


class PathLockManager(DetachedLeases, Renewing, Operating):
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
        check_flags(
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
        self._settings = checked_settings(settings)
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
        self._events = events.Emitter([*told, *events.checked(hooks)])
        self._cleanup_on_start = cleanup_on_start
        self._open_database(
            database,
            check_engine_options(engine_options),
            affinity=affinity,
            max_attempts=max_attempts,
            runner=runner,
        )
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
        self._calls = Calls()
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
        leases = self._begin_close()
        if leases is None:
            return
        # Again on a second call: an interrupt may have stopped the first
        # before it stopped them (every step is idempotent).
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

    def _begin_close(self) -> list[Lease] | None:
        """The first step of :meth:`close`: nothing is granted from now on
        and local waiters wake. The leases to release; ``None`` when a close
        finished already."""
        with self._leases_lock:
            self._closed = True
            leases = list(self._leases.values())
        if self._close_done:
            return None
        self._wakeups.close()
        return leases

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

    def _queued_here(self) -> int:
        # Not the bound method: a forked child gets new wakeups.
        return self._wakeups.queued()


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
