"""The machine and the servers a run uses: CPU time, memory, versions, the
plain server's database, and which node is each customer's home."""

from __future__ import annotations

import os
import platform
import time
from collections import Counter
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

import pymysql
from sqlalchemy import create_engine, make_url, text

from pathlock import migrate
from pathlock._routing import Router

from .settings import PLAIN_DATABASE


def cpu_times() -> tuple[int, int]:
    """(busy, total) time of all the machine's cores so far, in ticks (Linux)."""
    try:
        with Path("/proc/stat").open(encoding="ascii") as stat:
            fields = [int(value) for value in stat.readline().split()[1:9]]
    except (OSError, ValueError):
        return (0, 0)
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields) - idle, sum(fields))


def busy_over(seconds: float) -> float:
    """How busy the machine's cores are over the next ``seconds``, 0 to 1."""
    before = cpu_times()
    time.sleep(seconds)
    after = cpu_times()
    return (after[0] - before[0]) / max(1, after[1] - before[1])


def server_facts(url: str) -> dict[str, str]:
    where = make_url(url)
    connection = pymysql.connect(
        host=where.host or "127.0.0.1",
        port=where.port or 3306,
        user=where.username or "root",
        password=where.password or "",
        connect_timeout=5,
    )
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT VERSION(), @@innodb_flush_log_at_trx_commit, @@global.wsrep_sync_wait"
            )
            version, flush, sync_wait = cursor.fetchone()
            cursor.execute("SHOW GLOBAL STATUS LIKE 'wsrep_provider_version'")
            provider = cursor.fetchone()
    finally:
        connection.close()
    return {
        "version": str(version),
        "flush": str(flush),
        "sync_wait": str(sync_wait),
        "provider": str(provider[1]) if provider else "",
    }


def describe_servers(
    galera_url: str, plain_url: str | None, cluster_start: float
) -> list[tuple[str, str]]:
    """The report's rows on the Galera cluster and the plain server."""
    galera = server_facts(galera_url)
    plain = server_facts(plain_url) if plain_url else None
    return [
        (
            "Galera cluster",
            f"3 nodes on 127.0.0.1, {galera['version']}, Galera {galera['provider']}, "
            f"innodb_flush_log_at_trx_commit {galera['flush']}, global wsrep_sync_wait "
            f"{galera['sync_wait']}; started and synced in {cluster_start:.1f} s",
        ),
        (
            "plain server",
            f"{plain['version']} at 127.0.0.1:3306, innodb_flush_log_at_trx_commit {plain['flush']}"
            if plain
            else "not measured",
        ),
    ]


def memory() -> str:
    try:
        with Path("/proc/meminfo").open(encoding="ascii") as info:
            for line in info:
                if line.startswith("MemTotal:"):
                    return f"{int(line.split()[1]) / 2**20:.1f} GiB RAM"
    except (OSError, ValueError):
        pass
    return "unknown RAM"


def version_of(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "not installed"


def describe_machine(load: tuple[float, float, float], busy_before: float) -> list[tuple[str, str]]:
    """The report's rows on the machine, its load at the start and the software."""
    return [
        ("machine", f"{os.cpu_count()} cores, {memory()}, {platform.platform()}"),
        (
            "at the start",
            f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; cores "
            f"{busy_before:.0%} busy in the second before the cluster started",
        ),
        ("Python", f"{platform.python_implementation()} {platform.python_version()}"),
        ("SQLAlchemy", version_of("SQLAlchemy")),
        ("PyMySQL", version_of("PyMySQL")),
        ("pathlock", version_of("pathlock")),
    ]


def plain_database(server: str, *, create: bool) -> str:
    """(Re)create, or drop, this benchmark's database on the plain server;
    return its URL."""
    where = make_url(server)
    admin = create_engine(where.set(database=""), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            connection.execute(text(f"DROP DATABASE IF EXISTS {PLAIN_DATABASE}"))
            if create:
                connection.execute(text(f"CREATE DATABASE {PLAIN_DATABASE}"))
    finally:
        admin.dispose()
    url = where.set(database=PLAIN_DATABASE).render_as_string(hide_password=False)
    if create:
        migrate.upgrade(url)
    return url


def homes(urls: list[str], customers: Sequence[int]) -> Counter[str]:
    """How many of ``customers`` have each node as their home with affinity."""
    engines = [create_engine(url) for url in urls]  # no connection is opened
    try:
        router = Router(engines, affinity=True)
        names = {router.nodes[number].name: f"node {number + 1}" for number in range(len(urls))}
        return Counter(names[router.order(customer)[0].name] for customer in customers)
    finally:
        for engine in engines:
            engine.dispose()
