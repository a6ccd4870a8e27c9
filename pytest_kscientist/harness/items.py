"""The items under a candidate's node (collect.CandidateNode): its checks and benchmarks
(CaseItem), its check on drawn cases (DrawnItem), its performance gates (GateItem); and the
order the session runs them in (``plan_rounds``: each case's benchmarks side by side, in the
shared rounds of rounds.py).
"""

from __future__ import annotations

import functools
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pytest

from pytest_kscientist.errors import CandidateFailure, GateFailure, ReferenceFailed
from pytest_kscientist.formats.task import Case
from pytest_kscientist.harness import attribution, benchmark_bridge, gates
from pytest_kscientist.harness.baselines import yardstick_only
from pytest_kscientist.harness.failures import def_line, failure_repr, raised_line
from pytest_kscientist.harness.results import CaseResult, report_property
from pytest_kscientist.harness.rounds import Lineup, Outcome, bench_together, order_items
from pytest_kscientist.harness.scores import floor_fraction
from pytest_kscientist.harness.session import REFERENCE_NAME
from pytest_kscientist.harness.spawn import MachineFailed, Worker, WorkerDied
from pytest_kscientist.kswarnings import KsGateDeselected, KsGateUndecided, KsUnlikeOutput

if TYPE_CHECKING:
    from pytest_kscientist.harness.collect import CandidateNode


