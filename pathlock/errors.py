"""Every error pathlock raises derives from :class:`PathLockError`.

Subclasses also derive from the fitting built-in exception, so callers that only
know the standard library (``except TimeoutError``, ``except ValueError``) still
catch them. Each error carries its data as attributes and builds its message
from them.
"""

from __future__ import annotations

from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING

from pathlock.types import describe_paths, show

if TYPE_CHECKING:
    from pathlock.types import LockInfo, PathMode, WaiterInfo


def _describe_holders(held_by: Sequence[LockInfo]) -> str:
    if not held_by:
        return "no live holder was seen"
    return "; ".join(info.describe() for info in held_by)


def _describe_blockers(held_by: Sequence[LockInfo], queued_behind: Sequence[WaiterInfo]) -> str:
    if queued_behind and not held_by:
        return "queued behind " + "; ".join(info.describe() for info in queued_behind)
    return _describe_holders(held_by)


def _describe_request(paths: Sequence[PathMode], shallow: AbstractSet[str]) -> str:
    return describe_paths(paths, shallow)


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
        super().__init__(f"invalid path {_shown(path)}: {problem}")


def _shown(path: object) -> str:
    shown = show(path)
    if len(shown) > _MAX_SHOWN:
        size = len(path) if isinstance(path, (str, bytes)) else len(shown)
        shown = shown[: _MAX_SHOWN - 20] + f"...' ({size} characters)"
    return shown


class InvalidPathType(ArgumentTypeError):
    """A path of the wrong type (``bytes``, ``None``, a number...), or paths
    given as something other than an iterable of paths (``shared="/a"``): an
    :class:`ArgumentTypeError` (a ``TypeError``) like every wrong type. A
    ``str`` or an ``os.PathLike`` whose ``os.fspath()`` is a ``str``
    (``pathlib.PurePosixPath``) is a path. ``path`` and ``problem`` as for
    :class:`InvalidPath`."""

    def __init__(self, path: object, problem: str) -> None:
        self._args = (path, problem)
        self.path = path
        self.problem = problem
        super().__init__(f"invalid path {_shown(path)}: {problem}")


class LockTimeout(PathLockError, TimeoutError):
    """The requested paths were not granted within ``timeout`` seconds.

    ``paths`` are the normalized ``(path, mode)`` pairs that were requested
    (``shallow``: those of them at depth 0),
    ``held_by`` the holders that blocked the last attempt, and
    ``queued_behind`` the older queued requests it had to let go first (when
    no lock was in the way, the queue was): the 16 just ahead of it at most,
    which one read of the queue returns. ``contended`` is true when the
    last attempts did not get an answer at all: they kept losing races with
    concurrent writes of the same customer (on a cluster, certification
    failures against grants through other nodes; see docs/CLUSTER.md).
    ``unanswered`` is true when the time ran out while the database did not
    answer: the server or the network hung, the host could not be reached, or
    another client of the same customer stopped in the middle of a
    transaction (then its lock on the customer's row held this request up).
    The underlying error is chained as ``__cause__``.
    """

    def __init__(  # noqa: PLR0917 - positional, so that they pickle (see PathLockError)
        self,
        paths: Sequence[PathMode],
        timeout: float,
        held_by: Sequence[LockInfo],
        queued_behind: Sequence[WaiterInfo] = (),
        contended: bool = False,
        unanswered: bool = False,
        shallow: AbstractSet[str] = frozenset(),
    ) -> None:
        self._args = (paths, timeout, held_by, queued_behind, contended, unanswered, shallow)
        self.paths = tuple(paths)
        self.shallow = frozenset(shallow)
        self.timeout = timeout
        self.held_by = tuple(held_by)
        self.queued_behind = tuple(queued_behind)
        self.contended = contended
        self.unanswered = unanswered
        request = _describe_request(self.paths, self.shallow)
        message = f"could not lock {request} within {timeout:g} s: "
        if unanswered and not self.held_by and not self.queued_behind:
            message += "the database did not answer in time"
        else:
            message += _describe_blockers(self.held_by, self.queued_behind)
            if unanswered:
                message += "; then the database did not answer in time"
        if contended:
            message += (
                "; the last attempts lost every race with concurrent writes of this "
                "customer (deadlocks or cluster certification failures)"
            )
        super().__init__(message)


class DeadlockDetected(PathLockError):
    """Waiting could never succeed, so the request fails at once instead of
    waiting for its timeout. Either the request conflicts only with locks that
    its own owner (same node, process and thread) holds, so it would wait for
    itself (``party`` is ``None``); or it is blocked by locks of another owner
    whose own queued request, ``party``, waits for locks of the requesting
    owner: each holds what the other waits for.

    ``paths`` are the requested pairs (``shallow``: those at depth 0),
    ``held_by`` the conflicting locks (the owner's own, or the other party's).
    The other party keeps waiting; the caller should release what it holds
    (or retry later) to let it through.
    """

    def __init__(
        self,
        paths: Sequence[PathMode],
        held_by: Sequence[LockInfo],
        party: WaiterInfo | None = None,
        shallow: AbstractSet[str] = frozenset(),
    ) -> None:
        self._args = (paths, held_by, party, shallow)
        self.paths = tuple(paths)
        self.shallow = frozenset(shallow)
        self.held_by = tuple(held_by)
        self.party = party
        request = _describe_request(self.paths, self.shallow)
        if party is None:
            message = (
                f"request for {request} conflicts only with locks "
                f"held by the same owner and would wait for itself: "
                f"{_describe_holders(self.held_by)}"
            )
        else:
            message = (
                f"request for {request} would wait forever: "
                f"{_describe_holders(self.held_by)}, whose owner is itself queued "
                f"(ticket {party.ticket}) for {_describe_request(party.paths, party.shallow)}, "
                f"which conflicts with locks held by the requesting owner"
            )
        super().__init__(message)


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


