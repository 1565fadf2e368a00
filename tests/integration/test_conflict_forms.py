"""Both spellings of the conflict check find exactly the conflicting locks.

A request names the paths it meets by equality (its own and their ancestors)
in a list when they are of the usual size, and as lengths to cut its paths at
when spelled out they would be megabytes (``pathlock._statements.shape``).
The two must never disagree: here both run against the same random locks,
live and expired, on their subtree or at depth 0, beside the rule itself
(``pathlock.paths.conflicts``), on every backend, as the blockers query, as
the grant, and as the query for the queued requests in the way.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Connection, Engine, delete, insert, select

from pathlock._core.records import GrantRequest
from pathlock._parameters import grant_parameters
from pathlock._statements.common import now
from pathlock._statements.conflicts import blockers_query, conflict_parameters, shape
from pathlock._statements.grants import grant_statement
from pathlock._statements.queue import queued_in_the_way
from pathlock.paths import conflicts, normalize_request
from pathlock.schema import customer_locks, path_lock_waiter_paths, path_lock_waiters, path_locks
from pathlock.types import EXCLUSIVE, SHARED, Owner, PathMode

# Few names, so that paths meet often: as themselves, as ancestors and as
# descendants, with a four-byte character and a prefix that is no ancestor.
_NAMES = st.sampled_from(["a", "ab", "b", "\U0001f600"])
_PATHS = st.lists(_NAMES, min_size=0, max_size=3).map(lambda names: "/" + "/".join(names))
_MODES = st.sampled_from([EXCLUSIVE, SHARED])
# (path, mode, at depth 0, alive)
_HELD = st.lists(st.tuples(_PATHS, _MODES, st.booleans(), st.booleans()), max_size=8)
# (path, mode, at depth 0)
_REQUESTS = st.lists(st.tuples(_PATHS, _MODES, st.booleans()), min_size=1, max_size=3)
_Held = tuple[str, str, bool, bool]

_OWNER = Owner("forms", 1, "t")


@pytest.fixture
def connection(raw_engine: Engine) -> Iterator[Connection]:
    with raw_engine.connect() as connection:
        # Row counts of INSERT ... SELECT on PostgreSQL too (as pathlock's engines).
        yield connection.execution_options(preserve_rowcount=True)


def _hold(connection: Connection, customer_id: int, held: list[_Held]) -> None:
    """The customer's locks, ``(path, mode, shallow, alive)``, one lease
    each; and the same as queued requests, one path each, in that order."""
    _forget(connection, customer_id)
    connection.execute(insert(customer_locks).values(customer_id=customer_id, version=0))
    for n, (path, mode, shallow, alive) in enumerate(held):
        # The columns hold UTC, without a zone.
        expiry = datetime(2999, 1, 1) if alive else datetime(2000, 1, 1)  # noqa: DTZ001
        owner = {"node_id": "forms", "pid": 1, "thread": "t", "owner_key": "", "reason": ""}
        connection.execute(
            insert(path_locks).values(
                customer_id=customer_id, lease_id=f"held{n}", path=path, mode=mode,
                fencing_token=n, created_at=now(), expires_at=expiry, shallow=shallow,
                **owner,
            )
        )  # fmt: skip
        ticket = connection.execute(
            insert(path_lock_waiters).values(
                customer_id=customer_id,
                lease_id=f"queued{n}",
                paths=json.dumps([[path, mode, 0] if shallow else [path, mode]]),
                created_at=now(),
                expires_at=expiry,
                **owner,
            )
        ).inserted_primary_key[0]
        connection.execute(
            insert(path_lock_waiter_paths).values(
                ticket=ticket, customer_id=customer_id, path=path, mode=mode, shallow=shallow
            )
        )
    connection.commit()


def _forget(connection: Connection, customer_id: int) -> None:
    connection.execute(delete(path_locks).where(path_locks.c.customer_id == customer_id))
    connection.execute(
        delete(path_lock_waiter_paths).where(path_lock_waiter_paths.c.customer_id == customer_id)
    )
    connection.execute(
        delete(path_lock_waiters).where(path_lock_waiters.c.customer_id == customer_id)
    )
    connection.execute(delete(customer_locks).where(customer_locks.c.customer_id == customer_id))


def _forms(paths: tuple[PathMode, ...], shallow: frozenset[str]) -> list[Any]:
    spelled = shape(paths, shallow)
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
    held: list[_Held],
    requests: list[list[tuple[str, str, bool]]],
) -> None:
    customer_id = secrets.randbelow(2**62) + 1
    _hold(connection, customer_id, held)
    try:
        for wanted in requests:
            shallow = frozenset(path for path, _, at_depth_0 in wanted if at_depth_0)
            paths = normalize_request(
                [path for path, mode, _ in wanted if mode == EXCLUSIVE],
                [path for path, mode, _ in wanted if mode == SHARED],
            )
            shallow = frozenset(path for path, _ in paths if path in shallow)
            conflicting = {
                n
                for n, (path, mode, at_depth_0, alive) in enumerate(held)
                if alive
                and any(
                    conflicts((path, mode), mine, at_depth_0, mine[0] in shallow) for mine in paths
                )
            }
            expected = {(held[n][0], held[n][1], held[n][2]) for n in conflicting}
            request = GrantRequest(
                customer_id, secrets.token_hex(16), paths, _OWNER, "", 30.0, shallow=shallow
            )
            for form in _forms(paths, shallow):
                parameters = grant_parameters(request, None)
                parameters |= conflict_parameters(paths, form, shallow)
                found = {
                    (row.path, row.mode, bool(row.shallow))
                    for row in connection.execute(blockers_query(form), parameters)
                }
                assert found == expected, (form, paths, shallow)
                in_the_way = {
                    row.lease_id
                    for row in connection.execute(
                        queued_in_the_way(form, as_items=False), parameters | {"ahead_limit": 99}
                    )
                }
                assert in_the_way == {f"queued{n}" for n in conflicting}, (form, paths, shallow)
                inserted = connection.execute(
                    grant_statement(form, queued=False), parameters
                ).rowcount
                connection.rollback()
                assert inserted == (0 if expected else len(paths)), (form, paths, shallow)
                if not expected:
                    _granted_as_asked(connection, request, form, parameters)
    finally:
        connection.rollback()
        _forget(connection, customer_id)
        connection.commit()


def _granted_as_asked(
    connection: Connection, request: GrantRequest, form: Any, parameters: dict[str, Any]
) -> None:
    """The grant writes each path's depth as requested."""
    connection.execute(grant_statement(form, queued=False), parameters)
    rows = connection.execute(
        select(path_locks.c.path, path_locks.c.mode, path_locks.c.shallow).where(
            path_locks.c.lease_id == request.lease_id
        )
    ).all()
    connection.rollback()
    assert sorted((row.path, row.mode, bool(row.shallow)) for row in rows) == sorted(
        (path, mode, path in request.shallow) for path, mode in request.paths
    )


def test_a_deep_request_is_cut_not_spelled() -> None:
    deep = normalize_request(["/a" * 200], [])
    assert not shape(deep).spelled
    usual = normalize_request(["/Shared/projects/2026/report.odt"], ["/Shared/templates"])
    assert shape(usual).spelled