class CandidateItem(pytest.Item):
    """An item under a CandidateNode, marked ``kscientist``; never rerun by
    pytest-rerunfailures (``--reruns``): a kernel that returned a wrong output once is wrong,
    and under ``-k check --reruns 2`` one that did so in 1 of 2 calls passed its run."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_marker(pytest.mark.kscientist)
        if self.config.pluginmanager.hasplugin("rerunfailures"):
            self.add_marker(pytest.mark.flaky(reruns=0))  # its marker outranks --reruns

    @property
    def candidate(self) -> CandidateNode:
        """Its parent: items are made only by CandidateNode.collect."""
        return cast("CandidateNode", self.parent)

    def teardown(self) -> None:
        if self.candidate.last_item is self:
            self.candidate.drop_worker()

    def _publish(self, **fields: Any) -> None:
        """A case's result on the report (``ks_case``), for the session and xdist."""
        cand = self.candidate
        self.user_properties.append(("ks_case", report_property({
            "task": cand.task.name, "candidate": cand.name, "path": str(cand.source),
            "sha256": cand.sha256, "role": cand.role, "result": fields,
        })))

    def _note_machine(self, exc: CandidateFailure) -> None:
        """A worker that did not start (spawn.MachineFailed) failed this item: on the report,
        for the run's results (``machine_failures``), since it is no verdict on the kernel."""
        if isinstance(exc, MachineFailed):
            self.user_properties.append(("ks_machine_failure", report_property(
                {"task": self.candidate.task.name, "cause": exc.cause})))

    def failure_head(self) -> str:
        return f"{self.candidate.name} {self.name}: "

    def repr_failure(self, excinfo: Any, style: Any = None) -> Any:
        exc = excinfo.value
        if isinstance(exc, CandidateFailure):
            text = self.failure_head() + exc.reason
            detail = _beyond(exc.reason, exc.detail.rstrip())
            if detail:
                text += "\n\n" + detail
            cand = self.candidate
            # The line that raised (a traceback's last frame in the file), else the entry's.
            return failure_repr(self, text, cand.source,
                                lambda: raised_line(exc.detail, cand.source)
                                or def_line(cand.source, cand.entry))
        if isinstance(exc, ReferenceFailed):  # the task's fault: its message, no traceback
            return failure_repr(self, self.failure_head() + str(exc), *exc.where)
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
        if kind == "bench":
            # A benchmark to pytest-benchmark's --benchmark-only (kept) and --benchmark-skip
            # (skipped), which look for its fixture among an item's names; none is set up (the
            # timings reach pytest-benchmark through benchmark_bridge).
            self.fixturenames = ("benchmark",)

    def runtest(self) -> None:
        cand = self.candidate
        ks = cand.ks
        evaluator = ks.evaluator(cand.task)
        case_id = cand.task.case_id(self.case)
        try:
            if self.kind == "bench":
                ks.wait_for_starts(warm=False)  # builds: not under the GPU's lock
            with ks.device_turn(self.nodeid):
                result = self._run(evaluator, case_id)
        except CandidateFailure as exc:
            self._note_machine(exc)
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
        except ReferenceFailed as exc:  # the task's fault: the candidate was not judged
            if self.kind == "check" and not cand.failed_check:
                cand.failed_check = f"check {case_id} could not be judged"
            self._publish(kind=self.kind, case=self.case, case_id=case_id, outcome="failed",
                          reason=str(exc))
            raise
        result = yardstick_only(cand.name, result)
        self._publish(**result.model_dump(mode="json"))
        if result.kind == "bench":
            self._to_pytest_benchmark(result)
        if result.outcome == "xfailed":
            # Reported, not failed: the task declares this baseline a yardstick (verify =
            # "report"), so its times still count, flagged unverified.
            pytest.xfail(result.reason)

    def _run(self, evaluator: Any, case_id: str) -> CaseResult:
        """The check or the benchmark, with the GPU to this session (``device_turn``)."""
        cand = self.candidate
        if self.kind == "bench":
            cand.ks.wait_for_starts()  # the first calls, under the lock: they run kernels
        if self.kind == "bench" and cand.failed_check and cand.load_failure is None:
            raise CandidateFailure(f"not timed: {cand.failed_check}")
        worker = cand.live_worker()
        if self.kind != "check":
            return self._bench(worker)
        result = evaluator.check(worker, self.case, tolerate=cand.tolerate)
        result.attribution = self._attribute(evaluator, worker)
        if result.note and not cand.noted:
            cand.noted = True  # once a candidate: its other cases say the same
            # At the candidate's entry point, not the item's file (a GPU MODE folder's
            # task.yml:1 said nothing about which kernel).
            warnings.warn_explicit(
                KsUnlikeOutput(f"{cand.name} {case_id}: {result.note}"), None,
                str(cand.source), def_line(cand.source, cand.entry))
        return result

    def _attribute(self, evaluator: Any, worker: Worker) -> attribution.Attribution | None:
        """The candidate's profiled call, on its first passing check, when asked for
        (--ks-attribution) or required (--ks-min-own-share, else the task's [kernel]
        min_own_share: a candidate under it fails here; the reference and baselines are
        reported, never refused)."""
        cand = self.candidate
        minimum = cand.ks.settings.min_own_share
        source = cand.ks.settings.quoted("ks_min_own_share")
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
                                                   tolerate=cand.tolerate,
                                                   trusted=cand.trusted())
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
                                       tolerate=cand.tolerate, trusted=cand.trusted())
            case_id = cand.task.case_id(self.case)
            same = {stem: other for stem, (other, cases) in ks.settings.same_as.items()
                    if case_id in cases}
            try:
                done = bench_together(
                    evaluator, [n.as_member() for n in nodes], partners, self.case,
                    ks.device_name, budget, same=same,
                    fewer_workers=functools.partial(ks.fewer_workers, cand.task.name))
            except ReferenceFailed as exc:  # every member's item says so, none times again
                done = {n.name: Outcome(reference=exc) for n in nodes}
            outcome = done.pop(cand.name)
            ks.lineup.done[key] = done
        if outcome.reference is not None:
            raise outcome.reference
        if outcome.failure is not None:
            raise outcome.failure
        assert outcome.result is not None
        return outcome.result

    def _to_pytest_benchmark(self, result: CaseResult) -> None:
        bs = benchmark_bridge.benchmark_session(self.config)
        if bs is None or result.timed_as:  # another kernel's calls: not this item's to report
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


def _bench_key(item: Any) -> tuple[str, str] | None:
    if isinstance(item, CaseItem) and item.kind == "bench":
        return item.round_key()
    return None


def in_round_order(items: list[Any]) -> list[Any]:
    """Items in the order the shared rounds need (rounds.order_items)."""
    return order_items(items, _bench_key, lambda item: isinstance(item, GateItem))


def plan_rounds(items: list[Any], lineup: Lineup) -> list[Any]:
    """Items in the order the shared rounds need, each selected bench item of a round role
    planned into ``lineup`` under its case."""
    ordered = in_round_order(items)
    for item in ordered:
        if isinstance(item, CandidateItem):
            item.candidate.last_item = item
        key = _bench_key(item)
        node = item.candidate if key is not None else None
        if node is not None and node.role in ROUND_ROLES and not node.skip_reason:
            lineup.plan(key, node)
    return ordered


