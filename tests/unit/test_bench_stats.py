"""The benchmarks' one percentile: nearest rank, the same everywhere."""

from __future__ import annotations

import math

import pytest

from pathlock.bench.stats import mean, median, percentile


@pytest.mark.parametrize(
    ("samples", "fraction", "expected"),
    [
        ([1, 2, 3, 4], 0.5, 2),  # the lower median
        ([1, 2, 3], 0.5, 2),
        ([4, 1, 3, 2], 1.0, 4),  # order does not matter
        ([7], 0.01, 7),
        (list(range(1, 101)), 0.99, 99),
        (list(range(1, 101)), 0.29, 29),  # 0.29 * 100 is 28.999... in floating point
        (list(range(1, 11)), 0.95, 10),
        (list(range(1, 11)), 0.9, 9),
    ],
)
def test_nearest_rank(samples: list[float], fraction: float, expected: float) -> None:
    assert percentile(samples, fraction) == expected


def test_no_samples_is_nan_and_a_fraction_outside_0_1_is_refused() -> None:
    assert math.isnan(percentile([], 0.5))
    for fraction in (0.0, 1.5, -0.1):
        with pytest.raises(ValueError, match="fraction"):
            percentile([1.0], fraction)


def test_median_is_the_lower_median_and_mean_is_nan_for_no_samples() -> None:
    # One median for every benchmark: a sample (the 0.5 percentile), never
    # the average of the two middle ones.
    assert median([4, 1, 3, 2]) == 2
    assert median([3, 1, 2]) == 2
    assert median([1.0, math.inf, math.inf]) == math.inf  # "not granted" counts as longest
    assert math.isnan(median([]))
    assert mean([1.0, 2.0]) == 1.5
    assert math.isnan(mean([]))
