"""Checks of caller-supplied values other than paths, done before any SQL.

Wrong types raise :class:`ArgumentTypeError` (a ``TypeError``); right types
with unacceptable values raise :class:`InvalidArgument` (a ``ValueError``); both
are ``PathLockError``s.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any

from pathlock._core.limits import LEASE_ID_LENGTH, NODE_ID_LENGTH, REASON_LENGTH
from pathlock.errors import ArgumentTypeError, InvalidArgument
from pathlock.types import show

if TYPE_CHECKING:
    from pathlock.types import Cancel

MAX_CUSTOMER_ID = 2**63 - 1  # BIGINT
MAX_COUNT = 2**63 - 1  # the largest integer both databases bind (a LIMIT, say)
MAX_TTL = 366 * 24 * 3600.0
MIN_TTL = 0.001  # DATETIME(6) resolves microseconds; below a millisecond is noise
# A job period beyond a year is a mistake, and a few thousand years overflow
# the datetime arithmetic of the scheduler that runs it.
MAX_INTERVAL = MAX_TTL
MAX_DATA = 64 * 1024
"""The most bytes of data a lease may carry (text: in UTF-8)."""

_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _number(name: str, value: object) -> float:
    # bool is an int subclass; True seconds is a bug, not a duration.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ArgumentTypeError(f"{name} must be a number of seconds, got {type(value).__name__}")
    try:
        number = float(value)
    except OverflowError:  # an int beyond the float range is as good as infinite
        number = math.inf if value > 0 else -math.inf
    if math.isnan(number):
        raise InvalidArgument(f"{name} must be a number of seconds, got NaN")
    return number


def customer_id(value: object) -> int:
    """A customer id: an int from 0 to 2**63 - 1."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArgumentTypeError(f"customer_id must be an int, got {type(value).__name__}")
    if not 0 <= value <= MAX_CUSTOMER_ID:
        raise InvalidArgument(
            f"customer_id must be between 0 and {MAX_CUSTOMER_ID}, got {show(value)}"
        )
    return value


def timeout(value: object) -> float | None:
    """How long to wait: ``None`` (or infinity) for no limit, else >= 0 seconds."""
    if value is None:
        return None
    number = _number("timeout", value)
    if number < 0:
        raise InvalidArgument(f"timeout must be >= 0 seconds or None, got {number:g}")
    return None if math.isinf(number) else number


def ttl(value: object) -> float:
    """A lease duration in seconds, from 1 ms to a year."""
    number = _number("ttl", value)
    if not MIN_TTL <= number <= MAX_TTL:
        raise InvalidArgument(
            f"ttl must be between {MIN_TTL:g} and {MAX_TTL:g} seconds, got {number:g}"
        )
    return number


def reason(value: object, name: str = "reason") -> str:
    """Free text shown to operators: up to 1000 characters, no NUL or surrogates.
    ``name`` is the argument's name in error messages."""
    if not isinstance(value, str):
        raise ArgumentTypeError(f"{name} must be a str, got {type(value).__name__}")
    if len(value) > REASON_LENGTH:
        raise InvalidArgument(f"{name} is longer than {REASON_LENGTH} characters ({len(value)})")
    if "\x00" in value or _SURROGATE.search(value):
        raise InvalidArgument(f"{name} {value!r} contains NUL or a lone surrogate")
    return value


def node_id(value: object) -> str:
    """A node id: 1 to 255 printable characters."""
    if not isinstance(value, str):
        raise ArgumentTypeError(f"node_id must be a str, got {type(value).__name__}")
    if not 0 < len(value) <= NODE_ID_LENGTH:
        raise InvalidArgument(
            f"node_id must have 1 to {NODE_ID_LENGTH} characters, got {len(value)}"
        )
    if _CONTROL.search(value) or _SURROGATE.search(value):
        raise InvalidArgument(f"node_id {value!r} contains control characters or surrogates")
    return value


MAX_OWNER_LENGTH = 255