def check_same_as(lineup: Lineup, same_as: dict[str, tuple[str, frozenset[str]]],
                  known: set[str]) -> None:
    """A usage error for a --ks-same-as entry that names no kernel of the session, or whose
    candidate is timed here beside no kernel of that name (``known``: --ks-beside's and
    --kernel's stems and the candidates deselected, whose entries are no typos), or that names
    a case id none of the candidate's tasks' profiles benchmarks."""
    if not same_as:
        return
    timed: dict[str, set[str]] = {}  # candidate -> the kernels timed in its tasks' rounds
    ids: dict[str, set[str]] = {}  # candidate -> the benchmark ids of its tasks, every profile
    for nodes in lineup.planned.values():
        for node in nodes:
            timed.setdefault(node.name, set()).update(n.name for n in nodes)
            task = node.task
            ids.setdefault(node.name, set()).update(
                task.case_id(c) for p in task.spec.profiles.values() for c in p.benchmarks)
    for stem, (other, cases) in same_as.items():
        if stem not in timed:
            if stem not in known:
                raise pytest.UsageError(
                    f"--ks-same-as: '{stem}' names no candidate of this session; use the file "
                    "stem of a --kernel (or seed) the run collects")
            continue  # given, but not selected here
        if other not in timed[stem] | known:
            raise pytest.UsageError(
                f"--ks-same-as: '{stem}' is named as running the code of '{other}', which is not "
                f"timed beside it in this session; add --ks-beside {other}.py (or --kernel) or "
                "drop the entry")
        unknown = sorted(cases - ids[stem])
        if unknown:
            some = ", ".join(sorted(ids[stem])[:3])
            raise pytest.UsageError(
                f"--ks-same-as: '{stem}' names case id(s) {', '.join(unknown[:3])} that no "
                f"profile of its task benchmarks (its ids read like {some}); use the ids of "
                "--ks-json's bench cases")


PRINTED_MARGIN = "| "


def show_printed(item: pytest.Item, call: pytest.CallInfo[None]) -> None:
    """A candidate item's report gets what the candidate printed since its previous item, its
    stdout and its stderr each as the captured-output section pytest's own capture makes
    (shown under a failure, with -rP, in JUnit's system-out and system-err); with -s they go
    to the terminal's, with --capture=tee-sys to both. Not after its worker died: the failure
    quotes the logs' tails."""
    if not isinstance(item, CandidateItem):
        return
    printed = item.candidate.printed()
    if call.excinfo is not None and isinstance(call.excinfo.value, WorkerDied):
        return
    capture = item.config.getoption("capture")
    for name, text in zip(("stdout", "stderr"), printed, strict=True):
        if not text:
            continue
        # Each line behind a margin: untrusted code must not print lines that read as pytest's
        # own (the corpus's fake_records prints "PASSED ...::fake_records::check").
        text = "".join(PRINTED_MARGIN + line for line in text.splitlines(keepends=True))
        if capture in ("no", "tee-sys"):  # tee-sys: shown as printed, and kept in the report
            stream = sys.stdout if name == "stdout" else sys.stderr
            stream.write(text)
            stream.flush()
            if capture == "no":
                continue
        # "Captured stdout call" / "Captured stderr call", the sections pytest's own capture
        # makes: --show-capture and JUnit's system-out / system-err (junit_logging) read them
        # by those names.
        item.add_report_section("call", name, text)


def keep_gates_judged(items: list[Any]) -> None:
    """Take pytest-benchmark's ``--benchmark-only`` skip off the gates: they judge the
    benchmarks that flag keeps. (Named as benchmarks, they would be skipped by its
    ``--benchmark-skip`` instead, and a gate asked for must not pass unjudged: there they run,
    and fail as not judged.)"""
    for item in items:
        if isinstance(item, GateItem):
            item.own_markers[:] = [
                mark for mark in item.own_markers
                if mark.name != "skip" or "--benchmark-only" not in mark.kwargs.get("reason", "")]


def warn_deselected_gates(gates: list[Any], items: list[Any]) -> None:
    """Warn, at the gate, for each gate deselected (``-k``/``-m``) while a benchmark of its
    candidate is selected: the run would otherwise pass without the judgement its command line
    asked for."""
    benched = {id(item.parent) for item in items
               if isinstance(item, CaseItem) and item.kind == "bench"}
    for gate in gates:
        if id(gate.parent) not in benched:
            continue
        warning = KsGateDeselected(
            f"{gate.nodeid} was deselected while {gate.candidate.name}'s benchmarks run, so "
            "this gate is not judged in this run; select it too (-k 'bench or gate', or a -k "
            "expression that its name matches)")
        try:
            gate.warn(warning)
        except KsGateDeselected:  # -W error or filterwarnings = error: raised, not shown
            raise pytest.UsageError(f"{warning} (a warning made an error by -W or "
                                    "filterwarnings)") from None


