"""Summaries of samples (seconds) and how the report spells them."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def percentile(samples: Sequence[float], fraction: float) -> float:
    """The nearest-rank percentile: the smallest sample that at least
    ``fraction`` of the samples are no greater than (``fraction`` 0.5: the
    lower median, 2 of [1, 2, 3, 4]; 0.99 of 100 samples: the 99th). NaN for
    no samples. The one percentile of every benchmark of the project."""
    if not samples:
        return math.nan
    if not 0 < fraction <= 1:
        raise ValueError(f"a percentile's fraction is in (0, 1], got {fraction}")
    ordered = sorted(samples)
    # The rank is ceil(fraction * n); the rounding guards against 0.29 * 100
    # coming out as 28.999999999999996 in binary floating point.
    rank = math.ceil(round(fraction * len(ordered), 9))
    return ordered[max(rank, 1) - 1]


def median(samples: Sequence[float]) -> float:
    """The median as every report says it: ``percentile(samples, 0.5)``, the
    lower median of an even number of samples (a sample, never an average of
    two). NaN for no samples."""
    return percentile(samples, 0.5)


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
