"""Every error pathlock raises derives from :class:`PathLockError`.

Subclasses also derive from the fitting built-in exception, so callers that only
know the standard library (``except TimeoutError``, ``except ValueError``) still
catch them. Each error carries its data as attributes and builds its message
from them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlock.types import LockInfo, PathMode


def _describe_holders(held_by: Sequence[LockInfo]) -> str:
    if not held_by:
        return "no live holder was seen (the conflict may have been a queued request)"
    return "; ".join(info.describe() for info in held_by)


def _describe_request(paths: Sequence[PathMode]) -> str:
    return ", ".join(f"{path} ({mode})" for path, mode in paths)


_MAX_SHOWN = 120  # characters of a bad value quoted in a message


class PathLockError(Exception):
    """Base class of every error raised by pathlock.

    Subclasses that take data keep their constructor arguments in ``_args``, so
    they survive pickling (errors cross process boundaries) and ``copy``.
    """

    _args: tuple[object, ...] = ()

    def __reduce__(self) -> tuple[type[PathLockError], tuple[object, ...]]:
        return type(self), self._args or self.args


class ArgumentTypeError(PathLockError, TypeError):
    """An argument has the wrong type (a ``bool`` where seconds are expected,
    a ``str`` customer id, ...). Raised before anything is written."""


class InvalidArgument(PathLockError, ValueError):
    """An argument has the right type but a value pathlock does not accept.

    Raised before anything is written to the database.
    """


class InvalidPath(InvalidArgument):
    """A path cannot be locked: not a string, empty, relative, ``.`` or ``..``
    components, NUL or control characters, or longer than the column allows.

    ``path`` is the offending value as given (``repr``-ed in the message, so
    control characters are visible) and ``problem`` says what is wrong with it.
    """

    def __init__(self, path: object, problem: str) -> None:
        self._args = (path, problem)
        self.path = path
        self.problem = problem
        shown = repr(path)
        if len(shown) > _MAX_SHOWN:
            size = len(path) if isinstance(path, (str, bytes)) else len(shown)
            shown = shown[: _MAX_SHOWN - 20] + f"...' ({size} characters)"
        super().__init__(f"invalid path {shown}: {problem}")


class LockTimeout(PathLockError, TimeoutError):
    """The requested paths were not granted within ``timeout`` seconds.

    ``paths`` are the normalized ``(path, mode)`` pairs that were requested and
    ``held_by`` the holders that blocked the last attempt (may be empty if the
    last attempt was blocked by something other than a held lock).
    """

    def __init__(
        self,
        paths: Sequence[PathMode],
        timeout: float,
        held_by: Sequence[LockInfo],
    ) -> None:
        self._args = (paths, timeout, held_by)
        self.paths = tuple(paths)
        self.timeout = timeout
        self.held_by = tuple(held_by)
        super().__init__(
            f"could not lock {_describe_request(self.paths)} within {timeout:g} s: "
            f"{_describe_holders(self.held_by)}"
        )


class DeadlockDetected(PathLockError):
    """Waiting could never succeed: the request conflicts with locks that its own
    owner (same node, process and thread) holds, so it would wait for itself.

    ``paths`` are the requested pairs, ``held_by`` the owner's conflicting locks.
    """

    def __init__(self, paths: Sequence[PathMode], held_by: Sequence[LockInfo]) -> None:
        self._args = (paths, held_by)
        self.paths = tuple(paths)
        self.held_by = tuple(held_by)
        super().__init__(
            f"request for {_describe_request(self.paths)} conflicts only with locks "
            f"held by the same owner and would wait for itself: "
            f"{_describe_holders(self.held_by)}"
        )


class LeaseLost(PathLockError):
    """A lease is no longer held: it was released, it expired, or its rows were
    deleted (by the reaper after expiry, or by an operator).

    Once a lease is lost another process may already hold its paths; work done
    under it must be checked with the lease's fencing token.
    """

    def __init__(self, lease_id: str, reason: str) -> None:
        self._args = (lease_id, reason)
        self.lease_id = lease_id
        self.reason = reason
        super().__init__(f"lease {lease_id} is not held: {reason}")


class BackendError(PathLockError):
    """The database failed in a way pathlock could not retry past: a transient
    error (deadlock, lock-wait timeout, lost connection) that persisted through
    every retry, or a permanent one (missing tables, access denied).

    ``cause`` is the underlying exception (also chained as ``__cause__``).
    Whatever the failure, no request is left half-granted: one attempt is one
    transaction.
    """

    def __init__(self, action: str, cause: BaseException, hint: str = "") -> None:
        self._args = (action, cause, hint)
        self.action = action
        self.cause = cause
        message = f"{action} failed: {type(cause).__name__}: {_first_line(cause)}"
        if hint:
            message += f" ({hint})"
        super().__init__(message)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else "(no message)"
