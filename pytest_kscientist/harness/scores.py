"""Per-candidate scores over its benchmarks: geomean time, speedups, fraction of the floor.

A score exists only when every benchmark of the candidate in the run passed: a geomean over a
subset would flatter a candidate that fails its hardest shapes.
"""

from __future__ import annotations

from pytest_kscientist.harness.results import CandidateResult, CaseResult
from pytest_kscientist.harness.stats import geomean


def floor_fraction(case: CaseResult) -> float | None:
    """``floor_us / median_us``: 1.0 would be the physical limit of the device."""
    if case.floor_us is None or case.stats is None or case.stats.median_us <= 0:
        return None
    return case.floor_us / case.stats.median_us


def timed_benchmarks(cand: CandidateResult) -> list[CaseResult] | None:
    """The candidate's benchmarks, or None unless there are some and every one passed.

    A baseline's benchmark that missed only by precision (``xfailed``, verify = "report")
    counts as timed: its times are the yardstick it was declared to be.
    """
    bench = [c for c in cand.cases if c.kind == "bench"]
    if bench and all(c.outcome in ("passed", "xfailed") and c.stats for c in bench):
        return bench
    return None


def score(cand: CandidateResult) -> None:
    """Fill ``cand``'s geomean, speedups and floor fraction in place (None when incomplete)."""
    bench = timed_benchmarks(cand)
    cand.geomean_us = None
    cand.speedups = {}
    cand.speedup_intervals = {}
    cand.baseline_verified = {}
    cand.fellow_speedups, cand.fellow_intervals = {}, {}
    cand.floor_fraction = None
    if bench is None:
        return
    cand.geomean_us = geomean([c.stats.median_us for c in bench if c.stats])
    for name, (ratio, interval, verified) in _pooled(bench, "baselines").items():
        cand.speedups[name] = ratio
        cand.baseline_verified[name] = verified
        if interval:
            cand.speedup_intervals[name] = interval
    for name, (ratio, interval, _) in _pooled(bench, "fellows").items():
        cand.fellow_speedups[name] = ratio
        if interval:
            cand.fellow_intervals[name] = interval
    fractions = [floor_fraction(c) for c in bench]
    if all(f is not None and f > 0 for f in fractions):
        cand.floor_fraction = geomean([f for f in fractions if f is not None])


def _pooled(bench: list[CaseResult], field: str
            ) -> dict[str, tuple[float, list[float], bool]]:
    """Per name of ``case.<field>`` (baselines or fellows) timed on every benchmark: the
    geomean speedup, its interval (the geomeans of the per-case bounds; [] when one lacks
    them) and whether every output beside it was verified."""
    out = {}
    names = {name for c in bench for name in getattr(c, field)}
    for name in sorted(names):
        timings = [getattr(c, field).get(name) for c in bench]
        ratios = [t.speedup for t in timings if t is not None]
        if len(ratios) != len(bench) or not all(r is not None and r > 0 for r in ratios):
            continue
        lows = [t.speedup_low for t in timings if t is not None]
        highs = [t.speedup_high for t in timings if t is not None]
        interval: list[float] = []
        if len(lows) == len(bench) and all(x is not None and x > 0 for x in lows + highs):
            interval = [geomean([x for x in lows if x is not None]),
                        geomean([x for x in highs if x is not None])]
        out[name] = (geomean([r for r in ratios if r is not None]), interval,
                     all(t.verified for t in timings if t is not None))
    return out


def score_all(per_task: dict[str, CandidateResult], reference_name: str) -> None:
    """Score every candidate of a task, then each one's speedup over the reference."""
    for cand in per_task.values():
        score(cand)
    ref = per_task.get(reference_name)
    for cand in per_task.values():
        cand.speedup_over_reference = None
        if ref and ref.geomean_us and cand.geomean_us:
            cand.speedup_over_reference = ref.geomean_us / cand.geomean_us
