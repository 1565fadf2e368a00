"""What every experiment gets: the settings, the parent's own connections and
manager, the team of worker processes, and fresh customers."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TypeVar

from sqlalchemy import Engine

from pathlock import PathLockManager
from pathlock.bench.database import Server, customers_of
from pathlock.bench.settings import Settings
from pathlock.bench.team import Team

T = TypeVar("T")


@dataclass(slots=True)
class Bench:
    url: str
    settings: Settings
    engine: Engine
    """READ COMMITTED, for the naive algorithm, the floor's table and the bulk rows."""
    manager: PathLockManager
    """The parent's own manager (default settings), for single-process figures."""
    server: Server
    say: Callable[[str], None]
    """Progress for the reader, one line at a time."""
    workers: int
    """How many worker processes the selected experiments need."""
    _team: Team | None = field(default=None)

    def team(self) -> Team:
        """The worker processes, started on first use."""
        if self._team is None:
            self.say(f"starting {self.workers} worker processes")
            self._team = Team(self.url, self.workers)
        return self._team

    def customers(self, count: int) -> AbstractContextManager[range]:
        """Fresh customer ids; their rows are deleted when the block ends."""
        return customers_of(self.engine, count)

    def close(self) -> None:
        if self._team is not None:
            self._team.close()
            self._team = None


def alternate(rounds: int, *kinds: T) -> Iterator[tuple[int, T]]:
    """(round, kind) for every round and kind, the kinds' order reversed on
    every other round, so neither always runs first (after a pause, in a warm
    cache, ...)."""
    for number in range(rounds):
        for kind in kinds if number % 2 == 0 else reversed(kinds):
            yield number, kind
