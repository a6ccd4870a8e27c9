"""The offline scientist's structural move: one kernel that runs, per class of shapes, the knob
point that was fastest on that class's benchmarks (the paper's "reference kernel, fastest on
some shapes", made into a dispatch).

The rule, a greedy regression tree over the shape keys the kernel declares (``SHAPE_KEYS``):

1. The knob points are those the family's passed kernels ran (``points_of``): a kernel of one
   configuration (no ``TUNABLES_BY_SHAPE`` rules) measures its point on every benchmark; a
   composed kernel measures each of its classes' points on the benchmarks that class holds. A
   point measured by several kernels takes the geometric mean of their medians per benchmark.
   Only these are composed, so each class runs a point that passed inside a whole kernel, and a
   composed child that made one class faster lends that class's point to the next composition.
2. A class of benchmarks is served by the point with the lowest geomean over them among the
   points timed on all of them (ties: the earlier point, kernels of one configuration first).
3. Starting from one class holding every benchmark, a class is split in two at a threshold of
   one key, between two adjacent values its benchmarks take: their geometric mean, rounded up
   for integers (m 1024 | 6144 splits at 2509), or their mean where one is not positive. The
   split taken lowers the benchmarks' summed log time the most, and only if the benchmarks that
   change point gain at least ``MIN_CLASS_GAIN`` on geomean (below that, medians timed in
   different sessions may just differ by drift); at most ``MAX_CLASSES`` classes. A class no
   point is timed on throughout (only composed kernels measured its benchmarks, each a part)
   is split first, where the split gives a point to the most benchmarks; a class left without
   one leaves no composition.
4. The class with the most benchmarks (ties: the one the base's own point serves, then the
   first) becomes ``TUNABLES``; every other class is one rule, bounded by the splits that made
   it. The classes tile the whole space (thresholds are open ended), so any shape, benchmark or
   not, runs exactly one of the points.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pytest_kscientist.evolve.offline.knob_model import pct
from pytest_kscientist.evolve.offline.knobs import Knob, Rule
from pytest_kscientist.evolve.roles import CandidateSummary, ExperimentPlan, ShapeRule, TaskBrief
from pytest_kscientist.harness.stats import geomean

MAX_CLASSES = 4
MIN_CLASS_GAIN = 0.03  # CPU timings on 2 shared cores vary by a few percent between sessions

Bound = tuple[float | None, float | None]
Cases = Mapping[str, Mapping[str, Any]]  # benchmark id -> its case values


@dataclass(frozen=True)
class Point:
    """One measured knob point: a passed kernel's id, its knob values, its benchmark medians."""

    id: str
    knobs: dict[str, Knob]
    times: Mapping[str, float]


# The point of a class that no point is timed on throughout (rule 3): it is timed on nothing.
UNSERVED = Point("", {}, {})


@dataclass(frozen=True)
class ShapeClass:
    """Benchmarks whose shapes lie within ``when`` (key -> [low, high)), served by ``point``
    (``UNSERVED`` while no point is timed on all of them)."""

    when: dict[str, Bound]
    benches: tuple[str, ...]
    point: Point


def holds(when: Mapping[str, Bound], shape: Mapping[str, Any]) -> bool:
    """Whether every bound of ``when`` holds for ``shape`` (low <= value < high, None for no
    bound); KeyError when a bound names a key ``shape`` lacks."""
    return all((low is None or low <= shape[key]) and (high is None or shape[key] < high)
               for key, (low, high) in when.items())


def first_rule(rules: Sequence[Rule], shape: Mapping[str, Any]) -> int | None:
    """The index of the first rule (a ``{"when": ...}``: ``TUNABLES_BY_SHAPE``'s, a graft's)
    whose bounds hold for ``shape``, or None; KeyError as ``holds``."""
    return next((i for i, rule in enumerate(rules) if holds(rule["when"], shape)), None)


def dispatch(
    default: Mapping[str, Knob], rules: Sequence[Rule], shape: Mapping[str, Any]
) -> dict[str, Knob]:
    """The knobs a kernel runs for ``shape``: those of the first rule that holds over
    ``default``; the kernel's ``tunables_for``."""
    i = first_rule(rules, shape)
    return dict(default) if i is None else {**default, **rules[i]["knobs"]}


