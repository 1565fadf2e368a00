"""The command line: ``python -m pathlock.bench.cluster`` (see the package's docstring)."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from .environment import busy_over, describe_machine, plain_database
from .experiments import NoClusterHarness, galera_cluster, on_cluster, say
from .figures import Run
from .report import write_report
from .settings import (
    CLIENTS,
    DEFAULT_OUTPUT,
    HOLD,
    PLAIN_DATABASE,
    PLAIN_SERVER,
    ROUNDS,
    SOLO_WARMUP,
    TIMEOUT,
    TTL,
)


def arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m pathlock.bench.cluster",
        description="pathlock on a private 3-node Galera cluster: affinity, fairness, latency.",
    )
    parser.add_argument(
        "--seconds",
        type=float,
        default=None,
        help="seconds per variant in experiments 1 and 2, over all its rounds "
        "(default 15; 4 with --quick)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="a short smoke run (figures mean little)"
    )
    parser.add_argument(
        "--plain-server",
        default=PLAIN_SERVER,
        help=f"the plain MariaDB of experiment 3 (default {PLAIN_SERVER}); the benchmark "
        f"creates and drops its own database {PLAIN_DATABASE} there",
    )
    output = parser.add_mutually_exclusive_group()
    output.add_argument(
        "--output",
        type=Path,
        default=DEFAULT_OUTPUT,
        help=f"the report's path (default {DEFAULT_OUTPUT}, from the current directory)",
    )
    output.add_argument("--no-report", action="store_true", help="print the figures only")
    options = parser.parse_args(argv)
    if options.seconds is None:
        options.seconds = 4.0 if options.quick else 15.0
    if options.seconds <= 0:
        parser.error("--seconds must be positive")
    options.solo_count = 200 if options.quick else 500
    options.solo_rounds = 4 if options.quick else 5
    return options


def describe_settings(options: argparse.Namespace) -> list[tuple[str, str]]:
    """The report's list of settings."""
    return [
        (
            "experiments 1 and 2",
            f"{options.seconds:g} s per variant in {ROUNDS} rounds of "
            f"{options.seconds / ROUNDS:g} s, the variants alternating; {CLIENTS} clients; "
            f"hold {HOLD * 1000:g} ms; timeout {TIMEOUT:g} s; ttl {TTL:g} s",
        ),
        (
            "experiment 3",
            f"{options.solo_count} acquire + release per variant in {options.solo_rounds} "
            f"rounds (the order rotating), after {SOLO_WARMUP} warm-up ones",
        ),
        ("mode", "--quick (a smoke test)" if options.quick else "full"),
    ]


def measure(run: Run, options: argparse.Namespace) -> None:
    """Make this benchmark's database on the plain server (the rest runs
    without it), run everything on the cluster, drop the database."""
    plain_url: str | None = None
    try:
        plain_url = plain_database(options.plain_server, create=True)
    except Exception as error:  # noqa: BLE001 - the rest runs without it
        run.solo_note = f"The plain server was not measured: {str(error).splitlines()[0]}"
        say(run.solo_note)
    try:
        on_cluster(run, plain_url, options)
    finally:
        if plain_url:
            with contextlib.suppress(Exception):
                plain_database(options.plain_server, create=False)


def main(argv: Sequence[str] | None = None) -> int:
    options = arguments(argv)
    try:
        galera_cluster()  # before anything is measured or created
    except NoClusterHarness as error:
        sys.stderr.write(f"python -m pathlock.bench.cluster: {error}\n")
        return 2
    began = time.monotonic()
    started = datetime.now(UTC)
    load = os.getloadavg()
    run = Run()
    run.busy_before = busy_over(1.0)
    say(
        f"pathlock cluster benchmark, {started:%Y-%m-%d %H:%M} UTC, load {load[0]:.2f}, "
        f"cores {run.busy_before:.0%} busy"
    )
    measure(run, options)
    elapsed = time.monotonic() - began
    say(f"done in {elapsed:.0f} s")
    if options.no_report:
        return 0
    write_report(
        options.output,
        started=started,
        elapsed=elapsed,
        settings=describe_settings(options),
        environment=[*describe_machine(load, run.busy_before), *run.environment],
        run=run,
    )
    say(f"report written to {options.output}")
    return 0


# Spawned workers import pathlock.bench.cluster.clients, never this module
# (multiprocessing does not re-run a main module named *.__main__), but the
# guard keeps an import of it from starting a run.
if __name__ == "__main__":
    sys.exit(main())
