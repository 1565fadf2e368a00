"""A batch's SQL and parameters come from a plan made once per statement and
shape (:func:`pathlock._batch.expand`): they must be exactly what
SQLAlchemy's own expansion gives, for every statement pathlock sends, every
paramstyle of the drivers it runs on, and requests of every shape."""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

import pytest
from sqlalchemy.dialects.mysql import asyncmy as mysql_asyncmy
from sqlalchemy.dialects.mysql import pymysql as mysql_pymysql
from sqlalchemy.dialects.postgresql import psycopg as postgresql_psycopg
from sqlalchemy.dialects.sqlite import aiosqlite as sqlite_aiosqlite
from sqlalchemy.dialects.sqlite import pysqlite as sqlite_pysqlite
from sqlalchemy.engine.interfaces import Dialect
from sqlalchemy.exc import CompileError
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.expression import Executable

import pathlock._statements
from pathlock import _batch as batch
from pathlock import dialects
from pathlock._core.records import GrantRequest
from pathlock._parameters import grant_parameters
from pathlock._statements.common import NO_TICKET
from pathlock._statements.conflicts import blockers_query, shape
from pathlock._statements.grants import (
    CLAIM_IF_GRANTED,
    LOCK_SENTINEL,
    SET_GRANT_UNTIL,
    VERSION,
    WAKE_HEIR,
    grant_statement,
)
from pathlock._statements.leases import RELEASE
from pathlock._statements.queue import LIVE_WAITERS, MAX_WAITERS, WATCHED_TICKETS
from pathlock.paths import normalize_request
from pathlock.types import Owner

DIALECTS = {
    # The paramstyles of the drivers' DB-API modules.
    "pymysql": mysql_pymysql.dialect(paramstyle="pyformat"),  # by name
    "asyncmy": mysql_asyncmy.dialect(paramstyle="format"),  # positional
    "pysqlite": sqlite_pysqlite.dialect(paramstyle="qmark"),
    "aiosqlite": sqlite_aiosqlite.dialect(paramstyle="qmark"),
    "psycopg": postgresql_psycopg.dialect(),  # by name
}
# Those whose families send statements in batches: a family that does not
# spells none of the constructs only batches use.
BATCHING = {
    name: dialect for name, dialect in DIALECTS.items() if dialects.for_name(dialect.name).batches
}


# Statements a family sends only if it has notices (Dialect.notices).
NOTICES_ONLY = (WAKE_HEIR,)


def _compiled(statement: Executable, dialect: Dialect) -> SQLCompiler | None:
    """``statement`` compiled for ``dialect``; ``None`` if it is one that only
    batches (or notices) use and the dialect's family does not batch (or
    has no notices)."""
    try:
        return statement.compile(dialect=dialect)  # type: ignore[attr-defined, no-any-return]
    except CompileError:
        family = dialects.for_name(dialect.name)
        if family.batches and (family.notices or statement not in NOTICES_ONLY):
            raise
        return None


# Requests of different shapes: one path, several, shared ones, deep ones.
REQUESTS = [
    (["/a"], []),
    (["/Shared/bench/file.txt"], []),
    (["/a/b/c", "/d"], ["/e/f"]),
    ([], ["/x", "/y/z"]),
    (["/" + "/".join(f"p{n}" for n in range(40))], ["/q"]),
]


def _module_statements() -> list[Executable]:
    """Every fixed statement of every module of :mod:`pathlock._statements`."""
    modules = [
        importlib.import_module(f"pathlock._statements.{module.name}")
        for module in pkgutil.iter_modules(pathlock._statements.__path__)
    ]
    assert len(modules) >= 8
    return [
        value
        for module in modules
        for name, value in vars(module).items()
        if name.isupper() and isinstance(value, Executable)
    ]


def _values(compiled: SQLCompiler, length: int, salt: str) -> dict[str, Any]:
    """A value for every parameter the statement needs (lists of ``length``)."""
    return {
        name: [f"{salt}{n}" for n in range(length)] if bind.expanding else f"{salt}-{name}"
        for name, bind in compiled.binds.items()
        if bind.required
    }


def _reference(compiled: SQLCompiler, values: dict[str, Any]) -> tuple[str, Any]:
    state = compiled.construct_expanded_state(dict(values))
    if compiled.positional:
        return state.statement, state.positional_parameters
    return state.statement, dict(state.parameters)


@pytest.mark.parametrize("dialect", DIALECTS.values(), ids=DIALECTS.keys())
def test_every_statement_expands_as_sqlalchemy_expands_it(dialect: Dialect) -> None:
    """Each statement of the module, with lists of 0 to 3 values, twice per
    shape (the second from the plan) and with other values each time."""
    for statement in _module_statements():
        compiled = _compiled(statement, dialect)
        if compiled is None:
            continue
        for length in (1, 3, 0, 1):
            for salt in ("a", "b"):
                values = _values(compiled, length, salt)
                assert batch.expand(compiled, values) == _reference(compiled, values), statement


@pytest.mark.parametrize("dialect", DIALECTS.values(), ids=DIALECTS.keys())
@pytest.mark.parametrize("queued", [True, False])
def test_grants_and_conflict_queries_expand_as_sqlalchemy_expands_them(
    dialect: Dialect, queued: bool
) -> None:
    """The grant and the conflict query of requests of several shapes, each
    shape planned once and then used for other paths of the same shape."""
    owner = Owner("node", 1, "t", "key")
    for exclusive, shared in REQUESTS * 2:
        for prefix in ("", "/other"):
            paths = normalize_request(
                [prefix + path for path in exclusive], [prefix + path for path in shared]
            )
            request = GrantRequest(7, "f" * 32, paths, owner, "why", 30.0)
            values = grant_parameters(request, None) | {"c_case": False}
            form = shape(paths)
            for statement in (
                grant_statement(form, queued=queued),
                grant_statement(form, queued=True, sentinel_after=True, handed=queued),
                blockers_query(form),
            ):
                compiled = _compiled(statement, dialect)
                if compiled is not None:
                    assert batch.expand(compiled, values) == _reference(compiled, values)


