"""The coordinator: start the cluster, spawn the client team, run each
variant in rounds and collect the figures, printing them as it goes."""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import queue
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from pathlock import PathLockManager, migrate

from .clients import worker_main
from .environment import cpu_times, describe_servers, homes
from .figures import SOLO_LABELS, Run, Solo, Variant, milliseconds
from .report import reading_solo
from .settings import (
    CLIENTS,
    CUSTOMERS,
    DRAIN_TIMEOUT,
    GALERA_DATABASE,
    HOT_CUSTOMER,
    ROUNDS,
    SETUP_TIMEOUT,
    SOLO_CUSTOMER,
    TIMEOUT,
    TTL,
    Command,
    Result,
)

if TYPE_CHECKING:
    from multiprocessing.context import SpawnContext, SpawnProcess
    from multiprocessing.queues import Queue

    from servers.galera_cluster import GaleraCluster

NO_CHECKOUT = (
    "run it from a checkout of the pathlock repository: the cluster benchmark starts "
    "its servers with servers/galera_cluster.py"
)


class NoClusterHarness(RuntimeError):
    """``servers.galera_cluster`` cannot be imported: pathlock is installed, not
    run from a checkout of its repository."""


def galera_cluster() -> type[GaleraCluster]:
    """The Galera harness of the repository (``servers/galera_cluster.py``). It
    is not part of the pathlock package, so it is imported here, when a run
    needs it, not when this package is imported."""
    try:
        from servers.galera_cluster import GaleraCluster  # noqa: PLC0415
    except ModuleNotFoundError as error:
        if error.name not in {"servers", "servers.galera_cluster"}:
            raise
        raise NoClusterHarness(NO_CHECKOUT) from error
    return GaleraCluster


def say(line: str = "") -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class Team:
    """The client processes, spawned once, and the barrier every round starts at."""

    def __init__(self, context: SpawnContext, urls: list[str], size: int) -> None:
        self.size = size
        self.cpu_busy = float("nan")
        self.barrier = context.Barrier(size + 1)
        self.results: Queue[Result] = context.Queue()
        self.commands: list[Queue[Command | None]] = [context.Queue() for _ in range(size)]
        self.processes: list[SpawnProcess] = [
            context.Process(
                target=worker_main,
                args=(index, urls, self.commands[index], self.results, self.barrier),
                name=f"bench-{index}",
                daemon=True,
            )
            for index in range(size)
        ]
        for process in self.processes:
            process.start()

    def run(self, commands: list[Command], seconds: float, *, window: bool = False) -> list[Result]:
        """Send client ``i`` ``commands[i]``, release them all at the barrier
        once all are ready, and return their results in client order. With
        ``window``, :attr:`cpu_busy` is how busy the machine's cores were over
        the ``seconds`` after the barrier."""
        for queue_, command in zip(self.commands, commands, strict=True):
            queue_.put(command)
        broken = False
        try:
            self.barrier.wait(SETUP_TIMEOUT)
        except threading.BrokenBarrierError:
            broken = True
        if window and not broken:
            before = cpu_times()
            time.sleep(seconds)
            after = cpu_times()
            total = after[1] - before[1]
            self.cpu_busy = (after[0] - before[0]) / total if total > 0 else float("nan")
        results: list[Result] = []
        limit = time.monotonic() + (SETUP_TIMEOUT if broken else seconds + DRAIN_TIMEOUT)
        while len(results) < self.size:
            try:
                results.append(self.results.get(timeout=max(0.1, limit - time.monotonic())))
            except queue.Empty:
                break
            if broken and "error" in results[-1]:
                break
        errors = [result["error"] for result in results if "error" in result]
        if errors or broken or len(results) < self.size:
            detail = "\n".join(errors) or "a client did not answer"
            raise RuntimeError(f"a benchmark client failed:\n{detail}")
        return sorted(results, key=lambda result: int(result["client"]))

    def close(self) -> None:
        for commands in self.commands:
            with contextlib.suppress(Exception):
                commands.put(None)
        for process in self.processes:
            process.join(30)
        for process in self.processes:
            if process.is_alive():
                process.terminate()  # only our own children, by handle
                process.join(5)


