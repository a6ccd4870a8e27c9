"""Task folders -> pytest nodes: TaskFile (task.toml) -> CandidateNode -> its items (items.py:
CaseItem, DrawnItem, GateItem).

Test ids read ``tasks/fp8_gemm/task.toml::<candidate>::check[m64-n64-k128-s6635]`` (or
``bench[...]``, ``gate[min-speedup-cublas_task_layout]``), so ``-k`` selects by candidate, kind
or case. The task's reference and its declared baselines are nodes too, collected first, after
the task's own validation item, ``<task file>::task::validate`` (task_validation.py).
"""

from __future__ import annotations

import hashlib
import os
import re
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_kscientist.cuda.compile_gate import compile_items as cuda_compile_items
from pytest_kscientist.errors import CandidateFailure, TaskSpecError
from pytest_kscientist.formats import requires
from pytest_kscientist.formats.task import BaselineSpec, Case, Task, load_task
from pytest_kscientist.harness import gates
from pytest_kscientist.harness.baselines import (
    Turns,
    describe,
    first_unmet,
    start_worker,
    unmet_requirement,
)
from pytest_kscientist.harness.evaluate import file_sha256
from pytest_kscientist.harness.items import CaseItem, DrawnItem, GateItem
from pytest_kscientist.harness.results import BaselineInfo, CandidateResult
from pytest_kscientist.harness.rounds import Member
from pytest_kscientist.harness.scan import KsSuspiciousCode, scan_file
from pytest_kscientist.harness.session import KS_SESSION, REFERENCE_NAME, KsSession, kept_source
from pytest_kscientist.harness.spawn import Worker
from pytest_kscientist.harness.task_validation import NODE_NAME, TaskNode
from pytest_kscientist.hip import source as hip
from pytest_kscientist.hip.compile_gate import compile_items
from pytest_kscientist.kswarnings import KsWarning
from pytest_kscientist.options import option_name, unusable_stem

if TYPE_CHECKING:
    from pytest_kscientist.harness.starts import Starting


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


def _declares_devices(path: Path) -> bool:
    """Whether the candidate at ``path`` declares the devices it runs on (KS_REQUIRES); a
    declaration that does not read is its load failure (candidate_unmet), not a marker."""
    try:
        return bool(requires.declared(path))
    except requires.RequiresError:
        return False


def candidate_unmet(path: Path, device: str) -> tuple[str, str]:
    """(why ``device`` cannot run the candidate at ``path``, from its KS_REQUIRES, or ""; why
    its declaration itself is wrong, or "")."""
    try:
        missing = first_unmet(requires.declared(path), device)
        if missing is None:
            return hip.unmet_on(path, device), ""
    except (requires.RequiresError, hip.HipDeclarationError) as exc:
        return "", f"candidate {path}: {exc}"
    need, found = missing
    return (f"candidate '{path.stem}' requires {need} ({describe(need)}, its "
            f"{requires.NAME}), this run's device is {found}; run it on such a device"), ""


def matched_solutions(folder: Path, task: Task) -> list[Path]:
    """Candidates for ``task`` in a --ks-solutions folder: <task>.py and <task>/*.py."""
    found = [folder / f"{task.name}.py"] if (folder / f"{task.name}.py").is_file() else []
    sub = folder / task.name
    if sub.is_dir():
        found += sorted(p for p in sub.glob("*.py") if not p.name.startswith("_"))
    return found


def _distinct_name(tasks: dict[str, Task], task: Task) -> str:
    """A name for a task whose name another task of the run has (GPU MODE's pmpp and pmpp_v2
    share theirs; a copy ``fp8_gemm_v2`` of a native task keeps its ``name``): the folder
    above it joined to its own folder's name (a native task's folder may differ from its name),
    then a number. The summary and --ks-json keep one record a task; before, the two were
    merged into one."""
    own = task.root.name if task.form == "native" else task.name
    name = f"{task.root.parent.name}/{own}"
    count = 1
    while name in tasks:
        count += 1
        name = f"{task.root.parent.name}/{own}-{count}"
    return name


# A failure that says the draw wanted a device this run lacks (torch's CPU build, no driver, no
# GPU), in its message or by where it was raised (torch.cuda's lazy start).
_DEVICE_WORDS = re.compile(r"cuda|nvidia|\bgpu|accelerator|\bhip\b|rocm", re.IGNORECASE)


