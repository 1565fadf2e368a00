"""Unit tests of the error family: hierarchy, attributes and messages built from data."""

from __future__ import annotations

import copy
import inspect
import pickle
from datetime import UTC, datetime, timedelta

import pytest

import pathlock
from pathlock import errors
from pathlock.errors import (
    BackendError,
    DeadlockDetected,
    InvalidArgument,
    InvalidPath,
    LeaseLost,
    LockTimeout,
    PathLockError,
)
from pathlock.types import EXCLUSIVE, SHARED, LockInfo, Owner, WaiterInfo

ERROR_CLASSES = [
    value
    for _name, value in inspect.getmembers(errors, inspect.isclass)
    if issubclass(value, BaseException) and value.__module__ == errors.__name__
]


def _info(
    path: str = "/Shared/a",
    *,
    mode: str = EXCLUSIVE,
    reason: str = "nightly move",
    owner: Owner | None = None,
) -> LockInfo:
    created = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
    return LockInfo(
        customer_id=42,
        path=path,
        mode=mode,  # type: ignore[arg-type]
        lease_id="0123456789abcdef0123456789abcdef",
        owner=owner or Owner("web-1", 4242, "777"),
        reason=reason,
        fencing_token=17,
        created_at=created,
        expires_at=created + timedelta(seconds=30),
    )


def _waiter(*paths: tuple[str, str], ticket: int = 7) -> WaiterInfo:
    created = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
    return WaiterInfo(
        customer_id=42,
        ticket=ticket,
        paths=paths,  # type: ignore[arg-type]
        lease_id="fedcba9876543210fedcba9876543210",
        owner=Owner("web-2", 99, "5"),
        reason="rename",
        created_at=created,
        expires_at=created + timedelta(seconds=5),
    )


def _examples() -> list[PathLockError]:
    return [
        PathLockError("plain"),
        InvalidArgument("bad value"),
        InvalidPath("/a/..", "contains a '..' component"),
        LockTimeout([("/a", EXCLUSIVE)], 2.5, [_info()]),
        DeadlockDetected([("/a", SHARED)], [_info()]),
        DeadlockDetected([("/x", EXCLUSIVE)], [_info("/x")], _waiter(("/y", EXCLUSIVE))),
        LockTimeout([("/a/b", EXCLUSIVE)], 1.0, [], [_waiter(("/a", SHARED))]),
        LockTimeout([("/a", EXCLUSIVE)], 1.0, [_info()], shallow=frozenset({"/a"})),
        DeadlockDetected([("/a", SHARED)], [_info()], None, frozenset({"/a"})),
        errors.LockCancelled([("/a", SHARED)], frozenset({"/a"})),
        LeaseLost("abc123", "expired"),
        BackendError("acquire", ConnectionError("gone away"), "check the server"),
        errors.SchemaMismatch("0003", "0005", True),
        errors.CaseRuleMismatch(42, True),
    ]


# -- hierarchy ---------------------------------------------------------------------


def test_every_error_class_is_found() -> None:
    names = {cls.__name__ for cls in ERROR_CLASSES}
    assert names >= {
        "PathLockError",
        "InvalidArgument",
        "InvalidPath",
        "LockTimeout",
        "DeadlockDetected",
        "LeaseLost",
        "BackendError",
    }


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda cls: cls.__name__)
def test_every_error_derives_from_pathlock_error(cls: type[BaseException]) -> None:
    assert issubclass(cls, PathLockError)
    assert issubclass(cls, Exception)
    assert cls.__doc__


def test_public_errors_are_exported() -> None:
    exported = {
        name
        for name in pathlock.__all__
        if inspect.isclass(getattr(pathlock, name))
        and issubclass(getattr(pathlock, name), BaseException)
    }
    assert exported == {cls.__name__ for cls in ERROR_CLASSES}
    for name in exported:
        assert issubclass(getattr(pathlock, name), PathLockError)