class ManagerClosed(PathLockError, RuntimeError):
    """The :class:`PathLockManager` was closed: every call after
    :meth:`~PathLockManager.close` raises this, and so does a request that was
    waiting in another thread when the manager closed (it is not granted)."""

    def __init__(self, action: str = "") -> None:
        self._args = (action,)
        self.action = action
        detail = f": cannot {action}" if action else ""
        super().__init__(f"this PathLockManager is closed{detail}")


class LockCancelled(PathLockError):
    """A waiting :meth:`~CustomerLocks.lock_paths` was cancelled through its
    ``cancel`` event: nothing was granted, and the request left the queue."""

    def __init__(self, paths: Sequence[PathMode], shallow: AbstractSet[str] = frozenset()) -> None:
        self._args = (paths, shallow)
        self.paths = tuple(paths)
        self.shallow = frozenset(shallow)
        requested = describe_paths(self.paths, self.shallow)
        super().__init__(f"the request for {requested} was cancelled")


class SchemaMismatch(PathLockError):
    """pathlock's tables are not at the revision this pathlock was made for.

    The database records an older revision (run ``pathlock db upgrade``) or
    a newer one (a newer pathlock migrated it); or, with ``recorded`` ``None``,
    the tables exist but no revision is recorded, as an older pathlock's
    ``create_schema()`` left them: record the revision they are at with
    ``pathlock db stamp REV`` (docs/MIGRATIONS.md says how to tell which),
    then upgrade. Raised by the :class:`PathLockManager` constructor, before
    anything is locked, and by ``pathlock db upgrade`` on tables without a
    recorded revision, before anything is changed."""

    def __init__(self, recorded: str | None, expected: str, known: bool = False) -> None:
        self._args = (recorded, expected, known)
        self.recorded = recorded
        self.expected = expected
        if recorded is None:
            super().__init__(
                "pathlock's tables exist but record no revision (an older pathlock's "
                "create_schema() made them): record the revision they are at with "
                "`pathlock db stamp REV` (docs/MIGRATIONS.md says how to tell), then run "
                f"`pathlock db upgrade` (to {expected})"
            )
            return
        if known:
            advice = "run `pathlock db upgrade` (or the Alembic migrations) first"
        else:
            advice = "a newer pathlock migrated it: use that version, or downgrade the database"
        super().__init__(
            f"pathlock's tables are at revision {recorded}, and this pathlock needs "
            f"{expected}: {advice}"
        )


class CaseRuleMismatch(PathLockError):
    """The customer's paths were first locked by a manager with the other
    ``case_insensitive`` setting, which the database recorded. Their paths
    would never meet: ``/Shared/Foo`` as given and ``/shared/foo`` folded would
    both be granted. Every process that locks a customer's paths must use the
    same setting. Raised by a request, before anything is locked."""

    def __init__(self, customer_id: int, recorded: bool) -> None:
        self._args = (customer_id, recorded)
        self.customer_id = customer_id
        self.recorded = recorded
        rule = "case-insensitive" if recorded else "case-sensitive"
        super().__init__(
            f"customer {customer_id}'s paths are {rule}, as the database recorded at its "
            f"first lock: use case_insensitive={recorded} for this customer, in every process"
        )


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


class ContentionTimeout(BackendError):
    """An operation kept losing races with concurrent writes of the same
    customer (error 1213: a deadlock, or on a cluster a certification failure
    against a write through another node) until its time ran out. Nothing of
    it was applied. On a cluster, customer affinity makes this rare (see
    docs/CLUSTER.md)."""


class DatabaseTimeout(BackendError, TimeoutError):
    """An operation got no answer from the database within its time: the
    server or the network hung, the host could not be reached, or the rows it
    needed were locked by a transaction that did not end (a client that
    stopped in the middle of one). ``cause`` is the last error seen. If the
    operation was a write whose COMMIT got no reply, it may have taken effect;
    a lock request whose grant is in that state is never returned, and its
    rows, if any, expire within its ttl."""


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else "(no message)"


class RequestTooLarge(InvalidArgument):
    """A request asks for more than one request may hold: more paths than
    ``pathlock.paths.MAX_REQUEST_PATHS`` (1000), or more characters of paths
    in total than ``pathlock.paths.MAX_REQUEST_CHARACTERS`` (100,000). The
    limits keep every statement of a request within what database servers
    accept by default. Raised before anything is written; split the request,
    or lock a common parent folder instead.

    ``limit`` is ``"paths"`` or ``"characters"``, ``maximum`` the limit and
    ``size`` the request's size in that unit (``None`` when the count stopped
    at the first path over the limit).
    """

    def __init__(self, limit: str, maximum: int, size: int | None = None) -> None:
        self._args = (limit, maximum, size)
        self.limit = limit
        self.maximum = maximum
        self.size = size
        what = "paths" if limit == "paths" else "characters of paths in total"
        found = f"more than {maximum:,}" if size is None else f"{size:,}"
        super().__init__(
            f"request too large: {found} {what}, at most {maximum:,} per request "
            "(lock a common parent folder instead, or split the request)"
        )