def _draws_elsewhere(ks: KsSession, task: Task, case: Case) -> str:
    """Why a GPU MODE problem cannot run on this run's device ("" if it can): most draw their
    inputs on "cuda" whatever the device, which fails on a CPU-only machine. Any other failure
    of its generate_input is the problem's own error, raised as a collection error."""
    try:
        ks.evaluator(task).inputs(case, 0)
    except Exception as exc:  # noqa: BLE001 - the problem's own code, judged below
        text = f"{type(exc).__name__}: {first_sentence(str(exc))}"
        frames = traceback.extract_tb(exc.__traceback__)
        if _DEVICE_WORDS.search(str(exc)) or any(
                f"{os.sep}torch{os.sep}cuda{os.sep}" in f.filename for f in frames):
            return f"task '{task.name}': its generate_input fails on {ks.device} ({text}); " \
                   "run it on a GPU"
        raise TaskSpecError(
            f"task '{task.name}': its generate_input failed on case {task.case_id(case)} "
            f"({text}), not for want of a GPU; fix the problem's reference.py") from None
    return ""


def first_sentence(text: str, limit: int = 200) -> str:
    """The first line's first sentence of ``text``, at most ``limit`` characters ("..." where
    cut): a skip or error reason that does not stop mid-phrase."""
    line = text.strip().split("\n", 1)[0]
    end = line.find(". ")
    line = line if end < 0 else line[:end + 1]
    return line if len(line) <= limit else line[:limit - 3].rstrip() + "..."


def _has_reference_kernel(task: Task) -> bool:
    """Whether the task's reference can be timed: GPU MODE's evals never call ref_kernel, so a
    problem may lack one (it is then judged by its check_implementation alone)."""
    return task.form != "gpumode" or callable(getattr(task.module, task.reference_entry, None))


