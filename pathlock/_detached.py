"""Detached leases: granted as every request is, then held by no process;
looked up, renewed and released by their lease id from any process."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterable

from pathlock import _owners as owners
from pathlock import events
from pathlock._core import validation
from pathlock._core.records import GrantRequest, lease_data
from pathlock._requesting import Requesting
from pathlock._upkeep import LeaseRows
from pathlock.errors import (
    InvalidArgument,
    LeaseLost,
)
from pathlock.paths import normalize
from pathlock.types import (
    DetachedLease,
    LeaseInfo,
    LockInfo,
)


class DetachedLeases(Requesting):
    """A manager's detached leases, and the look-ups by lease id and path."""

    def _acquire_detached(
        self,
        customer_id: int,
        exclusive: Iterable[str],
        shared: Iterable[str],
        *,
        ttl: object,
        timeout: object,
        reason: object,
        blocking: bool,
        cancel: object = None,
        data: object = None,
        shallow: object = (),
    ) -> DetachedLease | None:
        """A request for a detached lease (see
        :meth:`CustomerLocks.lock_detached`): granted as every request is,
        then kept by nobody."""
        paths, depth_0 = self._request_paths(exclusive, shared, shallow)
        wait_limit = validation.timeout(timeout) if blocking else 0.0
        event = validation.cancel(cancel)
        lease_id = secrets.token_hex(16)
        request = GrantRequest(
            customer_id=customer_id,
            lease_id=lease_id,
            paths=paths,
            # An owner of its own: it waits for nobody's locks as its own,
            # and nobody waits for it as theirs.
            owner=owners.detached(self._node_id, lease_id),
            reason=validation.reason(reason),
            ttl=validation.ttl(ttl),
            abandoned=frozenset(),
            data=lease_data(validation.data(data)),
            shallow=depth_0,
        )

        granted: list[DetachedLease] = []

        def detached(token: int, _started: float, _term: float | None) -> DetachedLease:
            granted.append(
                DetachedLease(
                    customer_id, lease_id, paths, token, request.ttl, request.reason, depth_0
                )
            )
            return granted[0]

        try:
            return self._grant(
                request,
                detached,
                blocking=blocking,
                wait_limit=wait_limit,
                cancel=event,
                take_up_later=False,
            )
        except BaseException:
            # Raised on the way out of the call after the grant (see
            # _acquire): nobody has the lease id, and nobody would release
            # it before its ttl, hours maybe.
            if granted:
                self._resolve(customer_id, lease_id, request.ttl)
            raise

    def _lease_info(self, customer_id: int, lease_id: str) -> LeaseInfo | None:
        """The live lease ``lease_id`` of ``customer_id``, if any (see
        :meth:`CustomerLocks.get_lease`)."""
        with self._call("look up a lease"):
            read = self._upkeep.lease_rows(customer_id, lease_id)
        return _lease_info(read)

    def _locks_on(
        self,
        customer_id: int,
        path: object,
        *,
        ancestors: object,
        descendants: object,
        include_expired: object,
    ) -> list[LockInfo]:
        """See :meth:`CustomerLocks.locks_on`."""
        normalized = normalize(path, case_insensitive=self._case_insensitive)
        flags = {
            name: validation.flag(name, value)
            for name, value in (
                ("ancestors", ancestors),
                ("descendants", descendants),
                ("include_expired", include_expired),
            )
        }
        with self._call("look up locks"):
            return self._upkeep.locks_on(customer_id, normalized, **flags)

    def _renew_detached(self, customer_id: int, lease_id: str, ttl: float) -> LeaseInfo:
        """Renew a detached lease (see :meth:`CustomerLocks.renew_detached`)."""
        with self._call("renew a detached lease"):
            started = time.monotonic()
            rows = self._upkeep.lease_rows(customer_id, lease_id).rows
            live = [row for row, alive in rows if alive]
            if rows:
                _check_detached(rows[0][0], "renewed")
            if not live:
                raise LeaseLost(lease_id, "it expired" if rows else "no such lease")
            held, _ = self._store.renewals.renew([(customer_id, lease_id, len(live))], ttl)
            self._events.renewed(
                events.Renewed(
                    len(held), 1 - len(held), time.monotonic() - started, background=False
                )
            )
            if lease_id not in held:
                raise LeaseLost(lease_id, "it expired or was released before it was renewed")
            read = self._upkeep.lease_rows(customer_id, lease_id)
        renewed = _lease_info(read)
        if renewed is None:  # released right after its renewal
            raise LeaseLost(lease_id, "it was released after it was renewed")
        return renewed

    def _release_detached(self, customer_id: int, lease_id: str) -> int:
        """Release a detached lease (see :meth:`CustomerLocks.release_detached`)."""
        with self._call("release a detached lease"):
            read = self._upkeep.lease_rows(customer_id, lease_id)
            rows, database_now = read.rows, read.database_now
            if not rows:
                return 0
            assert database_now is not None  # noqa: S101 - read with the rows
            first = rows[0][0]
            _check_detached(first, "released")
            paths = tuple((row.path, row.mode) for row, _ in rows)
            try:
                deleted = self._store.releases.release(customer_id, lease_id, paths=paths)
            except BaseException:
                # Failed or interrupted, its DELETE may or may not have
                # landed: the rows go from the background, soon (as an
                # interrupted release of a lease of this manager's), not
                # at the lease's timeout, hours away maybe.
                left = max(row.expires_at for row, _ in rows) - database_now
                self._in_doubt.add(customer_id, lease_id, max(1.0, left.total_seconds()))
                self._in_doubt.settle_soon()
                raise
            finally:
                self._wakeups.notify(customer_id)
        live = sum(1 for _, alive in rows if alive)
        if deleted == 0 or not live:
            return 0  # released meanwhile by another call, or expired
        held = (database_now - first.created_at).total_seconds()
        self._events.released(events.Released(customer_id, lease_id, paths, max(0.0, held)))
        return live


def _lease_info(read: LeaseRows) -> LeaseInfo | None:
    """The lease whose rows ``read`` found, if live (``None``: none)."""
    rows = [row for row, live in read.rows if live]
    if not rows:
        return None
    first = rows[0]
    return LeaseInfo(
        customer_id=first.customer_id,
        lease_id=first.lease_id,
        paths=tuple((row.path, row.mode) for row in rows),
        fencing_token=first.fencing_token,
        owner=first.owner,
        reason=first.reason,
        created_at=first.created_at,
        expires_at=min(row.expires_at for row in rows),
        data=read.data,
        shallow=frozenset(row.path for row in rows if row.shallow),
    )


def _check_detached(row: LockInfo, done: str) -> None:
    """Refuse to renew or release by its id a lease that a manager holds."""
    if not row.owner.detached:
        raise InvalidArgument(
            f"lease {row.lease_id} is not detached, and is {done} only by the manager that"
            " holds it (an operator may release it: PathLockManager.release_lease)"
        )
