"""The offline designer's knob moves inside a composed kernel, one class of shapes at a time.

A composed kernel (``TUNABLES_BY_SHAPE`` rules, compose.py) runs one knob point per class of
shapes: a rule serves the shapes it is the first to hold for, ``TUNABLES`` the shapes no rule
holds for. A class move changes one knob of one class's point, or a pair, to values of
``TUNABLE_SPACE``, and every other class keeps running what it ran: the move goes inside the
rule's ``knobs``, or into ``TUNABLES``, where a rule that does not set a moved knob gets its old
value written in. The other rules keep their notes; the moved rule's note says where its knobs
now come from.

Each class has its own knob model (``KnobModel``) over what the family's kernels ran on the
class's benchmarks (a kernel counts there when it ran one point on all of them). A move's
predicted gain on the geomean is its gain on the class times the class's share of the
benchmarks, so moves in classes holding more benchmarks rank higher, and the designer's picks
take the classes in turn. A move whose kernel the family already holds (the same ``TUNABLES``
and rules, ``Tuned.config``) or that runs every benchmark with the knob point some kernel of the
family runs it with (``compose.assignment``) is not proposed.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from pytest_kscientist.evolve.offline import compose
from pytest_kscientist.evolve.offline.knob_model import (
    KnobModel,
    Observation,
    effects_text,
    pct,
    title,
)
from pytest_kscientist.evolve.offline.knobs import BY_SHAPE_NAME, Knob, Rule, moves, paired_moves
from pytest_kscientist.evolve.roles import ExperimentPlan, ShapeRule, TaskBrief
from pytest_kscientist.formats.declarations import assignments
from pytest_kscientist.formats.source_ast import parse
from pytest_kscientist.harness.stats import geomean

Config = tuple[tuple[str, Knob], ...]
DEFAULT_LABEL = "other shapes"


class Tunable(compose.Kernel, Protocol):
    """What the moves read of a kernel of the family (``offline.Tuned``)."""

    @property
    def space(self) -> dict[str, list[Knob]]: ...

    def config(
        self, values: dict[str, Knob] | None = None, rules: list[Rule] | None = None
    ) -> Config: ...


@dataclass(frozen=True)
class KernelClass:
    """One class of a composed kernel: its rule (None: ``TUNABLES``), its bounds in words, the
    benchmarks it serves and the knob point it runs."""

    rule: int | None
    label: str
    benches: tuple[str, ...]
    knobs: dict[str, Knob]


@dataclass(frozen=True)
class ClassPlan:
    """A class move as the designer's plan, with the class and the change it makes there."""

    plan: ExperimentPlan
    label: str
    change: dict[str, Knob]


def kernel_classes(
    values: Mapping[str, Knob], rules: Sequence[Rule], cases: compose.Cases, benches: Sequence[str]
) -> list[KernelClass]:
    """The kernel's classes that serve some of ``benches``, in rule order, ``TUNABLES`` last."""
    held: dict[int | None, list[str]] = {}
    for bench in benches:
        if bench in cases:
            try:
                held.setdefault(compose.first_rule(rules, cases[bench]), []).append(bench)
            except KeyError:  # a rule bounds a key the benchmark lacks: the kernel fails there
                continue
    order = [i for i in range(len(rules)) if i in held] + [None] * (None in held)
    return [
        KernelClass(
            i,
            DEFAULT_LABEL if i is None else compose.describe(rules[i]["when"]),
            tuple(held[i]),
            compose.dispatch(values, rules, cases[held[i][0]]),
        )
        for i in order
    ]


def rule_notes(source: str) -> list[str]:
    """The comment lines above each rule of the kernel's ``TUNABLES_BY_SHAPE`` literal, joined
    ('' where none): the notes ``knobs.rewrite_tunables`` writes."""
    node = None
    for name, value, _ in assignments(parse(source)):
        if name == BY_SHAPE_NAME and isinstance(value, ast.List):
            node = value
    if node is None:
        return []
    lines = source.splitlines()
    notes, after = [], node.lineno
    for elt in node.elts:
        between = (lines[i].strip() for i in range(after, elt.lineno - 1))
        notes.append(" ".join(line[1:].strip() for line in between if line.startswith("#")))
        after = elt.end_lineno or elt.lineno
    return notes


def apply(
    values: Mapping[str, Knob], rules: Sequence[Rule], cls: KernelClass, change: Mapping[str, Knob]
) -> tuple[dict[str, Knob], list[Rule]]:
    """The kernel's ``TUNABLES`` and rules with ``change`` made in ``cls`` only."""
    if cls.rule is not None:
        out = [{**r, "knobs": dict(r["knobs"])} for r in rules]
        out[cls.rule]["knobs"].update(change)
        return dict(values), out
    pinned = [
        {**r, "knobs": {**r["knobs"], **{k: values[k] for k in change if k not in r["knobs"]}}}
        for r in rules
    ]
    return {**values, **change}, pinned


def observations(
    cls: KernelClass, family: Sequence[compose.Kernel], cases: compose.Cases
) -> list[Observation]:
    """What the family's kernels ran on ``cls``'s benchmarks, each that ran one point on all of
    them: (that point, its status, its geomean over them when it passed)."""
    out: list[Observation] = []
    for f in family:
        point = _point_on(f, cls, cases)
        if point is None:
            continue
        times = [f.summary.bench_median_us.get(b, 0.0) for b in cls.benches]
        timed = f.summary.status == "passed" and all(t > 0 for t in times)
        out.append((point, f.summary.status, geomean(times) if timed else None))
    return out


