"""Both spellings of the conflict check find exactly the conflicting locks.

A request names the paths it meets by equality (its own and their ancestors)
in a list when they are of the usual size, and as lengths to cut its paths at
when spelled out they would be megabytes (``pathlock._statements.shape``).
The two must never disagree: here both run against the same random locks,
live and expired, beside the rule itself (``pathlock.paths.conflicts``), on
every backend, as the blockers query and as the grant.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Connection, Engine, delete, insert, text

from pathlock._records import GrantRequest, grant_parameters
from pathlock._statements import (
    NO_TICKET,
    blockers_query,
    conflict_parameters,
    grant_statement,
    shape,
)
from pathlock.paths import conflicts, normalize_request
from pathlock.schema import customer_locks, path_locks
from pathlock.types import EXCLUSIVE, SHARED, Owner, PathMode

# Few names, so that paths meet often: as themselves, as ancestors and as
# descendants, with a four-byte character and a prefix that is no ancestor.
_NAMES = st.sampled_from(["a", "ab", "b", "\U0001f600"])
_PATHS = st.lists(_NAMES, min_size=0, max_size=3).map(lambda names: "/" + "/".join(names))
_MODES = st.sampled_from([EXCLUSIVE, SHARED])
_HELD = st.lists(st.tuples(_PATHS, _MODES, st.booleans()), max_size=8)
_REQUESTS = st.lists(st.tuples(_PATHS, _MODES), min_size=1, max_size=3)

_OWNER = Owner("forms", 1, "t")


@pytest.fixture
def connection(raw_engine: Engine) -> Iterator[Connection]:
    with raw_engine.connect() as connection:
        yield connection


def _hold(connection: Connection, customer_id: int, held: list[tuple[str, str, bool]]) -> None:
    """The customer's locks: ``(path, mode, alive)``, one lease each."""
    connection.execute(delete(path_locks).where(path_locks.c.customer_id == customer_id))
    connection.execute(delete(customer_locks).where(customer_locks.c.customer_id == customer_id))
    connection.execute(insert(customer_locks).values(customer_id=customer_id, version=0))
    now = (
        "UTC_TIMESTAMP(6)"
        if connection.dialect.name != "sqlite"
        else "strftime('%Y-%m-%d %H:%M:%f', 'now')"
    )
    for n, (path, mode, alive) in enumerate(held):
        connection.execute(
            text(
                "INSERT INTO path_locks (customer_id, lease_id, path, mode, node_id, pid, thread,"
                " owner_key, reason, fencing_token, created_at, expires_at)"
                f" VALUES (:c, :l, :p, :m, 'forms', 1, 't', '', '', :n, {now}, :expiry)"
            ),
            {
                "c": customer_id,
                "l": f"held{n}",
                "p": path,
                "m": mode,
                "n": n,
                "expiry": "2999-01-01 00:00:00" if alive else "2000-01-01 00:00:00",
            },
        )
    connection.commit()


def _forms(paths: tuple[PathMode, ...]) -> list[Any]:
    spelled = shape(paths)
    assert spelled.spelled  # requests this small are spelled out
    return [spelled, spelled._replace(spelled=False)]


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(held=_HELD, requests=st.lists(_REQUESTS, min_size=1, max_size=4))
def test_both_forms_find_exactly_the_conflicts(
    connection: Connection,
    held: list[tuple[str, str, bool]],
    requests: list[list[PathMode]],
) -> None:
    customer_id = secrets.randbelow(2**62) + 1
    _hold(connection, customer_id, held)
    try:
        for wanted in requests:
            paths = normalize_request(
                [path for path, mode in wanted if mode == EXCLUSIVE],
                [path for path, mode in wanted if mode == SHARED],
            )
            expected = {
                (path, mode)
                for path, mode, alive in held
                if alive and any(conflicts((path, mode), mine) for mine in paths)
            }
            request = GrantRequest(customer_id, secrets.token_hex(16), paths, _OWNER, "", 30.0)
            for form in _forms(paths):
                parameters = grant_parameters(request) | conflict_parameters(paths, form)
                parameters["w_ticket"] = NO_TICKET
                found = {
                    (row.path, row.mode)
                    for row in connection.execute(blockers_query(form), parameters)
                }
                assert found == expected, (form, paths)
                inserted = connection.execute(
                    grant_statement(form, queued=True), parameters
                ).rowcount
                connection.rollback()
                assert inserted == (0 if expected else len(paths)), (form, paths)
    finally:
        connection.rollback()
        connection.execute(delete(path_locks).where(path_locks.c.customer_id == customer_id))
        connection.execute(
            delete(customer_locks).where(customer_locks.c.customer_id == customer_id)
        )
        connection.commit()


def test_a_deep_request_is_cut_not_spelled() -> None:
    deep = normalize_request(["/a" * 200], [])
    assert not shape(deep).spelled
    usual = normalize_request(["/Shared/projects/2026/report.odt"], ["/Shared/templates"])
    assert shape(usual).spelled
