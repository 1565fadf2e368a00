"""What a manager remembers of each customer from its own operations, to
choose the cheapest way of its next one: whether the customer had a queue or
live rows moments ago, which request a release of its handed paths to, and
who was next in line when a lease was handed its paths.

Hints only, and no I/O: every statement checks again under the customer's
sentinel row, so a wrong hint costs a round trip, never a wrong grant.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

from pathlock._core.fairness import may_conflict
from pathlock._core.records import GrantRequest, waiter_info
from pathlock.errors import PathLockError
from pathlock.paths import normalize
from pathlock.types import PathMode, WaiterInfo

log = logging.getLogger("pathlock.store")

QUEUED_FOR = 0.5
"""Seconds for which a customer seen with a queue (a release read one, or an
attempt queued) counts as having one: a new request of it skips the grant in
one round trip, which requires an empty queue, and goes straight to the
attempt that says who is in the way."""

BUSY_FOR = 2.0
"""Seconds for which a customer whose grant without searches was refused (it
had rows: see ``LEAN_CLAIM`` in :mod:`pathlock._statements.lean`) is granted the
searching way: a refusal costs a round trip."""

KEPT = 4096
"""Customers (or leases) remembered at most in each of the hints."""


class Heir(NamedTuple):
    """The queued request a release grants its paths to, and for how long."""

    request: WaiterInfo
    term_us: int


def well_formed(paths: Sequence[PathMode]) -> bool:
    """Whether a queue row's paths are a request pathlock could have made (a
    row written by hand may hold anything): only those are handed over."""
    try:
        return bool(paths) and all(
            normalize(path) == path and mode in ("exclusive", "shared") for path, mode in paths
        )
    except PathLockError:
        return False


class Hints:
    """One manager's hints (see the module's docstring)."""

    def __init__(self) -> None:
        # Customer id -> monotonic time it was last seen with a queue.
        self._queued: dict[int, float] = {}
        # Customer id -> monotonic time it was last refused a grant without
        # searches.
        self._busy: dict[int, float] = {}
        # Lease id -> the request next in line when a release handed the
        # lease its paths (None: nobody was), the one its own release hands
        # them to.
        self._heirs: dict[str, Heir | None] = {}
        # Customer id -> (monotonic time, paths) of this manager's last
        # hand-over that granted them.
        self._handed: dict[int, tuple[float, Sequence[PathMode]]] = {}

    def seen_queued(self, customer_id: int) -> None:
        now = time.monotonic()
        if len(self._queued) >= KEPT:
            self._queued = {
                customer: seen
                for customer, seen in list(self._queued.items())
                if now - seen < QUEUED_FOR
            }
        self._queued[customer_id] = now

    def likely_queued(self, customer_id: int) -> bool:
        seen = self._queued.get(customer_id)
        return seen is not None and time.monotonic() - seen < QUEUED_FOR

    def likely_idle(self, customer_id: int) -> bool:
        """Whether a grant without searches is worth its round trip."""
        seen = self._busy.get(customer_id) if self._busy else None
        return (seen is None or time.monotonic() - seen >= BUSY_FOR) and not self.likely_queued(
            customer_id
        )

    def seen_busy(self, customer_id: int) -> None:
        if len(self._busy) >= KEPT:
            self._busy.clear()
        self._busy[customer_id] = time.monotonic()

    def seen_idle(self, customer_id: int) -> None:
        """A release left the customer with no row and nobody queued."""
        self._busy.pop(customer_id, None)

    def handed_to(self, customer_id: int, heir: Heir) -> None:
        """A release of this manager granted ``heir`` its paths."""
        if len(self._handed) >= KEPT:
            self._handed.clear()
        self._handed[customer_id] = (time.monotonic(), heir.request.paths)

    def handed_on_lately(self, request: GrantRequest) -> bool:
        """Whether a release of this manager handed paths that conflict with
        ``request``'s to another request moments ago: then that request likely
        holds them still, and ``request`` will wait."""
        handed = self._handed.get(request.customer_id) if self._handed else None
        return (
            handed is not None
            and time.monotonic() - handed[0] < QUEUED_FOR
            and may_conflict(handed[1], request.paths)
        )

    def note_heir(self, customer_id: int, lease_id: str, row: Any) -> None:
        """Keep the request that is next in line now that ``lease_id`` was
        handed its paths (``row``: the head of the queue, with the columns a
        release reads; ``None``: nobody is queued), for the release of that
        lease (:meth:`heir_of`)."""
        heir: Heir | None = None
        if row is not None:
            try:
                heir = Heir(waiter_info(row), int(row.hand_over_us))
            except (ValueError, TypeError, AttributeError):
                # Not a request pathlock could have queued (written by hand),
                # or queued by an older pathlock: the release reads the queue.
                log.debug("customer %d: unreadable queued request %.200r", customer_id, row)
                return
            if heir.term_us <= 0 or heir.request.customer_id != customer_id:
                return
        if len(self._heirs) >= KEPT:
            self._heirs.clear()  # leases never released here: forget them all
        self._heirs[lease_id] = heir

    def heir_of(
        self, lease_id: str, released: Sequence[PathMode] | None
    ) -> tuple[bool, Heir | None]:
        """Whether ``lease_id`` was handed its paths by a release (then it
        knows who was next in line; see :meth:`note_heir`), and that request,
        if a release of ``released`` (``None``: unknown) can hand them on to
        it; forgotten either way."""
        if not self._heirs or lease_id not in self._heirs:
            return False, None
        heir = self._heirs.pop(lease_id, None)
        if heir is None or not well_formed(heir.request.paths):
            return True, None
        if released is not None and not may_conflict(heir.request.paths, released):
            return True, None
        return True, heir
