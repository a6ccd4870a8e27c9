"""The offline scientist: selector, designer and writer that tune ``TUNABLES`` knobs without an LLM.

The designer learns an additive model of log(geomean) over knob values from every evaluated
member of the base's family (kernels whose code differs only in knob values), extrapolates one
step along observed trends, and proposes unexplored single, paired and cross-over moves. When the
base's kernel can run knob values per class of shapes (``TUNABLES_BY_SHAPE``), it also proposes
the structural move of ``compose.py``: one kernel dispatching each class of shapes to the knob
point fastest there. A base that is such a composed kernel gets its knob moves inside one class
at a time (``class_moves.py``). Where a kernel of another family (other code) beat the base on
some benchmarks, the second structural move grafts it onto the shapes around them
(``graft.py``). Gains are speed-ups in percent: +100 means twice as fast.
"""

from __future__ import annotations

import copy
import functools
import itertools
import json
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pytest_kscientist.evolve.offline import class_moves, compose, graft
from pytest_kscientist.evolve.offline.knob_model import (
    KnobModel,
    Observation,
    effects_text,
    pct,
    title,
)
from pytest_kscientist.evolve.offline.knobs import (
    BY_SHAPE_NAME,
    Knob,
    KnobError,
    Rule,
    moves,
    paired_moves,
    read_by_shape,
    read_shape_keys,
    read_space,
    read_tunables,
    rewrite_tunables,
    skeleton_sha,
)
from pytest_kscientist.evolve.roles import (
    CandidateSummary,
    Design,
    Draft,
    ExperimentPlan,
    Selection,
    TaskBrief,
    keep_three,
)

N_AVENUES = 10
N_PLANS = 5
MAX_GLOBAL_SPACE = 4096


class NothingToMove(KnobError):
    """The offline designer's base declares no knobs: there is no experiment it can propose.

    The loop stops on it with exit code 4 (pytest's usage error: the command needs another
    scientist, or a seed needs knobs), not as a role failure."""


@dataclass(frozen=True)
class Tuned:
    """A candidate whose knobs the offline roles can read; ``rules``: its TUNABLES_BY_SHAPE
    (None when it declares none), ``shape_keys``: its SHAPE_KEYS; ``grafts``: its GRAFTS rules
    (``graft.py``; none: []) and ``own_family`` the family of the kernel it was grafted onto
    ("" for no graft)."""

    summary: CandidateSummary
    values: dict[str, Knob]
    space: dict[str, list[Knob]]
    family: str
    rules: list[Rule] | None = None
    shape_keys: tuple[str, ...] = ()
    grafts: list[Rule] = field(default_factory=list)
    own_family: str = ""

    def config(
        self, values: dict[str, Knob] | None = None, rules: list[Rule] | None = None
    ) -> tuple[tuple[str, Knob], ...]:
        """The kernel's configuration (or the one with other ``values`` / ``rules``)."""
        rules = self.rules if rules is None else rules
        config = tuple(sorted((self.values if values is None else values).items()))
        return config + ((BY_SHAPE_NAME, json.dumps(rules, sort_keys=True)),) if rules else config

    @property
    def composed(self) -> bool:
        """Whether it runs other knob values on some shapes (so its geomean is no knob point's)."""
        return bool(self.rules)


def tuned(candidate: CandidateSummary) -> Tuned | None:
    """The candidate's knobs and knob space, or None if it declares none or does not parse."""
    read = _read(candidate.source)
    if read is None:
        return None
    values, space, family, rules, keys, grafts, own = copy.deepcopy(read)  # the cache's stay
    return Tuned(candidate, values, space, family, rules, keys, grafts, own)


@functools.lru_cache(maxsize=4096)
def _read(
    source: str,
) -> tuple[dict[str, Knob], dict[str, list[Knob]], str, list[Rule] | None, tuple[str, ...],
           list[Rule], str] | None:
    """What ``tuned`` reads of a source, parsed once: the selector reads every candidate once
    for each candidate whose moves it counts (cProfile here: 30 ms a read of the fp8 Triton
    seed, 15 s a selection among 22 of its composed kernels without this cache, 0.2 s with),
    and every link reads its child's grafts."""
    try:
        values, space = read_tunables(source), read_space(source)
        family = skeleton_sha(source)
        rules, keys = read_by_shape(source), read_shape_keys(source)
    except KnobError:
        return None
    if not values or not any(k in values for k in space):
        return None
    try:
        grafts, own = graft.read_grafts(source) or [], graft.own_source(source)
        own_family = skeleton_sha(own) if own is not None else ""
    except (KnobError, SyntaxError):  # a GRAFTS that does not read: not taken for a graft
        grafts, own_family = [], ""
    return values, space, family, rules, tuple(keys), grafts, own_family