def key_of(knobs: Mapping[str, Knob]) -> str:
    """A knob point as one comparable string."""
    return json.dumps(dict(knobs), sort_keys=True)


def _cost(point: Point, benches: Sequence[str]) -> float:
    return sum(math.log(point.times[b]) for b in benches)


def _best(points: Sequence[Point], benches: Sequence[str]) -> tuple[float, Point]:
    """Rule 2: (summed log time, point), or (inf, UNSERVED) when no point is timed throughout."""
    timed = [p for p in points if all(b in p.times for b in benches)]
    if not timed:
        return math.inf, UNSERVED
    return min(((_cost(p, benches), p) for p in timed), key=lambda cp: cp[0])


def threshold(low: float, high: float) -> float:
    """Where a class is cut between two adjacent values (rule 3): ``low < t <= high``."""
    if low > 0:
        mid = math.sqrt(low * high)
        return math.ceil(mid) if isinstance(low, int) and isinstance(high, int) else mid
    mid = (low + high) / 2
    return math.floor(mid) + 1 if isinstance(low, int) and isinstance(high, int) else mid


Score = tuple[int, float]  # (benchmarks a split gives a point, gain in summed log time)


def _split(
    cls: ShapeClass, points: Sequence[Point], cases: Cases, keys: Sequence[str], min_gain: float
) -> tuple[Score, ShapeClass, ShapeClass] | None:
    """The best allowed split of ``cls`` (rule 3): (its score, left, right)."""
    cost, _ = _best(points, cls.benches)
    found: tuple[Score, ShapeClass, ShapeClass] | None = None
    for key in keys:
        values = sorted({cases[b][key] for b in cls.benches})
        for low, high in zip(values, values[1:], strict=False):
            t = threshold(low, high)
            left = tuple(b for b in cls.benches if cases[b][key] < t)
            right = tuple(b for b in cls.benches if b not in left)
            (cost_l, p_l), (cost_r, p_r) = _best(points, left), _best(points, right)
            if cls.point is UNSERVED:
                sides = ((left, cost_l), (right, cost_r))
                served = [(side, c) for side, c in sides if c < math.inf]
                if not served:
                    continue
                score = (sum(len(side) for side, _ in served), -sum(c for _, c in served))
            else:
                gain = cost - cost_l - cost_r
                moved = [b for b in left if p_l is not cls.point] + [
                    b for b in right if p_r is not cls.point
                ]
                if not moved or gain < len(moved) * math.log1p(min_gain):
                    continue
                score = (0, gain)
            if found is None or score > found[0]:
                lo, hi = cls.when.get(key, (None, None))
                found = (
                    score,
                    ShapeClass({**cls.when, key: (lo, t)}, left, p_l),
                    ShapeClass({**cls.when, key: (t, hi)}, right, p_r),
                )
    return found


def shape_classes(
    points: Sequence[Point],
    cases: Cases,
    keys: Sequence[str],
    benches: Sequence[str],
    min_gain: float = MIN_CLASS_GAIN,
    max_classes: int = MAX_CLASSES,
) -> list[ShapeClass]:
    """The classes of rules 2-3 over ``benches``: one when no split pays."""
    usable = [k for k in keys if all(_number(cases[b].get(k)) for b in benches)]
    classes = [ShapeClass({}, tuple(benches), _best(points, benches)[1])]
    while len(classes) < max_classes:
        splits = [
            (s, i)
            for i, c in enumerate(classes)
            if (s := _split(c, points, cases, usable, min_gain)) is not None
        ]
        if not splits:
            break
        (_, left, right), i = max(splits, key=lambda si: si[0][0])
        classes[i : i + 1] = [left, right]
    return classes


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def describe(when: Mapping[str, Bound]) -> str:
    """``1024 <= m < 2509, k < 725``: a class's bounds in words."""
    parts = []
    for key, (low, high) in when.items():
        if low is not None and high is not None:
            parts.append(f"{low:g} <= {key} < {high:g}")
        elif high is not None:
            parts.append(f"{key} < {high:g}")
        elif low is not None:
            parts.append(f"{key} >= {low:g}")
    return ", ".join(parts) or "any shape"


