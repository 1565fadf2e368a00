"""Which database node an operation runs on, when there are several.

A manager may be given the nodes of one multi-master cluster (MariaDB Galera)
instead of one server. Every node holds the same tables, so any node can serve
any operation; what changes is only speed and the errors a node gives while it
is gone:

- **Order.** Without affinity every operation goes to the first healthy node in
  the order given: app servers that list the nodes in the same order write
  through one node, whose conflicts are ordinary row-lock waits. With
  ``affinity``, each customer has a home node of its own, chosen by rendezvous
  hashing of the customer id over the nodes' addresses: customers spread over
  the nodes, a customer's conflicts stay on one node (no certification
  aborts between its app servers), and when a node is down only its customers
  move, each to its own second choice, the same one on every app server.
- **Failover.** A node that fails an operation with a lost connection or a
  cluster error (it left the primary component: 1047, 1180) is set aside for
  ``set_aside`` seconds (5); the operation is retried at once on the next
  node. A node that only let an attempt time out is set aside only if it does
  not answer a ping either (see ``Transactions._failed_over``): the attempt
  may just have waited for a row lock. Set-aside nodes are tried again when
  that time has passed, so traffic goes back to a node that rejoined. When
  every node is set aside, they are tried in the usual order anyway.

None of this is about safety: a grant through any node writes the customer's
sentinel row, and the cluster's certification aborts the one of two
conflicting transactions that came second, wherever they ran.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from sqlalchemy import Engine

from pathlock import dialects, events
from pathlock._settling import Expiring
from pathlock.dialects import Dialect
from pathlock.dialects.base import ServerSession


@dataclass(eq=False)
class Node:
    """One database server (an engine on it) and its health as seen here."""

    engine: Engine
    name: str
    """host:port/database: the node's identity for affinity and in messages."""
    dialect: Dialect
    set_aside_until: float = field(default=0.0)
    dropped: Expiring[ServerSession] = field(default_factory=Expiring)
    """The server sessions of connections dropped in the middle of an
    operation: the server may still run what was sent on them (see
    :func:`pathlock._transactions.attempt_once`)."""


def node_name(engine: Engine) -> str:
    """The address of a node, without user or password: the same on every app
    server that spells the node's address the same way (affinity depends on it)."""
    url = engine.url
    socket = url.query.get("unix_socket")
    host = url.host or (f"unix:{socket}" if isinstance(socket, str) else "localhost")
    port = f":{url.port}" if url.port else ""
    return f"{host}{port}/{url.database or ''}"


class Router:
    """The nodes of a manager, in the order operations should try them."""

    def __init__(
        self,
        engines: Sequence[Engine],
        *,
        affinity: bool = False,
        set_aside: float = 5.0,
        emitter: events.Emitter = events.SILENT,
    ) -> None:
        self.nodes = tuple(
            Node(engine, node_name(engine), dialects.for_name(engine.dialect.name))
            for engine in engines
        )
        self.spares = len(self.nodes) - 1
        """How many nodes an operation may try after the first one fails."""
        self.affinity = affinity
        self.events = emitter
        self.set_aside_time = set_aside
        """Seconds a failed node is skipped before it is tried again."""
        self._lock = threading.Lock()

    def after_fork(self) -> None:
        """In a forked child: a lock another thread of the parent held at the
        fork would stay held for ever. The sessions the parent dropped are
        the parent's to end."""
        self._lock = threading.Lock()
        for node in self.nodes:
            node.dropped = Expiring()

    def order(self, customer_id: int | None) -> list[Node]:
        """Every node, best first, for an operation on ``customer_id`` (``None``:
        an operation on all customers, such as a listing or the reaper)."""
        if not self.affinity or customer_id is None or len(self.nodes) == 1:
            return list(self.nodes)
        return sorted(self.nodes, key=lambda node: _weight(node.name, customer_id), reverse=True)

    def pick(self, customer_id: int | None, avoid: Sequence[Node] = ()) -> Node:
        """The first node in :meth:`order` that is neither set aside nor in
        ``avoid`` (nodes that already failed this operation); failing that, the
        first one not in ``avoid``; failing that, the first one."""
        if not self.spares:  # (without order(): in every attempt)
            return self.nodes[0]
        candidates = self.order(customer_id)
        if len(candidates) == 1:
            return candidates[0]
        now = time.monotonic()
        with self._lock:
            for node in candidates:
                if node not in avoid and node.set_aside_until <= now:
                    return node
        for node in candidates:
            if node not in avoid:
                return node
        return candidates[0]

    def set_aside(self, node: Node, error: BaseException) -> None:
        """``node`` failed with ``error``: skip it for ``set_aside_time`` seconds
        and drop its pooled connections (they are broken or lead to a node that
        left the cluster)."""
        if len(self.nodes) == 1:
            return
        with self._lock:
            fresh = node.set_aside_until <= time.monotonic()
            node.set_aside_until = time.monotonic() + self.set_aside_time
        if fresh:
            self.events.failed_over(
                events.FailedOver(
                    node.name, str(getattr(error, "orig", error)), self.set_aside_time
                )
            )
        node.engine.dispose()


def _weight(name: str, customer_id: int) -> int:
    """Rendezvous (highest random weight) hashing: every app server computes
    the same weights from the same names, whatever order it lists them in."""
    digest = hashlib.blake2b(f"{name}\0{customer_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")