def _family(base: Tuned, population: list[CandidateSummary], single: bool = False) -> list[Tuned]:
    """The kernels of ``base``'s family; ``single``: only those with one configuration."""
    out = []
    for c in population:
        t = tuned(c)
        if t is not None and t.family == base.family and set(t.values) == set(base.values):
            if not (single and t.composed):
                out.append(t)
    return out


def _observed(t: Tuned) -> Observation:
    """A kernel of one configuration as a measurement of its knob point."""
    return t.values, t.summary.status, t.summary.geomean_us


def _lineage_root(cid: str, by_id: Mapping[str, CandidateSummary]) -> str:
    seen = set()
    while cid in by_id and by_id[cid].parents and cid not in seen:
        seen.add(cid)
        cid = by_id[cid].parents[0]
    return cid


def _has_untried(task: TaskBrief, base: Tuned, population: list[CandidateSummary]) -> bool:
    """Whether a knob move of ``base`` is left: inside one of its classes when it is composed,
    else a configuration no kernel of one configuration of its family has."""
    if base.composed:
        return next(class_moves.untried(task, base, _family(base, population)), None) is not None
    family = _family(base, population, True)
    tried = {t.config() for t in family}
    size = math.prod(len(v) for v in base.space.values())
    if size <= MAX_GLOBAL_SPACE:
        in_space = {
            c for c in tried if all(dict(c).get(k) in opts for k, opts in base.space.items())
        }
        return len(in_space) < size
    near = itertools.chain(moves(base.values, base.space, 2), paired_moves(base.values, base.space))
    return any(tuple(sorted((base.values | c).items())) not in tried for c in near)


class OfflineSelector:
    """Base = fastest passing kernel with knobs left to try; reference = its strongest rival.

    When the best kernel has not been beaten for ``stall`` generations, the base moves to the
    best kernel of another family (different code) that still has untried knobs. A composed
    kernel (knob points per shape class) is a base like any other: its knob moves go inside one
    class at a time.
    """

    def __init__(self, stall: int = 3) -> None:
        self.stall = stall

    def select(
        self, task: TaskBrief, population: list[CandidateSummary], findings: str
    ) -> Selection:
        passed = sorted(
            (c for c in population if c.status == "passed" and c.geomean_us),
            key=lambda c: c.geomean_us or math.inf,
        )
        if not passed:
            raise ValueError("no candidate has passed its checks; there is no base to improve")
        best = passed[0]
        open_ = [c for c in passed if (t := tuned(c)) and _has_untried(task, t, population)]
        base, note = (open_[0] if open_ else best), ""
        if base is not best:
            fastest = tuned(best)
            note = f" (the fastest, {best.id}, has every knob " + (
                "move inside its shape classes tried)"
                if fastest is not None and fastest.composed
                else "configuration tried)"
            )
        latest = max(c.generation for c in population)
        if open_ and latest - best.generation >= self.stall:
            family = tb.family if (tb := tuned(base)) else ""
            other = [c for c in open_ if (t := tuned(c)) and t.family != family]
            if other:
                base = other[0]
                note = (
                    f" (the fastest, {best.id}, is unbeaten for {latest - best.generation} "
                    "generations: exploring another family)"
                )
        rank = passed.index(base) + 1
        if (tb := tuned(base)) is not None and tb.composed:
            note += "; it runs knob points per shape class: its moves go inside one class"
        reason = (
            f"base {base.id}: {base.geomean_us:.1f} us geomean, rank {rank} of "
            f"{len(passed)} passing{note}"
        )
        reference, why = self._reference(base, passed, population)
        if reference is not None:
            reason += f"; reference {reference.id}: {why}"
        return Selection(
            base_id=base.id, reference_id=reference.id if reference else None, reason=reason
        )

    @staticmethod
    def _reference(
        base: CandidateSummary, passed: list[CandidateSummary], population: list[CandidateSummary]
    ) -> tuple[CandidateSummary | None, str]:
        wins: Counter[str] = Counter()
        for bench in base.bench_median_us:
            # own times only: a candidate not timed on a benchmark ran another's code there
            timed = [c for c in passed if bench in c.bench_median_us and bench not in c.timed_as]
            if not timed:
                continue
            winner = min(timed, key=lambda c: c.bench_median_us[bench])
            faster = winner.bench_median_us[bench] < base.bench_median_us[bench]
            if faster and winner.id not in (base.id, base.timed_as.get(bench)):
                wins[winner.id] += 1
        if wins:
            rank = {c.id: i for i, c in enumerate(passed)}
            cid, n = min(wins.items(), key=lambda kv: (-kv[1], rank[kv[0]]))
            ref = next(c for c in passed if c.id == cid)
            return ref, f"fastest on {n} of {len(base.bench_median_us)} benchmarks"
        by_id = {c.id: c for c in population}
        root = _lineage_root(base.id, by_id)
        for c in passed:
            if _lineage_root(c.id, by_id) != root:
                return c, f"best of another lineage (rooted at {_lineage_root(c.id, by_id)})"
        return None, ""


