"""Several statements of one transaction in one round trip, on the
connections whose database family can take them (MySQL and MariaDB's).

The hot path is short statements whose cost is mostly the network's round
trip: an uncontended acquire is "lock the sentinel, insert if no conflict,
write the sentinel if inserted, commit", a release "write the sentinel,
delete, commit". Sent one by one, that is seven round trips for an acquire +
release. A batch may carry its transaction's COMMIT (``run(...,
commit=True)``, on the engines pathlock creates:
:func:`~pathlock.dialects._commits.commit_in_batches`),
and then each is one round trip, as a plain durable commit is.

The statements are the same SQLAlchemy constructs as everywhere else,
compiled for the engine's dialect and sent as one query with the driver's own
escaping of every value (nothing is formatted into the SQL by pathlock). Only
a connection that takes several statements per query can; which ones do is
the database family's to say (:meth:`Dialect.can_batch
<pathlock.dialects.base.Dialect.can_batch>`, and ``enable_batches()`` for the
engines pathlock creates: see :mod:`pathlock.dialects.mysql`). On any other
connection the store sends the statements one by one.
The server stops at the first statement that fails, and the error is raised
here as the :class:`~sqlalchemy.exc.DBAPIError` SQLAlchemy would have raised
(a lost connection is invalidated, so it never goes back to the pool).
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, TypeVar

from sqlalchemy import Connection
from sqlalchemy.engine.interfaces import Dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql.compiler import Compiled, SQLCompiler
from sqlalchemy.sql.expression import Executable

from pathlock import _deadlines as deadlines
from pathlock import dialects
from pathlock.dialects._commits import COMMITTING as _COMMITTING
from pathlock.dialects._commits import SENT as _SENT

T = TypeVar("T")


class Reply(NamedTuple):
    """What the server said about one statement of a batch: for a SELECT,
    its ``rows`` too, each with its columns as attributes (as the driver
    returns the values: no SQLAlchemy type processing)."""

    rowcount: int
    lastrowid: int
    rows: tuple[Any, ...] = ()


@functools.lru_cache(maxsize=64)
def _row_type(names: tuple[str, ...]) -> Any:
    return collections.namedtuple("Row", names, rename=True)


def supports_batches(connection: Connection) -> bool:
    """Whether ``connection`` takes several statements per query: its
    family's answer (:meth:`Dialect.can_batch
    <pathlock.dialects.base.Dialect.can_batch>`, which the store asks
    itself), for code that holds a connection and no dialect."""
    return dialects.for_name(connection.dialect.name).can_batch(connection)


@functools.lru_cache(maxsize=512)
def _compiled(statement: Executable, dialect: Dialect) -> Compiled:
    compiled: Compiled = statement.compile(  # type: ignore[attr-defined]
        dialect=dialect, compile_kwargs={dialects.base.BATCHED: True}
    )
    return compiled


def prepare(statement: Executable, dialect: Dialect) -> None:
    """Compile ``statement`` for ``dialect`` now, outside any deadline: the
    first request of a new shape (1,000 paths, say) takes seconds of client
    CPU to compile, which must not count as the database's time."""
    _compiled(statement, dialect)


def rolls_back_in_batches(connection: Connection) -> bool:
    """Whether a batch on ``connection`` may end with a ROLLBACK: its engine
    was set up for batches that end its transactions, and the connection
    takes batches at all. A server that wants its COMMITs alone (a Galera
    node) takes a read's ROLLBACK in the read's round trip all the same."""
    return connection.dialect in _COMMITTING and supports_batches(connection)


def commits_in_batches(connection: Connection) -> bool:
    """Whether a batch on ``connection`` may carry its COMMIT: it may end
    with a ROLLBACK (:func:`rolls_back_in_batches`), and its server does not
    want its COMMITs alone (:data:`pathlock.dialects.base.COMMIT_ALONE`)."""
    # Asked in every grant and release: the answer is kept with the
    # connection (its pool entry's info, emptied when it connects anew).
    info = connection.connection.info
    answer: bool | None = info.get(_COMMITS)
    if answer is None:
        answer = info[_COMMITS] = rolls_back_in_batches(connection) and not info.get(
            dialects.base.COMMIT_ALONE, False
        )
    return answer


_COMMITS = "pathlock_commits_in_batches"


def run(
    connection: Connection,
    steps: Sequence[tuple[Executable, dict[str, Any]]],
    *,
    commit: bool = False,
    rollback: bool = False,
) -> list[Reply]:
    """Send ``steps`` ((statement, parameters) pairs) in one round trip, inside
    the connection's transaction (begun if need be); return one reply each.
    Where the driver takes parameters by name, parameters of the same name
    must have the same value in every step.

    ``commit`` (only where :func:`commits_in_batches`): the COMMIT goes in
    the same round trip, and the transaction is over when this returns.
    While its reply is awaited, the current limit counts the COMMIT as
    unanswered (:attr:`pathlock._deadlines.Limit.commit_unanswered`): an
    attempt cut short then is in doubt, and so is one whose COMMIT itself was
    answered with an error (a Galera node may answer 1213 to a COMMIT that
    lands all the same); one whose statement was refused is not (the
    server runs nothing of a batch after an error).

    ``rollback`` (only where :func:`rolls_back_in_batches`): a ROLLBACK ends
    the batch instead, for reads that need nothing kept: a waiter's check
    is one round trip, not two."""
    if commit and rollback:
        raise ValueError("a batch ends with a COMMIT or a ROLLBACK, not both")
    dialect = connection.dialect
    end = "COMMIT" if commit else "ROLLBACK" if rollback else None
    sql, parameters = _compose(dialect, steps, end=end)
    unbegun = _begin(connection, end)
    proxied = connection.connection
    error_class = dialect.loaded_dbapi.Error
    dbapi_connection, cursor = _sender(proxied)
    limit = deadlines.current() if commit else None
    if limit is not None:
        limit.commit_unanswered = True
    replies: list[Reply] = []
    try:
        if cursor is None:
            dbapi_connection.send_batch(sql, parameters)
            _read_replies(dbapi_connection, len(steps), end, replies)
        else:
            cursor.execute(sql, parameters)
            _replies(cursor, len(steps), end, replies)
    except error_class as error:
        if unbegun:
            # The server's transaction is open: so is SQLAlchemy's again,
            # as if begun before the query (its begin sends nothing here),
            # and the caller's rollback() sends the ROLLBACK.
            connection.begin()
            if limit is not None:
                # Listeners of that begin (the asyncio API's) clear the mark:
                # the COMMIT is as unanswered as before.
                limit.commit_unanswered = True
        # Every statement answered: the error is the COMMIT's own.
        committing = commit and len(replies) == len(steps)
        raise _failure(
            connection, cursor, (sql, parameters), error, refused=None if committing else limit
        ) from error
    finally:
        _drained(dbapi_connection, cursor, error_class)
    if limit is not None:
        limit.commit_unanswered = False
    if not unbegun:
        if commit:
            _ended(connection, connection.commit)
        elif rollback:
            _ended(connection, connection.rollback)
    return replies


def _sender(proxied: Any) -> tuple[Any, Any]:
    """What sends a batch on the pooled connection ``proxied``: the driver's
    connection, where it sends batches itself (under an adapter of
    SQLAlchemy's for the asyncio drivers), or else the DB-API connection and
    a cursor of it."""
    driver = proxied.driver_connection
    if hasattr(driver, "send_batch"):
        return driver, None
    dbapi_connection = proxied.dbapi_connection
    return dbapi_connection, dbapi_connection.cursor()


def _drained(dbapi_connection: Any, cursor: Any, error_class: type[Exception]) -> None:
    """Read any results left (after an error); the connection may be gone
    by then. (Not contextlib.suppress(): three calls more per batch.)"""
    try:  # noqa: SIM105
        (dbapi_connection.drain if cursor is None else cursor.close)()
    except error_class:
        pass


def _failure(
    connection: Connection,
    cursor: Any,
    sent: tuple[str, Any],
    error: Any,
    *,
    refused: deadlines.Limit | None,
) -> DBAPIError:
    """The error to raise for the driver's ``error`` in a batch (``sent``:
    its SQL and parameters); a lost connection invalidated. ``refused``: the
    limit whose COMMIT is unanswered, if the error was a statement's."""
    dialect = connection.dialect
    lost = dialect.is_disconnect(error, connection.connection.dbapi_connection, cursor)
    if refused is not None and not lost:
        refused.commit_unanswered = False  # a statement refused: no COMMIT ran
    if lost:
        connection.invalidate(error)
    sql, parameters = sent
    failure = DBAPIError.instance(
        sql,
        parameters,
        error,
        dialect.loaded_dbapi.Error,
        connection_invalidated=lost,
        dialect=dialect,
    )
    assert isinstance(failure, DBAPIError)  # noqa: S101 - the driver's errors make one
    return failure


def _begin(connection: Connection, end: str | None) -> bool:
    """Begin SQLAlchemy's transaction on ``connection`` for a batch, unless
    one is under way; whether the batch goes without: one that begins and
    ends its transaction on the server need not tell SQLAlchemy's connection
    about it. The connection's begin() and commit() cost a grant more client
    CPU than anything else around the query, and sent nothing (see
    :func:`~pathlock.dialects._commits.commit_in_batches`). Not where anyone listens for the
    connection's begin, commit or rollback (SQLite's engines do, and your own
    listeners may), but for listeners whose work such a batch does itself
    (:func:`done_in_batches`: the asyncio API's)."""
    if connection.in_transaction():
        return False
    if end is not None and (
        not (connection._has_events or connection.engine._has_events)
        or _only_done_in_batches(connection)
    ):
        return True
    connection.begin()
    return False


_DONE_IN_BATCHES = "_pathlock_done_in_batches"


def done_in_batches(listener: T) -> T:
    """Mark ``listener``, of an engine's begin, commit or rollback, as one
    whose work a batch that ends its own transaction does itself (it marks
    its COMMIT unanswered while the COMMIT is on its way, see :func:`run`):
    such a batch need not go through the connection's begin() and commit()
    for it."""
    setattr(listener, _DONE_IN_BATCHES, True)
    return listener


def _only_done_in_batches(connection: Connection) -> bool:
    """Whether the engine's listeners of begin, commit and rollback are all
    marked :func:`done_in_batches`, and the connection has none of its own.
    Loops, not generators: this runs in every batch of such an engine."""
    if connection._has_events:
        return False
    dispatch = connection.engine.dispatch
    for listeners in (dispatch.begin, dispatch.commit, dispatch.rollback):
        for listener in listeners:
            if not getattr(listener, _DONE_IN_BATCHES, False):
                return False
    return True


def _replies(cursor: Any, count: int, end: str | None, replies: list[Reply]) -> None:
    """Add to ``replies`` the replies to a batch's ``count`` statements, one
    result each, then read the reply to its ``end``; or raise the error of
    the one that failed (SQLAlchemy's asyncio adapter does not pass
    nextset()'s answer on)."""
    for number in range(count):
        if number:
            cursor.nextset()
        rows: tuple[Any, ...] = ()
        if cursor.description:
            row = _row_type(tuple([column[0] for column in cursor.description]))
            rows = tuple(map(row._make, cursor.fetchall()))
        replies.append(Reply(cursor.rowcount, cursor.lastrowid, rows))
    if end is not None:
        cursor.nextset()  # the COMMIT's or ROLLBACK's reply


def _read_replies(dbapi_connection: Any, count: int, end: str | None, replies: list[Reply]) -> None:
    """:func:`_replies`, read without a cursor, on a connection that can
    (:mod:`pathlock.dialects._pymysql`)."""
    reply = dbapi_connection.reply
    for _ in range(count):
        changed, inserted, names, rows = reply()
        if names is None:
            replies.append(Reply(changed, inserted))
        else:
            replies.append(Reply(changed, inserted, tuple(map(_row_type(names)._make, rows))))
    if end is not None:
        reply()  # the COMMIT's or ROLLBACK's reply


def _compose(
    dialect: Dialect, steps: Sequence[tuple[Executable, dict[str, Any]]], *, end: str | None
) -> tuple[str, Any]:
    """The batch's SQL and its parameters, in the dialect's paramstyle: from
    a plan made once per dialect, sequence of statements and shape
    (:class:`_Batch`), or else statement by statement (:func:`_composed`)."""
    key = (dialect, end, tuple([statement for statement, _ in steps]))
    if key in _LAYOUTS:
        layout = _LAYOUTS[key]
    else:
        layout = _LAYOUTS[key] = _layout(dialect, steps)
    if layout is None:
        return _composed(dialect, steps, end=end)
    shape = layout.shape(steps)
    if shape and max(shape) > _EXACT:
        steps, shape = _padded(steps, layout.lists, shape)
    shape_key = (key, shape)
    planned = _BATCHES.get(shape_key)
    if planned is None:
        if len(_BATCHES) >= _PLANS_KEPT:
            _BATCHES.clear()
        planned = _BATCHES[shape_key] = _batch_plan(dialect, steps, end=end)
    return planned.sql, planned.parameters(steps)


def _composed(
    dialect: Dialect, steps: Sequence[tuple[Executable, dict[str, Any]]], *, end: str | None
) -> tuple[str, Any]:
    """:func:`_compose`, statement by statement."""
    family = dialects.for_name(dialect.name)
    parts: list[str] = []
    named: dict[str, Any] = {}
    positional: list[Any] = []  # for a positional paramstyle (%s): in order
    for statement, values in steps:
        compiled = _compiled(statement, dialect)
        if not isinstance(compiled, SQLCompiler):  # pragma: no cover - DML and SELECT only
            raise TypeError(f"cannot batch {type(statement).__name__}")
        sql, parameters = expand(compiled, values)
        parts.append(family.in_batch(sql, compiled))
        if dialect.positional:
            # Each step's values in its own order: names may repeat (the
            # LIMIT of two statements is "param_1" in both).
            positional.extend(parameters)
            continue
        for name, value in parameters.items():
            if named.setdefault(name, value) != value:
                raise ValueError(f"parameter {name!r} differs between batched statements")
    if end is not None:
        parts.append(end)
    return ";\n".join(parts), tuple(positional) if dialect.positional else named


class _Layout(NamedTuple):
    """What a sequence of statements needs to find its batch's plan: the
    shape of the values given (the length of each list a statement expands),
    as a function of the steps."""

    shape: Callable[[Sequence[tuple[Executable, dict[str, Any]]]], tuple[int, ...]]
    lists: tuple[tuple[int, str], ...]
    """The step and name of each list the shape measures, in its order."""


class _Batch(NamedTuple):
    """A batch planned once per dialect, sequence of statements and shape:
    its SQL, and a function of the steps that returns the driver's
    parameters (what :func:`_composed` would return, without a loop over
    statements and names on every call)."""

    sql: str
    parameters: Callable[[Sequence[tuple[Executable, dict[str, Any]]]], Any]


# Per (dialect, end, statements): the layout; None: composed statement by
# statement (a statement whose values are written into its SQL).
_LAYOUTS: dict[tuple[Any, ...], _Layout | None] = {}
_BATCHES: dict[tuple[Any, ...], _Batch] = {}


def _layout(dialect: Dialect, steps: Sequence[tuple[Executable, dict[str, Any]]]) -> _Layout | None:
    lists: list[tuple[int, str]] = []
    for index, (statement, _values) in enumerate(steps):
        compiled = _compiled(statement, dialect)
        if not isinstance(compiled, SQLCompiler):  # pragma: no cover - DML and SELECT only
            raise TypeError(f"cannot batch {type(statement).__name__}")
        expanding = _expanding(compiled)
        if expanding is None:
            return None
        lists.extend((index, name) for name in expanding)
    # Generated once per sequence of statements, from their own names.
    lengths = "".join(f"len(steps[{index}][1][{name!r}]), " for index, name in lists)
    shape = _generated("steps", f"({lengths})", {})
    return _Layout(shape, tuple(lists))


# Lists up to this long are sent as they are; longer ones are padded to the
# next power of two by repeating their last value, which an IN list ignores.
# A batch is planned once per shape, and a plan's code is compiled: the
# checks of a hundred waiting threads ask about lists of every length (the
# tickets ahead of them, the leases in their way), and planning a batch for
# each new length cost their process more than the reads themselves.
_EXACT = 8


def _padded(
    steps: Sequence[tuple[Executable, dict[str, Any]]],
    lists: tuple[tuple[int, str], ...],
    shape: tuple[int, ...],
) -> tuple[list[tuple[Executable, dict[str, Any]]], tuple[int, ...]]:
    """``steps`` with their lists longer than :data:`_EXACT` padded, and the
    shape they have then."""
    padded = list(steps)
    sizes = []
    for (index, name), length in zip(lists, shape, strict=True):
        size = length if length <= _EXACT else 1 << (length - 1).bit_length()
        if size != length:
            statement, values = padded[index]
            items = list(values[name])  # any iterable SQLAlchemy expands
            items += [items[-1]] * (size - length)
            padded[index] = (statement, {**values, name: items})
        sizes.append(size)
    return padded, tuple(sizes)


def _batch_plan(
    dialect: Dialect, steps: Sequence[tuple[Executable, dict[str, Any]]], *, end: str | None
) -> _Batch:
    """The plan of a batch of ``steps``' statements and shape: each
    statement's plan (:func:`_plan`), and one function that reads every
    parameter from the steps' values as :func:`expand` would, and checks
    that parameters of one name have one value, as :func:`_composed` does."""
    family = dialects.for_name(dialect.name)
    parts: list[str] = []
    outs: list[tuple[str, str]] = []  # (driver's name, expression)
    namespace: dict[str, Any] = {"_differs": _differs}
    for number, (statement, values) in enumerate(steps):
        compiled = _compiled(statement, dialect)
        assert isinstance(compiled, SQLCompiler)  # noqa: S101 - checked by _layout
        plan = _plan(compiled, values)
        parts.append(family.in_batch(plan.sql, compiled))
        given = f"steps[{number}][1]"
        for out, (name, index) in zip(plan.outs, plan.sources, strict=True):
            if index == _VALUE:
                expression = f"{given}[{name!r}]"
            elif index >= 0:
                expression = f"{given}[{name!r}][{index}]"
            else:
                default = f"_default{len(namespace)}"
                namespace[default] = plan.defaults[name]
                expression = f"{given}.get({name!r}, {default})"
            outs.append((out, expression))
    if end is not None:
        parts.append(end)
    if dialect.positional:
        body = f"({''.join(expression + ', ' for _out, expression in outs)})"
        return _Batch(";\n".join(parts), _generated("steps", body, namespace))
    first: dict[str, str] = {}
    checks: list[str] = []
    for out, expression in outs:
        if out not in first:
            first[out] = expression
        else:
            checks.append(f"    if {expression} != named[{out!r}]:\n        _differs({out!r})\n")
    entries = "".join(f"{out!r}: {expression}, " for out, expression in first.items())
    lines = f"    named = {{{entries}}}\n{''.join(checks)}    return named\n"
    return _Batch(";\n".join(parts), _generated("steps", lines, namespace, body=True))


def _generated(
    argument: str, code: str, namespace: dict[str, Any], *, body: bool = False
) -> Callable[[Any], Any]:
    """A function of ``argument`` that returns the expression ``code`` (or
    runs the function body ``code``). Written out once per plan, from the
    statements' parameter names (quoted with ``repr``): reading some twenty
    parameters through a loop of Python calls cost a batch more client CPU
    than its composition otherwise does. (SQLAlchemy generates its row
    processors the same way.)"""
    source = f"def generated({argument}):\n{code if body else f'    return {code}'}\n"
    exec(compile(source, "<pathlock batch plan>", "exec"), namespace)  # noqa: S102
    function: Callable[[Any], Any] = namespace.pop("generated")
    return function


def _differs(name: str) -> None:
    raise ValueError(f"parameter {name!r} differs between batched statements")


class _Plan(NamedTuple):
    """A compiled statement expanded for values of one shape (the length of
    each list it expands): its SQL, the names of the driver's parameters in
    the driver's order (``outs``), and where each comes from (``sources``):
    ``(given name, index)``, the index in the given list, or ``_VALUE`` for
    the value itself, or ``_DEFAULT`` for the value or else the statement's
    own (``defaults``)."""

    sql: str
    outs: tuple[str, ...]
    sources: tuple[tuple[str, int], ...]
    defaults: dict[str, Any]


_VALUE = -1
_DEFAULT = -2
_UNKNOWN = object()
# Expanding names per compiled statement; None: not planned (its values are
# written into its SQL, or its names are escaped).
_EXPANDING: dict[SQLCompiler, tuple[str, ...] | None] = {}  # kept with the plans
_PLANS: dict[tuple[SQLCompiler, tuple[int, ...]], _Plan] = {}
_PLANS_KEPT = 1024


def expand(compiled: SQLCompiler, values: dict[str, Any]) -> tuple[str, Any]:
    """``compiled``'s SQL and its parameters for ``values`` (a dict, or for a
    positional paramstyle a tuple in order): what
    :meth:`SQLCompiler.construct_expanded_state` returns (without type
    processing, as before), from a plan made once per statement and shape.
    SQLAlchemy rewrites the SQL of a statement with lists on every call
    (``IN`` of the ancestors): a third of a grant's client CPU."""
    # One dict operation at a time: other threads may clear the dicts.
    expanding = _EXPANDING.get(compiled, _UNKNOWN)
    if expanding is _UNKNOWN:
        expanding = _EXPANDING[compiled] = _expanding(compiled)
    if not isinstance(expanding, tuple):
        state = compiled.construct_expanded_state(values)
        if compiled.positional:
            return state.statement, state.positional_parameters
        return state.statement, state.parameters
    key = (compiled, tuple(len(values[name]) for name in expanding))
    plan = _PLANS.get(key)
    if plan is None:
        if len(_PLANS) >= _PLANS_KEPT:
            _PLANS.clear()
            _EXPANDING.clear()
            _EXPANDING[compiled] = expanding
        plan = _PLANS[key] = _plan(compiled, values)
    defaults = plan.defaults
    given = tuple(
        values[name]
        if index == _VALUE
        else values[name][index]
        if index >= 0
        else values.get(name, defaults[name])
        for name, index in plan.sources
    )
    return plan.sql, given if compiled.positional else dict(zip(plan.outs, given, strict=True))


def _expanding(compiled: SQLCompiler) -> tuple[str, ...] | None:
    binds = compiled.binds.values()
    if (
        compiled.literal_execute_params
        or compiled.escaped_bind_names
        or any(bind.literal_execute or bind.callable is not None for bind in binds)
        or any(bind.expanding and bind.type._is_tuple_type for bind in binds)
    ):
        return None
    return tuple(name for name, bind in compiled.binds.items() if bind.expanding)


def _plan(compiled: SQLCompiler, values: dict[str, Any]) -> _Plan:
    state = compiled.construct_expanded_state(values)  # raises if one is missing
    origin = {
        out: (name, index)
        for name, outs in state.parameter_expansion.items()
        for index, out in enumerate(outs)
    }
    outs = tuple(state.positiontup if state.positiontup is not None else state.parameters)
    sources: list[tuple[str, int]] = []
    defaults: dict[str, Any] = {}
    for out in outs:
        name, index = origin.get(out, (out, _VALUE))
        bind = compiled.binds[name]
        if index == _VALUE and not bind.required:
            index = _DEFAULT
            defaults[name] = bind.effective_value
        sources.append((name, index))
    return _Plan(state.statement, outs, tuple(sources), defaults)


def _ended(connection: Connection, end: Callable[[], None]) -> None:
    """The server ended the transaction (a batch's COMMIT or ROLLBACK): end
    SQLAlchemy's too with ``end``, sending nothing (see
    :func:`~pathlock.dialects._commits.commit_in_batches`)."""
    sent = _SENT.set(connection.connection)
    try:
        end()
    finally:
        _SENT.reset(sent)
