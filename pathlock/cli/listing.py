"""Locks and waiters as people and scripts read them: a table, a tree, JSON.

Pure functions of the rows and of ``now``, the database's clock: ages and
times left are computed against the clock every lease expires by, so a skewed
local clock on the operator's machine never shows a live lock as expired. The
command line prints what these return.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal

from pathlock.types import LockInfo, Mode, Owner, WaiterInfo

State = Literal["held", "expired", "waiting"]

COLUMNS = ("CUSTOMER", "PATH", "MODE", "STATE", "OWNER", "AGE", "LEFT", "TOKEN", "LEASE", "REASON")

# Reasons are free text (a whole command line, by default): long ones are cut
# in the table and the tree, never in JSON.
_SHOWN_REASON = 60
# Reasons may hold newlines and other control characters, which would break
# the table's rows and could drive the operator's terminal.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
# Durations shorter than this show tenths of a second: short ttls are common
# in tests and batch jobs, and "0s left" would say nothing.
_TENTHS_BELOW = 10.0


@dataclass(frozen=True, slots=True)
class Entry:
    """One line of a listing: a locked path, or one path of a queued request."""

    state: State
    customer_id: int
    path: str
    mode: Mode
    lease_id: str
    owner: Owner
    reason: str
    fencing_token: int | None  # waiting requests have none yet
    created_at: datetime
    expires_at: datetime
    shallow: bool = False  # at depth 0: the path alone

    @property
    def shown_mode(self) -> str:
        """The mode as shown: ``exclusive``, ``shared (depth 0)``, ..."""
        return f"{self.mode} (depth 0)" if self.shallow else self.mode


def entries(locks: Iterable[LockInfo], waiters: Iterable[WaiterInfo], now: datetime) -> list[Entry]:
    """Locks and waiters as one list, by customer, path and state."""
    found = [
        Entry(
            state="held" if lock.expires_at > now else "expired",
            customer_id=lock.customer_id,
            path=lock.path,
            mode=lock.mode,
            lease_id=lock.lease_id,
            owner=lock.owner,
            reason=lock.reason,
            fencing_token=lock.fencing_token,
            created_at=lock.created_at,
            expires_at=lock.expires_at,
            shallow=lock.shallow,
        )
        for lock in locks
    ]
    found.extend(
        Entry(
            state="waiting",
            customer_id=waiter.customer_id,
            path=path,
            mode=mode,
            lease_id=waiter.lease_id,
            owner=waiter.owner,
            reason=waiter.reason,
            fencing_token=None,
            created_at=waiter.created_at,
            expires_at=waiter.expires_at,
            shallow=path in waiter.shallow,
        )
        for waiter in waiters
        for path, mode in waiter.paths
    )
    found.sort(key=lambda entry: (entry.customer_id, entry.path, entry.state, entry.lease_id))
    return found


def duration(seconds: float) -> str:
    """A short human duration: ``1.4s``, ``42s``, ``4m05s``, ``2h03m``, ``3d04h``."""
    seconds = max(0.0, seconds)
    if seconds < _TENTHS_BELOW:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    for unit, size, smaller, smaller_size in (
        ("d", 86400, "h", 3600),
        ("h", 3600, "m", 60),
        ("m", 60, "s", 1),
    ):
        if whole >= size:
            return f"{whole // size}{unit}{whole % size // smaller_size:02d}{smaller}"
    return f"{whole}s"


def _time_left(entry: Entry, now: datetime) -> str:
    if entry.state == "waiting":
        return "-"
    left = (entry.expires_at - now).total_seconds()
    return duration(left) if left > 0 else f"expired {duration(-left)} ago"


def _shown_reason(reason: str) -> str:
    text = _CONTROL.sub(lambda match: ascii(match.group())[1:-1], reason)
    return text if len(text) <= _SHOWN_REASON else text[: _SHOWN_REASON - 1] + "…"


def table(rows: Sequence[Entry], now: datetime) -> list[str]:
    """An aligned table with a header line; the reason comes last, unpadded."""
    cells = [
        (
            str(entry.customer_id),
            entry.path,
            entry.shown_mode,
            entry.state,
            str(entry.owner),
            duration((now - entry.created_at).total_seconds()),
            _time_left(entry, now),
            "-" if entry.fencing_token is None else str(entry.fencing_token),
            entry.lease_id,
            _shown_reason(entry.reason),
        )
        for entry in rows
    ]
    widths = [max(len(row[n]) for row in [COLUMNS, *cells]) for n in range(len(COLUMNS) - 1)]
    return [
        "  ".join(
            [*(cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=True)), row[-1]]
        ).rstrip()
        for row in [COLUMNS, *cells]
    ]


@dataclass
class _Node:
    children: dict[str, _Node] = field(default_factory=dict)
    entries: list[Entry] = field(default_factory=list)


def _annotation(entry: Entry, now: datetime) -> str:
    if entry.state == "waiting":
        waited = duration((now - entry.created_at).total_seconds())
        return f"waiting for {entry.shown_mode}, {entry.owner}, for {waited}"
    return f"{entry.shown_mode}, {entry.owner}, {_time_left(entry, now)}" + (
        " left" if entry.state == "held" else ""
    )


def _node_line(name: str, node: _Node, now: datetime) -> str:
    if not node.entries:
        return name
    return f"{name}  [" + "; ".join(_annotation(entry, now) for entry in node.entries) + "]"


def _draw(node: _Node, prefix: str, now: datetime) -> list[str]:
    lines: list[str] = []
    names = sorted(node.children)
    for n, name in enumerate(names):
        last = n == len(names) - 1
        child = node.children[name]
        lines.append(prefix + ("└── " if last else "├── ") + _node_line(name, child, now))
        lines.extend(_draw(child, prefix + ("    " if last else "│   "), now))
    return lines


def tree(rows: Sequence[Entry], now: datetime) -> list[str]:
    """Each customer's paths as a tree drawn like ``tree(1)``: folders that
    only lead to locked paths plainly, locked ones with mode, owner and time
    left. Customers are separated by a blank line."""
    roots: dict[int, _Node] = {}
    for entry in rows:
        node = roots.setdefault(entry.customer_id, _Node())
        for part in entry.path.split("/"):
            if part:
                node = node.children.setdefault(part, _Node())
        node.entries.append(entry)
    lines: list[str] = []
    for customer_id, root in sorted(roots.items()):
        if lines:
            lines.append("")
        lines.append(f"customer {customer_id}")
        lines.append(_node_line("/", root, now))
        lines.extend(_draw(root, "", now))
    return lines


def _iso(value: datetime) -> str:
    return value.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def as_json(rows: Sequence[Entry], now: datetime) -> str:
    """A JSON array with one object per entry, every object with the same
    keys: ISO-8601 UTC times and numeric seconds (``expires_in_seconds`` is
    negative once expired)."""
    return json.dumps(
        [
            {
                "customer_id": entry.customer_id,
                "path": entry.path,
                "mode": entry.mode,
                "shallow": entry.shallow,
                "state": entry.state,
                "owner": {
                    "node_id": entry.owner.node_id,
                    "pid": entry.owner.pid,
                    "thread": entry.owner.thread,
                    "detached": entry.owner.detached,
                },
                "reason": entry.reason,
                "fencing_token": entry.fencing_token,
                "lease_id": entry.lease_id,
                "created_at": _iso(entry.created_at),
                "expires_at": _iso(entry.expires_at),
                "age_seconds": round((now - entry.created_at).total_seconds(), 3),
                "expires_in_seconds": round((entry.expires_at - now).total_seconds(), 3),
            }
            for entry in rows
        ],
        indent=2,
        ensure_ascii=False,
    )