class OfflineDesigner:
    """Ranks untried knob moves around the base by the gain the history predicts."""

    def design(
        self,
        task: TaskBrief,
        base: CandidateSummary,
        reference: CandidateSummary | None,
        population: list[CandidateSummary],
        findings: str,
        n_keep: int,
    ) -> Design:
        t = tuned(base)
        if t is None:
            raise NothingToMove(
                f"the offline scientist has nothing to move in task '{task.name}': its base "
                f"{base.id} declares no knobs (TUNABLES and TUNABLE_SPACE); evolve this task "
                "with the LLM scientist (--ks-llm gemini with GEMINI_API_KEY set, or --ks-llm "
                "openai --ks-model NAME --ks-llm-base-url URL), or declare knobs in a seed"
            )
        family = _family(t, population)
        single = [f for f in family if not f.composed]
        model = KnobModel.fit([_observed(f) for f in single], t.space)
        turns: dict[str, tuple[str | None, Mapping[str, Knob]]] = {}
        if t.composed:  # moves inside one class at a time, each class's own model
            ref = tuned(reference) if reference is not None else None
            moved, fitted = class_moves.plans(
                task, t, family, ref if ref is not None and ref.family == t.family else None
            )
            plans = [m.plan for m in moved]
            turns = {m.plan.title: (m.label, m.change) for m in moved}
        else:
            changes = self._changes(t, family, reference)
            plans = [self._plan(t, model, c, origin, len(single)) for c, origin in changes]
            fitted = effects_text(t.values, model)
        ranked = sorted(
            plans, key=lambda p: p.expected_gain_min_pct + p.expected_gain_max_pct, reverse=True
        )
        composition, learned = compose.move(task, t, family, model.spread)
        grafted, donated = graft.plan(task, base, t.family, t.shape_keys, population,
                                      model.spread)
        # The structural moves come first: the knob plans fill the other places.
        ranked = [p for p in (composition, grafted) if p] + ranked
        avenues = [f"{p.title}: {p.changes}" for p in ranked[:N_AVENUES]]
        chosen = self._choose(ranked, max(N_PLANS, n_keep), turns)
        return Design(
            avenues=avenues or [f"every knob configuration near {base.id} has been tried"],
            plans=chosen,
            kept=keep_three(chosen, n_keep),
            findings_update="\n".join(x for x in (fitted, learned, donated) if x),
        )

    @staticmethod
    def _changes(
        t: Tuned, family: list[Tuned], reference: CandidateSummary | None
    ) -> list[tuple[dict[str, Knob], str]]:
        tried = {f.config() for f in family}
        out: list[tuple[dict[str, Knob], str]] = []

        def add(change: dict[str, Knob], origin: str) -> None:
            config = t.config(t.values | change)
            if change and config not in tried:
                tried.add(config)
                out.append((change, origin))

        ref = tuned(reference) if reference is not None else None
        if ref is not None and ref.family == t.family:
            diff = {k: v for k, v in ref.values.items() if t.values.get(k) != v}
            for k, v in diff.items():
                add({k: v}, f"taken from reference {reference.id}")  # type: ignore[union-attr]
            add(diff, f"cross-over with reference {reference.id}")  # type: ignore[union-attr]
        for change in moves(t.values, t.space, steps=1):
            add(change, "neighbouring value")
        for change in paired_moves(t.values, t.space):
            add(change, "paired neighbouring values")
        for change in moves(t.values, t.space, steps=2):
            add(change, "two steps away")
        if len(out) < N_AVENUES and math.prod(len(v) for v in t.space.values()) <= MAX_GLOBAL_SPACE:
            knobs = list(t.space)
            for combo in itertools.product(*(t.space[k] for k in knobs)):
                config = dict(zip(knobs, combo, strict=True))
                add({k: v for k, v in config.items() if t.values.get(k) != v}, "far jump")
        return out

    @staticmethod
    def _plan(
        t: Tuned,
        model: KnobModel,
        change: dict[str, Knob],
        origin: str,
        n_family: int,
    ) -> ExperimentPlan:
        f = model.forecast(t.values, change)
        low, high = f.bounds()
        return ExperimentPlan(
            title=title(t.values, change),
            changes=(
                f"{origin}; predicted {pct(f.gain):+.0f}% ({low:+.0f}..{high:+.0f}%) "
                f"by a model of {n_family} related kernel(s); seen {f.seen}"
            ),
            expected_gain_min_pct=round(low, 2),
            expected_gain_max_pct=round(high, 2),
            innovation=round(f.innovation, 2),
            knobs=change,
        )

    @staticmethod
    def _choose(
        ranked: list[ExperimentPlan],
        n: int,
        turns: Mapping[str, tuple[str | None, Mapping[str, Knob]]] | None = None,
    ) -> list[ExperimentPlan]:
        """Best by each criterion in turn, preferring plans that try values not yet picked, and
        then plans in a shape class not yet picked (``turns``: a class move's title -> its
        class and change; any other plan moves its ``knobs`` in no class)."""
        turns = turns or {}

        def moved(p: ExperimentPlan) -> tuple[str | None, set[tuple[str | None, str, Knob]]]:
            where, change = turns.get(p.title, (None, p.knobs))
            return where, {(where, k, v) for k, v in change.items()}

        picks: list[ExperimentPlan] = []
        orders = [
            ranked,
            sorted(ranked, key=lambda p: p.expected_gain_max_pct, reverse=True),
            sorted(ranked, key=lambda p: p.expected_gain_min_pct, reverse=True),
            sorted(ranked, key=lambda p: p.innovation, reverse=True),
        ]
        for order in itertools.cycle(orders):
            if len(picks) >= min(n, len(ranked)):
                break
            used = {item for p in picks for item in moved(p)[1]}
            classes = {moved(p)[0] for p in picks}
            fresh = [p for p in order if all(p is not q for q in picks)]
            new = [p for p in fresh if used.isdisjoint(moved(p)[1])]
            turn = [p for p in new if moved(p)[0] not in classes]
            picks.append((turn or new or fresh)[0])
        return picks