def owner(value: object) -> str:
    """A caller-given owner name (``owner=``): 1 to 255 characters, no NUL or
    lone surrogates. Only its digest is stored, so any text will do."""
    if not isinstance(value, str):
        raise ArgumentTypeError(f"owner must be a str, got {type(value).__name__}")
    if not 0 < len(value) <= MAX_OWNER_LENGTH:
        raise InvalidArgument(
            f"owner must have 1 to {MAX_OWNER_LENGTH} characters, got {len(value)}"
        )
    if "\x00" in value or _SURROGATE.search(value):
        raise InvalidArgument(f"owner {value!r} contains NUL or a lone surrogate")
    return value


_LEASE_ID = re.compile(f"[0-9a-f]{{{LEASE_ID_LENGTH}}}")


def lease_id(value: object) -> str:
    """A lease id as pathlock makes them: 32 lowercase hexadecimal digits."""
    if not isinstance(value, str):
        raise ArgumentTypeError(f"lease_id must be a str, got {type(value).__name__}")
    if not _LEASE_ID.fullmatch(value):
        raise InvalidArgument(
            f"lease_id must be {LEASE_ID_LENGTH} lowercase hexadecimal digits, got {value!r}"
        )
    return value


def wait_policy(value: object) -> Any:
    """A wait policy: ``start()`` returns an object whose ``next()`` gives
    seconds and whose ``reset()`` starts it over (see :class:`pathlock.WaitPolicy`);
    checked by calling ``start()`` once, which has no side effects for the
    policies pathlock ships."""
    start = getattr(value, "start", None)
    try:
        sequence = start() if callable(start) else None
    except TypeError:  # a class given for its instance, say
        sequence = None
    if not all(callable(getattr(sequence, name, None)) for name in ("next", "reset")):
        raise ArgumentTypeError(
            "backoff must be a wait policy, such as ExponentialBackoff(): an object whose "
            "start() returns an object with next() -> seconds and reset(); "
            f"got {type(value).__name__}"
        )
    return value


def cancel(value: object) -> Cancel | None:
    """A ``cancel`` event: ``None``, or an object with ``is_set()``, such as
    a :class:`threading.Event`."""
    if value is None:
        return None
    if not callable(getattr(value, "is_set", None)):
        raise ArgumentTypeError(
            f"cancel must be a threading.Event (or have is_set()), got {type(value).__name__}"
        )
    return value  # type: ignore[return-value]


def data(value: object) -> bytes | str | None:
    """A lease's data: bytes (or a bytearray, memoryview: kept as bytes) or
    text, up to :data:`MAX_DATA` bytes; ``None`` for none."""
    if value is None or isinstance(value, str | bytes):
        given = value
    elif isinstance(value, bytearray | memoryview):
        given = bytes(value)
    else:
        raise ArgumentTypeError(f"data must be bytes or a str, got {type(value).__name__}")
    if isinstance(given, str):
        if _SURROGATE.search(given):
            raise InvalidArgument("data must be text without lone surrogates (not UTF-8)")
        size = len(given.encode())
    else:
        size = 0 if given is None else len(given)
    if size > MAX_DATA:
        raise InvalidArgument(f"data must be at most {MAX_DATA} bytes, got {size}")
    return given


def flag(name: str, value: object) -> bool:
    """A yes or no: a bool, nothing that merely converts to one."""
    if not isinstance(value, bool):
        raise ArgumentTypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value


def positive_int(name: str, value: object) -> int:
    """A count from 1 to 2**63 - 1 (batch sizes, attempts)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArgumentTypeError(f"{name} must be an int, got {type(value).__name__}")
    if not 1 <= value <= MAX_COUNT:
        raise InvalidArgument(
            f"{name} must be at least 1 and at most {MAX_COUNT}, got {show(value)}"
        )
    return value


def interval(value: object) -> float:
    """A period in seconds for scheduled jobs: more than 0, at most a year."""
    number = _number("interval", value)
    if not 0 < number <= MAX_INTERVAL:
        raise InvalidArgument(
            f"interval must be a positive number of seconds up to {MAX_INTERVAL:g}, got {number:g}"
        )
    return number
