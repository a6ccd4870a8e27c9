"""The three roles of the GPU Kernel Scientist as Protocols, and the records they exchange.

A role is any object with the method below; ``conftest.py`` files supply their own through the
``pytest_kscientist_make_selector/designer/writer`` hooks (see ``hookspecs.py``).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from pydantic import BaseModel, Field

DEFAULT_CONTRACT = (
    "`custom_kernel(data)` with the base's contract (same inputs, same output tensor)"
)


class TaskBrief(BaseModel):
    """What every role is told about the task and the machine; ``entry`` is the name a
    candidate file must define at module level and ``contract`` says what it is, in words;
    ``benchmark_cases``: each benchmark's case values by id (its shape, for the offline
    composition move)."""

    name: str
    description: str
    reference_source: str
    hardware: str
    benchmark_ids: list[str]
    benchmark_cases: dict[str, dict[str, int | float | bool | str]] = Field(default_factory=dict)
    entry: str = "custom_kernel"
    contract: str = DEFAULT_CONTRACT


class CandidateSummary(BaseModel):
    """One member of the population as the roles see it."""

    id: str
    generation: int
    parents: list[str] = Field(default_factory=list)
    source: str
    status: str  # "passed" | "failed" | "pending"
    geomean_us: float | None = None
    bench_median_us: dict[str, float] = Field(default_factory=dict)
    # Benchmark -> the kernel whose rounds its median is (not timed itself: it runs that
    # kernel's code there, --ks-same-as); who is fastest on a benchmark counts only own times.
    timed_as: dict[str, str] = Field(default_factory=dict)
    failure: str = ""
    failure_detail: str = ""  # the traceback or mismatch detail, trimmed (failure_text.trim)
    plan_title: str = ""
    explanation: str = ""


class Selection(BaseModel):
    """Stage 1: the base to improve and a reference to learn from, with the reason."""

    base_id: str
    reference_id: str | None = None
    reason: str


class ShapeRule(BaseModel):
    """One entry of a kernel's ``TUNABLES_BY_SHAPE``: the knob values for calls whose shape lies
    within ``when`` (key -> [low, high]: low <= value < high, None for no bound)."""

    when: dict[str, tuple[int | float | None, int | float | None]]
    knobs: dict[str, int | float | str | bool | None]
    note: str = ""  # written above the rule as a comment: where its values come from


class Graft(BaseModel):
    """One rule of a graft (``graft.py``): calls whose shape lies within ``when`` run the whole
    kernel ``kernel`` (a population id) of ``source`` (not stored with the plan: the child's
    file holds it)."""

    when: dict[str, tuple[int | float | None, int | float | None]]
    kernel: str
    source: str = Field(default="", repr=False, exclude=True)
    note: str = ""  # written above the rule as a comment


class ExperimentPlan(BaseModel):
    """One experiment: what to change, the expected gain range (percent) and how novel it is;
    ``knobs``, ``by_shape`` and ``grafts`` are the offline writer's exact edits (``TUNABLES``
    values, the rules that replace ``TUNABLES_BY_SHAPE``, other kernels run on some shapes)."""

    title: str
    changes: str
    expected_gain_min_pct: float
    expected_gain_max_pct: float
    innovation: float = Field(ge=0, le=10)
    knobs: dict[str, int | float | str | bool | None] = Field(default_factory=dict)
    by_shape: list[ShapeRule] = Field(default_factory=list)
    grafts: list[Graft] = Field(default_factory=list)


class Design(BaseModel):
    """Stage 2: ten avenues, five plans, three kept (most innovative, best max, best min gain)."""

    avenues: list[str]
    plans: list[ExperimentPlan]
    kept: list[ExperimentPlan]
    findings_update: str = ""


class Draft(BaseModel):
    """Stage 3: a complete candidate file implementing one plan."""

    source: str
    explanation: str


@runtime_checkable
class Selector(Protocol):
    def select(
        self, task: TaskBrief, population: list[CandidateSummary], findings: str
    ) -> Selection: ...


@runtime_checkable
class Designer(Protocol):
    def design(
        self,
        task: TaskBrief,
        base: CandidateSummary,
        reference: CandidateSummary | None,
        population: list[CandidateSummary],
        findings: str,
        n_keep: int,
    ) -> Design: ...


@runtime_checkable
class Writer(Protocol):
    """Writes one candidate file per plan. Optional, used when present: a ``reference``
    keyword of ``write`` (the selector's reference kernel), a ``population`` keyword (the
    members, given when a plan grafts kernels: their sources); ``repair(task, failed, base, plan)
    -> Draft`` (a fix of a candidate that failed when it ran, from its trimmed error);
    ``concurrent = True`` (the loop may call it from several threads at once)."""

    def write(self, task: TaskBrief, base: CandidateSummary, plan: ExperimentPlan) -> Draft: ...


def keep_three(plans: list[ExperimentPlan], n_keep: int = 3) -> list[ExperimentPlan]:
    """The paper's rule: keep the most innovative, the highest max gain, the highest min gain.

    Ties and duplicates fall through to the next-best plan by the same rule, so up to
    ``n_keep`` distinct plans come back (fewer only when fewer distinct plans exist). Plans
    with the same title, changes and knobs (ignoring case and spacing) are one plan (issue 13:
    three identical plans could be kept).
    """
    rules = [
        lambda p: p.innovation,
        lambda p: p.expected_gain_max_pct,
        lambda p: p.expected_gain_min_pct,
    ]
    distinct: list[ExperimentPlan] = []
    for plan in plans:
        if not any(_same_plan(plan, d) for d in distinct):
            distinct.append(plan)
    kept: list[ExperimentPlan] = []
    i = 0
    while len(kept) < min(n_keep, len(distinct)):
        rule = rules[i % len(rules)]
        for plan in sorted(distinct, key=rule, reverse=True):
            if all(plan is not k for k in kept):
                kept.append(plan)
                break
        i += 1
    return kept


def _same_plan(a: ExperimentPlan, b: ExperimentPlan) -> bool:
    def norm(text: str) -> str:
        return " ".join(text.lower().split())

    return (norm(a.title), norm(a.changes), a.knobs, a.by_shape, a.grafts) == (
        norm(b.title), norm(b.changes), b.knobs, b.by_shape, b.grafts)