@dataclass(frozen=True)
class Composition:
    """Rule 4: the class that becomes ``TUNABLES`` and the classes that become rules."""

    default: ShapeClass
    ruled: tuple[ShapeClass, ...]

    def rules(self) -> list[ShapeRule]:
        return [
            ShapeRule(
                when=c.when,
                knobs=c.point.knobs,
                note=f"{describe(c.when)}: {c.point.id}'s knobs, fastest on "
                f"{_count(c.benches)} there",
            )
            for c in self.ruled
        ]

    def assignment(self) -> dict[str, str]:
        """Benchmark -> the knob point it runs (``key_of``)."""
        return {b: key_of(c.point.knobs) for c in (self.default, *self.ruled) for b in c.benches}

    def text(self, ids: bool = True) -> str:
        """Each class, its point and its benchmarks (``ids``, else how many), on one line."""
        classes = [(describe(c.when), c) for c in self.ruled] + [("other shapes", self.default)]
        return "; ".join(
            f"{where} -> {c.point.id} ({', '.join(c.benches) if ids else _count(c.benches)})"
            for where, c in classes
        )


def _count(benches: Sequence[str]) -> str:
    return f"{len(benches)} benchmark{'s' if len(benches) != 1 else ''}"


def compose(
    points: Sequence[Point],
    cases: Cases,
    keys: Sequence[str],
    benches: Sequence[str],
    base_knobs: Mapping[str, Knob],
    min_gain: float = MIN_CLASS_GAIN,
) -> Composition | None:
    """Rules 2-4 over ``points`` (each timed on some of the benchmarks), or None when one point
    serves every class, some class has no point timed throughout, or the benchmarks' shapes are
    unknown."""
    benches = [b for b in benches if b in cases]
    timed = [
        Point(p.id, p.knobs, {b: p.times[b] for b in benches if p.times.get(b, 0) > 0})
        for p in points
    ]
    points = [p for p in timed if p.times]
    if len(points) < 2 or len(benches) < 2 or not keys:
        return None
    classes = shape_classes(points, cases, keys, benches, min_gain)
    if any(c.point is UNSERVED for c in classes):
        return None
    if len({key_of(c.point.knobs) for c in classes}) < 2:
        return None
    base = key_of(base_knobs)
    default = max(classes, key=lambda c: (len(c.benches), key_of(c.point.knobs) == base))
    comp = Composition(default, tuple(c for c in classes if c is not default))
    rules = [r.model_dump(exclude={"note"}) for r in comp.rules()]
    for c in classes:  # each benchmark runs its class's point through the kernel's own rule
        assert all(
            dispatch(default.point.knobs, rules, cases[b]) == c.point.knobs for b in c.benches
        ), (c, rules)
    return comp


def composition_plan(
    comp: Composition,
    base_id: str,
    base_knobs: Mapping[str, Knob],
    base_times: Mapping[str, float],
    prior: Sequence[Mapping[str, str]],
    spread: float,
    n_kernels: int,
) -> ExperimentPlan | None:
    """The move as a plan: its gain over the base predicted from the points' own medians (+-
    ``spread``, log units), its innovation 10 x the share of benchmarks given a point that
    neither the base nor an earlier composition (``prior``: their ``assignment``s) gives them.
    None when the base is timed on fewer benchmarks or is predicted no slower."""
    assignment = comp.assignment()
    if not all(b in base_times and base_times[b] > 0 for b in assignment):
        return None
    times = {b: c.point.times[b] for c in (comp.default, *comp.ruled) for b in c.benches}
    gain = sum(math.log(base_times[b] / times[b]) for b in assignment) / len(assignment)
    if gain <= 0:
        return None
    new = [b for b, point in assignment.items() if all(p.get(b) != point for p in prior)]
    low, high = pct(gain - spread), pct(gain + spread)
    title = "per shape class: " + "; ".join(
        [f"{describe(c.when)} {c.point.id}" for c in comp.ruled]
        + [f"other shapes {comp.default.point.id}"]
    )
    return ExperimentPlan(
        title=title,
        changes=(
            f"composed from the per-shape winners of {n_kernels} passed kernel(s) of the "
            f"family: {comp.text()}; predicted {pct(gain):+.0f}% ({low:+.0f}..{high:+.0f}%)"
            f" over {base_id} from their medians, timed in different sessions"
        ),
        expected_gain_min_pct=round(low, 2),
        expected_gain_max_pct=round(high, 2),
        innovation=round(10.0 * len(new) / len(assignment), 2),
        knobs={k: v for k, v in comp.default.point.knobs.items() if base_knobs.get(k) != v},
        by_shape=comp.rules(),
    )