def run_rounds(
    team: Team,
    variants: list[Variant],
    kind: str,
    seconds: float,
    *,
    check: bool,
) -> None:
    """Every variant for ``seconds`` in all, in ``ROUNDS`` rounds, the order of
    the variants rotating from one round to the next."""
    per_round = seconds / ROUNDS
    for number in range(ROUNDS):
        shift = number % len(variants)
        for variant in variants[shift:] + variants[:shift]:
            command: Command = {
                "kind": kind,
                "affinity": variant.affinity,
                "same_order": variant.same_order,
                "seconds": per_round,
                "seed": number * 10 + variants.index(variant),
            }
            results = team.run([command] * team.size, per_round, window=True)
            before = variant.grants
            variant.add(results, per_round, check=check)
            variant.cpu.append(team.cpu_busy)
            grants = variant.grants - before
            say(
                f"  round {number + 1}, {variant.name}: {grants} grants in {per_round:g} s "
                f"({grants / per_round:.0f}/s), cores {team.cpu_busy:.0%} busy, last client done "
                f"{max(r['finished'] - r['deadline'] for r in results):.2f} s after the end"
            )


def uncontended(
    team: Team, urls: list[str], plain_url: str | None, options: argparse.Namespace
) -> dict[str, Any]:
    """Experiment 3 in client 0, the others idle; return client 0's figures."""
    variants = [("galera", urls[0], False), ("galera-nocausal", urls[0], True)]
    if plain_url:
        variants.insert(0, ("plain", plain_url, False))
    command: Command = {
        "kind": "solo",
        "variants": variants,
        "rounds": options.solo_rounds,
        "per_round": options.solo_count // options.solo_rounds,
    }
    idle: Command = {"kind": "idle"}
    results = team.run([command] + [idle] * (CLIENTS - 1), 120.0)
    solo: dict[str, Any] = results[0]["solo"]
    return solo


def experiments(
    run: Run, urls: list[str], plain_url: str | None, options: argparse.Namespace
) -> None:
    team = Team(multiprocessing.get_context("spawn"), urls, CLIENTS)
    try:
        say(f"1. hot path, {options.seconds:g} s per variant")
        run_rounds(team, run.hot, "hot", options.seconds, check=True)
        for variant in run.hot:
            say(f"  {variant.summary()}, {variant.overlaps} overlapping holds")
        say(f"2. many customers, {options.seconds:g} s per variant")
        run_rounds(team, run.many, "many", options.seconds, check=False)
        for variant in run.many:
            say(f"  {variant.summary()}")
        say(f"3. uncontended latency, {options.solo_count} samples per variant")
        result = uncontended(team, urls, plain_url, options)
    finally:
        team.close()
    run.solo = solo = Solo(result, SOLO_LABELS)
    for name, label in SOLO_LABELS.items():
        if name in solo.samples:
            say(
                f"  {label}: p50 {milliseconds(solo.p(name, 0.5))}, "
                f"p99 {milliseconds(solo.p(name, 0.99))} "
                f"(wsrep_sync_wait {solo.sync_wait.get(name)})"
            )
    say(f"  {reading_solo(solo)}")


def on_cluster(run: Run, plain_url: str | None, options: argparse.Namespace) -> None:
    """Start the cluster, prepare its database, run the experiments, stop it."""
    with galera_cluster()() as cluster:
        say("starting a 3-node Galera cluster ...")
        run.cluster_start = cluster.start()
        say(f"cluster synced in {run.cluster_start:.1f} s")
        cluster.nodes[0].execute(f"CREATE DATABASE {GALERA_DATABASE}")
        urls = cluster.urls(GALERA_DATABASE)
        migrate.upgrade(urls[0])
        run.environment = describe_servers(urls[0], plain_url, run.cluster_start)
        # Every customer's sentinel row exists before the rounds start.
        with PathLockManager(urls[0], node_id="bench-setup", ttl=TTL) as setup:
            for customer in (HOT_CUSTOMER, SOLO_CUSTOMER, *CUSTOMERS):
                setup.for_customer(customer).lock_paths("/setup", timeout=TIMEOUT).release()
        counts = homes(urls, CUSTOMERS)
        run.homes = (
            f"With affinity its home is {next(iter(homes(urls, [HOT_CUSTOMER])))}",
            f"With affinity the {len(CUSTOMERS)} customers' homes are "
            + ", ".join(f"{node}: {counts[node]}" for node in sorted(counts)),
        )
        say(f"customer {HOT_CUSTOMER}: {run.homes[0]}; {run.homes[1]}")
        experiments(run, urls, plain_url, options)
        say("stopping the cluster ...")
