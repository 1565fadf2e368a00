"""Hearing PostgreSQL's notices of hand-overs: one listening connection per
process and database, shared by every manager of the process that listens
(:meth:`pathlock.dialects.postgresql.PostgreSQL.listen`).

A release that hands paths to the request next in line sends, in its
transaction, ``pg_notify`` on :data:`CHANNEL` with ``"<customer id>
<ticket>"``: the listener of each process relays it to its managers, and the
one whose request holds that ticket wakes it. A notice is only a hint: a
request that misses one (the listener connecting, or gone) finds its paths at
its next check, as it does without notices.

Behind a pooler that hands each transaction another server session
(pgbouncer's transaction mode) a session's LISTEN is lost: the listener checks
that its session still listens, and gives up hearing (with a warning) when it
does not.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import URL

log = logging.getLogger("pathlock.store")

CHANNEL = "pathlock_hand_over"
"""The channel of the notices (a database's, whatever the schema)."""

POLL = 0.25
"""Seconds the listener waits for notices between looks at whether it must
stop."""

VERIFY_EVERY = 10.0
"""Seconds between the listener's checks that its session still listens."""

RETRY_FIRST = 0.5
RETRY_MAX = 30.0
"""Seconds before the listener connects again after losing its connection:
doubling from the first to the max."""

_LISTEN = f"LISTEN {CHANNEL}"
_STILL_LISTENING = f"SELECT '{CHANNEL}' = ANY(pg_listening_channels())"

Heard = Callable[[int, int], None]

_lock = threading.Lock()
# (pid, the database's URL) -> its listener, in this process.
_listeners: dict[tuple[int, str], _Listener] = {}


def _after_fork() -> None:
    """In a forked child: the parent's listeners are not the child's (their
    threads are not there), and a thread of the parent may have held the
    lock at the fork."""
    global _lock  # noqa: PLW0603 - the module's own, made anew
    _lock = threading.Lock()
    _listeners.clear()


os.register_at_fork(after_in_child=_after_fork)


def listening(url: URL, connect: Callable[[], Any], heard: Heard) -> Subscription:
    """Hear the notices of the database at ``url``: ``heard(customer_id,
    ticket)`` for each, on the listener's thread. ``connect()`` opens a
    psycopg connection to it, the listener's own (the first listener's, if
    this process listens there already)."""
    # One per database, whichever driver (the APIs') reaches it.
    where = url.set(drivername=url.get_backend_name())
    key = (os.getpid(), where.render_as_string(hide_password=False))
    with _lock:
        listener = _listeners.get(key)
        if listener is None or listener.stopped:
            listener = _listeners[key] = _Listener(connect, key)
        subscription = Subscription(listener, heard)
        listener.add(heard)
    return subscription


class Subscription:
    """One listener's hearing (:class:`pathlock.waiting.Hearing`)."""

    def __init__(self, listener: _Listener, heard: Heard) -> None:
        self._listener = listener
        self._heard = heard
        self._stopped = False

    @property
    def live(self) -> bool:
        return not self._stopped and self._listener.live

    def stop(self) -> None:
        if not self._stopped:
            self._stopped = True
            self._listener.remove(self._heard)


class _Listener:
    """The thread that listens on one connection and relays the notices."""

    def __init__(self, connect: Callable[[], Any], key: tuple[int, str]) -> None:
        self._connect = connect
        self._key = key
        self._heard: list[Heard] = []
        self._halt = threading.Event()
        self.live = False
        self.stopped = False
        self._thread: threading.Thread | None = None

    def add(self, heard: Heard) -> None:
        """(Under the module's lock.)"""
        self._heard = [*self._heard, heard]
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="pathlock-notices", daemon=True)
            self._thread.start()

    def remove(self, heard: Heard) -> None:
        with _lock:
            self._heard = [each for each in self._heard if each is not heard]
            if self._heard:
                return
            self.stopped = True
            if _listeners.get(self._key) is self:
                del _listeners[self._key]
        self._halt.set()

    def _run(self) -> None:
        delay = RETRY_FIRST
        while not self._halt.is_set():
            try:
                if self._listen():
                    return  # a pooler in between: no notices to hear
            except Exception as error:  # noqa: BLE001 - logged; the waits poll meanwhile
                if self.live:
                    delay = RETRY_FIRST  # it listened: a new outage
                log.info("hearing hand-overs: %s; connecting again in %g s", error, delay)
            finally:
                self.live = False
            if self._halt.wait(delay):
                return
            delay = min(delay * 2, RETRY_MAX)

    def _listen(self) -> bool:
        """Listen until told to stop or the connection fails; whether the
        session turned out not to be the connection's own."""
        connection = self._connect()
        try:
            connection.autocommit = True
            connection.execute(_LISTEN)
            self.live = True
            verified = time.monotonic()
            while not self._halt.is_set():
                for notice in connection.notifies(timeout=POLL):
                    self._relay(notice.payload)
                if time.monotonic() - verified >= VERIFY_EVERY:
                    row = connection.execute(_STILL_LISTENING).fetchone()
                    if not (row and row[0]):
                        log.warning(
                            "not hearing hand-overs on %s: the session that listened is not"
                            " this connection's any more (a pooler in transaction mode?);"
                            " waiting requests poll",
                            self._key[1].split("@")[-1],
                        )
                        return True
                    verified = time.monotonic()
            return False
        finally:
            connection.close()

    def _relay(self, payload: str) -> None:
        try:
            customer, ticket = (int(part) for part in payload.split())
        except ValueError:
            log.debug("hearing hand-overs: not a notice of pathlock's: %.100r", payload)
            return
        for heard in self._heard:
            try:
                heard(customer, ticket)
            except Exception:  # a listener's failure is not the others'
                log.exception("hearing hand-overs: relaying a notice failed")
