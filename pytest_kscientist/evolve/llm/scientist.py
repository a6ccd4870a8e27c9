"""The three LLM roles of the GPU Kernel Scientist (arXiv 2506.20807) over one ``Session``.

``LLMSelector`` picks a base and a reference kernel, ``LLMDesigner`` brainstorms avenues, plans
experiments and grows the findings document, ``LLMWriter`` writes a complete kernel file per plan
(with one repair round). Failures are the typed errors of ``llm_errors.py``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationInfo, create_model, field_validator

from pytest_kscientist.evolve.llm import draft as drafts
from pytest_kscientist.evolve.llm import prompts
from pytest_kscientist.evolve.llm.llm_errors import DraftRejected, MalformedReply
from pytest_kscientist.evolve.llm.session import Session
from pytest_kscientist.evolve.roles import (
    CandidateSummary,
    Design,
    Draft,
    ExperimentPlan,
    Selection,
    TaskBrief,
    keep_three,
)

N_AVENUES = 10  # the paper's brainstorm width
N_PLANS = 5  # plans scored before three are kept
REJECTED_CHARS = 40_000  # of a rejected reply quoted back in the repair prompt


class SelectionAnswer(BaseModel):
    """Structured output of stage 1."""

    base_id: str = Field(description="id of the candidate the next experiments modify")
    reference_id: str | None = Field(
        default=None, description="id of another candidate to learn from, or null"
    )
    reason: str = Field(description="two to four sentences citing numbers")


class PlanAnswer(BaseModel):
    """One experiment as the designer states it."""

    title: str
    changes: str = Field(description="precise instructions for the kernel writer")
    expected_gain_min_pct: float
    expected_gain_max_pct: float
    innovation: float = Field(ge=0, le=10, description="0 = parameter tweak, 10 = new technique")


class DesignAnswer(BaseModel):
    """Structured output of stage 2."""

    avenues: list[str] = Field(description=f"{N_AVENUES} one-line avenues of optimisation")
    plans: list[PlanAnswer] = Field(description=f"{N_PLANS} concrete experiments")
    findings_update: str = Field(default="", description="new facts, one '- ' line each")


def _selection_schema(ids: list[str]) -> type[SelectionAnswer]:
    """``SelectionAnswer`` with both ids restricted to ``ids``: the schema the provider gets
    lists them as an enum the model's constrained decoding cannot leave (issue 13), and an id
    written with quotes or backticks is still read as the bare id."""
    choice = Literal[tuple(ids)]  # type: ignore[valid-type]

    def known(cls: type, value: Any, info: ValidationInfo) -> Any:
        value = _id(value) if isinstance(value, str) else value
        if value is not None and value not in ids:
            hint = "; use null for no reference" if info.field_name == "reference_id" else ""
            raise ValueError(
                f"{info.field_name} {value!r} is not an id of the population table{hint}")
        return value

    return create_model(  # type: ignore[call-overload, no-any-return]
        "SelectionAnswer",
        __base__=SelectionAnswer,
        __validators__={"_known": field_validator("base_id", "reference_id", mode="before")(
            known)},
        base_id=(choice, Field(description="id of the candidate the next experiments modify")),
        reference_id=(choice | None, Field(
            default=None, description="id of another candidate to learn from, or null")),
    )


def _id(text: str | None) -> str | None:
    return text.strip().strip("`'\" ") or None if text is not None else None


def _remember(session: Session, population: list[CandidateSummary]) -> None:
    for candidate in population:
        session.known.add(candidate.source, f"candidate `{candidate.id}`")


def _task_values(task: TaskBrief) -> dict[str, object]:
    return {
        "task_name": task.name,
        "task_description": task.description.strip(),
        "hardware": task.hardware.strip() or "(not stated)",
        "reference_source": task.reference_source.rstrip(),
        "contract": task.contract,
    }


class LLMSelector:
    """Stage 1: choose the base to improve and a reference to learn from."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def select(
        self, task: TaskBrief, population: list[CandidateSummary], findings: str
    ) -> Selection:
        """Ask for a base and a reference among ``population`` (no call for a single member)."""
        if not population:
            raise ValueError("select() needs a population with at least one candidate")
        _remember(self.session, population)
        if len(population) == 1:
            return Selection(base_id=population[0].id, reason="the only candidate")
        ids = {c.id for c in population}

        def check(answer: SelectionAnswer) -> None:
            answer.base_id = _id(answer.base_id) or ""
            answer.reference_id = _id(answer.reference_id)
            if answer.base_id not in ids:
                raise ValueError(f"base_id {answer.base_id!r} is not an id of the population table")
            if answer.reference_id is not None and answer.reference_id not in ids:
                raise ValueError(
                    f"reference_id {answer.reference_id!r} is not an id of the population table; "
                    "use null for no reference"
                )

        values = _task_values(task)
        del values["reference_source"]
        prompt = prompts.render(
            "selector",
            **values,
            benchmark_ids="\n".join(f"- {b}" for b in task.benchmark_ids) or "(none)",
            n_population=len(population),
            population_table=prompts.population_table(population),
            shape_table=prompts.shape_table(population),
            history=prompts.history(population),
            findings=prompts.findings_text(findings),
        )
        schema = _selection_schema(sorted(ids))
        answer = self.session.ask("selector", prompt, schema, check)
        # A reference equal to the base teaches nothing: treat it as "no reference".
        reference = None if answer.reference_id == answer.base_id else answer.reference_id
        return Selection(base_id=answer.base_id, reference_id=reference, reason=answer.reason)