def test_a_value_given_replaces_the_statements_own() -> None:
    """A parameter with a value of its own in the statement (the queue's
    limit) takes the value given, when one is, as SQLAlchemy's does."""
    compiled = LIVE_WAITERS.compile(dialect=DIALECTS["pymysql"])
    _sql, plain = batch.expand(compiled, {"c_id": 1})
    assert plain["waiters_limit"] == MAX_WAITERS
    _sql, given = batch.expand(compiled, {"c_id": 1, "waiters_limit": 5})
    assert given["waiters_limit"] == 5
    assert given == _reference(compiled, {"c_id": 1, "waiters_limit": 5})[1]


def test_a_missing_value_is_an_error_as_before() -> None:
    compiled = RELEASE.compile(dialect=DIALECTS["pymysql"])
    batch.expand(compiled, {"c_id": 1, "l_id": "x"})  # planned
    with pytest.raises(KeyError):
        batch.expand(compiled, {"c_id": 1})


@pytest.mark.parametrize("dialect", BATCHING.values(), ids=BATCHING.keys())
def test_a_batch_composes_as_its_statements_one_by_one(dialect: Dialect) -> None:
    """A batch's SQL and parameters come from a plan made once per sequence
    of statements and shape: the same as composing it statement by
    statement, for requests of every shape, twice each (the second from the
    plan), with other values each time."""
    owner = Owner("node", 1, "t", "key")
    for exclusive, shared in REQUESTS * 2:
        for prefix, ticket in (("", NO_TICKET), ("/other", 12)):
            paths = normalize_request(
                [prefix + path for path in exclusive], [prefix + path for path in shared]
            )
            request = GrantRequest(7, "f" * 32, paths, owner, prefix, 30.0)
            values = grant_parameters(request, ticket) | {"c_case": False}
            form = shape(paths)
            steps: list[tuple[Executable, dict[str, Any]]] = [
                (SET_GRANT_UNTIL, {"until_us": len(prefix)}),
                (LOCK_SENTINEL, {"c_id": 7}),
                (grant_statement(form, queued=True, sentinel_after=True), values),
                (CLAIM_IF_GRANTED, {"c_id": 7, "c_case": False, "l_id": "f" * 32}),
                (blockers_query(form), values),
                (LIVE_WAITERS, {"c_id": 7}),
            ]
            for end in (None, "COMMIT"):
                expected = batch._composed(dialect, _padded(steps), end=end)
                assert batch._compose(dialect, steps, end=end) == expected


def _padded(
    steps: list[tuple[Executable, dict[str, Any]]],
) -> list[tuple[Executable, dict[str, Any]]]:
    """``steps`` with each list longer than 8 padded to the next power of two
    with its last value, as a batch sends them."""

    def pad(value: Any) -> Any:
        if not isinstance(value, list) or len(value) <= 8:
            return value
        size = 16
        while size < len(value):
            size *= 2
        return value + [value[-1]] * (size - len(value))

    return [
        (statement, {name: pad(value) for name, value in given.items()})
        for statement, given in steps
    ]


@pytest.mark.parametrize("dialect", DIALECTS.values(), ids=DIALECTS.keys())
def test_long_lists_are_padded_so_that_few_plans_serve_every_length(
    dialect: Dialect, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch whose lists take every length from 0 to 100 is planned once
    per length up to 8 and once per power of two above: the checks of many
    waiting threads ask about lists of every length, and a plan per length
    cost more than the reads. The padding repeats a list's last value, so an
    IN list means what it meant."""
    monkeypatch.setattr(batch, "_BATCHES", {})
    plans = []
    real = batch._batch_plan

    def planned(*args: Any, **kwargs: Any) -> Any:
        plans.append(args[1][1][1]["tickets"])
        return real(*args, **kwargs)

    monkeypatch.setattr(batch, "_batch_plan", planned)
    for length in range(101):
        tickets = list(range(1000, 1000 + length))
        steps: list[tuple[Executable, dict[str, Any]]] = [
            (VERSION, {"c_id": 7}),
            (WATCHED_TICKETS, {"c_id": 7, "tickets": tickets}),
        ]
        sql, parameters = batch._compose(dialect, steps, end="ROLLBACK")
        assert (sql, parameters) == batch._composed(dialect, _padded(steps), end="ROLLBACK")
        given = parameters if dialect.positional else list(parameters.values())
        assert set(given) == {7, *tickets}
        assert steps[1][1]["tickets"] == tickets  # the caller's list is left as it was
        as_tuple = [steps[0], (WATCHED_TICKETS, {"c_id": 7, "tickets": tuple(tickets)})]
        assert batch._compose(dialect, as_tuple, end="ROLLBACK") == (sql, parameters)
    assert [len(tickets) for tickets in plans] == [*range(9), 16, 32, 64, 128]


def test_a_parameter_of_two_values_in_one_batch_is_refused() -> None:
    dialect = DIALECTS["pymysql"]
    steps: list[tuple[Executable, dict[str, Any]]] = [
        (LOCK_SENTINEL, {"c_id": 7}),
        (RELEASE, {"c_id": 7, "l_id": "x"}),
    ]
    batch._compose(dialect, steps, end=None)  # planned
    with pytest.raises(ValueError, match="c_id"):
        batch._compose(dialect, [steps[0], (RELEASE, {"c_id": 8, "l_id": "x"})], end=None)
