"""Opening a manager's database: its flags checked, how its transactions
run (on the caller's thread, or on the asyncio API's loop), the schema's
revision checked (an embedded database brought up to date), what an earlier
run of its node left behind cleaned up; and its engines disposed."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import URL, Connection, Engine, inspect

from pathlock import dialects
from pathlock._backends import open_engines, open_renewal_engines
from pathlock._core import validation
from pathlock._embedded import upgrade_on_open
from pathlock._manager_state import ManagerState
from pathlock._routing import Router
from pathlock._store import Store
from pathlock._transactions import THREAD, Runner, Transactions
from pathlock._upkeep import Upkeep
from pathlock.dialects.base import is_async
from pathlock.errors import (
    ArgumentTypeError,
    BackendError,
    InvalidArgument,
    PathLockError,
    SchemaMismatch,
)
from pathlock.schema import REVISION, REVISIONS, metadata

log = logging.getLogger("pathlock.manager")


def _several(database: object) -> bool:
    """Whether ``database`` names several nodes (see :func:`open_engines`)."""
    listed = isinstance(database, (list, tuple)) and not isinstance(database, URL)
    return listed and len(database) > 1  # type: ignore[arg-type]


def check_flags(
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


def check_engine_options(engine_options: object) -> dict[str, Any]:
    """``engine_options``, checked before anything is opened: ``dict()`` and
    ``create_engine(**options)`` would raise a bare TypeError, or one for
    each node of a cluster."""
    if engine_options is None:
        return {}
    if not isinstance(engine_options, Mapping):
        raise ArgumentTypeError(
            "engine_options must be a dict of create_engine() keyword arguments, or None; "
            f"got {type(engine_options).__name__}"
        )
    for key in engine_options:
        if not isinstance(key, str):
            raise ArgumentTypeError(
                "engine_options' keys must be names of create_engine() arguments (str), "
                f"got {type(key).__name__}"
            )
    return dict(engine_options)


class Opening(ManagerState):
    """A manager's database, opened and disposed."""

    def _open_database(
        self,
        database: object,
        engine_options: dict[str, Any],
        *,
        affinity: bool,
        max_attempts: int,
        runner: Runner,
    ) -> None:
        """The engines (the nodes', and the heartbeat's own pool's) and the
        operations on them; opened now (the synchronous API) or made ready
        for the asyncio API's loop."""
        timing, emitter = self._settings, self._events
        opened = open_engines(
            database, dict(engine_options), timing, asynchronous=self._asynchronous
        )
        self.engines = tuple(engine for engine, _ in opened)
        self.engine = self.engines[0]
        self._owned = [engine for engine, owned in opened if owned]
        try:

            def transactions(engines: Sequence[Engine]) -> Transactions:
                return Transactions(
                    Router(engines, affinity=affinity, set_aside=timing.set_aside, emitter=emitter),
                    max_attempts=max_attempts,
                    case_insensitive=self._case_insensitive,
                    settings=timing,
                    emitter=emitter,
                    runner=runner,
                )

            main = transactions(self.engines)
            self._store = Store(main)
            self._upkeep = Upkeep(main)
            # The heartbeat's own pool: threads waiting for locks can never
            # take every connection while a renewal is due.
            renewal = open_renewal_engines(opened, dict(engine_options), timing)
            self._owned += [engine for engine, owned in renewal if owned]
            self._renewals = Store(transactions([engine for engine, _ in renewal]))
            self._prepare([engine for engine, _ in [*opened, *renewal]])
        except PathLockError:
            if not self._asynchronous:
                self._dispose()
            raise

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

    def _release_node(self, node_id: str) -> int:
        released = self._upkeep.release_node(node_id)
        for customer_id in released:
            self._wakeups.notify(customer_id)
        return sum(released.values())

    def _clean_up_node(self) -> None:
        deleted = self._release_node(self._node_id)
        if deleted:
            log.warning(
                "cleanup_on_start: deleted %d locked paths left by an earlier run of node %r",
                deleted,
                self._node_id,
            )

    def _dispose(self) -> None:
        for engine in self._owned:
            engine.dispose()
