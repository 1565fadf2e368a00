"""Summaries of samples (seconds) and how the report spells them."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def percentile(samples: Sequence[float], fraction: float) -> float:
    """The nearest-rank percentile (``fraction`` 0.5 is the median); NaN
    for no samples."""
    if not samples:
        return math.nan
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def mean(samples: Sequence[float]) -> float:
    return statistics.fmean(samples) if samples else math.nan


def ms(seconds: float) -> str:
    """``1.234 ms``, ``56.7 ms``, ``1234 ms``: three significant digits or more."""
    if math.isnan(seconds):
        return "n/a"
    if math.isinf(seconds):
        return "∞"
    value = seconds * 1000
    if value < 10:  # noqa: PLR2004 - the number of decimals follows the magnitude
        return f"{value:.3f} ms"
    if value < 100:  # noqa: PLR2004
        return f"{value:.1f} ms"
    return f"{value:.0f} ms"


def count(number: int, noun: str) -> str:
    """``1 round``, ``2 rounds``."""
    return f"{number:,} {noun}" if number == 1 else f"{number:,} {noun}s"


def ratio(value: float, base: float) -> float:
    return value / base if base > 0 else math.inf


def times(value: float) -> str:
    """A ratio: ``2.17×``."""
    if math.isnan(value):
        return "n/a"
    return "∞" if math.isinf(value) else f"{value:.2f}×"
