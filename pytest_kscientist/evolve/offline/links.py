"""A child's speed-up over its parent, from the ratios timed beside it (``--ks-beside``).

Over the whole run a link is the child's geomean ratio, and its 95% interval the geomean of the
per-benchmark bounds (scores.py): conservative, as if every benchmark erred the same way.

A child that differs from its parent only in knob values (the same code once knob values and
shape rules are blanked, ``knobs.skeleton_sha``: the offline scientist's moves) runs the
parent's code at the parent's knob point on every benchmark where its shape rules pick the
parent's point; its true ratio there is 1, and the ratio measured there is noise that widens
the whole-run interval. Such a link is taken over the c of n benchmarks whose point changed:
the geomean of their ratios and of their bounds, raised to c / n (the geomean over all n with
1 on the rest). A class move 3% faster on 6 of 18 benchmarks then reads 1.01x, confirmed when
those six confirm it, where the whole-run interval (about +-2% on the H200) cannot. A graft
onto the parent (``graft.py``) is taken the same way over the benchmarks its rules send to
another kernel: on the others it runs the parent's code, behind one Python call that reads the
shape (1.5 us of host time a call on a 2-core CPU, against the ~0.3 ms of GPU work the harness
queues before its start event: notes/timing.md). On the
H200, 16 of 276 per-benchmark intervals of benchmarks a class move left unchanged excluded 1
(notes/fp8_gemm_h200.md): about the 5% a 95% interval allows.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_kscientist.evolve.offline.compose import dispatch, first_rule
from pytest_kscientist.evolve.offline.scientist import tuned
from pytest_kscientist.evolve.population import Member
from pytest_kscientist.evolve.roles import CandidateSummary
from pytest_kscientist.harness.stats import geomean


@dataclass(frozen=True)
class Link:
    """Parent time / child time with its 95% interval, over the ``changed`` of ``total``
    benchmarks whose knob point the child changed (``changed == total``: over the whole run)."""

    speedup: float
    low: float
    high: float
    changed: int
    total: int

    @property
    def partial(self) -> bool:
        return self.changed < self.total

    def ratio(self, table: bool = False) -> str:
        """``1.01x [1.00-1.02]`` (``table``: ``1.01x(1.00-1.02)``), with three decimals over
        part of the benchmarks."""
        d = 3 if self.partial else 2
        opening, closing = ("(", ")") if table else (" [", "]")
        return f"{self.speedup:.{d}f}x{opening}{self.low:.{d}f}-{self.high:.{d}f}{closing}"

    def short(self) -> str:
        """For the generation table: ``1.01x(1.00-1.02)``, or over part of the benchmarks
        ``1.007x(1.002-1.012) 6/18``."""
        if not self.partial:
            return self.ratio(table=True)
        if not self.changed:
            return f"1x(same) 0/{self.total}"
        return f"{self.ratio(table=True)} {self.changed}/{self.total}"

    def text(self) -> str:
        """The link in words, for the findings and the best-so-far line."""
        if not self.partial:
            return self.ratio()
        if not self.changed:
            return f"1x, the parent's kernel on all {self.total} benchmarks"
        on_moved = self.speedup ** (self.total / self.changed)
        return (f"{self.ratio()} ({on_moved:.3f}x on the {self.changed} of {self.total} "
                "benchmarks it moved)")


def link(child: Member, parent: Member | None, parent_id: str) -> Link | None:
    """``child``'s speed-up over ``parent_id`` as timed beside it; None when the child did not
    pass or its parent was not timed beside it. Taken over the benchmarks whose knob point
    changed when ``parent`` is known and ``split`` can tell which those are."""
    ev = child.evaluation
    if ev is None or ev.status != "passed":
        return None
    speedup, interval = ev.speedups.get(parent_id), ev.speedup_intervals.get(parent_id)
    if speedup is None or not interval or len(interval) != 2:
        return None
    found = split(child, parent) if parent is not None else None
    if found is None or not found[1]:  # not a knob move, or one that moved every benchmark
        n = len(ev.bench_median_us)
        return Link(speedup, interval[0], interval[1], n, n)
    moved, kept = found
    total = len(moved) + len(kept)
    if not moved:  # the parent's kernel on every benchmark
        return Link(1.0, 1.0, 1.0, 0, total)
    power = len(moved) / total
    speedup, low, high = (geomean([r[i] for r in moved]) ** power for i in range(3))
    return Link(speedup, low, high, len(moved), total)


Bounds = tuple[float, float, float]  # ratio, low, high of one benchmark


def split(child: Member, parent: Member) -> tuple[list[Bounds], list[Bounds]] | None:
    """The (ratio, low, high) timed beside ``parent`` on the benchmarks where ``child`` runs
    another knob point than ``parent`` does or another kernel (``same_code``), and on those
    where it runs the same; None unless ``same_code`` can tell and every benchmark has its
    ratio."""
    ev = child.evaluation
    if ev is None or ev.result is None:
        return None
    benches = [c for c in ev.result.cases if c.kind == "bench"]
    same = same_code(child.source, parent.source, [c.case for c in benches])
    if same is None or not benches:
        return None
    moved: list[Bounds] = []
    kept: list[Bounds] = []
    for case, kept_here in zip(benches, same, strict=True):
        timed = case.baselines.get(parent.id)
        bounds = (timed.speedup, timed.speedup_low, timed.speedup_high) if timed else (None,)
        if not all(isinstance(x, float) and math.isfinite(x) and x > 0 for x in bounds):
            return None
        (kept if kept_here else moved).append(bounds)  # type: ignore[arg-type]
    return moved, kept


def same_code(child: str, parent: str, shapes: Sequence[Mapping[str, Any]]) -> list[bool] | None:
    """For each shape, whether the ``child`` source runs the ``parent`` source's code at its
    knob point there: both read as one kernel with other knob values (the same
    ``knobs.skeleton_sha``: the offline scientist's moves) and the child's shape rules pick the
    parent's point (as ``tunables_for`` does), or the child is a graft onto the parent
    (``graft.py``) and none of its rules holds. None when neither reads so, or a rule bounds a
    key a shape lacks."""
    mine, theirs = tuned(_summary(child)), tuned(_summary(parent))
    if mine is None or theirs is None:
        return None
    if mine.family == theirs.family:  # a knob move; of a graft, its rules run the donor in both
        grafts, shared = [], mine.grafts
    elif mine.own_family == theirs.family:  # a graft onto the parent: its rules run the donor
        grafts, shared = mine.grafts, []
    else:
        return None
    if set(mine.values) != set(theirs.values):
        return None
    out = []
    for shape in shapes:
        try:
            differs = first_rule(grafts, shape) is not None or (
                first_rule(shared, shape) is None
                and dispatch(mine.values, mine.rules or [], shape)
                != dispatch(theirs.values, theirs.rules or [], shape))
        except (KeyError, TypeError, ValueError):  # a rule bounds a key the shape lacks
            return None
        out.append(not differs)
    return out


def _summary(source: str) -> CandidateSummary:
    return CandidateSummary(id="", generation=0, source=source, status="pending")