def tag_timed(items: list[Any], baselines: dict[str, list[Any]]) -> None:
    """Give every item of a task a ``ks_item`` property (its task, kind: check, bench,
    compile, gate, validate, and the task's folder), so each phase's report adds its duration
    to the session's ``item_seconds`` (reports carry it under xdist too, where the controller
    collects no task and learns the folders from them). The first item of each task carries
    the task's ``baselines`` too (the summary's columns and the JSON's, --ks-beside and
    --ks-compare's saved kernels among them), which the controller has no other way to learn."""
    told: set[str] = set()
    for item in items:
        if item.get_closest_marker("kscientist") is None:
            continue
        task = getattr(item.parent, "task", None)
        if task is not None:  # every kscientist item is named <kind>[...] or <kind>
            kind = item.name.split("[", 1)[0]
            tag: dict[str, Any] = {"task": task.name, "kind": kind, "task_path": str(task.root)}
            if task.name not in told:
                told.add(task.name)
                tag["baselines"] = [b.model_dump(mode="json")
                                    for b in baselines.get(task.name, [])]
            item.user_properties.append(("ks_item", report_property(tag)))


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
            except ReferenceFailed as exc:  # the task's fault: stop, nothing to shrink
                raise _ReferenceRaised(case, exc) from None
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
            self._note_machine(exc)
            self._publish(case={}, case_id="drawn", outcome="failed", reason=exc.reason,
                          detail=exc.detail[-4000:])
            raise
        try:
            with ks.device_turn(self.nodeid):
                found = drawn.falsify(self.space, task.spec.case_keys, check, ks.salt,
                                      self.examples)
        except _ReferenceRaised as raised:
            if not cand.failed_check:
                cand.failed_check = "a drawn check could not be judged"
            where = drawn.describe(raised.case)
            self._publish(case=raised.case, case_id=f"drawn {where}", outcome="failed",
                          reason=f"at {where}: {raised.error}")
            raise ReferenceFailed(f"at {where}: {raised.error}", raised.error.where) from None
        except _Everywhere as crash:
            self._note_machine(crash.failure)
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
        reason = (f"fails at {where}: {exc.reason} (shrunk by Hypothesis, "
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


class _ReferenceRaised(BaseException):
    """The task's reference raised on a drawn case: raised through Hypothesis (which shrinks
    only on Exception) to stop the search at once."""

    def __init__(self, case: Case, error: ReferenceFailed) -> None:
        super().__init__(str(error))
        self.case = case
        self.error = error


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
        # A gate judges benchmarks: `-k bench` (the README's form) keeps it beside them, and so
        # does pytest-benchmark's --benchmark-only (keep_gates_judged); its --benchmark-skip
        # leaves the gate to fail as not judged.
        self.extra_keyword_matches.add("bench")

    def runtest(self) -> None:
        cand = self.candidate
        ks, task = cand.ks, cand.task
        results = ks.results.get(task.name, {})
        mine = results.get(cand.name)
        kind, name, factor = self.check
        if kind == "min_speedup":
            verdict = gates.min_speedup(cand.name, mine, name, factor, results,
                                        ks.skipped_baselines(task.name),
                                        ks.settings.quoted("ks_min_speedup"))
        else:
            settings = ks.settings
            assert settings.compare_path is not None and settings.max_regression is not None
            verdict = gates.max_regression(cand.name, mine, task.name, ks.profile,
                                           settings.max_regression, settings.compare_path,
                                           settings.compare_runs, results.get(REFERENCE_NAME),
                                           settings.quoted("ks_max_regression"),
                                           settings.quoted("ks_compare"), ks.machine())
        self.user_properties.append(("ks_gate", report_property({
            "task": task.name, "candidate": cand.name, "path": str(cand.source),
            "sha256": cand.sha256, "gate": self.name[len("gate["):-1],
            "outcome": verdict.outcome, "message": verdict.message,
        })))
        if verdict.undecided:  # a pass the terminal must show: its line said so only in JSON
            self.warn(KsGateUndecided(verdict.message))
        if verdict.outcome == "skipped":
            # Reported at the task file, like the skip marks of the baseline items, rather than
            # at this line of the plugin (the same flag pytest's own skip marks use).
            raise pytest.skip.Exception(verdict.message, _use_item_location=True)
        if verdict.outcome == "failed":
            raise GateFailure(verdict.message)

    def repr_failure(self, excinfo: Any, style: Any = None) -> Any:
        if isinstance(excinfo.value, GateFailure):
            return failure_repr(self, str(excinfo.value), self.path)
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


