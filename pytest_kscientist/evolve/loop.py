"""The ``--evolve`` driver: select, design, write, then evaluate in a child pytest session.

Every step leaves a record in the population before the next starts, so a run stopped anywhere
(Ctrl-C, ``kill -9``, time limit) resumes from what was persisted: candidates written but never
evaluated are evaluated first, a generation whose design was logged writes its remaining plans,
and the count of generations comes from the ``generation_done`` events. A resumed run first
stops any child session a killed run left running and adopts the results of one that finished
(``orphans.py``), so it never times beside the killed run's processes.
"""

from __future__ import annotations

import time
import traceback
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_kscientist.evolve import findings as findings_doc
from pytest_kscientist.evolve import orphans, progress
from pytest_kscientist.evolve.assemble import Roles, is_budget_exhausted, is_outage
from pytest_kscientist.evolve.offline.scientist import NothingToMove
from pytest_kscientist.evolve.population import EvaluationRecord, Event, Member, Population
from pytest_kscientist.evolve.roles import ExperimentPlan, Selection, TaskBrief
from pytest_kscientist.evolve.sessions import (
    EVALUATOR_KEY,
    ChildSession,
    EvaluationError,
    GenerationEvaluator,
    ParallelSessions,
    to_record,
)
from pytest_kscientist.evolve.writing import Stop, WriteStage

FINDINGS = "findings.md"
WAIT_POLL_S = 0.2  # how often a run checks on candidates another live run is evaluating
WAIT_NOTE_S = 30.0  # how often it says it is still waiting
# The exit code when the offline scientist has nothing to move (no knobs): the command needs
# another scientist (--ks-llm) or a seed with knobs, as a usage error would.
NOTHING_TO_MOVE = int(pytest.ExitCode.USAGE_ERROR)
# Parents re-timed beside a generation's candidates: each one costs as much bench time as a
# candidate's own benchmarks, and a generation usually has one base.
MAX_BESIDE = 2
# Rounds of writer calls a generation gets when none of a round's calls returns a draft (an
# unreachable LLM, answers in prose) before the run stops with the generation open.
WRITE_ATTEMPTS = 3


@dataclass(frozen=True)
class Budget:
    """How much one run may do."""

    generations: int
    candidates: int = 3
    time_limit_s: float | None = None


