"""Renewals: held leases extended under their customers' sentinel rows,
skipping customers whose row another transaction holds where the server can;
and whether a lease is still held, by a plain read."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Connection

from pathlock._statements.leases import CLAIM_SENTINELS, HELD, LEASE_ALIVE, LOCK_SENTINELS, RENEW
from pathlock._transactions import Transactions


class Renewals:
    """A manager's renewals, run through ``transactions`` (see
    :class:`pathlock._store.Store`)."""

    def __init__(self, transactions: Transactions) -> None:
        self._tx = transactions
        self.dialect = transactions.dialect

    def renew(
        self,
        leases: Sequence[tuple[int, str, int]],
        ttl: float,
        *,
        wait: bool = True,
        deadline: float | None = None,
    ) -> tuple[set[str], set[int]]:
        """Extend ``leases`` ((customer id, lease id, row count) triples) to
        expire ``ttl`` seconds from now, database time. Returns the ids still
        held, and the customers skipped. A lease whose rows expired or were
        deleted is not renewed and not returned.

        With ``wait=False``, on servers that can skip locked rows (MariaDB
        10.6+, MySQL 8), a customer whose sentinel another transaction holds
        is skipped: its leases are neither renewed nor returned, and the
        others are renewed without waiting for it. Otherwise the renewal
        waits for every sentinel, and nothing is skipped; everything by the
        monotonic time ``deadline`` (see ``Transactions.run``)."""
        customers = sorted({customer_id for customer_id, _, _ in leases})

        def attempt(connection: Connection, _number: int) -> tuple[set[str], set[int]]:
            claimed = customers
            if not wait and self.dialect.skips_locked_rows(connection.dialect):
                claimed = list(connection.execute(CLAIM_SENTINELS, {"c_ids": customers}).scalars())
                if not claimed:
                    connection.rollback()
                    return set(), set(customers)
            connection.execute(LOCK_SENTINELS, {"c_ids": claimed})
            held = self._renew_rows(connection, leases, set(claimed), ttl)
            connection.commit()
            return held, set(customers).difference(claimed)

        # The manager groups leases by home node (routing.py): the first
        # customer's route is every customer's.
        return self._tx.run("renewing leases", attempt, customer_id=customers[0], deadline=deadline)

    @staticmethod
    def _renew_rows(
        connection: Connection,
        leases: Sequence[tuple[int, str, int]],
        customers: set[int],
        ttl: float,
    ) -> set[str]:
        """Extend the leases of ``customers`` (whose sentinels this
        transaction holds); return the ids still held."""
        lease_ids = [lease_id for customer_id, lease_id, _ in leases if customer_id in customers]
        expected = sum(rows for customer_id, _, rows in leases if customer_id in customers)
        renewed = connection.execute(
            RENEW, {"l_ids": lease_ids, "ttl_us": round(ttl * 1_000_000)}
        ).rowcount
        if renewed == expected:
            return set(lease_ids)
        # Some lease is gone: find out which.
        return set(connection.execute(HELD, {"l_ids": lease_ids}).scalars())

    def lease_alive(self, customer_id: int, lease_id: str, rows: int) -> bool:
        """Whether all ``rows`` rows of the lease exist and have not expired,
        by the database's clock (a plain read)."""
        parameters = {"c_id": customer_id, "l_id": lease_id}

        def attempt(connection: Connection, _number: int) -> bool:
            alive = connection.execute(LEASE_ALIVE, parameters).scalar_one()
            connection.rollback()
            return int(alive) == rows

        return self._tx.run(
            "asking whether a lease is held", attempt, read_only=True, customer_id=customer_id
        )
