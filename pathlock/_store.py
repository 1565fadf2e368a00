"""Where pathlock talks to the database: every operation is one short
transaction (or a bounded series of retries of one), its statements built in
:mod:`pathlock._statements` and run through :mod:`pathlock._transactions`.

:class:`Store` holds one object per job, which share what the manager has
learnt of its customers lately (:mod:`pathlock._core.hints`):

- :mod:`pathlock._granting`: an attempt to grant a request every path at once;
- :mod:`pathlock._queue`: a queued request's checks, its queue row kept alive,
  the paths handed to it taken up, its rows deleted when it gives up;
- :mod:`pathlock._releasing`: releases, and :mod:`pathlock._handing_over`, the
  paths they hand to the request next in line;
- :mod:`pathlock._renewing`: renewals of held leases.

Who is in the way of a request is read and judged in :mod:`pathlock._picture`.

Transactions run in READ COMMITTED: under REPEATABLE READ a read before the
sentinel write would fix the snapshot and the conflict query would read the past.
Every time is the database's clock (``UTC_TIMESTAMP(6)``, independent of the
session time zone): app servers' clocks drift, the database is the one clock
they share.
"""

from __future__ import annotations

from sqlalchemy.exc import DBAPIError

from pathlock._core.hints import Hints
from pathlock._granting import Grants
from pathlock._handing_over import HandOver
from pathlock._queue import Queue
from pathlock._releasing import Releases
from pathlock._renewing import Renewals
from pathlock._transactions import Transactions
from pathlock.dialects._commits import may_commit
from pathlock.errors import BackendError


class Store:
    """The SQL operations of grants, the queue, releases and renewals, run
    through ``transactions`` (its nodes, retries and sentinel write), one
    object per job.

    Every operation is one transaction (or a bounded series of retries of
    one), retried on transient errors with a WARNING each time, and raises
    :class:`BackendError` for anything else. Each ends by its ``deadline``
    (monotonic time; default: ``settings.call_time`` from now), or raises
    :class:`DatabaseTimeout` (see ``Transactions.run``).
    """

    def __init__(self, transactions: Transactions) -> None:
        self.settings = transactions.settings
        self.events = transactions.events
        self.router = transactions.router
        self.dialect = transactions.dialect
        self.home = transactions.home
        # What the manager learnt of its customers lately, which every
        # job reads and updates (and tests set, to choose a way).
        self.hints = hints = Hints()
        self.grants = Grants(transactions, hints)
        self.queue = Queue(transactions, hints)
        self.hand_over = HandOver(transactions, hints)
        self.releases = Releases(transactions, hints, self.hand_over)
        self.renewals = Renewals(transactions)

    def after_fork(self) -> None:
        """In a forked child: the parent's connections and the reads of its
        threads are not the child's."""
        self.router.after_fork()
        self.queue.after_fork()

    def tables_missing(self, error: BackendError) -> bool:
        """Whether ``error`` says pathlock's tables are missing."""
        cause = error.cause
        return isinstance(cause, DBAPIError) and self.dialect.is_missing_table(cause)

    @property
    def hands_over(self) -> bool:
        """Whether releases may grant their paths to the head of the queue
        (see :meth:`Releases.release <pathlock._releasing.Releases.release>`):
        where a batch may carry its COMMIT."""
        return self.dialect.batches and may_commit(self.router.nodes[0].engine.dialect)