class Evolution(WriteStage):
    """One run of the loop over one task's population."""

    def __init__(
        self,
        *,
        task: str,
        seeds: list[Path],
        population: Population,
        evaluator: GenerationEvaluator,
        make_roles: Any,
        budget: Budget,
        terminal: progress.Terminal,
        clock: Any = time.monotonic,
        sleep: Any = time.sleep,
        task_dir: Path | None = None,
        seed_notes: dict[str, str] | None = None,
        seed_hint: str = "add kernels to seeds/",
        preview: Any = None,
    ) -> None:
        self.task = task
        self.task_dir = task_dir  # what a child session collects: a folder or a problem file
        self.seeds = seeds
        self.seed_notes = seed_notes or {}  # derived seeds (seeding.py): file name -> note
        self.seed_hint = seed_hint
        self.pop = population
        self.evaluator = evaluator
        self._make_roles = make_roles  # callable(members) -> (Roles, TaskBrief), called lazily
        # callable(members) -> lines to show before generation 0 (the LLM cost projection)
        self._preview = preview
        self.budget = budget
        self.term = terminal
        self.clock = clock
        self.sleep = sleep
        self.start = clock()
        self.roles: Roles | None = None
        self.brief: TaskBrief | None = None
        self.generation = 0
        watch = getattr(evaluator, "on_session_start", None)
        if callable(watch):  # child sessions: each start logged for a resumed run (orphans.py)
            watch(lambda started: orphans.record(self.pop, self.generation, started))

    # -- driver -------------------------------------------------------------------------------
    def run(self) -> int:
        """Run until the generation budget, the time limit or an interruption; return exit code."""
        self.pop.log("run_start", budget=self.budget.__dict__)
        code, reason = 0, f"{self.budget.generations} generation(s) done"
        if (already := max(self._done())) >= self.budget.generations:
            reason = (
                f"the population already has {already} generation(s), as many as --evolve "
                f"{self.budget.generations} asks; raise --evolve to go further"
            )
        try:
            self._show_preview(already)
            self._evaluate_pending(resumed=True)
            if 0 not in self._done():
                self._seed()
            while (done := max(self._done())) < self.budget.generations:
                self._generation(done + 1)
        except Stop as stop:
            code, reason = stop.code, stop.reason
        except KeyboardInterrupt:
            code, reason = int(pytest.ExitCode.INTERRUPTED), "interrupted (Ctrl-C)"
        self.pop.log("run_end", reason=reason, code=code)
        done = max(self._done())
        try:
            self._finish(reason, done)
        except KeyboardInterrupt:  # a second Ctrl-C: the ending stops, not with a traceback
            self.term.line(f"ending cut short (Ctrl-C); everything is saved in {self.pop.root}; "
                           "rerun the same command to see it or go on", yellow=True)
            code = int(pytest.ExitCode.INTERRUPTED)
        # The session's last line says what the run holds, not "no tests ran" (issue 11): the
        # generations after the seeds that added candidates. One closed with nothing new (the
        # designer proposed nothing, every draft a duplicate) is not counted.
        grown = len({m.meta.generation for m in self.pop.members()
                     if 1 <= m.meta.generation <= done})
        self.term.count("generation" if grown == 1 else "generations", grown)
        return code

    def _show_preview(self, done: int) -> None:
        """Show what the run will cost before anything is spent or run (issue 13: the line came
        only after the seeds' evaluation, minutes into a GPU run)."""
        if self._preview is None:
            return
        self.generation = max(done, 0)
        try:
            lines = self._preview(self.pop.members())
        except Exception as exc:
            if is_outage(exc):
                self.pop.log("role_failed", self.generation, role="start check", error=repr(exc))
                raise Stop(f"the LLM provider cannot go on: {exc}", 3, stand_in=False) from None
            raise
        for stage, line in lines:
            self._stage(stage, line)

    def _done(self) -> set[int]:
        done = {e.generation for e in self.pop.events() if e.kind == "generation_done"}
        return {g for g in done if g is not None} or {-1}

    def _remaining(self) -> float | None:
        if self.budget.time_limit_s is None:
            return None
        left = self.budget.time_limit_s - (self.clock() - self.start)
        if left <= 0:
            raise Stop(f"time limit of {self.budget.time_limit_s:g} s reached; rerun to continue")
        return left

    def _stage(self, stage: str, text: str) -> None:
        g = f"gen {self.generation}/{self.budget.generations}"
        self.term.line(f"kscientist evolve {self.task} | {g} | {stage:<8} | {text}")

    # -- generation 0 -------------------------------------------------------------------------
    def _seed(self) -> None:
        self.generation = 0
        if not self.seeds:
            raise Stop(f"task '{self.task}' has no seeds to start from; {self.seed_hint}", 1)
        added, stored = [], set()
        for path in self.seeds:
            note = self.seed_notes.get(path.name, "")
            result = self.pop.add(
                path.read_text(encoding="utf-8"), generation=0, origin="seed", seed_file=path.name,
                explanation=note,
            )
            if note:
                self._stage("seed", f"{result.id} is {note}")
            stored.add(result.id)
            if not result.duplicate:
                added.append(result.id)
        self._stage("seed", f"{len(added)} new of {len(self.seeds)} seed(s): {' '.join(added)}")
        self._evaluate_pending()
        self._await_other_runs(stored)
        self._close_generation(0)

    # -- generations 1.. ----------------------------------------------------------------------
    def _generation(self, g: int) -> None:
        self.generation = g
        members = self.pop.members()
        if not any(m.geomean_us is not None for m in members) and self._await_other_runs():
            members = self.pop.members()
        if not any(m.geomean_us is not None for m in members):
            raise Stop("no candidate passes its checks; fix a seed so there is a base to evolve", 1)
        roles, brief = self._roles(members)
        design = self._design_event(g) or self._select_and_design(g, roles, brief, members)
        base_id = design.data["selection"]["base_id"]
        plans = [ExperimentPlan.model_validate(p) for p in design.data["kept"]]
        base = next((m for m in self.pop.members() if m.id == base_id), None)
        if base is None:
            raise Stop(f"the base {base_id} of generation {g} is no longer readable", 3)
        first: Stop | None = None
        for attempt in range(1, WRITE_ATTEMPTS + 1):
            failed = self._write_stage(g, design, plans, self._plans_written(design), base,
                                       roles, brief)
            if failed is None:
                break
            first = first or failed
            if attempt < WRITE_ATTEMPTS:
                self._stage("write", f"no draft came back; writing again ({attempt + 1} of "
                                     f"{WRITE_ATTEMPTS})")
        else:  # a generation with nothing written is not done: a rerun writes its plans again
            raise Stop(f"generation {g}: no writer call returned a draft in {WRITE_ATTEMPTS} "
                       f"attempts, the first failure: {first.reason}; rerun the same "
                       "command to write them again", 3)
        self._evaluate_pending()
        self._close_generation(g)
        if not plans:
            raise Stop("the designer proposed no new experiment; the search space is exhausted")

    def _plans_written(self, design: Event) -> set[int]:
        """Indices of the design's plans whose draft came back (stored or a duplicate); a plan
        whose writer call failed is written again by the next attempt or a resumed run."""
        return {
            e.data["plan_index"]
            for e in self.pop.events()
            if e.kind == "plan_done" and e.data.get("design_id") == design.data["design_id"]
            and e.data.get("outcome") != "write_failed"
        }

    def _roles(self, members: list[Member]) -> tuple[Roles, TaskBrief]:
        if self.roles is None or self.brief is None:
            try:
                self.roles, self.brief = self._make_roles(members)
            except (KeyboardInterrupt, Stop):
                raise
            except Exception as exc:  # hooks and LLM set-up are user code: report, do not crash
                self.pop.log("role_failed", self.generation, role="setup", error=repr(exc))
                raise Stop(
                    f"the roles could not be set up: {type(exc).__name__}: {exc}", 3
                ) from None
            self._stage("roles", ", ".join(f"{k}={v}" for k, v in self.roles.names().items()))
            for note in self.roles.notes:
                self._stage("roles", note)
        return self.roles, self.brief

    def _designs(self, events: list[Event] | None = None) -> dict[int, Event]:
        """Per generation, the design this run goes on with: its own latest, else the latest
        any run logged (one read of the event log)."""
        chosen: dict[int, Event] = {}
        for e in self.pop.events() if events is None else events:
            if e.kind != "design" or e.generation is None:
                continue
            earlier = chosen.get(e.generation)
            if earlier is None or e.run_id == self.pop.run_id or earlier.run_id != self.pop.run_id:
                chosen[e.generation] = e
        return chosen

    def _design_event(self, g: int) -> Event | None:
        event = self._designs().get(g)
        if event is not None and event.run_id != self.pop.run_id:
            self._stage("resume", f"continuing the design logged at {event.at}")
        return event

    def _select_and_design(
        self, g: int, roles: Roles, brief: TaskBrief, members: list[Member]
    ) -> Event:
        summaries = [m.summary() for m in members]
        notes = self.pop.read_text(FINDINGS)
        self._remaining()
        by_id = {s.id: s for s in summaries}
        selection = self._select(roles.selector, brief, summaries, notes, by_id)
        self._stage("select", selection.reason)
        base, ref = by_id[selection.base_id], by_id.get(selection.reference_id or "")
        self._remaining()
        design = self._design(roles.designer, brief, base, ref, summaries, notes)
        kept = list(design.kept)[: self.budget.candidates]
        self._stage(
            "design",
            f"{len(design.avenues)} avenues, {len(design.plans)} plans, kept {len(kept)}"
            + (": " + "; ".join(p.title for p in kept) if kept else ""),
        )
        return self.pop.log(
            "design",
            generation=g,
            design_id=uuid.uuid4().hex[:12],
            selection=selection.model_dump(),
            avenues=list(design.avenues),
            plans=[p.model_dump() for p in design.plans],
            kept=[p.model_dump() for p in kept],
            findings_update=design.findings_update,
        )

    def _select(self, selector: Any, brief: TaskBrief, summaries: list[Any], notes: str,
                by_id: dict[str, Any]) -> Selection:
        """The selector's choice; if it fails or names ids not in the population, the offline
        selector's for this generation (issue 13: one bad answer ended a long LLM run)."""
        from pytest_kscientist.evolve.offline.scientist import OfflineSelector

        try:
            selection = self._call("selector", selector.select, brief, summaries, notes)
            problem = _selection_problem(selection, by_id)
        except Stop as stop:
            if stop.code != 3 or not stop.stand_in:  # the budget ran out, an outage
                raise
            selection, problem = None, stop.reason
        if not problem:
            return selection  # type: ignore[return-value]
        if isinstance(selector, OfflineSelector):
            raise Stop(problem, 3)
        self._stand_in("selector", "select", problem)
        selection = self._call("selector", OfflineSelector().select, brief, summaries, notes)
        problem = _selection_problem(selection, by_id)
        if problem:
            raise Stop(problem, 3)
        return selection  # type: ignore[return-value]

    def _design(self, designer: Any, brief: TaskBrief, base: Any, ref: Any,
                summaries: list[Any], notes: str) -> Any:
        """The designer's plans; if it fails (a rate limit outlasting the retries, answers that
        stay malformed), the offline designer's for this generation, when the base has knobs."""
        from pytest_kscientist.evolve.offline.scientist import OfflineDesigner

        args = (brief, base, ref, summaries, notes, self.budget.candidates)
        try:
            return self._call("designer", designer.design, *args)
        except Stop as stop:
            if stop.code != 3 or not stop.stand_in or isinstance(designer, OfflineDesigner):
                raise
            problem = stop.reason
        self._stand_in("designer", "design", problem)
        try:
            return self._call("designer", OfflineDesigner().design, *args)
        except Stop as stop:
            code = 3 if stop.code == NOTHING_TO_MOVE else stop.code  # the designer failed
            raise Stop(f"{problem}; the offline designer could not stand in: {stop.reason}",
                       code) from None

    def _stand_in(self, role: str, stage: str, problem: str) -> None:
        """Log and show that the offline ``role`` replaces the run's for this generation."""
        self.pop.log("role_fallback", self.generation, role=role, error=problem)
        self._stage(stage, f"{problem}; the offline {role} stands in for this generation")

    def _call(self, role: str, method: Any, *args: Any, **kwargs: Any) -> Any:
        """Call a role; a role's failure stops the run (code 3) with its traceback logged."""
        try:
            return method(*args, **kwargs)
        except (KeyboardInterrupt, Stop):
            raise
        except NothingToMove as exc:  # not a failure: this scientist cannot evolve the task
            self.pop.log("nothing_to_move", self.generation, role=role, reason=str(exc))
            raise Stop(str(exc), NOTHING_TO_MOVE, stand_in=False) from None
        except Exception as exc:  # a role is user or LLM code: an isolation boundary
            detail = traceback.format_exc()
            self.pop.log(
                "role_failed", self.generation, role=role, error=repr(exc), traceback=detail
            )
            if is_budget_exhausted(exc):
                raise Stop(f"LLM budget exhausted in the {role}: {exc}") from None
            if is_outage(exc):  # no stand-in: the run stops, and resumes when rerun
                raise Stop(f"the LLM provider cannot go on ({role}): {exc}", 3,
                           stand_in=False) from None
            raise Stop(f"the {role} failed: {type(exc).__name__}: {exc}", 3) from None

    # -- evaluation ---------------------------------------------------------------------------
    def _await_other_runs(self, ids: set[str] | None = None) -> bool:
        """Wait for candidates (those in ``ids``, or any) that other live runs of this
        population are evaluating; return whether there were any.

        Two runs started together on one population store a shared seed once, and only the run
        that stored it evaluates it. The other must wait for those results rather than close
        generation 0 without them or stop because nothing has passed yet.
        """
        waited, noted = False, None
        while True:
            live = self.pop.live_runs()
            busy = [
                m
                for m in self.pop.members()
                if m.evaluation is None
                and m.meta.run_id in live
                and (ids is None or m.id in ids)
            ]
            if not busy:
                return waited
            waited, now = True, self.clock()
            if noted is None or now - noted >= WAIT_NOTE_S:
                noted = now
                pids = sorted({live[m.meta.run_id] for m in busy})
                self._stage(
                    "wait",
                    f"{' '.join(m.id for m in busy)} being evaluated by another run "
                    f"(pid {', '.join(map(str, pids))})",
                )
            self._remaining()
            self.sleep(WAIT_POLL_S)

    def _evaluate_pending(self, resumed: bool = False) -> None:
        """Evaluate this run's unevaluated candidates; on resume, also those of ended runs (a
        killed run's), not those a live concurrent run is evaluating."""
        if resumed:
            self._settle_left_behind()
        live = self.pop.live_runs() if resumed else {}
        pending = [
            m
            for m in self.pop.members()
            if m.evaluation is None
            and (m.meta.run_id == self.pop.run_id or (resumed and m.meta.run_id not in live))
        ]
        if not pending:
            return
        ids = " ".join(m.id for m in pending)
        if resumed:
            self.generation = max(m.meta.generation for m in pending)
            self._stage("resume", f"{len(pending)} candidate(s) written but never evaluated: {ids}")
        label = getattr(self.evaluator, "label", None)
        where = label(len(pending)) if label else "a child pytest session"
        self._stage("evaluate", f"{ids} in {where}")
        began = self.clock()
        paths = [self.pop.source_path(m.id) for m in pending]
        beside = self._parents_beside(pending)
        if beside:
            names = " ".join(p.stem for p in beside)
            self._stage("evaluate", f"parents timed beside each: {names}")
        try:
            run = self.evaluator.evaluate(paths, self._remaining(), beside=beside)
        except EvaluationError as exc:
            self.pop.log(
                "evaluation_failed",
                self.generation,
                candidates=[m.id for m in pending],
                error=str(exc),
            )
            raise Stop(str(exc), exc.code) from None
        verdicts = self._store(pending, run, self.pop.run_id)
        self._stage("evaluate", f"done in {self.clock() - began:.1f} s: {', '.join(verdicts)}"
                                f"{_where(run.item_seconds)}")

    def _store(self, pending: list[Member], run: Any, run_id: str, **note: Any) -> list[str]:
        """Record a session's results for ``pending``; return their verdicts."""
        self._check_profile(run.profile)
        results = {c.name: c for c in run.candidates}
        verdicts = []
        for m in pending:
            record = to_record(m.id, results.get(m.id), run, run_id)
            self.pop.record(record)
            verdicts.append(f"{m.id} {record.status}{_timed_as(record)}")
        self.pop.log("evaluated", self.generation, candidates=[m.id for m in pending],
                     profile=run.profile, salt=run.salt, **note)
        return verdicts

    def _settle_left_behind(self) -> None:
        """Before timing anything: stop the child sessions that killed runs left running, and
        store the results of those that finished (issue 31), under the population's lock so
        that two resumed runs do not both act on one session."""
        with self.pop.locked():
            pending = {m.id: m for m in self.pop.members() if m.evaluation is None}
            for event in orphans.left_behind(self.pop, set(pending)):
                self.generation = event.generation or 0
                data, ids = event.data, " ".join(event.data.get("candidates", []))
                pid = int(data.get("child_pid", 0))
                try:
                    was_running = orphans.stop(pid, str(data.get("child_started", "")))
                except TimeoutError as exc:
                    raise Stop(f"{exc}; stop it before resuming", 3) from None
                if was_running:
                    self.pop.log("orphan_stopped", event.generation, child_pid=pid,
                                 of_run=event.run_id)
                    self._stage("resume", f"stopped the child session (pid {pid}) of a killed "
                                f"run, still evaluating {ids}, and its workers")
                run = orphans.finished(data, set(pending))
                if run is None:
                    continue
                members = [pending.pop(c) for c in data["candidates"]]
                verdicts = self._store(members, run, event.run_id, adopted_from=event.run_id,
                                       results=data.get("results"))
                self._stage("resume", f"results of a finished child session of a killed run "
                            f"adopted, not evaluated again: {', '.join(verdicts)}")

    def _parents_beside(self, pending: list[Member]) -> tuple[Path, ...]:
        """The passed first parents of ``pending``, re-timed interleaved with them, so each
        child's speedup over its parent is a ratio within one session (issue 10)."""
        by_id = {m.id: m for m in self.pop.members()}
        ids: list[str] = []
        for m in pending:
            parent = by_id.get(m.meta.parents[0]) if m.meta.parents else None
            if parent is not None and parent.status == "passed" and parent.id not in ids:
                ids.append(parent.id)
        return tuple(self.pop.source_path(i) for i in ids[:MAX_BESIDE])

    def _check_profile(self, profile: str) -> None:
        earlier = {
            m.evaluation.profile
            for m in self.pop.members()
            if m.evaluation and m.evaluation.profile
        }
        if earlier and earlier != {profile}:
            self.term.line(
                f"warning: this session used case profile '{profile}' but the population was "
                f"measured with {sorted(earlier)}: times are not comparable; use another "
                "--ks-population per profile",
                yellow=True,
            )

    def _close_generation(self, g: int) -> None:
        # Candidates of this generation another live run wrote are part of it: its table, its
        # findings and the next selection wait for their results (docs/evolve.md).
        self._await_other_runs({m.id for m in self.pop.members() if m.meta.generation == g})
        members = self.pop.members()
        # Every generation's designer notes, newest first (issue 13: each replaced the last).
        events = self.pop.events()
        designs = self._designs(events)
        history = [(earlier, designs[earlier].data.get("findings_update", ""))
                   for earlier in range(g, 0, -1) if earlier in designs]
        self.pop.write_text(FINDINGS, findings_doc.render(self.task, members, history, g,
                                                          _rejected(events)))
        with self.pop.locked():  # one generation_done a generation, whichever run closes it
            if g not in self._done():
                self.pop.log("generation_done", g)
        self.term.sep(f"kscientist {self.task}: generation {g}")
        for line in progress.generation_table(members, g):
            self.term.line(line)

    def _finish(self, reason: str, done: int) -> None:
        members = self.pop.members()
        self.term.sep(f"kscientist evolution of {self.task}")
        for line in progress.summary(members, reason, self.clock() - self.start):
            self.term.line(line)
        for message in self.pop.skipped:
            self.term.line(f"warning: {message}", yellow=True)
        if members:
            self.pop.write_text(progress.LINEAGE, progress.lineage_markdown(self.task, members))
            note = progress.write_plot(members, self.pop.root / progress.PLOT, self.task)
            self.term.line(note)
        self.term.line(f"population: {self.pop.root} (findings.md, lineage.md, events.jsonl)")
        top = findings_doc.best(members)
        if top is not None:
            path = self.pop.source_path(top.id)
            where = self.task_dir if self.task_dir is not None else "<task folder>"
            self.term.line(f"best kernel: {path}")
            self.term.line(f"check it again: pytest {where} --kernel {path}")
            # Going on from a run that stopped short is the same command (it resumes).
            go_on = self.budget.generations if done < self.budget.generations else done + 3
            for line in progress.not_the_best(members, top, self.pop.source_path, where,
                                              go_on, self.pop.root.parent):
                self.term.line(line)