class OfflineWriter:
    """Writes a plan's knob values into the base's TUNABLES, and its per-shape rules into
    TUNABLES_BY_SHAPE, via the ast, or a graft's kernels after the base (``graft.py``); nothing
    else changes."""

    def write(self, task: TaskBrief, base: CandidateSummary, plan: ExperimentPlan,
              population: Sequence[CandidateSummary] = ()) -> Draft:
        if plan.grafts:  # a plan read back from its record holds no sources: the population's
            sources = {c.id: c.source for c in population}
            grafts = [g if g.source else g.model_copy(update={"source": sources.get(g.kernel, "")})
                      for g in plan.grafts]
            missing = sorted({g.kernel for g in grafts if not g.source})
            if missing:
                raise KnobError(f"plan '{plan.title}' grafts {', '.join(missing)}, which the "
                                "population given to the writer lacks; pass population=")
            return Draft(source=graft.graft_source(base.source, grafts, task.entry),
                         explanation=f"{base.id} with {plan.title}. {plan.changes}.")
        if not plan.knobs and not plan.by_shape:
            raise KnobError(
                f"plan '{plan.title}' names no knob values; "
                "the offline writer only rewrites TUNABLES and TUNABLES_BY_SHAPE"
            )
        rules = [r.model_dump(exclude={"note"}) for r in plan.by_shape] if plan.by_shape else None
        notes = [r.note for r in plan.by_shape]
        source = rewrite_tunables(base.source, plan.knobs, rules, notes)
        return Draft(
            source=source,
            explanation=f"{base.id} with {plan.title}. {plan.changes}.",
        )
