"""The queue pool of the engines pathlock creates (``pathlock._deadlines``)
takes an idle connection and gives one back without the queue's conditions:
it must hand out and keep connections exactly as SQLAlchemy's QueuePool does
(order, size, overflow), and a checkout waiting for a connection must still
be woken by one given back."""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

import pytest
from sqlalchemy.pool import QueuePool

from pathlock import _deadlines as deadlines


class _Connection:
    """A DB-API connection that does nothing, numbered in creation order."""

    numbers = itertools.count()

    def __init__(self) -> None:
        self.number = next(self.numbers)
        self.closed = False

    def rollback(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def _pool(cls: type[QueuePool], **options: Any) -> QueuePool:
    return cls(_Connection, reset_on_return=None, **options)


def _script(pool: QueuePool) -> list[Any]:
    """Check out and in, over and beyond the pool's size: which connection
    each checkout got (by creation order, relative), and which were closed."""
    base = None
    seen: list[Any] = []
    out = [pool.connect() for _ in range(3)]  # 2 pooled, 1 overflow
    for fairy in out:
        number = fairy.dbapi_connection.number
        base = number if base is None else base
        seen.append(number - base)
    raws = [fairy.dbapi_connection for fairy in out]
    for fairy in reversed(out):
        fairy.close()  # the overflow's goes: the pool holds 2
    seen.append([raw.closed for raw in raws])
    again = [pool.connect() for _ in range(2)]
    seen.append([fairy.dbapi_connection.number - base for fairy in again])  # type: ignore[operator]
    for fairy in again:
        fairy.close()
    seen.append((pool.checkedin(), pool.checkedout(), pool.overflow()))
    return seen


@pytest.mark.parametrize("lifo", [False, True])
def test_connections_come_and_go_as_in_sqlalchemys_pool(lifo: bool) -> None:
    bounded = deadlines.bounded_pool(QueuePool)
    assert bounded is not QueuePool
    options = {"pool_size": 2, "max_overflow": 1, "timeout": 1.0, "use_lifo": lifo}
    assert _script(_pool(bounded, **options)) == _script(_pool(QueuePool, **options))


def test_a_checkout_waiting_for_a_connection_gets_the_one_given_back() -> None:
    pool = _pool(deadlines.bounded_pool(QueuePool), pool_size=1, max_overflow=0, timeout=10.0)
    held = pool.connect()
    raw = held.dbapi_connection
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(pool.connect()))
    waiter.start()
    time.sleep(0.2)  # the waiter waits on the pool's condition by now
    assert not got
    held.close()
    waiter.join(5.0)  # woken by the close, not by its own timeout (10 s)
    assert got
    assert got[0].dbapi_connection is raw
    got[0].close()