def _rejected(events: list[Event]) -> list[tuple[int, str, str]]:
    """(generation, plan title, why) of every draft rejected before the GPU, newest first."""
    kept = {e.data.get("design_id"): e.data.get("kept", []) for e in events if e.kind == "design"}
    found = []
    for e in events:
        if e.kind != "plan_done" or e.data.get("outcome") != "write_failed":
            continue
        plans = kept.get(e.data.get("design_id"), [])
        index = e.data.get("plan_index", -1)
        title = e.data.get("plan_title") or (
            plans[index].get("title", "?") if 0 <= index < len(plans) else "?")
        found.append((e.generation or 0, str(title), str(e.data.get("error", ""))))
    return found[::-1]


def _selection_problem(selection: Any, by_id: dict[str, Any]) -> str:
    """What is wrong with a selector's answer ("" when it can be used)."""
    if not isinstance(selection, Selection):
        return f"the selector returned {type(selection).__name__}, not a Selection"
    if selection.base_id not in by_id or (
        selection.reference_id is not None and selection.reference_id not in by_id
    ):
        return (f"the selector chose base '{selection.base_id}' / reference "
                f"'{selection.reference_id}', which are not in the population")
    return ""


def run_evolution(config: pytest.Config, spec_path: Path) -> int:
    """Run ``--evolve N`` on the task collected from ``spec_path`` (a ``task.toml``, a GPU MODE
    ``task.yml`` or a KernelBench problem file); return a pytest exit code (0 done, 1 nothing
    passes, 2 interrupted, 3 a role, the LLM provider or a child session cannot go on, 4 the
    offline scientist has nothing to move: no seed declares knobs).

    N counts the population's generations after the seeds (generation 0), so rerunning the same
    command after an interruption finishes the job, and a larger N continues a finished run.
    """
    from pytest_kscientist.evolve.assemble import make_roles_factory
    from pytest_kscientist.evolve.seeding import seeds_for
    from pytest_kscientist.harness.collect import load_any
    from pytest_kscientist.harness.session import KS_SESSION

    ks = config.stash[KS_SESSION]
    settings = ks.settings.evolve_options  # resolved at configure time (plugin.py)
    task = load_any(spec_path, ks.settings.kernelbench_tol)
    # Child sessions collect what a hand-run session would: the folder of a native task, the
    # problem's own file otherwise (a KernelBench problem is one file among many in its level).
    task_dir = task.root if task.form == "native" else task.spec_path
    population = Population(settings.population_root / task.name, task.name)
    seeds = seeds_for(task, population.root)
    evaluator = config.stash.get(EVALUATOR_KEY, None)
    # Every profile's: the child session picks its profile on its own device.
    benchmarks = list({task.case_id(case): case for profile in task.spec.profiles.values()
                       for case in profile.benchmarks}.items())
    if evaluator is None and settings.devices:
        evaluator = ParallelSessions.for_config(
            config, task_dir, population.root / "sessions", settings.devices, benchmarks
        )
    elif evaluator is None:
        evaluator = ChildSession.for_config(config, task_dir, population.root / "sessions",
                                            benchmarks)
    roles = make_roles_factory(config, task, population.root)
    evolution = Evolution(
        task=task.name,
        seeds=seeds.paths,
        seed_notes=seeds.notes,
        seed_hint=f"add kernels to {task.seeds_dir}",
        population=population,
        evaluator=evaluator,
        make_roles=roles,
        preview=roles.preview,
        budget=Budget(ks.settings.evolve, settings.candidates, settings.time_limit_s),
        terminal=progress.Terminal.for_config(config),
        task_dir=task_dir,
    )
    return evolution.run()


def _timed_as(record: EvaluationRecord) -> str:
    """`` (6 of 18 benchmarks as c0001's)``: those it was not timed on, running its parent's
    code there (``sessions.same_as_entries``); "" when it was timed on all."""
    borrowed = record.timed_as()
    if not borrowed:
        return ""
    total = sum(1 for c in record.result.cases if c.kind == "bench") if record.result else 0
    return (f" ({len(borrowed)} of {total} benchmarks as "
            f"{', '.join(sorted(set(borrowed.values())))}'s)")


def _where(item_seconds: dict[str, float]) -> str:
    """Where a child session's time went, by kind of item, most first (RunResults.item_seconds);
    the rest of the session is its start-up, collection and the workers' loads."""
    kinds = sorted(((k, s) for k, s in item_seconds.items() if s >= 0.05),
                   key=lambda kv: -kv[1])
    if not kinds:
        return ""
    return (" (in items: " + ", ".join(f"{kind} {s:.1f} s" for kind, s in kinds)
            + "; the rest: the session's start and its workers' loads)")