def test_builtin_bases() -> None:
    assert issubclass(LockTimeout, TimeoutError)
    assert issubclass(InvalidPath, ValueError)
    assert issubclass(InvalidPath, InvalidArgument)
    assert issubclass(InvalidArgument, ValueError)
    assert not issubclass(LockTimeout, ValueError)
    assert not issubclass(InvalidPath, TimeoutError)


def test_lock_timeout_is_caught_as_timeout_error() -> None:
    with pytest.raises(TimeoutError, match="within 1 s"):
        raise LockTimeout([("/a", EXCLUSIVE)], 1.0, [])


def test_invalid_path_is_caught_as_value_error() -> None:
    with pytest.raises(ValueError, match="invalid path"):
        raise InvalidPath("a", "not absolute")


# -- messages and attributes ----------------------------------------------------------


def test_lock_timeout_carries_its_data() -> None:
    holder = _info("/Shared", mode=SHARED, reason="backup")
    paths = [("/Shared/a", EXCLUSIVE), ("/Shared/b", SHARED)]
    error = LockTimeout(paths, 2.5, [holder])
    assert error.paths == tuple(paths)
    assert error.timeout == 2.5
    assert error.held_by == (holder,)
    message = str(error)
    assert "/Shared/a (exclusive)" in message
    assert "/Shared/b (shared)" in message
    assert "2.5 s" in message
    assert "/Shared (shared)" in message
    assert "web-1 pid 4242 thread 777" in message
    assert "'backup'" in message


def test_lock_timeout_names_every_holder() -> None:
    holders = [
        _info("/x", owner=Owner("node-a", 1, "11"), reason="first"),
        _info("/x/y", owner=Owner("node-b", 2, "22"), reason="second"),
    ]
    message = str(LockTimeout([("/x", EXCLUSIVE)], 0, holders))
    for text in ["node-a pid 1 thread 11", "node-b pid 2 thread 22", "'first'", "'second'"]:
        assert text in message
    assert "within 0 s" in message


def test_lock_timeout_without_holders_says_so() -> None:
    message = str(LockTimeout([("/a", EXCLUSIVE)], 1.0, []))
    assert "no live holder" in message


def test_holder_without_reason_is_described_without_one() -> None:
    message = str(LockTimeout([("/a", EXCLUSIVE)], 1.0, [_info("/a", reason="")]))
    assert "/a (exclusive) held by web-1 pid 4242 thread 777" in message
    assert " for " not in message


def test_deadlock_detected_carries_its_data() -> None:
    holder = _info("/a", reason="outer")
    error = DeadlockDetected([("/a/b", EXCLUSIVE)], [holder])
    assert error.paths == (("/a/b", EXCLUSIVE),)
    assert error.held_by == (holder,)
    message = str(error)
    assert "/a/b (exclusive)" in message
    assert "web-1 pid 4242 thread 777" in message
    assert "'outer'" in message


def test_deadlock_of_two_owners_names_the_other_party() -> None:
    party = _waiter(("/y", EXCLUSIVE), ticket=31)
    error = DeadlockDetected([("/x", EXCLUSIVE)], [_info("/x")], party)
    assert error.party == party
    message = str(error)
    assert "would wait forever" in message
    assert "/x (exclusive) held by web-1 pid 4242 thread 777" in message
    assert "(ticket 31) for /y (exclusive)" in message


def test_timeout_behind_the_queue_names_the_queued_requests() -> None:
    ahead = _waiter(("/a", SHARED), ("/b", EXCLUSIVE), ticket=12)
    error = LockTimeout([("/a/b", EXCLUSIVE)], 1.0, [], [ahead])
    assert error.queued_behind == (ahead,)
    message = str(error)
    assert "queued behind ticket 12: /a (shared), /b (exclusive)" in message
    assert "requested by web-2 pid 99 thread 5 for 'rename'" in message


def test_long_paths_and_long_requests_are_shortened_in_messages() -> None:
    paths = [(f"/{n:02d}" + "x" * 4000, EXCLUSIVE) for n in range(25)]
    message = str(LockTimeout(paths, 1.0, [_info("/" + "y" * 4000)]))
    assert len(message) < 2500
    assert "(4003 characters)" in message
    assert "(4001 characters)" in message
    assert "and 15 more" in message