class LLMDesigner:
    """Stage 2: ten avenues, five scored plans, the kept three, and new findings."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def design(
        self,
        task: TaskBrief,
        base: CandidateSummary,
        reference: CandidateSummary | None,
        population: list[CandidateSummary],
        findings: str,
        n_keep: int,
    ) -> Design:
        """Ask for avenues and plans; keep ``n_keep`` by the paper's rule (``keep_three``)."""
        _remember(self.session, [base, *([reference] if reference else []), *population])
        n_plans = max(N_PLANS, n_keep)

        def check(answer: DesignAnswer) -> None:
            if not answer.avenues:
                raise ValueError("avenues is empty; list the avenues of optimisation first")
            if len(answer.plans) < n_keep:
                raise ValueError(
                    f"plans holds {len(answer.plans)} experiments, {n_plans} were asked for"
                )
            for plan in answer.plans:
                if plan.expected_gain_min_pct > plan.expected_gain_max_pct:
                    raise ValueError(
                        f"plan {plan.title!r}: expected_gain_min_pct "
                        f"{plan.expected_gain_min_pct:g} exceeds expected_gain_max_pct "
                        f"{plan.expected_gain_max_pct:g}"
                    )

        prompt = prompts.render(
            "designer",
            **_task_values(task),
            base=prompts.candidate_card(base, "Base kernel"),
            reference=prompts.candidate_card(reference, "Reference kernel"),
            history=prompts.history(population),
            findings=prompts.findings_text(findings),
            n_avenues=N_AVENUES,
            n_plans=n_plans,
            n_keep=n_keep,
        )
        answer = self.session.ask("designer", prompt, DesignAnswer, check)
        plans = [ExperimentPlan(**plan.model_dump()) for plan in answer.plans]
        return Design(
            avenues=answer.avenues,
            plans=plans,
            kept=keep_three(plans, n_keep),
            findings_update=answer.findings_update.strip(),
        )


class LLMWriter:
    """Stage 3: a complete candidate file for one plan, checked before any GPU time.

    Its calls share nothing but the thread-safe session, so the loop makes a generation's
    calls at once (``concurrent``)."""

    concurrent = True

    def __init__(self, session: Session) -> None:
        self.session = session

    def write(self, task: TaskBrief, base: CandidateSummary, plan: ExperimentPlan,
              reference: CandidateSummary | None = None) -> Draft:
        """Write, check, repair once; raise ``DraftRejected`` if the file still fails."""
        self.session.known.add(base.source, f"candidate `{base.id}` (the base)")
        prompt = prompts.render(
            "writer",
            **_task_values(task),
            base=prompts.candidate_card(base, "Base kernel"),
            reference=prompts.candidate_card(reference, "Reference kernel"),
            plan=prompts.plan_text(plan),
        )
        return self._draft("writer", prompt, plan, base, task)

    def repair(self, task: TaskBrief, failed: CandidateSummary, base: CandidateSummary,
               plan: ExperimentPlan) -> Draft:
        """Fix ``failed`` (written from ``base`` for ``plan``) from its error as it ran."""
        self.session.known.add(base.source, f"candidate `{base.id}` (the base)")
        self.session.known.add(failed.source, f"candidate `{failed.id}` (the failed file)")
        prompt = prompts.render(
            "repair_failed",
            **_task_values(task),
            failure=prompts.failure_text(failed),
            plan=prompts.plan_text(plan),
            failed_id=failed.id,
            failed_source=failed.source.rstrip(),
            base_id=base.id,
            base_source=base.source.rstrip(),
        )
        return self._draft("repair", prompt, plan, base, task)

    def _draft(self, role: str, prompt: str, plan: ExperimentPlan,
               base: CandidateSummary, task: TaskBrief) -> Draft:
        source, explanation, problem, text = self._attempt(role, prompt, task.entry)
        if problem:
            first = problem
            repair = prompts.render(
                "repair",
                problem=problem,
                plan=prompts.plan_text(plan),
                rejected=text[:REJECTED_CHARS] or "(empty reply)",
                base_id=base.id,
                base_source=base.source.rstrip(),
                contract=task.contract,
            )
            source, explanation, problem, _text = self._attempt("repair", repair, task.entry)
            if problem:
                raise DraftRejected(
                    f"draft for {plan.title!r} rejected after one repair round: {problem} "
                    f"(first attempt: {first})",
                    source or "",
                    explanation,
                )
        draft = Draft(source=source or "", explanation=explanation)  # no problem: a source
        self.session.known.add(draft.source, f"an earlier draft ({plan.title})")
        return draft

    def _attempt(self, role: str, prompt: str,
                 entry: str) -> tuple[str | None, str, str, str]:
        """(source, explanation, problem, raw reply text) of one writer call; ``entry`` is the
        name the file must define (``TaskBrief.entry``)."""
        try:
            reply = self.session.call(role, prompt)
        except MalformedReply as exc:
            return None, "", str(exc), ""
        source, explanation, problem = drafts.extract(reply.text, reply.finish_reason, entry)
        if source is not None:
            problem = drafts.check(source, self.session.known, entry)
        return source, explanation, problem, reply.text