class TaskFile(pytest.File):
    """A task's spec file; collects one node per candidate."""

    def collect(self) -> Any:
        nodes = list(self._nodes())
        # Its nodes' names, for the hint beside pytest's "not found" (plugin.py).
        self.config.stash[KS_SESSION].node_names[self.path] = [n.name for n in nodes]
        return nodes

    def _nodes(self) -> Any:
        from pytest_kscientist.formats.gpumode import ProblemTask, Unsupported

        ks = self.config.stash[KS_SESSION]
        try:
            task = load_any(self.path, ks.settings.kernelbench_tol)
            profile = task.profile(ks.profile, option_name(self.config, "ks_profile"))
            unmet = (_draws_elsewhere(ks, task, profile.tests[0])
                     if task.form == "gpumode" and not ks.device.startswith("cuda") else "")
        except Unsupported as exc:
            pytest.skip(str(exc), allow_module_level=True)
        except TaskSpecError as exc:
            raise self.CollectError(str(exc)) from None
        if unmet:
            pytest.skip(unmet, allow_module_level=True)
        if ks.settings.drawn and profile.space is None:
            self.warn(KsWarning(
                f"{option_name(self.config, 'ks_drawn')} {ks.settings.drawn}: task "
                f"'{task.name}' declares no [profiles.{ks.profile}.space], so no case is drawn "
                "for it; declare one (docs/formats.md, \"Drawn cases\") or drop the option"))
        beside = [p.stem for p in ks.settings.beside]
        for path in ks.settings.beside:
            if path.stem in {b.name for b in task.spec.baselines}:
                raise self.CollectError(
                    f"--ks-beside {path}: task '{task.name}' already has a baseline named "
                    f"'{path.stem}'; rename the file")
            task.spec.baselines.append(BaselineSpec(
                name=path.stem, file=str(path), description="timed beside (--ks-beside)"))
        known = ks.tasks.get(task.name)
        if known is not None and known.spec_path != task.spec_path:
            task.name = _distinct_name(ks.tasks, task)  # pmpp/sort_py beside pmpp_v2/sort_py
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
            if task.form == "kernelbench":  # one file of many (pytest level1), seeds never
                pytest.skip(f"task '{task.name}': a KernelBench problem brings no kernel of its "
                            "own; pass --kernel PATH (a file defining ModelNew) or "
                            "--ks-solutions DIR (files named after the problems)",
                            allow_module_level=True)
            raise self.CollectError(
                f"task '{task.name}': no candidates: {task.seeds_dir} holds no seed kernels and "
                "no --kernel was given; add a seed or pass --kernel PATH"
            )
        for path in candidates:  # seeds, --ks-solutions (--kernel files failed at the start)
            if why := unusable_stem(path):
                raise self.CollectError(f"task '{task.name}': candidate {path}: {why}")
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
                tolerate=spec.verify == "report", needs_device=bool(spec.requires),
            )
        for path in candidates:
            unmet, declared = candidate_unmet(path, ks.device)
            if unmet:
                ks.unmet.setdefault(task.name, {})[path.stem] = CandidateResult(
                    name=path.stem, path=str(path), sha256=file_sha256(path), not_run=unmet)
            node = CandidateNode.from_parent(
                self, name=path.stem, task=task, source=path, entry=task.entry,
                tests=profile.tests, benchmarks=profile.benchmarks, skip_reason=unmet,
                needs_device=_declares_devices(path),
            )
            if declared:  # its own declaration is wrong: its items fail, not the task's
                node.load_failure = CandidateFailure(declared)
            yield node

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
        taken = {b.name for b in task.spec.baselines} | {p.stem for p in candidates}
        names = []
        for path in candidates:
            name = path.stem + gates.SAVED_SUFFIX
            then = gates.saved_candidate(run, path.stem, kept_source(path))
            text = then.source if then is not None and then.role == "candidate" else None
            if text is None or name in taken or any(candidate_unmet(path, ks.device)):
                continue
            # One folder a task: two tasks' candidates of one stem (each GPU MODE folder's own
            # submission) got one file, and a task timed the other's kernel as its saved copy.
            folder = ks.saved_folder() / hashlib.sha256(
                str(task.spec_path).encode()).hexdigest()[:16]
            folder.mkdir(exist_ok=True)
            copy = folder / f"{name}.py"
            copy.write_text(text, encoding="utf-8")
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
        gate_option = option_name(self.config, "ks_min_speedup")
        picking = option_name(self.config, "ks_baselines")
        for name in picked or ():
            if name not in declared:
                raise self.CollectError(
                    f"{picking} names '{name}', which task '{task.name}' does not declare "
                    f"(its baselines: {known}); fix the name, or use all or none"
                )
        for name, _ in ks.settings.min_speedup:
            if name != REFERENCE_NAME and name not in declared:
                raise self.CollectError(
                    f"{gate_option} names '{name}', which task '{task.name}' does not declare "
                    f"(its baselines: {known}; or 'reference'); fix the name or declare it in "
                    f"{task.root / 'task.toml'} [[baselines]]"
                )
            if picked is not None and name != REFERENCE_NAME and name not in picked:
                raise self.CollectError(
                    f"{gate_option} names '{name}', which {picking} leaves out; time it "
                    f"(add it to {picking}) or drop the gate"
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
                 skip_reason: str = "", tolerate: bool = False, needs_device: bool = False,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # It declares the devices it runs on (KS_REQUIRES, a baseline's requires): its items
        # that run it carry the `gpu` marker, so `-m "not gpu"` leaves them out on a CPU CI.
        self.needs_device = needs_device
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
        # What workers dropped before their item's report printed (stdout, stderr): shown there.
        self.unshown = ("", "")
        self.starting: Starting | None = None  # its start in the background (start_workers)
        # Its rounds' workers (auto: KsSession.auto_workers sets the count after collection).
        self.turns = Turns(self.ks.settings.bench_workers or 1)
        self.load_failure: CandidateFailure | None = None
        self.load_shown = False  # its load_failure was raised by an item
        self.failed_check = ""  # why its benchmarks are not timed ("" to time them)
        self.attributed = False  # its profiled call (harness/attribution.py) was made
        self.noted = False  # a check's note (an output unlike the reference's) was warned of
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
        compiled: list[pytest.Item] = []
        if self.role == "candidate":
            # HIP sources are compiled for each declared target on any machine (issue 14);
            # CUDA sources for each declared sm target where the candidate cannot run.
            compiled = [*compile_items(self, self.source),
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
        # The items that run it (its compile items run anywhere): skipped where this device
        # cannot judge it (KS_REQUIRES), marked `gpu` where it declares its devices.
        for item in items:
            if self.skip_reason:
                item.add_marker(pytest.mark.skip(reason=self.skip_reason))
            if self.needs_device:
                item.add_marker(pytest.mark.gpu)
        items[:0] = compiled
        return items

    @property
    def ks(self) -> KsSession:
        return self.config.stash[KS_SESSION]

    def live_worker(self) -> Worker:
        """The candidate's worker, spawned and loaded on first use or after a failure (its
        start in the background, when one was begun, waited for first)."""
        if self.starting is not None:
            self.starting.wait()  # kept until it has ended: an interrupted wait waits again
            self.starting = None
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
        """Its own worker (turn 0's): a failure to load is the candidate's, shown at its items."""
        try:
            return self._spawn(own=True)
        except CandidateFailure as exc:
            self.load_failure = exc
            self.load_shown = True
            raise

    def _start_twin(self) -> Worker:
        """A timing twin (Turns): a failure is its round's, not the candidate's load failure.
        As ``_start``, a twin whose start failed in the background (CUDA out of memory at
        load, 16 starts past one timeout) failed every later item of a kernel whose own worker
        had passed its checks, and a broken kernel's twins hid the traceback of its load."""
        if not self.timeable():
            why = (self.load_failure.reason if self.load_failure is not None
                   else self.failed_check or self.skip_reason)
            raise CandidateFailure(f"{self.name} is not timed: {why}")
        return self._spawn(own=False)

    def _spawn(self, own: bool) -> Worker:
        # Its own first load's load_inline answers are its record's (results.InlineBuild); a
        # twin's, loading beside it, were kept too (a build and its reuses, for one build).
        answered = (self.ks.inline_builds.setdefault((self.task.name, self.name), [])
                    if own else None)
        worker = start_worker(self.task, self.source, self.entry, self.prepare,
                              self.ks.device, self.ks.settings.timeout_s,
                              self.ks.evaluator(self.task).init_seed, self.ks.spares,
                              self.ks.shared_builds, answered)
        self.ks.holders.add(self)  # closed at the session's end if its last item never ran
        return worker

    def round_worker(self, turn: int) -> Worker:
        """The worker of timing round ``turn`` (``turns``; turn 0's is the one its checks ran
        in; a load failure is the candidate's, shown as at every item)."""
        self.turns.hung_first(turn)
        return self.turns.worker(turn, self.live_worker(), self._start_twin)

    def start_early(self) -> None:
        """Start and load the worker now (start_workers); a failure waits for the first item.
        Whatever the start raised is this candidate's: raised in the background, an
        unexpected error (an OSError of the process start, a TypeError on a malformed build
        request) went to whichever item waited next, another kernel's or the session's end."""
        try:
            self._live()
        except CandidateFailure:
            self.load_shown = False
        except Exception as exc:  # noqa: BLE001 - kept as its load failure, traceback and all
            self.load_failure = CandidateFailure(
                f"failed to start its worker: {type(exc).__name__}: {exc}",
                "".join(traceback.format_exception(exc)))
            self.load_shown = False

    def timeable(self) -> bool:
        """Whether its benchmarks can be timed now: not skipped, loaded, no failed check."""
        return not (self.skip_reason or self.load_failure or self.failed_check)

    def as_member(self) -> Member:
        """This node as a member of a case's shared rounds (rounds.py)."""
        def failed(exc: CandidateFailure) -> None:
            if not exc.wrong_result:
                self.drop_worker()

        return Member(self.name, self.round_worker, tolerate=self.tolerate,
                      trusted=self.trusted(), on_failure=failed)

    def trusted(self) -> str:
        """Who this node is when it runs the task's own code ("" for a candidate)."""
        return {"reference": "the task's reference",
                "baseline": f"baseline '{self.name}'"}.get(self.role, "")

    def printed(self) -> tuple[str, str]:
        """What its workers (its own and its timing twins) wrote to stdout and to stderr since
        the last look."""
        found = [self.unshown, *(w.new_output() for w in self.turns.live(self.worker))]
        self.unshown = ("", "")
        return "".join(out for out, _ in found), "".join(err for _, err in found)

    def drop_worker(self) -> None:
        # A failed item drops its worker before its report is made: keep what it printed.
        self.unshown = self.printed()
        if self.worker is not None:
            self.worker.close()
            self.worker = None
        self.turns.close()

    def teardown(self) -> None:
        # Not here: the run's order (checks first, then each case's benchmarks side by side)
        # leaves and re-enters a candidate's node; its last item drops the worker instead.
        pass