def test_lease_lost_carries_its_data() -> None:
    error = LeaseLost("feedbeef", "expired before renewal")
    assert error.lease_id == "feedbeef"
    assert error.reason == "expired before renewal"
    assert "feedbeef" in str(error)
    assert "expired before renewal" in str(error)


def test_backend_error_carries_its_data() -> None:
    cause = ConnectionError("Lost connection to server\nsecond line with details")
    error = BackendError("release", cause, "is the server up?")
    assert error.action == "release"
    assert error.cause is cause
    message = str(error)
    assert "release failed" in message
    assert "ConnectionError" in message
    assert "Lost connection to server" in message
    assert "second line" not in message
    assert "is the server up?" in message


def test_backend_error_without_message_or_hint() -> None:
    message = str(BackendError("reap", RuntimeError()))
    assert message == "reap failed: RuntimeError: (no message)"


def test_invalid_path_carries_its_data() -> None:
    error = InvalidPath("/a/..", "contains a '..' component")
    assert error.path == "/a/.."
    assert error.problem == "contains a '..' component"
    assert "'/a/..'" in str(error)
    assert "contains a '..' component" in str(error)


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("/a\x00b", "\\x00"),
        ("/a\nb", "\\n"),
        ("/a\x7f", "\\x7f"),
        ("/a\x85", "\\x85"),
        ("/a\ud800", "\\ud800"),
    ],
)
def test_invalid_path_shows_control_characters_visibly(value: str, shown: str) -> None:
    message = str(InvalidPath(value, "contains a control character"))
    assert shown in message
    assert value not in message
    assert message.isprintable()


def test_invalid_path_message_for_non_str() -> None:
    assert "None" in str(InvalidPath(None, "expected a str, got NoneType"))
    assert "b'/a'" in str(InvalidPath(b"/a", "expected a str, got bytes"))


def test_invalid_path_truncates_very_long_values() -> None:
    value = "/" + "a" * 10_000
    error = InvalidPath(value, "too long")
    message = str(error)
    assert error.path == value  # the attribute keeps the whole value
    assert len(message) < 200
    assert message.startswith("invalid path '/aaa")
    assert "..." in message
    assert message.endswith(": too long")


def test_invalid_path_truncation_states_the_real_length() -> None:
    value = "/" + "a" * 9_999
    message = str(InvalidPath(value, "too long"))
    assert "(10000 characters)" in message, message


def test_invalid_path_short_values_are_not_truncated() -> None:
    value = "/" + "a" * 50
    assert str(InvalidPath(value, "x")) == f"invalid path {value!r}: x"


# -- errors survive pickling (multiprocessing, concurrent.futures) -------------------


def test_messages_say_which_requested_paths_are_at_depth_0() -> None:
    timeout = LockTimeout([("/a", EXCLUSIVE), ("/b", SHARED)], 1.0, [], shallow={"/a"})
    assert "could not lock /a (exclusive, depth 0), /b (shared) within 1 s" in str(timeout)
    assert timeout.shallow == {"/a"}
    deadlock = DeadlockDetected([("/a", SHARED)], [_info()], None, frozenset({"/a"}))
    assert "request for /a (shared, depth 0) conflicts" in str(deadlock)
    cancelled = errors.LockCancelled([("/a", SHARED)], frozenset({"/a"}))
    assert "/a (shared, depth 0)" in str(cancelled)


@pytest.mark.parametrize("error", _examples(), ids=lambda error: type(error).__name__)
def test_errors_survive_pickle_and_copy(error: PathLockError) -> None:
    for clone in (pickle.loads(pickle.dumps(error)), copy.copy(error)):  # noqa: S301
        assert type(clone) is type(error)
        assert str(clone) == str(error)
        assert _attributes(clone) == _attributes(error)


def _attributes(error: BaseException) -> dict[str, object]:
    # A chained cause compares by identity; compare what it says instead.
    return {name: repr(value) for name, value in vars(error).items()}
