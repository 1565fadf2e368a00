"""Does a Galera node commit a transaction it answered 1213 to?

The measurement behind "A COMMIT answered with 1213 that lands anyway" in
docs/CLUSTER.md. On a private 3-node cluster (:mod:`servers.galera_cluster`),
8 clients (each listing the nodes from a different one, moving on when a node
fails) run transactions in a loop::

    UPDATE s SET v = LAST_INSERT_ID(v + 1) WHERE id = 1;
    INSERT INTO g (token, attempt) VALUES (LAST_INSERT_ID(), <attempt id>);
    SELECT LAST_INSERT_ID();
    COMMIT

half of them with the statements and the COMMIT in one query (the
multi-statement protocol, as pathlock's batches), half one by one. Meanwhile
node 3 is cut off (``gmcast.isolate``) until evicted, and reconnected until
synced, ``--cycles`` times. Then the log table ``g`` says which transactions
committed: one whose client got an error (1213 to its COMMIT) but whose row is
there committed all the same, and a token in ``g`` twice means two committed
transactions wrote ``v`` from the same value, unchecked against each other.

    python -m servers.galera_commit_probe [--cycles 6]

Prints one line per way of sending the COMMIT: transactions, COMMITs answered
with an error, and of those the ones committed all the same.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import pymysql
from pymysql.constants import CLIENT

from servers import galera_cluster

CLIENTS = 8
LOST_CONNECTION = frozenset({2006, 2013, 2014, 2055})
MOVE_ON = frozenset({1047, 2003}) | LOST_CONNECTION


@dataclass(frozen=True, slots=True)
class Outcome:
    attempt: str
    batched: bool
    node: int
    step: str  # "ok", or where the error came: "statement" or "commit"
    code: int


class Probe:
    def __init__(self, ports: Sequence[int]) -> None:
        self.ports = list(ports)
        self.outcomes: list[Outcome] = []
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self._numbers = itertools.count()

    def connect(self, port: int) -> pymysql.connections.Connection:
        return pymysql.connect(
            host="127.0.0.1",
            port=port,
            user="root",
            password="",
            database="probe",
            client_flag=CLIENT.MULTI_STATEMENTS,
            autocommit=False,
            read_timeout=30,
            write_timeout=30,
            connect_timeout=3,
        )

    def client(self, first: int, batched: bool) -> None:
        order = self.ports[first:] + self.ports[:first]
        index = 0
        connection = None
        while not self.stop.is_set():
            node = index % len(order)
            try:
                if connection is None:
                    connection = self.connect(order[node])
            except pymysql.err.MySQLError:
                index += 1
                time.sleep(0.05)
                continue
            attempt = f"{first}-{int(batched)}-{next(self._numbers)}"
            step, code = "statement", 0
            try:
                self.run(connection, attempt, batched)
                step = "ok"
            except _Committing as reached:
                step, code = "commit", reached.code
            except pymysql.err.MySQLError as error:
                code = int(error.args[0])
            with self._lock:
                self.outcomes.append(
                    Outcome(attempt, batched, self.ports.index(order[node]), step, code)
                )
            if step != "ok":
                with contextlib.suppress(pymysql.err.Error):
                    connection.close()
                connection = None
                if code in MOVE_ON:
                    index += 1

    @staticmethod
    def run(connection: pymysql.connections.Connection, attempt: str, batched: bool) -> None:
        cursor = connection.cursor()
        if batched:
            cursor.execute(
                "BEGIN; UPDATE s SET v = LAST_INSERT_ID(v + 1) WHERE id = 1; "
                "INSERT INTO g (token, attempt) VALUES (LAST_INSERT_ID(), %s); COMMIT",
                (attempt,),
            )
            cursor.nextset()
            cursor.nextset()
            try:
                cursor.nextset()  # the COMMIT's reply
            except pymysql.err.MySQLError as error:
                raise _Committing(int(error.args[0])) from error
            return
        cursor.execute("BEGIN")
        cursor.execute("UPDATE s SET v = LAST_INSERT_ID(v + 1) WHERE id = 1")
        cursor.execute("INSERT INTO g (token, attempt) VALUES (LAST_INSERT_ID(), %s)", (attempt,))
        try:
            connection.commit()
        except pymysql.err.MySQLError as error:
            raise _Committing(int(error.args[0])) from error


class _Committing(Exception):
    """The COMMIT itself was answered with an error (``code``)."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def _set_up(port: int) -> None:
    connection = pymysql.connect(host="127.0.0.1", port=port, user="root", autocommit=True)
    with connection.cursor() as cursor:
        cursor.execute("CREATE DATABASE probe")
        cursor.execute("CREATE TABLE probe.s (id INT PRIMARY KEY, v BIGINT NOT NULL)")
        cursor.execute(
            "CREATE TABLE probe.g (n BIGINT AUTO_INCREMENT PRIMARY KEY, token BIGINT NOT NULL,"
            " attempt VARCHAR(40) NOT NULL)"
        )
        cursor.execute("INSERT INTO probe.s VALUES (1, 0)")
    connection.close()


def _committed(port: int) -> list[tuple[int, str]]:
    connection = pymysql.connect(host="127.0.0.1", port=port, user="root", database="probe")
    with connection.cursor() as cursor:
        cursor.execute("SELECT token, attempt FROM g")
        rows = [(int(token), str(attempt)) for token, attempt in cursor.fetchall()]
    connection.close()
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m servers.galera_commit_probe")
    parser.add_argument("--cycles", type=int, default=6, help="cut-offs of node 3 (default 6)")
    arguments = parser.parse_args(argv)
    reason = galera_cluster.missing()
    if reason is not None:
        print(reason, file=sys.stderr)
        return 1
    with galera_cluster.GaleraCluster() as cluster:
        cluster.start()
        ports = [node.port for node in cluster.nodes]
        _set_up(ports[0])
        time.sleep(1)
        probe = Probe(ports)
        clients = [
            threading.Thread(target=probe.client, args=(number % 3, number % 2 == 0), daemon=True)
            for number in range(CLIENTS)
        ]
        for thread in clients:
            thread.start()
        for _cycle in range(arguments.cycles):
            time.sleep(3)
            cluster.isolate(2)
            cluster.wait_non_primary(2, timeout=60)
            time.sleep(4)
            cluster.isolate(2, isolated=False)
            cluster.wait_all_synced(60)
        time.sleep(2)
        probe.stop.set()
        for thread in clients:
            thread.join(60)
        time.sleep(2)
        rows = _committed(ports[0])
    committed = {attempt for _, attempt in rows}
    tokens = Counter(token for token, _ in rows)
    print(f"{len(rows)} transactions committed, {arguments.cycles} cut-offs of node 3")
    for batched in (True, False):
        mine = [outcome for outcome in probe.outcomes if outcome.batched == batched]
        refused = [outcome for outcome in mine if outcome.step == "commit"]
        landed = [outcome for outcome in refused if outcome.attempt in committed]
        how = "COMMIT at the end of one query" if batched else "COMMIT on its own"
        print(
            f"{how}: {len(mine)} transactions, {len(refused)} COMMITs answered with an error "
            f"({dict(Counter(outcome.code for outcome in refused))}), "
            f"{len(landed)} of them committed all the same"
        )
    twice = {token: count for token, count in tokens.items() if count > 1}
    print(f"tokens committed more than once: {twice or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
