"""Summary statistics of timed calls and geometric means."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from pytest_kscientist.results import TimingStats


def summarize(times_us: Sequence[float], verified_runs: int = 0, clock: str = "") -> TimingStats:
    """Mean, median, min, max, std and standard error of the mean of ``times_us`` (kept too)."""
    n = len(times_us)
    if n == 0:
        raise ValueError("summarize() needs at least one timed call, got none")
    std = statistics.stdev(times_us) if n > 1 else 0.0
    return TimingStats(
        mean_us=statistics.fmean(times_us),
        median_us=statistics.median(times_us),
        min_us=min(times_us),
        max_us=max(times_us),
        std_us=std,
        stderr_us=std / math.sqrt(n),
        runs=n,
        verified_runs=verified_runs,
        clock=clock,
        samples_us=list(times_us),
    )


def geomean(values: Sequence[float]) -> float:
    """Geometric mean of positive values."""
    if not values or any(v <= 0 for v in values):
        raise ValueError(f"geomean() needs positive values, got {list(values)!r}")
    return math.exp(sum(math.log(v) for v in values) / len(values))
