"""The locks of one customer: what a file server calls on every request."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from pathlock._core import validation
from pathlock.errors import ArgumentTypeError
from pathlock.lease import Lease, LostCallback
from pathlock.types import Cancel, DetachedLease, LeaseInfo, LockInfo

if TYPE_CHECKING:
    from pathlock.manager import PathLockManager


_NO_LEASE = "blocking acquire returned no lease"


class CustomerLocks:
    """The locks of one customer; get one from :meth:`PathLockManager.for_customer`."""

    def __init__(self, manager: PathLockManager, customer_id: int) -> None:
        self.manager = manager
        self.customer_id = customer_id

    def lock_paths(
        self,
        *paths: str,
        shared: Iterable[str] = (),
        shallow: Iterable[str] = (),
        timeout: float | None = None,
        reason: str = "",
        ttl: float | None = None,
        on_lost: LostCallback | None = None,
        owner: str | None = None,
        cancel: Cancel | None = None,
        data: bytes | str | None = None,
    ) -> Lease:
        """Lock every path at once, all or nothing, waiting while any conflicts.

        Positional paths are locked exclusive, ``shared`` ones shared. A lock
        covers the path's whole subtree and conflicts with locks on the same
        path, its ancestors and its descendants (shared + shared excepted).

        Paths named in ``shallow`` are locked at depth 0 (WebDAV's ``Depth:
        0``): the path alone, not what is below it. Such a lock conflicts with
        locks on the same path and with those of its ancestors that cover
        their subtree, never with locks on its descendants; a lock on an
        ancestor at depth 0 does not reach it either. A ``shallow`` path is
        shared if it is also in ``shared`` (and not among the positional
        ones), else exclusive: ``lock_paths(shallow=["/Shared"])`` locks
        ``/Shared`` alone, exclusive.
        ``timeout=None`` waits without limit, ``0`` makes one attempt; on expiry
        :class:`LockTimeout` names the holders (or the queued requests) that
        blocked the last attempt.

        Waiting is first come, first served among conflicting requests: a
        blocked request is queued, and no later request that conflicts with it
        is granted before it (requests that do not conflict never wait for each
        other). A queued request that waits for locks of this owner does not
        hold this owner back. :class:`DeadlockDetected` is raised at once when
        waiting could never succeed: the request is blocked only by locks of its
        own owner, or by locks of an owner that is itself queued for something
        this owner holds.

        The owner is, within this manager instance, ``owner`` if given (any
        text, such as a request id: use it when one piece of work moves
        between threads of a pool, or when unrelated work shares a thread),
        else the calling asyncio task, else the calling thread; a call that
        ``asyncio.to_thread`` runs (in a copy of its task's context) is an
        owner of its own, not the pool thread's. It decides
        :meth:`release_locks` and the deadlock rule above; it never lets
        anyone release a lease but through the lease itself.

        ``ttl`` overrides the manager's lease duration; ``on_lost`` is called if
        this lease is lost.

        ``cancel`` (a :class:`threading.Event`, or anything with ``is_set()``)
        lets another thread end the wait without a signal: once it is set, the
        request raises :class:`LockCancelled` within 50 ms (an attempt under
        way finishes first), leaves the queue, and holds nothing.

        ``data`` (bytes or text, up to 64 KiB) goes with the lease, granted
        with it in one transaction, and comes back, as given, from
        :meth:`get_lease` in any process (a WebDAV lock's owner and timeout,
        say).
        """
        _check_on_lost(on_lost)
        lease = self.manager._acquire(
            self.customer_id,
            paths,
            shared,
            timeout=timeout,
            reason=reason,
            ttl=ttl,
            blocking=True,
            on_lost=on_lost,
            owner=owner,
            cancel=cancel,
            data=data,
            shallow=shallow,
        )
        # No call from here to the caller: a signal's handler could raise at
        # one (Ctrl-C), and the caller would never get the lease it holds.
        if lease is None:  # pragma: no cover - a blocking acquire returns or raises
            raise AssertionError(_NO_LEASE)
        return lease

    def try_lock_paths(
        self,
        *paths: str,
        shared: Iterable[str] = (),
        shallow: Iterable[str] = (),
        reason: str = "",
        ttl: float | None = None,
        on_lost: LostCallback | None = None,
        owner: str | None = None,
        data: bytes | str | None = None,
    ) -> Lease | None:
        """One attempt: a :class:`Lease`, or ``None`` if anything conflicts
        (``owner`` and ``data`` as for :meth:`lock_paths`)."""
        _check_on_lost(on_lost)
        return self.manager._acquire(
            self.customer_id,
            paths,
            shared,
            timeout=0,
            reason=reason,
            ttl=ttl,
            blocking=False,
            on_lost=on_lost,
            owner=owner,
            data=data,
            shallow=shallow,
        )

    def lock_detached(
        self,
        *paths: str,
        ttl: float,
        shared: Iterable[str] = (),
        shallow: Iterable[str] = (),
        timeout: float | None = None,
        reason: str = "",
        cancel: Cancel | None = None,
        data: bytes | str | None = None,
    ) -> DetachedLease:
        """Lock every path at once, as :meth:`lock_paths` does, for a
        *detached* lease: one that outlives this call, this manager and this
        process, such as a WebDAV client's lock, taken by one request and
        refreshed and released by later ones, served by any worker.

        The lease lasts ``ttl`` seconds (required: nobody renews it on its
        own), by the database's clock, unless :meth:`renew_detached` extends
        it or :meth:`release_detached` ends it first, both by its
        ``lease_id``, from any manager of any process. No manager keeps it:
        neither ``close()`` nor the process's exit releases it, nor a node's
        clean-up (``cleanup_on_start``, :meth:`PathLockManager.release_node`);
        once expired it blocks nobody, and the reaper deletes it.

        It conflicts, queues and waits as every lease does. Each detached
        lease is an owner of its own: it never counts as this caller's (in
        :meth:`release_locks` or the deadlock rule), and two detached leases
        on overlapping paths conflict even when one caller asks for both.
        Returns a :class:`DetachedLease`; :class:`LockTimeout`,
        :class:`DeadlockDetected`, ``cancel`` and ``data`` as for
        :meth:`lock_paths`.
        """
        lease = self.manager._acquire_detached(
            self.customer_id,
            paths,
            shared,
            ttl=ttl,
            timeout=timeout,
            reason=reason,
            blocking=True,
            cancel=cancel,
            data=data,
            shallow=shallow,
        )
        if lease is None:  # pragma: no cover - as in lock_paths, no call before the return
            raise AssertionError(_NO_LEASE)
        return lease

    def try_lock_detached(
        self,
        *paths: str,
        ttl: float,
        shared: Iterable[str] = (),
        shallow: Iterable[str] = (),
        reason: str = "",
        data: bytes | str | None = None,
    ) -> DetachedLease | None:
        """One attempt at :meth:`lock_detached`: a :class:`DetachedLease`, or
        ``None`` if anything conflicts."""
        return self.manager._acquire_detached(
            self.customer_id,
            paths,
            shared,
            ttl=ttl,
            timeout=0,
            reason=reason,
            blocking=False,
            data=data,
            shallow=shallow,
        )

    def renew_detached(self, lease_id: str, *, ttl: float) -> LeaseInfo:
        """Make the detached lease ``lease_id`` last ``ttl`` seconds from now,
        by the database's clock (shorter or longer than before), and return it
        as it is then. Atomic: an expired or released lease is never brought
        back; it raises :class:`LeaseLost`, and its paths may be someone
        else's already. A lease that a manager holds (not detached) raises
        :class:`InvalidArgument`: its manager renews it."""
        lease_id = validation.lease_id(lease_id)
        return self.manager._renew_detached(self.customer_id, lease_id, validation.ttl(ttl))

    def release_detached(self, lease_id: str) -> int:
        """Release the detached lease ``lease_id``; return how many paths it
        held (0 if it had expired or was released already). As every release,
        it hands the paths to the next request in line. A lease that a
        manager holds (not detached) raises :class:`InvalidArgument`."""
        lease_id = validation.lease_id(lease_id)
        return self.manager._release_detached(self.customer_id, lease_id)

    def get_lease(self, lease_id: str) -> LeaseInfo | None:
        """The lease ``lease_id`` of this customer as the database holds it
        now, detached or not, with its data (one indexed read); ``None`` if
        it does not exist or has expired."""
        lease_id = validation.lease_id(lease_id)
        return self.manager._lease_info(self.customer_id, lease_id)

    def locks_on(
        self,
        path: str,
        *,
        ancestors: bool = True,
        descendants: bool = False,
        include_expired: bool = False,
    ) -> list[LockInfo]:
        """The locks of this customer on ``path`` (any lease, any owner), by
        path: those on the path itself; with ``ancestors`` (the default) also
        those on its ancestors that cover their subtree, and so reach it
        (not those at depth 0); with ``descendants`` also those on every path
        below it. A lock conflicts with a request for ``path`` if it is among
        all three (among the first two for a request at depth 0) and either
        of them is exclusive.
        One indexed query, however many locks the customer has; expired
        rows the reaper has not deleted yet only with ``include_expired``."""
        return self.manager._locks_on(
            self.customer_id,
            path,
            ancestors=ancestors,
            descendants=descendants,
            include_expired=include_expired,
        )

    def release_locks(self, *, owner: str | None = None) -> int:
        """Release every lease that this owner holds for this customer through
        this manager; return the number of paths released. The owner is
        ``owner`` if given, else the calling asyncio task, else the calling
        thread (as for :meth:`lock_paths`): never another manager's leases,
        nor another thread's or task's. A holder still using a lease released
        here finds it lost (:meth:`Lease.ensure_held` and the end of its
        ``with`` block raise :class:`LeaseLost`), as after ``close()``."""
        return self.manager._release_owner(self.customer_id, owner)

    def list_locks(self, *, include_expired: bool = False) -> list[LockInfo]:
        """This customer's locked paths (see :meth:`PathLockManager.list_locks`)."""
        return self.manager.list_locks(self.customer_id, include_expired=include_expired)

    def __repr__(self) -> str:
        return f"<CustomerLocks customer_id={self.customer_id} {self.manager!r}>"


def _check_on_lost(on_lost: object) -> None:
    """Refuse an ``on_lost`` that is not callable before anything is written:
    otherwise the mistake shows only when the lease is lost, as a failed call
    on the callback thread, and the caller never hears of the loss."""
    if on_lost is not None and not callable(on_lost):
        raise ArgumentTypeError(
            "on_lost must be a function that takes the lost Lease, or None; "
            f"got {type(on_lost).__name__}"
        )
