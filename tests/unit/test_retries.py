"""The retry loop's decisions, driven step by step: which node, when to ask a
node whether it is alive, when to set it aside, how long to pause. No
database: the engines are never connected."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pymysql
import pytest
from sqlalchemy import Engine, create_engine
from sqlalchemy.exc import OperationalError, ProgrammingError

from pathlock import BackendError, DatabaseTimeout, Settings, _aio
from pathlock._routing import Router
from pathlock._transactions import AttemptFailed, Pause, Ping, SetAside, Transactions, Try

URLS = [
    "mysql+pymysql://app@db1.example:3306/locks",
    "mysql+pymysql://app@db2.example:3306/locks",
]


@pytest.fixture
def engines() -> Iterator[list[Engine]]:
    made = [create_engine(url) for url in URLS]
    yield made
    for engine in made:
        engine.dispose()


def failed(code: int, message: str = "message", *, unanswered: bool = False) -> AttemptFailed:
    error = OperationalError("statement", {}, pymysql.err.OperationalError(code, message))
    return AttemptFailed(error, unanswered)


def test_a_success_is_one_try(engines: list[Engine]) -> None:
    steps = Transactions(Router(engines[:1])).retries("acting")
    step = next(steps)
    assert isinstance(step, Try)
    assert step.number == 1
    with pytest.raises(StopIteration) as done:
        steps.send(("result", False))
    assert done.value.value == "result"


def test_a_node_that_is_gone_is_set_aside_and_the_next_tried_at_once(
    engines: list[Engine],
) -> None:
    steps = Transactions(Router(engines)).retries("acting")
    first = next(steps)
    assert isinstance(first, Try)
    assert first.node.name == "db1.example:3306/locks"
    aside = steps.throw(failed(2003, "Can't connect"))
    assert isinstance(aside, SetAside)
    assert aside.node is first.node
    second = steps.send(None)
    assert isinstance(second, Try)
    assert second.node.name == "db2.example:3306/locks"
    assert second.number == 2


def test_a_node_that_timed_out_is_asked_before_it_is_passed_over(engines: list[Engine]) -> None:
    steps = Transactions(Router(engines)).retries("acting")
    first = next(steps)
    ping = steps.throw(failed(2013, "Lost connection to MySQL server (timed out)"))
    assert isinstance(ping, Ping)
    assert ping.node is first.node
    kept = steps.send(True)  # it answers: only slow, kept
    assert isinstance(kept, Try)
    assert kept.node is first.node


def test_an_attempt_out_of_its_asyncio_time_is_a_node_that_did_not_answer_anywhere(
    tmp_path: Path,
) -> None:
    """The asyncio API's timer raises the same error on every database: the
    retry loop takes it for a node that did not answer, whether or not the
    dialect knows the error (SQLite's knows no node failures of its own)."""
    engines = [create_engine(f"sqlite:///{tmp_path / name}") for name in ("a.db", "b.db")]
    try:
        steps = Transactions(Router(engines)).retries("acting")
        first = next(steps)
        ping = steps.throw(AttemptFailed(_aio._timed_out(1.0), False))
        assert isinstance(ping, Ping)
        assert ping.node is first.node
        aside = steps.send(False)  # it does not answer: set aside, the next tried
        assert isinstance(aside, SetAside)
        second = steps.send(None)
        assert isinstance(second, Try)
        assert second.node is not first.node
    finally:
        for engine in engines:
            engine.dispose()


def test_a_transient_error_pauses_then_retries_until_max_attempts(engines: list[Engine]) -> None:
    steps = Transactions(Router(engines[:1]), max_attempts=2).retries("acting")
    next(steps)
    pause = steps.throw(failed(1205, "Lock wait timeout exceeded"))
    assert isinstance(pause, Pause)
    assert 0 < pause.seconds < 1
    assert isinstance(steps.send(None), Try)
    with pytest.raises(BackendError, match="persisted through 2 attempts"):
        steps.throw(failed(1205, "Lock wait timeout exceeded"))


def test_an_error_that_is_not_transient_ends_at_once(engines: list[Engine]) -> None:
    steps = Transactions(Router(engines[:1])).retries("acting")
    next(steps)
    error = ProgrammingError("statement", {}, pymysql.err.ProgrammingError(1146, "no such"))
    with pytest.raises(BackendError, match="pathlock db upgrade"):
        steps.throw(AttemptFailed(error, False))


def test_past_the_deadline_only_an_unanswered_commit_gets_one_more_try(
    engines: list[Engine],
) -> None:
    settings = Settings(call_time=0.001, grace=5.0)
    steps = Transactions(Router(engines[:1]), settings=settings).retries("acting")
    next(steps)
    # Its COMMIT went out and no reply came: one more try finds out, at once.
    step = steps.throw(failed(2013, "Lost connection", unanswered=True))
    assert isinstance(step, SetAside)  # a no-op with one node
    pause = steps.send(None)
    assert pause == Pause(0.0)
    assert isinstance(steps.send(None), Try)
    steps = Transactions(Router(engines[:1]), settings=settings).retries("acting")
    next(steps)
    assert isinstance(steps.throw(failed(2013, "Lost connection")), SetAside)
    with pytest.raises(DatabaseTimeout):
        steps.send(None)