def _changes(
    cls: KernelClass, space: Mapping[str, list[Knob]], reference: tuple[str, dict[str, Knob]] | None
) -> Iterator[tuple[dict[str, Knob], str]]:
    """Candidate changes of ``cls``'s point, all within ``space``, in the single kernels' order."""
    if reference is not None:
        rid, point = reference
        for k, v in point.items():
            if k in cls.knobs and cls.knobs[k] != v and v in space.get(k, []):
                yield {k: v}, f"taken from reference {rid}"
    yield from ((c, "neighbouring value") for c in moves(cls.knobs, space, steps=1))
    yield from ((c, "paired neighbouring values") for c in paired_moves(cls.knobs, space))
    yield from ((c, "two steps away") for c in moves(cls.knobs, space, steps=2))


def untried(
    task: TaskBrief, base: Tunable, family: Sequence[Tunable], reference: Tunable | None = None
) -> Iterator[tuple[KernelClass, dict[str, Knob], str, dict[str, Knob], list[Rule]]]:
    """Each class move of ``base`` new to ``family``: (class, change, origin, TUNABLES, rules)."""
    cases, rules = task.benchmark_cases, base.rules or []
    tried = {f.config() for f in family}
    runs = [compose.assignment(f, cases) for f in family]
    for cls in kernel_classes(base.values, rules, cases, task.benchmark_ids):
        point = None if reference is None else _point_on(reference, cls, cases)
        ref = None if point is None else (reference.summary.id, point)  # type: ignore[union-attr]
        for change, origin in _changes(cls, base.space, ref):
            values, moved = apply(base.values, rules, cls, change)
            config = base.config(values, moved)
            run = {b: compose.key_of(compose.dispatch(values, moved, c)) for b, c in cases.items()}
            if config in tried or run in runs:
                continue
            tried.add(config)
            runs.append(run)
            yield cls, change, origin, values, moved


def _point_on(
    kernel: compose.Kernel, cls: KernelClass, cases: compose.Cases
) -> dict[str, Knob] | None:
    """The one knob point ``kernel`` runs on every benchmark of ``cls``; None when it runs
    several there, or a rule bounds a key a benchmark lacks."""
    try:
        ran = [compose.dispatch(kernel.values, kernel.rules or [], cases[b]) for b in cls.benches]
    except KeyError:
        return None
    return ran[0] if all(r == ran[0] for r in ran) else None


def plans(
    task: TaskBrief, base: Tunable, family: Sequence[Tunable], reference: Tunable | None
) -> tuple[list[ClassPlan], str]:
    """Every untried class move of the composed ``base`` as a plan, and findings lines on what
    each class's knob model learned."""
    cases, rules = task.benchmark_cases, base.rules or []
    classes = kernel_classes(base.values, rules, cases, task.benchmark_ids)
    total = sum(len(c.benches) for c in classes)
    seen = {c.label: observations(c, family, cases) for c in classes}
    models = {c.label: KnobModel.fit(seen[c.label], base.space) for c in classes}
    weights = sorted((len(c.benches) for c in classes), reverse=True)
    notes = rule_notes(base.summary.source)
    out = []
    for cls, change, origin, values, moved in untried(task, base, family, reference):
        held = len(cls.benches)
        rank = weights.index(held) + 1
        standing = (
            f"class {rank} of {len(classes)} by weight"
            if rank > 1
            else f"the heaviest of {len(classes)} classes"
            if weights.count(held) == 1
            else f"tied for the heaviest of {len(classes)} classes"
        )
        why = (
            f"({held} of {total} benchmarks: {held / total:.0%} of the geomean's weight, "
            f"{standing}; the picks take the classes in turn)"
        )
        by_shape: list[ShapeRule] = []
        if moved != rules:  # a rule moved, or took the old value of a moved TUNABLES knob
            by_shape = [
                ShapeRule(when=r["when"], knobs=r["knobs"], note=_note(i, cls, base, change, notes))
                for i, r in enumerate(moved)
            ]
        plan = _plan(cls, models[cls.label], len(seen[cls.label]), change,
                     f"{origin} in the class {cls.label} {why}", held / total)
        knobs = {k: v for k, v in values.items() if base.values.get(k) != v}
        out.append(ClassPlan(plan.model_copy(update={"knobs": knobs, "by_shape": by_shape}),
                             cls.label, change))
    learned = "\n".join(
        text for c in classes if (text := effects_text(c.knobs, models[c.label], c.label))
    )
    return out, learned


def _note(i: int, cls: KernelClass, base: Tunable, change: Mapping[str, Knob],
          notes: Sequence[str]) -> str:
    if i == cls.rule:
        return f"{cls.label}: {base.summary.id}'s knobs there, {title(cls.knobs, change)}"
    return notes[i] if i < len(notes) else ""


def _plan(cls: KernelClass, model: KnobModel, n: int, change: dict[str, Knob], origin: str,
          share: float) -> ExperimentPlan:
    """The move's plan: its gain on the class from the class's model, on the geomean by its
    ``share`` of the benchmarks; innovation as a single kernel's move."""
    f = model.forecast(cls.knobs, change)
    there_low, there_high = f.bounds()
    low, high = f.bounds(share)
    return ExperimentPlan(
        title=f"{cls.label}: {title(cls.knobs, change)}",
        changes=(
            f"{origin}; predicted {pct(f.gain):+.0f}% there ({there_low:+.0f}.."
            f"{there_high:+.0f}%), {pct(share * f.gain):+.0f}% ({low:+.0f}..{high:+.0f}%) on "
            f"the geomean, by a model of {n} kernel(s) measured there; seen {f.seen} there"
        ),
        expected_gain_min_pct=round(low, 2),
        expected_gain_max_pct=round(high, 2),
        innovation=round(f.innovation, 2),
    )
