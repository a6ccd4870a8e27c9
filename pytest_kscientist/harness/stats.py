"""Summary statistics of timed calls, intervals of medians and of ratios, geometric means."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from pytest_kscientist.harness.results import TimingStats

Z95 = 1.96


def summarize(times_us: Sequence[float], verified_runs: int = 0, clock: str = "",
              counted_us: float = 0.0) -> TimingStats:
    """Mean, median (with its 95% interval), min, max, std and standard error of ``times_us``."""
    n = len(times_us)
    if n == 0:
        raise ValueError("summarize() needs at least one timed call, got none")
    std = statistics.stdev(times_us) if n > 1 else 0.0
    low, high = median_interval(times_us)
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
        ci_low_us=low,
        ci_high_us=high,
        counted_outside_us=counted_us,
        samples_us=list(times_us),
    )


def median_interval(times: Sequence[float]) -> tuple[float, float]:
    """A distribution-free ~95% interval of the median: order statistics n/2 -+ 0.98 sqrt(n).

    Assumes only independent calls from one distribution; below 6 calls it is the whole range.
    """
    ordered = sorted(times)
    n = len(ordered)
    if n == 0:
        raise ValueError("median_interval() needs at least one value, got none")
    if n < 6:
        return ordered[0], ordered[-1]
    half = Z95 * math.sqrt(n) / 2
    low = max(math.floor(n / 2 - half), 0)
    high = min(math.ceil(n / 2 + half), n - 1)
    return ordered[low], ordered[high]


def ratio_interval(num: TimingStats, den: TimingStats) -> tuple[float, float] | None:
    """A conservative interval of num.median / den.median from both medians' intervals."""
    bounds = (num.ci_low_us, num.ci_high_us, den.ci_low_us, den.ci_high_us)
    if any(b is None or b <= 0 for b in bounds):
        return None
    num_low, num_high, den_low, den_high = bounds
    return num_low / den_high, num_high / den_low  # type: ignore[operator]


# Student's t, two-sided 95%, by degrees of freedom (1-10); beyond 10, 2.2 down to Z95.
T95 = (12.71, 4.30, 3.18, 2.78, 2.57, 2.45, 2.36, 2.31, 2.26, 2.23)


def t95(freedom: int) -> float:
    """Student's t, two-sided 95%, for ``freedom`` degrees of freedom (1-10 exact; beyond, a
    line from 2.2 down to Z95)."""
    if freedom < 1:
        raise ValueError(f"t95() needs at least one degree of freedom, got {freedom}")
    return T95[freedom - 1] if freedom <= len(T95) else max(Z95, 2.2 - (freedom - 10) * 0.01)


def spread_interval(ratios: Sequence[float]) -> tuple[float, float] | None:
    """A 95% interval of the geometric mean of per-round ratios from their spread (Student's t
    on the logs): how far the rounds disagree, which one round's own interval cannot show.
    None below two rounds."""
    n = len(ratios)
    if n < 2 or any(r <= 0 for r in ratios):
        return None
    logs = [math.log(r) for r in ratios]
    centre = statistics.fmean(logs)
    half = t95(n - 1) * statistics.stdev(logs) / math.sqrt(n)
    return math.exp(centre - half), math.exp(centre + half)


def rounds_centre(ratios: Sequence[float]) -> float:
    """The centre of per-round ratios: their median on the log scale (up to two rounds, their
    geometric mean). A round in which one side alone was slowed for its whole turn (a burst of
    the machine's own work, seen on the 2-core CPU as one round of four at 0.69 while the
    others read 0.99-1.01) moves it little; a kernel that is slower in every round moves it
    fully."""
    if not ratios or any(r <= 0 for r in ratios):
        raise ValueError(f"rounds_centre() needs positive ratios, got {list(ratios)!r}")
    return math.exp(statistics.median(math.log(r) for r in ratios))


def geomean(values: Sequence[float]) -> float:
    """Geometric mean of positive values."""
    if not values or any(v <= 0 for v in values):
        raise ValueError(f"geomean() needs positive values, got {list(values)!r}")
    return math.exp(sum(math.log(v) for v in values) / len(values))