class Kernel(Protocol):
    """What the move reads of a kernel of the family (``offline.Tuned``)."""

    @property
    def summary(self) -> CandidateSummary: ...

    @property
    def values(self) -> dict[str, Knob]: ...

    @property
    def rules(self) -> list[Rule] | None: ...

    @property
    def shape_keys(self) -> tuple[str, ...]: ...

    @property
    def composed(self) -> bool: ...


def move(
    task: TaskBrief, base: Kernel, family: Sequence[Kernel], spread: float
) -> tuple[ExperimentPlan | None, str]:
    """The composition move from ``base`` over its ``family``, and a findings line on the
    classes, over the points of ``points_of``; no plan when the kernel cannot dispatch per shape
    (no ``TUNABLES_BY_SHAPE`` or ``SHAPE_KEYS``), one point wins everywhere, or a kernel of the
    family already runs each benchmark with the same point (the same composition, measured)."""
    if base.rules is None or not base.shape_keys:
        return None, ""
    cases = task.benchmark_cases
    points, n_single, n_composed = points_of(family, cases)
    comp = compose(points, cases, base.shape_keys, task.benchmark_ids, base.values)
    if comp is None:
        return None, ""
    measured = f"{n_single} kernels of one configuration" + (
        f", the classes of {n_composed} composed" if n_composed else ""
    )
    learned = f"- fastest per shape class ({measured}): " + comp.text(ids=False)
    prior = [assignment(f, cases) for f in [base, *(f for f in family if f.composed)]]
    if comp.assignment() in prior:
        return None, learned
    summary = base.summary
    plan = composition_plan(
        comp, summary.id, base.values, summary.bench_median_us, prior, spread,
        n_single + n_composed,
    )
    return plan, learned


def points_of(family: Sequence[Kernel], cases: Cases) -> tuple[list[Point], int, int]:
    """Rule 1: the knob points the passed kernels of ``family`` ran on the benchmarks of
    ``cases``, each named after the first kernel that ran it (kernels of one configuration
    first), and how many kernels of one configuration and composed kernels measured them."""
    runs: dict[str, tuple[str, dict[str, Knob], dict[str, list[float]]]] = {}
    counted: Counter[bool] = Counter()
    passed = [f for f in family if f.summary.status == "passed"]
    for f in sorted(passed, key=lambda f: f.composed):  # stable: population order within each
        timed = False
        for bench, median in f.summary.bench_median_us.items():
            if bench not in cases or not median > 0:
                continue
            try:
                knobs = dispatch(f.values, f.rules or [], cases[bench])
            except KeyError:  # a rule bounds a key the benchmark lacks: the kernel fails there
                continue
            _, _, times = runs.setdefault(key_of(knobs), (f.summary.id, knobs, {}))
            times.setdefault(bench, []).append(median)
            timed = True
        counted[f.composed] += timed
    points = [
        Point(pid, knobs, {b: geomean(ts) for b, ts in t.items()})
        for pid, knobs, t in runs.values()
    ]
    return points, counted[False], counted[True]


def assignment(kernel: Kernel, cases: Cases) -> dict[str, str]:
    """Benchmark -> the knob point ``kernel`` runs it with; {} when its rules name a key the
    benchmarks lack (such a kernel fails its own calls)."""
    try:
        return {b: key_of(dispatch(kernel.values, kernel.rules or [], c)) for b, c in cases.items()}
    except KeyError:
        return {}
