"""Task folders -> pytest nodes: TaskFile (task.toml) -> CandidateNode -> CaseItem / GateItem.

Test ids read ``tasks/fp8_gemm/task.toml::<candidate>::check[m64-n64-k128-s6635]`` (or
``bench[...]``, ``gate[min-speedup-cublas_task_layout]``), so ``-k`` selects by candidate, kind
or case. The task's reference and its declared baselines are nodes too, collected first, after
the task's own validation item, ``<task file>::task::validate`` (task_validation.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pytest_kscientist.cuda.compile_gate import compile_items as cuda_compile_items
from pytest_kscientist.errors import CandidateFailure, GateFailure, TaskSpecError
from pytest_kscientist.formats import requires
from pytest_kscientist.formats.task import BaselineSpec, Case, Task, load_task
from pytest_kscientist.harness import attribution, benchmark_bridge, gates
from pytest_kscientist.harness.baselines import (
    Turns,
    describe,
    first_unmet,
    start_worker,
    unmet_requirement,
    yardstick_only,
)
from pytest_kscientist.harness.evaluate import file_sha256
from pytest_kscientist.harness.results import BaselineInfo, CandidateResult, CaseResult
from pytest_kscientist.harness.rounds import Lineup, Member, bench_together, order_items
from pytest_kscientist.harness.scan import KsSuspiciousCode, scan_file
from pytest_kscientist.harness.scores import floor_fraction
from pytest_kscientist.harness.session import KS_SESSION, REFERENCE_NAME, KsSession
from pytest_kscientist.harness.spawn import Worker, WorkerDied
from pytest_kscientist.harness.task_validation import NODE_NAME, TaskNode
from pytest_kscientist.hip import source as hip
from pytest_kscientist.hip.compile_gate import compile_items


def load_any(path: Path, kernelbench_tol: float = 1e-2) -> Task:
    """The task ``path`` was claimed for: task.toml, a GPU MODE task.yml or a KernelBench file
    (checked with atol = rtol = ``kernelbench_tol``)."""
    if path.name == "task.yml":
        from pytest_kscientist.formats import gpumode

        return gpumode.load_problem(path)
    if path.suffix == ".py":
        from pytest_kscientist.formats import kernelbench

        return kernelbench.load_problem(path, kernelbench_tol)
    return load_task(path.parent)


def matched_solutions(folder: Path, task: Task) -> list[Path]:
    """Candidates for ``task`` in a --ks-solutions folder: <task>.py and <task>/*.py."""
    found = [folder / f"{task.name}.py"] if (folder / f"{task.name}.py").is_file() else []
    sub = folder / task.name
    if sub.is_dir():
        found += sorted(p for p in sub.glob("*.py") if not p.name.startswith("_"))
    return found


def _draws_elsewhere(ks: KsSession, task: Task, case: Case) -> str:
    """Why a GPU MODE problem cannot run on this run's device ("" if it can): most draw their
    inputs on "cuda" whatever the device, which fails on a CPU-only machine."""
    try:
        ks.evaluator(task).inputs(case, 0)
    except Exception as exc:  # noqa: BLE001 - the problem's own code; any failure says the same
        return (f"task '{task.name}': its generate_input fails on {ks.device} "
                f"({type(exc).__name__}: {str(exc)[:200]}); run it on a GPU")
    return ""


def _has_reference_kernel(task: Task) -> bool:
    """Whether the task's reference can be timed: GPU MODE's evals never call ref_kernel, so a
    problem may lack one (it is then judged by its check_implementation alone)."""
    return task.form != "gpumode" or callable(getattr(task.module, task.reference_entry, None))


class TaskFile(pytest.File):
    """A task's spec file; collects one node per candidate."""

    def collect(self) -> Any:
        from pytest_kscientist.formats.gpumode import ProblemTask, Unsupported

        ks = self.config.stash[KS_SESSION]
        try:
            task = load_any(self.path, ks.settings.kernelbench_tol)
            profile = task.profile(ks.profile)
        except Unsupported as exc:
            pytest.skip(str(exc), allow_module_level=True)
        except TaskSpecError as exc:
            raise self.CollectError(str(exc)) from None
        if task.form == "gpumode" and not ks.device.startswith("cuda"):
            unmet = _draws_elsewhere(ks, task, profile.tests[0])
            if unmet:
                pytest.skip(unmet, allow_module_level=True)
        beside = [p.stem for p in ks.settings.beside]
        for path in ks.settings.beside:
            if path.stem in {b.name for b in task.spec.baselines}:
                raise self.CollectError(
                    f"--ks-beside {path}: task '{task.name}' already has a baseline named "
                    f"'{path.stem}'; rename the file")
            task.spec.baselines.append(BaselineSpec(
                name=path.stem, file=str(path), description="timed beside (--ks-beside)"))
        ks.tasks[task.name] = task
        if ks.settings.solutions is not None:
            candidates = matched_solutions(ks.settings.solutions, task)
            if not candidates:
                pytest.skip(f"task '{task.name}': no candidate in {ks.settings.solutions} "
                            f"(looked for {task.name}.py and {task.name}/*.py)",
                            allow_module_level=True)
        else:
            candidates = list(ks.settings.kernels) or task.seeds()
        if not candidates:
            if isinstance(task, ProblemTask):
                # One folder of many (pytest .ext/problems): a skip, not an error for the run.
                pytest.skip(task.no_candidates(), allow_module_level=True)
            raise self.CollectError(
                f"task '{task.name}': no candidates: {task.seeds_dir} holds no seed kernels and "
                "no --kernel was given; add a seed or pass --kernel PATH"
            )
        beside += self._saved_beside(ks, task, candidates)
        ks.beside.update((task.name, name) for name in beside)
        skip = self._baselines(ks, task, [p.stem for p in candidates], beside)
        yield TaskNode.from_parent(self, name=NODE_NAME, task=task)
        if profile.benchmarks and not ks.settings.skip_reference and _has_reference_kernel(task):
            yield CandidateNode.from_parent(
                self, name=REFERENCE_NAME, task=task, source=task.reference,
                entry=task.reference_entry,
                tests=[], benchmarks=profile.benchmarks, role="reference",
            )
        for spec in task.spec.baselines:
            if spec.name not in skip or spec.name in beside:
                # Left out by --ks-baselines; or a --ks-beside kernel, only timed beside others.
                continue
            yield CandidateNode.from_parent(
                self, name=spec.name, task=task, source=task.baseline_path(spec),
                entry="run" if spec.prepare else "custom_kernel",
                prepare="prepare" if spec.prepare else None, tests=profile.tests,
                benchmarks=profile.benchmarks, role="baseline", skip_reason=skip[spec.name],
                tolerate=spec.verify == "report",
            )
        for path in candidates:
            unmet = self._unmet(path, ks.device)
            if unmet:
                ks.unmet.setdefault(task.name, {})[path.stem] = CandidateResult(
                    name=path.stem, path=str(path), sha256=file_sha256(path), not_run=unmet)
            yield CandidateNode.from_parent(
                self, name=path.stem, task=task, source=path, entry=task.entry,
                tests=profile.tests, benchmarks=profile.benchmarks, skip_reason=unmet,
            )

    def _unmet(self, path: Path, device: str) -> str:
        """Why this run's device cannot run the candidate, from its KS_REQUIRES ("" if it can)."""
        try:
            missing = first_unmet(requires.declared(path), device)
            if missing is None:
                return hip.unmet_on(path, device)
        except (requires.RequiresError, hip.HipDeclarationError) as exc:
            raise self.CollectError(f"candidate {path}: {exc}") from None
        need, found = missing
        return (f"candidate '{path.stem}' requires {need} ({describe(need)}, its "
                f"{requires.NAME}), this run's device is {found}; run it on such a device")

    def _saved_beside(self, ks: KsSession, task: Task, candidates: list[Path]) -> list[str]:
        """With --ks-compare: each candidate's file as the saved run ran it (the results'
        ``source``, schema 7), timed beside it as a partner named '<stem>_saved', so the
        regression gate compares two kernels timed in the same rounds instead of two sessions'
        numbers (gates.change_beside). A saved result without its source (schema 6 and older,
        or a file over results.SOURCE_KEPT_BYTES) leaves the gate reading through the
        reference timed in both runs. Returns the partners' names."""
        run = next((r for r in ks.settings.compare_runs if r.task == task.name), None)
        if run is None:
            return []
        saved = {c.name: c.source for c in run.candidates if c.role == "candidate" and c.source}
        taken = {b.name for b in task.spec.baselines} | {p.stem for p in candidates}
        names = []
        for path in candidates:
            name = path.stem + gates.SAVED_SUFFIX
            if path.stem not in saved or name in taken or self._unmet(path, ks.device):
                continue
            copy = ks.saved_folder() / f"{name}.py"
            copy.write_text(saved[path.stem], encoding="utf-8")
            task.spec.baselines.append(BaselineSpec(
                name=name, file=str(copy),
                description=f"'{path.stem}' as {ks.settings.compare_path} ran it, timed beside "
                            "it (--ks-compare)"))
            names.append(name)
        return names

    def _baselines(self, ks: KsSession, task: Task, stems: list[str],
                   beside: list[str]) -> dict[str, str]:
        """Baselines to collect -> why their items skip ("" to run them); errors for bad names.
        ``beside``: partners only timed beside candidates (--ks-beside, the saved copies)."""
        declared = [b.name for b in task.spec.baselines]
        picked = ks.settings.baselines
        if picked is not None:
            picked = (*picked, *beside)
        known = ", ".join(declared) or "none"
        for name in picked or ():
            if name not in declared:
                raise self.CollectError(
                    f"--ks-baselines names '{name}', which task '{task.name}' does not declare "
                    f"(its baselines: {known}); fix the name, or use all or none"
                )
        for name, _ in ks.settings.min_speedup:
            if name != REFERENCE_NAME and name not in declared:
                raise self.CollectError(
                    f"--ks-min-speedup names '{name}', which task '{task.name}' does not declare "
                    f"(its baselines: {known}; or 'reference'); fix the name or declare it in "
                    f"{task.root / 'task.toml'} [[baselines]]"
                )
            if picked is not None and name != REFERENCE_NAME and name not in picked:
                raise self.CollectError(
                    f"--ks-min-speedup names '{name}', which --ks-baselines leaves out; time it "
                    "(add it to --ks-baselines) or drop the gate"
                )
        for stem in stems:
            if stem in declared or stem in (REFERENCE_NAME, NODE_NAME):
                raise self.CollectError(
                    f"candidate '{stem}' has the name of the task's {stem} node; test ids use "
                    "the file stem, so rename the candidate file"
                )
        collected: dict[str, str] = {}
        infos = []
        for spec in task.spec.baselines:
            if picked is not None and spec.name not in picked:
                reason = f"baseline '{spec.name}' left out by --ks-baselines"
            else:
                reason = collected[spec.name] = unmet_requirement(spec, ks.device)
            infos.append(BaselineInfo(
                name=spec.name, path=str(task.baseline_path(spec)), prepare=spec.prepare,
                requires=spec.requires, status="skipped" if reason else "active", reason=reason,
                verify=spec.verify,
            ))
        ks.baselines[task.name] = infos
        return collected

    def repr_failure(self, excinfo: Any, style: Any = None) -> Any:
        if isinstance(excinfo.value, self.CollectError):
            return str(excinfo.value)
        return super().repr_failure(excinfo)


class CandidateNode(pytest.Collector):
    """One candidate file of one task (or its reference, or a baseline); owns its worker."""

    def __init__(self, *, task: Task, source: Path, entry: str, tests: list[Case],
                 benchmarks: list[Case], role: str = "candidate", prepare: str | None = None,
                 skip_reason: str = "", tolerate: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.task = task
        self.source = source
        self.entry = entry
        self.prepare = prepare
        self.role = role
        self.skip_reason = skip_reason
        # A baseline declaring verify = "report": a precision miss is an xfail that keeps times.
        self.tolerate = tolerate
        self.tests = tests
        self.benchmarks = benchmarks
        self.sha256 = file_sha256(source)
        self.worker: Worker | None = None
        self.starting: Starting | None = None  # its start in the background (start_workers)
        self.turns = Turns(self.ks.settings.bench_workers)  # its rounds' workers
        self.load_failure: CandidateFailure | None = None
        self.load_shown = False  # its load_failure was raised by an item
        self.failed_check = ""  # why its benchmarks are not timed ("" to time them)
        self.attributed = False  # its profiled call (harness/attribution.py) was made
        # The last of its items in the run's order (plan_rounds): its worker lives until then,
        # across the checks and the benchmarks that the shared rounds put far apart.
        self.last_item: pytest.Item | None = None

    def collect(self) -> Any:
        items: list[pytest.Item] = []
        for case in self.tests:
            items.append(CaseItem.from_parent(self, name=f"check[{self.task.case_id(case)}]",
                                              kind="check", case=case))
        space = self.task.profile(self.ks.profile).space
        drawn = self.ks.settings.drawn if self.ks.settings.drawn is not None else (
            space.examples if space is not None else 0)
        if self.role == "candidate" and space is not None and drawn > 0:
            items.append(DrawnItem.from_parent(self, name="check[drawn]", space=space,
                                               examples=drawn))
        for case in self.benchmarks:
            items.append(CaseItem.from_parent(self, name=f"bench[{self.task.case_id(case)}]",
                                              kind="bench", case=case))
        if self.skip_reason:
            for item in items:
                item.add_marker(pytest.mark.skip(reason=self.skip_reason))
        if self.role == "candidate":
            # HIP sources are compiled for each declared target on any machine (issue 14);
            # CUDA sources for each declared sm target where the candidate cannot run.
            items[:0] = [*compile_items(self, self.source),
                         *cuda_compile_items(self, self.source, runs_here=not self.skip_reason)]
            for finding in scan_file(self.source):
                self.warn(KsSuspiciousCode(f"{self.name}: {finding}"))
            settings = self.ks.settings
            for name, factor in settings.min_speedup:
                items.append(GateItem.from_parent(self, name=f"gate[min-speedup-{name}]",
                                                  check=("min_speedup", name, factor)))
            if settings.max_regression is not None:
                items.append(GateItem.from_parent(self, name="gate[max-regression]",
                                                  check=("max_regression", "", 0.0)))
        return items

    @property
    def ks(self) -> KsSession:
        return self.config.stash[KS_SESSION]

    def live_worker(self) -> Worker:
        """The candidate's worker, spawned and loaded on first use or after a failure (its
        start in the background, when one was begun, waited for first)."""
        starting, self.starting = self.starting, None
        if starting is not None:
            starting.wait()
        return self._live()

    def _live(self) -> Worker:
        if self.load_failure is not None and not self.load_shown:
            self.load_shown = True  # a failure of start_workers' load: its item shows it whole
            raise self.load_failure
        if self.load_failure is not None:
            # The detail (a traceback) was shown at the first item; once is enough.
            where = (f"(details under the first failed item of {self.name})"
                     if self.load_failure.detail else "")
            raise CandidateFailure(self.load_failure.reason, where)
        if self.worker is not None and self.worker.alive():
            return self.worker
        self.worker = self._start()
        if self.worker.load_s is not None:
            self.ks.loads.setdefault((self.task.name, self.name), self.worker.load_s)
        return self.worker

    def _start(self) -> Worker:
        try:
            # Its first load's load_inline answers are its record's (results.InlineBuild).
            answered = self.ks.inline_builds.setdefault((self.task.name, self.name), [])
            worker = start_worker(self.task, self.source, self.entry, self.prepare,
                                  self.ks.device, self.ks.settings.timeout_s,
                                  self.ks.evaluator(self.task).init_seed, self.ks.spares,
                                  self.ks.shared_builds, None if answered else answered)
        except CandidateFailure as exc:
            self.load_failure = exc
            self.load_shown = True
            raise
        self.ks.holders.add(self)  # closed at the session's end if its last item never ran
        return worker

    def round_worker(self, turn: int) -> Worker:
        """The worker of timing round ``turn`` (``turns``; turn 0's is the one its checks ran
        in; a load failure is the candidate's, shown as at every item)."""
        return self.turns.worker(turn, self.live_worker(), self._start)

    def start_early(self) -> None:
        """Start and load the worker now (start_workers); a failure waits for the first item."""
        try:
            self._live()
        except CandidateFailure:
            self.load_shown = False

    def timeable(self) -> bool:
        """Whether its benchmarks can be timed now: not skipped, loaded, no failed check."""
        return not (self.skip_reason or self.load_failure or self.failed_check)

    def as_member(self) -> Member:
        """This node as a member of a case's shared rounds (rounds.py)."""
        def failed(exc: CandidateFailure) -> None:
            if not exc.wrong_result:
                self.drop_worker()

        return Member(self.name, self.round_worker, tolerate=self.tolerate, on_failure=failed)

    def drop_worker(self) -> None:
        if self.worker is not None:
            self.worker.close()
            self.worker = None
        self.turns.close()

    def teardown(self) -> None:
        # Not here: the run's order (checks first, then each case's benchmarks side by side)
        # leaves and re-enters a candidate's node; its last item drops the worker instead.
        pass


class CandidateItem(pytest.Item):
    """An item under a CandidateNode, marked ``kscientist``."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_marker(pytest.mark.kscientist)

    @property
    def candidate(self) -> CandidateNode:
        assert isinstance(self.parent, CandidateNode)
        return self.parent

    def teardown(self) -> None:
        if self.candidate.last_item is self:
            self.candidate.drop_worker()

    def _publish(self, **fields: Any) -> None:
        """A case's result on the report (``ks_case``), for the session and xdist."""
        cand = self.candidate
        self.user_properties.append(("ks_case", {
            "task": cand.task.name, "candidate": cand.name, "path": str(cand.source),
            "sha256": cand.sha256, "role": cand.role, "result": fields,
        }))

    def failure_head(self) -> str:
        return f"{self.candidate.name} {self.name}: "

    def repr_failure(self, excinfo: Any, style: Any = None) -> Any:
        exc = excinfo.value
        if isinstance(exc, CandidateFailure):
            text = self.failure_head() + exc.reason
            detail = _beyond(exc.reason, exc.detail.rstrip())
            if detail:
                text += "\n\n" + detail
            return text
        return super().repr_failure(excinfo)

    def reportinfo(self) -> tuple[Path, int, str]:
        return self.path, 0, f"{self.candidate.name}::{self.name}"


class CaseItem(CandidateItem):
    """A correctness check or a benchmark of one candidate on one case."""

    def __init__(self, *, kind: str, case: Case, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.kind = kind
        self.case = case
        self.attribution: attribution.Attribution | None = None  # its profiled call, if made

    def runtest(self) -> None:
        cand = self.candidate
        ks = cand.ks
        evaluator = ks.evaluator(cand.task)
        case_id = cand.task.case_id(self.case)
        try:
            if self.kind == "bench":
                ks.wait_for_starts()
            if self.kind == "bench" and cand.failed_check and cand.load_failure is None:
                raise CandidateFailure(f"not timed: {cand.failed_check}")
            worker = cand.live_worker()
            if self.kind == "check":
                result = evaluator.check(worker, self.case, tolerate=cand.tolerate)
                result.attribution = self._attribute(evaluator, worker)
            else:
                result = self._bench(worker)
        except CandidateFailure as exc:
            if not exc.wrong_result:
                # A worker that failed may hold a sticky device error or a candidate's patches:
                # start afresh next time. One that only computed a wrong result is kept.
                cand.drop_worker()
            if isinstance(exc, WorkerDied) and exc.hung:
                # Each further case would wait out the whole timeout again: fail them at once.
                cand.load_failure = CandidateFailure(
                    f"not run: the candidate hung on {self.kind} {case_id} and was killed")
            if self.kind == "check" and not cand.failed_check:
                # Timing a candidate that fails a check cannot give a passing benchmark: its
                # benchmarks fail at once instead of spending their budget (issue 10).
                cand.failed_check = f"check {case_id} failed earlier in this run"
            self._publish(kind=self.kind, case=self.case, case_id=case_id, outcome="failed",
                          reason=exc.reason, detail=exc.detail[-4000:],
                          attribution=self.attribution)
            raise
        result = yardstick_only(cand.name, result)
        self._publish(**result.model_dump())
        if result.kind == "bench":
            self._to_pytest_benchmark(result)
        if result.outcome == "xfailed":
            # Reported, not failed: the task declares this baseline a yardstick (verify =
            # "report"), so its times still count, flagged unverified.
            pytest.xfail(result.reason)

    def _attribute(self, evaluator: Any, worker: Worker) -> attribution.Attribution | None:
        """The candidate's profiled call, on its first passing check, when asked for
        (--ks-attribution) or required (--ks-min-own-share, else the task's [kernel]
        min_own_share: a candidate under it fails here; the reference and baselines are
        reported, never refused)."""
        cand = self.candidate
        minimum, source = cand.ks.settings.min_own_share, "--ks-min-own-share"
        if minimum is None:
            minimum, source = (cand.task.spec.kernel.min_own_share,
                               "the task's [kernel] min_own_share")
        if cand.attributed or not (cand.ks.settings.attribution or minimum is not None):
            return None
        cand.attributed = True
        self.attribution = evaluator.attribute(worker, self.case,
                                               cand.source.read_text(errors="replace"))
        if minimum is not None and cand.role == "candidate":
            why = attribution.refusal(self.attribution, minimum, source)
            if why:
                raise CandidateFailure(why, wrong_result=True)
        return self.attribution

    def _bench(self, worker: Worker) -> CaseResult:
        """Time the case: a candidate or the reference in the rounds its case shares with the
        other candidates and the task's active baselines; a baseline's own item alone."""
        cand, ks = self.candidate, self.candidate.ks
        if cand.role in ROUND_ROLES:
            result = self._in_rounds(worker)
        else:
            result = ks.evaluator(cand.task).bench(worker, self.case, ks.device_name,
                                                   ks.bench_budget(cand.task),
                                                   tolerate=cand.tolerate)
        result.floor_fraction = floor_fraction(result)
        return result

    def round_key(self) -> tuple[str, str]:
        return str(self.candidate.task.spec_path), self.candidate.task.case_id(self.case)

    def _in_rounds(self, worker: Worker) -> CaseResult:
        """This item's result from the rounds every selected bench item of its case shares:
        timed now when it is the first of them, else taken from what the first one timed."""
        cand, ks = self.candidate, self.candidate.ks
        evaluator, budget = ks.evaluator(cand.task), ks.bench_budget(cand.task)
        key = self.round_key()
        outcome = ks.lineup.take(key, cand.name)
        if outcome is None:
            nodes = _fellows(self, ks.lineup.planned.get(key, []))
            partners = (ks.partners_for(cand.task)
                        if any(n.role == "candidate" for n in nodes) else [])
            if len(nodes) == 1 and not partners:
                return evaluator.bench(worker, self.case, ks.device_name, budget,
                                       tolerate=cand.tolerate)
            done = bench_together(evaluator, [n.as_member() for n in nodes], partners,
                                  self.case, ks.device_name, budget)
            outcome = done.pop(cand.name)
            ks.lineup.done[key] = done
        if outcome.failure is not None:
            raise outcome.failure
        assert outcome.result is not None
        return outcome.result

    def _to_pytest_benchmark(self, result: CaseResult) -> None:
        bs = benchmark_bridge.benchmark_session(self.config)
        if bs is None:
            return
        cand = self.candidate
        extra = {"ks_task": cand.task.name, "ks_candidate": cand.name, "ks_role": cand.role,
                 "ks_sha256": cand.sha256, "floor_us": result.floor_us,
                 "clock": result.stats.clock if result.stats else "",
                 "speedups": {k: v.speedup for k, v in result.baselines.items()}}
        benchmark_bridge.record(bs, self.nodeid, f"{cand.name}::{self.name}",
                                f"{cand.task.name} {result.case_id}", result, extra)

    def failure_head(self) -> str:
        return f"{self.candidate.name} {self.kind} {self.candidate.task.case_id(self.case)}: "


# Who is timed in the shared rounds of a case (baselines are partners there, beside them).
ROUND_ROLES = ("candidate", "reference")


def _fellows(item: CaseItem, planned: list[CandidateNode]) -> list[CandidateNode]:
    """The item's candidate first, then every other node planned for the case that can still
    be timed (not skipped, loaded, no failed check), in item order."""
    own = item.candidate
    return [own, *(n for n in planned if n is not own and n.timeable())]


def plan_rounds(items: list[Any], lineup: Lineup) -> list[Any]:
    """Items in the order the shared rounds need (rounds.order_items), each selected bench
    item of a round role planned into ``lineup`` under its case."""
    def bench_key(item: Any) -> tuple[str, str] | None:
        if isinstance(item, CaseItem) and item.kind == "bench":
            return item.round_key()
        return None

    ordered = order_items(items, bench_key, lambda item: isinstance(item, GateItem))
    for item in ordered:
        if isinstance(item, CandidateItem):
            item.candidate.last_item = item
        key = bench_key(item)
        node = item.candidate if key is not None else None
        if node is not None and node.role in ROUND_ROLES and not node.skip_reason:
            lineup.plan(key, node)
    return ordered


def tag_timed(items: list[Any]) -> None:
    """Give every item of a task a ``ks_item`` property (its task and kind: check, bench,
    compile, gate, validate), so each phase's report adds its duration to the session's
    ``item_seconds`` (reports carry it under xdist too)."""
    for item in items:
        if item.get_closest_marker("kscientist") is None:
            continue
        task = getattr(item.parent, "task", None)
        if task is not None:  # every kscientist item is named <kind>[...] or <kind>
            kind = item.name.split("[", 1)[0]
            item.user_properties.append(("ks_item", {"task": task.name, "kind": kind}))


def start_workers(items: list[Any], jobs: int) -> int:
    """Begin starting and loading, ``jobs`` at a time in the background, the workers of every
    candidate (and baseline) that has an item to run; returns how many were begun.

    A worker's start (torch's import) and load (the candidate's import: a ``load_inline``
    build, a Triton compile at import) then overlap with the others' on the machine's cores and
    with the items that time nothing (task validation, checks): an item waits for its own
    candidate's start, and the first benchmark item for every start
    (``KsSession.wait_for_starts``), so no build runs beside a timed call. A load that fails is
    the candidate's failure, shown whole by its first item.
    """
    nodes: list[CandidateNode] = []
    partners: list[Any] = []
    for item in items:
        if not isinstance(item, CandidateItem):
            continue
        node = item.candidate
        if node in nodes or node.skip_reason or node.worker is not None:
            continue
        if node.load_failure is not None:
            continue
        nodes.append(node)
        if isinstance(item, CaseItem) and item.kind == "bench" and node.role == "candidate":
            partners += [p for p in node.ks.partners_for(node.task) if p not in partners]
    if len(nodes) + len(partners) < 2 or jobs < 2:
        return 0  # nothing to overlap: the first item starts its worker as before
    for node in nodes:  # made here, not by two threads at once
        node.ks.evaluator(node.task)
        _ = node.ks.spares
    gate = threading.BoundedSemaphore(jobs)
    pending = nodes[0].ks.starting
    for node in nodes:
        node.starting = Starting(node.start_early, gate, pending)
    for partner in partners:
        Starting(partner.start_early, gate, pending)
    return len(nodes) + len(partners)


class Starting(threading.Thread):
    """A worker's start in the background (``start_workers``), one of ``gate``'s at a time,
    listed in ``pending`` (its session's ``KsSession.starting``) until waited for.

    A daemon: an interrupted session does not wait for a build to end (the worker it was
    starting dies with this process, through its lifeline)."""

    def __init__(self, job: Callable[[], None], gate: threading.BoundedSemaphore,
                 pending: list[Any]) -> None:
        super().__init__(name="ks-start", daemon=True)
        self.job, self.gate = job, gate
        self.error: BaseException | None = None
        pending.append(self)
        self.start()

    def run(self) -> None:
        with self.gate:
            try:
                self.job()
            except BaseException as exc:  # noqa: BLE001 - raised again where it is waited for
                self.error = exc

    def wait(self) -> None:
        self.join()
        error, self.error = self.error, None
        if error is not None:
            raise error


class DrawnItem(CandidateItem):
    """A candidate checked on Hypothesis-drawn cases of its task's space (drawn.py)."""

    def __init__(self, *, space: Any, examples: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.space = space
        self.examples = examples

    def runtest(self) -> None:
        from pytest_kscientist.formats import drawn

        cand = self.candidate
        ks, task = cand.ks, cand.task
        evaluator = ks.evaluator(task)

        def check(case: Case) -> None:
            try:
                evaluator.check(cand.live_worker(), case)
            except CandidateFailure as exc:
                if not exc.wrong_result:
                    cand.drop_worker()
                    own = next((c for c in cand.tests if c != case), None)
                    if own is not None and _dies_at(own):
                        raise _Everywhere(case, own, exc) from None
                raise

        def _dies_at(own: Case) -> bool:
            """Whether the worker dies at the task's own case too: a crash at every shape is
            not a shape's failure (issue 29: such a candidate read "fails at m=1, n=1, k=128"
            after ~12 s of shrinking)."""
            try:
                evaluator.check(cand.live_worker(), own)
            except CandidateFailure as again:
                if not again.wrong_result:
                    cand.drop_worker()
                    return True
            return False

        try:
            cand.live_worker()  # a candidate that does not load fails here, as at every item
        except CandidateFailure as exc:
            self._publish(case={}, case_id="drawn", outcome="failed", reason=exc.reason,
                          detail=exc.detail[-4000:])
            raise
        try:
            found = drawn.falsify(self.space, task.spec.case_keys, check, ks.salt,
                                  self.examples)
        except _Everywhere as crash:
            reason = (f"{crash.failure.reason}, at the first drawn case "
                      f"({drawn.describe(crash.case)}) and at the task's own case "
                      f"{task.case_id(crash.own)} alike: "
                      "not a shape's failure, so not shrunk")
            self._publish(case=crash.case, case_id="drawn", outcome="failed", reason=reason,
                          detail=crash.failure.detail[-4000:])
            raise CandidateFailure(reason, crash.failure.detail) from None
        if found is None:
            self._publish(case={}, case_id="drawn", outcome="passed",
                          reason=f"{self.examples} drawn cases passed")
            return
        case, exc, again = found
        where = drawn.describe(case)
        note = "" if again else " (it did not fail again when replayed: flaky?)"
        reason = (f"fails at {where}: {exc.reason} (the smallest failing case of "
                  f"{self.examples} drawn{note}; reproduce with --ks-salt {ks.salt})")
        if not cand.failed_check:
            cand.failed_check = f"drawn check failed at {where} earlier in this run"
        self._publish(case=case, case_id=f"drawn {where}", outcome="failed", reason=reason,
                      detail=exc.detail[-4000:])
        raise CandidateFailure(reason, exc.detail)

    def _publish(self, **fields: Any) -> None:
        super()._publish(kind="check", **fields)

    def failure_head(self) -> str:
        return f"{self.candidate.name} drawn check: "


class _Everywhere(BaseException):
    """A drawn case's worker died and so did one on the task's own case: raised through
    Hypothesis (which shrinks only on Exception) to stop the search at once."""

    def __init__(self, case: Case, own: Case, failure: CandidateFailure) -> None:
        super().__init__(failure.reason)
        self.case = case
        self.own = own
        self.failure = failure


class GateItem(CandidateItem):
    """A performance gate on one candidate, judged from its benchmarks earlier in this run."""

    def __init__(self, *, check: tuple[str, str, float], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.check = check

    def runtest(self) -> None:
        cand = self.candidate
        ks, task = cand.ks, cand.task
        results = ks.results.get(task.name, {})
        mine = results.get(cand.name)
        kind, name, factor = self.check
        if kind == "min_speedup":
            verdict = gates.min_speedup(mine, name, factor, results,
                                        ks.skipped_baselines(task.name))
        else:
            settings = ks.settings
            assert settings.compare_path is not None and settings.max_regression is not None
            verdict = gates.max_regression(mine, task.name, ks.profile, settings.max_regression,
                                           settings.compare_path, settings.compare_runs,
                                           results.get(REFERENCE_NAME))
        self.user_properties.append(("ks_gate", {
            "task": task.name, "candidate": cand.name, "path": str(cand.source),
            "sha256": cand.sha256, "gate": self.name[len("gate["):-1],
            "outcome": verdict.outcome, "message": verdict.message,
        }))
        if verdict.outcome == "skipped":
            # Reported at the task file, like the skip marks of the baseline items, rather than
            # at this line of the plugin (the same flag pytest's own skip marks use).
            raise pytest.skip.Exception(verdict.message, _use_item_location=True)
        if verdict.outcome == "failed":
            raise GateFailure(verdict.message)

    def repr_failure(self, excinfo: Any, style: Any = None) -> Any:
        if isinstance(excinfo.value, GateFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo)


def _beyond(reason: str, detail: str) -> str:
    """What ``detail`` adds to ``reason``: without the part that repeats the reason's message
    (issue 29: shape and NaN failures printed their message twice)."""
    if not detail or detail in reason:
        return ""
    tails = [reason] + [reason[i + 2:] for i in range(len(reason)) if reason.startswith(": ", i)]
    for tail in tails:
        if tail and detail.startswith(tail):
            return detail[len(tail):].lstrip("; \n")
    return detail
