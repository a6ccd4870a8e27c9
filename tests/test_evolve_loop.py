"""The --evolve driver with injected roles and a synthetic evaluator: stages, resume, budgets."""

from __future__ import annotations

import io
import itertools
import subprocess
import sys
from pathlib import Path

import pytest
from evolve_fakes import (
    SEED,
    FakeEvaluator,
    ScriptedDesigner,
    ScriptedSelector,
    ScriptedWriter,
)

from pytest_kscientist.evolve.assemble import Roles
from pytest_kscientist.evolve.findings import best as best_member
from pytest_kscientist.evolve.loop import Budget, Evolution
from pytest_kscientist.evolve.offline.scientist import (
    OfflineDesigner,
    OfflineSelector,
    OfflineWriter,
)
from pytest_kscientist.evolve.population import HOST, Event, Population, PopulationWarning, now
from pytest_kscientist.evolve.progress import Terminal
from pytest_kscientist.evolve.roles import Design, TaskBrief
from pytest_kscientist.evolve.sessions import (
    ChildSession,
    EvaluationError,
    ParallelSessions,
    _plugin_args,
    to_record,
)
from pytest_kscientist.harness.results import CandidateResult, CaseResult, MachineInfo, RunResults

BRIEF = TaskBrief(name="toy", description="", reference_source="", hardware="", benchmark_ids=[])


def offline() -> Roles:
    return Roles(OfflineSelector(), OfflineDesigner(), OfflineWriter())


class Run:
    """Builds an Evolution over ``tmp_path`` and keeps what it printed."""

    def __init__(self, tmp_path: Path) -> None:
        self.seeds = tmp_path / "seeds"
        self.seeds.mkdir(exist_ok=True)
        (self.seeds / "tunable.py").write_text(SEED)
        self.root = tmp_path / "population" / "toy"
        self.out = io.StringIO()

    def __call__(
        self,
        generations: int,
        roles: Roles | None = None,
        evaluator: object | None = None,
        candidates: int = 3,
        time_limit_s: float | None = None,
        clock: object = None,
        sleep: object = None,
        reporter: object = None,
    ) -> int:
        self.pop = Population(self.root, "toy")
        self.evaluator = evaluator or FakeEvaluator()
        chosen = roles or offline()
        kwargs = {"clock": clock} if clock is not None else {}
        if sleep is not None:
            kwargs["sleep"] = sleep
        evo = Evolution(
            task="toy",
            seeds=sorted(self.seeds.glob("*.py")),
            population=self.pop,
            evaluator=self.evaluator,  # type: ignore[arg-type]
            make_roles=lambda members: (chosen, BRIEF),
            budget=Budget(generations, candidates, time_limit_s),
            terminal=Terminal(reporter) if reporter is not None else Terminal(stream=self.out),
            **kwargs,
        )
        return evo.run()

    def done(self) -> list[int]:
        return sorted(e.generation for e in self.pop.events() if e.kind == "generation_done")

    def ids(self) -> list[str]:
        return [m.id for m in self.pop.members()]


def test_each_generation_selects_designs_writes_and_evaluates(tmp_path: Path) -> None:
    run = Run(tmp_path)
    assert run(3) == 0
    members = run.pop.members()
    assert run.done() == [0, 1, 2, 3]
    assert [m.meta.generation for m in members] == [0] + [1] * 3 + [2] * 3 + [3] * 3
    evaluated = list(itertools.chain.from_iterable(run.evaluator.calls))
    assert evaluated == run.ids()  # each candidate evaluated exactly once, in order
    assert all(m.status == "passed" for m in members)
    child = members[1]
    assert child.meta.parents[0] == "c0001" and child.meta.plan and child.meta.selection
    assert child.meta.roles["writer"] == "OfflineWriter" and child.meta.explanation
    best = min(m.geomean_us or 1e9 for m in members)
    assert (members[0].geomean_us or 0) / best > 1.2
    text = run.out.getvalue()
    for stage in ("seed", "select", "design", "write", "evaluate"):
        assert f"| {stage}" in text
    # Where each child session's time went, most first, the negligible left out.
    assert (": c0001 passed (in items: bench 2.5 s, check 1.2 s; the rest: the session's start "
            "and its workers' loads)") in text
    assert "gen 3/3" in text and "over seed c0001 (tunable.py), ratios timed beside" in text
    assert "stopped: 3 generation(s) done" in text
    top = best_member(members)
    assert top is not None
    assert f"best kernel: {run.pop.source_path(top.id)}" in text
    assert f"check it again: pytest <task folder> --kernel {run.pop.source_path(top.id)}" in text
    findings = (run.root / "findings.md").read_text()
    assert "## What helped" in findings and "## Designer notes" in findings
    # every generation's notes stay, newest first
    assert findings.index("### After generation 3") < findings.index("### After generation 2")
    assert "`c0001`" in (run.root / "lineage.md").read_text()
    assert (run.root / "progress.png").read_bytes()[:4] == b"\x89PNG"


def test_rerun_continues_from_completed_generations_without_renumbering(tmp_path: Path) -> None:
    run = Run(tmp_path)
    run(1)
    assert run.ids() == ["c0001", "c0002", "c0003", "c0004"]
    assert run(1) == 0
    assert run.evaluator.calls == []  # nothing left to do: nothing evaluated again
    assert "already has 1 generation(s), as many as --evolve 1 asks" in run.out.getvalue()
    run(2)
    assert run.done() == [0, 1, 2]
    assert run.ids() == [f"c{i:04d}" for i in range(1, 8)]
    assert run.evaluator.calls == [["c0005", "c0006", "c0007"]]


def test_interrupted_generation_resumes_from_its_logged_design(tmp_path: Path) -> None:
    run = Run(tmp_path)
    first = Roles(ScriptedSelector(), ScriptedDesigner(), ScriptedWriter(interrupt_at=2))
    assert run(1, first) == int(pytest.ExitCode.INTERRUPTED)
    assert [m.status for m in run.pop.members()] == ["passed", "pending"]
    assert run.done() == [0]
    again = Roles(ScriptedSelector(), ScriptedDesigner(), ScriptedWriter())
    assert run(1, again) == 0
    assert run.evaluator.calls == [["c0002"], ["c0003", "c0004"]]  # pending first
    assert again.selector.seen == [] and again.designer.calls == 0  # the design was reused
    assert run.ids() == ["c0001", "c0002", "c0003", "c0004"] and run.done() == [0, 1]
    plans = [m.meta.plan_index for m in run.pop.members()[1:]]
    assert plans == [0, 1, 2]
    assert "resume" in run.out.getvalue()


def test_ctrl_c_during_evaluation_leaves_candidates_pending_then_evaluates_them(
    tmp_path: Path,
) -> None:
    class Interrupting(FakeEvaluator):
        def evaluate(self, kernels, timeout_s, beside=()):  # type: ignore[no-untyped-def]
            if len(self.calls) == 1:
                self.calls.append([p.stem for p in kernels])
                raise KeyboardInterrupt
            return super().evaluate(kernels, timeout_s, beside)

    run = Run(tmp_path)
    assert run(2, evaluator=Interrupting()) == 2
    assert [m.status for m in run.pop.members()] == ["passed"] + ["pending"] * 3
    assert "interrupted" in run.out.getvalue()
    assert run(2) == 0
    assert run.evaluator.calls[0] == ["c0002", "c0003", "c0004"]
    assert run.done() == [0, 1, 2] and len(run.ids()) == 7


def test_time_limit_stops_cleanly_and_a_rerun_finishes(tmp_path: Path) -> None:
    ticks = itertools.count(0, 10.0)
    run = Run(tmp_path)
    assert run(5, time_limit_s=100, clock=lambda: next(ticks)) == 0
    assert "time limit of 100 s reached" in run.out.getvalue()
    stopped_at = run.done()
    assert 0 in stopped_at and stopped_at[-1] < 5
    assert run(5) == 0
    assert run.done() == [0, 1, 2, 3, 4, 5]
    ids = run.ids()
    assert ids == [f"c{i:04d}" for i in range(1, len(ids) + 1)]
    assert all(m.status == "passed" for m in run.pop.members())


@pytest.mark.parametrize("n", [1, 2, 5])
def test_candidates_per_generation_follow_the_budget(tmp_path: Path, n: int) -> None:
    run = Run(tmp_path)
    run(2, candidates=n)
    gens = [m.meta.generation for m in run.pop.members()]
    assert gens.count(1) == n and gens.count(2) == n


def test_identical_drafts_are_stored_and_evaluated_once(tmp_path: Path) -> None:
    run = Run(tmp_path)
    roles = Roles(ScriptedSelector(), ScriptedDesigner(), ScriptedWriter(same_source=True))
    assert run(1, roles) == 0
    assert run.ids() == ["c0001", "c0002"]
    assert run.evaluator.calls == [["c0001"], ["c0002"]]
    assert run.out.getvalue().count("identical to c0002, not evaluated again") == 2


class Reporter:
    """pytest's terminal reporter as Terminal uses it: its lines, and the stats pytest's last
    line counts."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.stats: dict[str, list[object]] = {}

    def write_line(self, text: str, **markup: bool) -> None:
        self.lines.append(text)

    def write_sep(self, sep: str, title: str) -> None:
        self.lines.append(title)


def test_the_last_line_counts_only_generations_that_added_candidates(tmp_path: Path) -> None:
    """A generation whose designer proposed nothing ended the run ("the search space is
    exhausted") and was counted anyway: "2 generations" beside "population: 4 candidates in 2
    generations", seeds' generation 0 included there."""
    class DriesUp(ScriptedDesigner):
        def design(self, *args):  # type: ignore[no-untyped-def]
            found = super().design(*args)
            return found if self.calls == 1 else Design(avenues=[], plans=[], kept=[])

    run, reporter = Run(tmp_path), Reporter()
    assert run(3, Roles(ScriptedSelector(), DriesUp(), ScriptedWriter()), reporter=reporter) == 0
    assert run.done() == [0, 1, 2]
    assert "population: 4 candidates in 2 generations (4 passed, 0 failed, 0 pending)" in (
        reporter.lines)
    assert {k: len(v) for k, v in reporter.stats.items()} == {"generation": 1}
    # Nothing new at all: no generation counted (pytest then says "no tests ran").
    (tmp_path / "dry").mkdir()
    run, reporter, dry = Run(tmp_path / "dry"), Reporter(), DriesUp()
    dry.calls = 1  # its first design already made
    assert run(1, Roles(ScriptedSelector(), dry, ScriptedWriter()), reporter=reporter) == 0
    assert "population: 1 candidate in 1 generation (1 passed, 0 failed, 0 pending)" in (
        reporter.lines)
    assert reporter.stats == {}
    assert any(line.endswith("| design   | 0 avenues, 0 plans, kept 0")
               for line in reporter.lines), reporter.lines  # no title list, no colon


def test_a_failing_designer_is_logged_with_its_traceback(tmp_path: Path) -> None:
    class Broken(ScriptedDesigner):
        def design(self, *args):  # type: ignore[no-untyped-def]
            raise RuntimeError("model returned nonsense")

    run = Run(tmp_path)
    assert run(2, Roles(ScriptedSelector(), Broken(), ScriptedWriter())) == 0  # offline stood in
    assert "the designer failed: RuntimeError: model returned nonsense" in run.out.getvalue()
    failure = [e for e in run.pop.events() if e.kind == "role_failed"]
    assert "Traceback" in failure[0].data["traceback"] and run.done() == [0, 1, 2]


def test_a_failing_writer_skips_only_that_plan(tmp_path: Path) -> None:
    class Flaky(ScriptedWriter):
        def write(self, task, base, plan):  # type: ignore[no-untyped-def]
            if self.calls == 0:
                self.calls += 1
                raise ValueError("draft did not compile")
            return super().write(task, base, plan)

    run = Run(tmp_path)
    assert run(1, Roles(ScriptedSelector(), ScriptedDesigner(), Flaky())) == 0
    assert len(run.ids()) == 3
    assert "skipped: the writer failed: ValueError: draft did not compile" in run.out.getvalue()


def test_a_generation_whose_every_writer_call_failed_stays_open(tmp_path: Path) -> None:
    """An unreachable writer (no outage limit yet) wrote nothing: the plans are written again,
    twice, then the run stops with code 3 instead of counting the generation done, and the
    rerun writes them."""
    class Unreachable(ScriptedWriter):
        def write(self, task, base, plan):  # type: ignore[no-untyped-def]
            self.calls += 1
            raise ConnectionError("connection refused")

    run = Run(tmp_path)
    down = Unreachable()
    assert run(2, Roles(ScriptedSelector(), ScriptedDesigner(), down)) == 3
    text = run.out.getvalue()
    assert down.calls == 9 and "no draft came back; writing again (3 of 3)" in text
    assert ("stopped: generation 1: no writer call returned a draft in 3 attempts, the first "
            "failure: the writer failed: ConnectionError: connection refused; rerun the same "
            "command") in text
    assert run.done() == [0] and run.ids() == ["c0001"]
    writer = ScriptedWriter()
    assert run(2, Roles(ScriptedSelector(), ScriptedDesigner(), writer)) == 0
    assert run.done() == [0, 1, 2] and writer.calls == 6
    gen1 = [m for m in run.pop.members() if m.meta.generation == 1]
    assert len(gen1) == 3 and all(m.status == "passed" for m in gen1)


def test_a_round_with_no_draft_is_written_again(tmp_path: Path) -> None:
    class Once(ScriptedWriter):  # the first round's three calls fail, the next ones succeed
        def write(self, task, base, plan):  # type: ignore[no-untyped-def]
            if self.calls < 3:
                self.calls += 1
                raise ValueError("the model answered in prose")
            return super().write(task, base, plan)

    run = Run(tmp_path)
    assert run(1, Roles(ScriptedSelector(), ScriptedDesigner(), Once())) == 0
    assert "no draft came back; writing again (2 of 3)" in run.out.getvalue()
    assert len([m for m in run.pop.members() if m.meta.generation == 1]) == 3
    failed = [e for e in run.pop.events() if e.kind == "plan_done"
              and e.data["outcome"] == "write_failed"]
    assert len(failed) == 3  # the failed round stays in the log (the designer's findings)


def test_a_selector_choosing_an_unknown_base_is_replaced_for_that_generation(
        tmp_path: Path) -> None:
    class Lost(ScriptedSelector):
        def select(self, task, population, findings):  # type: ignore[no-untyped-def]
            sel = super().select(task, population, findings)
            return sel.model_copy(update={"base_id": "4050"})

    class Raises(ScriptedSelector):
        def select(self, task, population, findings):  # type: ignore[no-untyped-def]
            raise ValueError("the model answered in prose")

    for selector, said in ((Lost(), "chose base '4050'"),
                           (Raises(), "the selector failed: ValueError: the model answered")):
        (tmp_path / type(selector).__name__).mkdir()
        run = Run(tmp_path / type(selector).__name__)
        assert run(2, Roles(selector, ScriptedDesigner(), ScriptedWriter())) == 0
        out = run.out.getvalue()
        assert said in out and "the offline selector stands in for this generation" in out
        assert run.done() == [0, 1, 2]  # the run went on
        assert [e.data["role"] for e in run.pop.events() if e.kind == "role_fallback"] == [
            "selector", "selector"]


def test_a_failing_designer_is_replaced_for_that_generation(tmp_path: Path) -> None:
    class RateLimited(ScriptedDesigner):
        def design(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            raise RuntimeError("429 after 4 attempts")

    run = Run(tmp_path)
    assert run(2, Roles(ScriptedSelector(), RateLimited(), ScriptedWriter())) == 0
    out = run.out.getvalue()
    assert "the designer failed: RuntimeError: 429 after 4 attempts" in out
    assert "the offline designer stands in for this generation" in out
    assert run.done() == [0, 1, 2]
    assert [e.data["role"] for e in run.pop.events() if e.kind == "role_fallback"] == [
        "designer", "designer"]


def test_a_failing_designer_stops_the_run_when_offline_cannot_stand_in(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class Broken(ScriptedDesigner):
        def design(self, *args):  # type: ignore[no-untyped-def]
            raise RuntimeError("model returned nonsense")

    def fails(self, *args):  # type: ignore[no-untyped-def]
        raise ValueError("no knobs to vary")

    monkeypatch.setattr(OfflineDesigner, "design", fails)
    run = Run(tmp_path)
    assert run(1, Roles(ScriptedSelector(), Broken(), ScriptedWriter())) == 3
    assert ("the designer failed: RuntimeError: model returned nonsense; the offline designer "
            "could not stand in: the designer failed: ValueError: no knobs to vary"
            ) in run.out.getvalue()


def test_the_offline_selector_failing_stops_the_run(tmp_path: Path) -> None:
    class Lost(OfflineSelector):
        def select(self, task, population, findings):  # type: ignore[no-untyped-def]
            sel = super().select(task, population, findings)
            return sel.model_copy(update={"base_id": "c9999"})

    run = Run(tmp_path)
    assert run(1, Roles(Lost(), ScriptedDesigner(), ScriptedWriter())) == 3
    assert "chose base 'c9999'" in run.out.getvalue()


def test_no_passing_seed_means_nothing_to_evolve(tmp_path: Path) -> None:
    run = Run(tmp_path)
    assert run(2, evaluator=FakeEvaluator(fail={(("tile", 16), ("unroll", 1))})) == 1
    assert "no candidate passes its checks" in run.out.getvalue()
    assert "mismatch at [3]" in (run.root / "findings.md").read_text()


def test_a_child_session_error_stops_and_keeps_candidates_pending(tmp_path: Path) -> None:
    class Crashing(FakeEvaluator):
        def evaluate(self, kernels, timeout_s, beside=()):  # type: ignore[no-untyped-def]
            raise EvaluationError("child pytest session exited with code 4 without results")

    run = Run(tmp_path)
    assert run(1, evaluator=Crashing()) == 3
    assert [m.status for m in run.pop.members()] == ["pending"]
    assert "exited with code 4" in run.out.getvalue()


def test_a_corrupt_record_warns_and_the_run_goes_on(tmp_path: Path) -> None:
    run = Run(tmp_path)
    run(1)
    (run.root / "c0003" / "meta.json").write_text("{")
    with pytest.warns(PopulationWarning, match="c0003"):
        assert run(2) == 0
    assert "warning: population record" in run.out.getvalue()
    assert run.done() == [0, 1, 2]


def test_a_corrupt_result_evaluated_again_is_not_warned_about_at_the_end(tmp_path: Path) -> None:
    run = Run(tmp_path)
    run(1)
    (run.root / "c0003" / "results.json").write_text("{")
    with pytest.warns(PopulationWarning, match="c0003"):
        assert run(1) == 0
    assert run.evaluator.calls[0] == ["c0003"]  # pending again: re-evaluated, the file rewritten
    assert run.pop.members()[2].status == "passed"
    assert "warning: population record" not in run.out.getvalue()


def test_plugin_args_are_passed_on_to_the_child() -> None:
    args = ["-p", "myplug", "-pother", "-p", "no:cacheprovider", "-q", "x"]
    assert _plugin_args(args) == ["-p", "myplug", "-p", "other"]


def test_results_become_records_with_first_failure_and_bench_medians() -> None:
    run = RunResults(
        task="toy",
        task_path="t",
        profile="cpu",
        salt=1,
        started_at="s",
        machine=MachineInfo(
            hostname="h", platform="p", python="3", torch="t", device="cpu", device_name="x"
        ),
    )
    bad = CandidateResult(
        name="c0002",
        path="p",
        sha256="s",
        cases=[
            CaseResult(kind="check", case={}, case_id="n1", outcome="failed", reason="nan"),
            CaseResult(kind="check", case={}, case_id="n2", outcome="failed", reason="nan"),
        ],
    )
    record = to_record("c0002", bad, run, "r")
    assert record.status == "failed"
    assert record.failure == "check n1: nan (and 1 more failed case(s))"
    skipped = CandidateResult(
        name="c0003",
        path="p",
        sha256="s",
        cases=[CaseResult(kind="bench", case={}, case_id="b", outcome="skipped", reason="no gpu")],
    )
    # Every item skipped (a kernel for another device): not run here, not a failure.
    record = to_record("c0003", skipped, run, "r")
    assert (record.status, record.failure) == ("skipped", "not run here: no gpu")
    partly = skipped.model_copy(update={"cases": [
        CaseResult(kind="check", case={}, case_id="n1", outcome="passed"), *skipped.cases]})
    record = to_record("c0003", partly, run, "r")
    assert record.status == "failed" and "skipped: no gpu" in record.failure
    # Only compile items ran (a HIP seed off ROCm): the session says why the rest did not.
    compiled = CandidateResult(name="c0005", path="p", sha256="s", not_run="requires rocm")
    record = to_record("c0005", compiled, run, "r")
    assert (record.status, record.failure) == ("skipped", "not run here: requires rocm")
    assert "reported no result" in to_record("c0004", None, run, "r").failure


def test_a_session_on_another_case_profile_is_flagged(tmp_path: Path) -> None:
    class SwitchesProfile(FakeEvaluator):
        def evaluate(self, kernels, timeout_s, beside=()):  # type: ignore[no-untyped-def]
            run = super().evaluate(kernels, timeout_s, beside)
            return run.model_copy(update={"profile": "full" if len(self.calls) > 1 else "cpu"})

    run = Run(tmp_path)
    run(1, evaluator=SwitchesProfile())
    assert "used case profile 'full' but the population was measured with ['cpu']" in (
        run.out.getvalue()
    )


class _Session(ChildSession):
    """A ChildSession whose evaluate answers from memory (or fails), recording what it got."""

    def __init__(self, tag: str, error: EvaluationError | None = None,
                 bench_s: float = 1.0) -> None:
        super().__init__(Path("."), Path("."), [], tag=tag)
        self.error = error
        self.bench_s = bench_s
        self.got: list[tuple[list[str], tuple[str, ...]]] = []

    def evaluate(self, kernels, timeout_s, beside=(), extra=()):
        self.got.append(([p.stem for p in kernels], tuple(extra)))
        if self.error is not None:
            raise self.error
        machine = MachineInfo(hostname="h", platform="p", python="3", torch="t", device="cpu",
                              device_name="fake")
        return RunResults(task="toy", task_path="toy", profile="cpu",
                          salt=int(extra[1]) if extra else 5, started_at="now", machine=machine,
                          candidates=[CandidateResult(name=p.stem, path=str(p), sha256="0")
                                      for p in kernels],
                          item_seconds={"bench": self.bench_s, "check": 1.0})


def test_parallel_sessions_deal_kernels_out_with_one_salt_and_merge() -> None:
    sessions = [_Session("cuda:0", bench_s=20.0), _Session("cuda:1", bench_s=50.0)]
    parallel = ParallelSessions(sessions, salt_given=False)
    kernels = [Path(f"c000{i}.py") for i in (2, 3, 4)]
    run = parallel.evaluate(kernels, None)
    assert [s.got[0][0] for s in sessions] == [["c0002", "c0004"], ["c0003"]]
    salts = {s.got[0][1] for s in sessions}
    assert len(salts) == 1 and next(iter(salts))[0] == "--ks-salt"
    assert sorted(c.name for c in run.candidates) == ["c0002", "c0003", "c0004"]
    assert run.item_seconds == {"bench": 50.0, "check": 1.0}  # the slower session's
    assert parallel.label(3) == "2 child pytest sessions at once (cuda:0, cuda:1)"
    assert parallel.label(1) == "a child pytest session (cuda:0)"
    parallel.evaluate([Path("c0005.py")], None)  # one kernel: one session
    assert [len(s.got) for s in sessions] == [2, 1]


def test_parallel_sessions_raise_the_first_failure_after_all_end() -> None:
    failing = _Session("cuda:1", EvaluationError("child pytest session exited with code 4"))
    healthy = _Session("cuda:0")
    parallel = ParallelSessions([healthy, failing], salt_given=True)
    with pytest.raises(EvaluationError, match="exited with code 4"):
        parallel.evaluate([Path("c0002.py"), Path("c0003.py")], None)
    assert healthy.got == [(["c0002"], ())] and failing.got == [(["c0003"], ())]


def _other_run(run: Run, pid: int) -> Population:
    """A second run of the same population that started in process ``pid`` and stored the
    seed before this one, so this run's seed is a duplicate the other run will evaluate."""
    other = Population(run.root, "toy", run_id="other")
    start = Event(at=now(), run_id="other", pid=pid, host=HOST, kind="run_start")
    with open(run.root / "events.jsonl", "a", encoding="utf-8") as f:
        f.write(start.model_dump_json() + "\n")
    other.add(SEED, generation=0, origin="seed", seed_file="tunable.py")
    other.add(SEED + "OTHER_RUN = True\n", generation=1, origin="writer")  # still pending
    return other


def test_a_run_waits_for_a_seed_another_live_run_is_evaluating(tmp_path: Path) -> None:
    run = Run(tmp_path)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        other = _other_run(run, sleeper.pid)
        naps: list[float] = []

        def sleep(seconds: float) -> None:
            naps.append(seconds)
            done = {3: "c0001", 5: "c0002"}.get(len(naps))  # the other run's two evaluations
            if done:
                results = FakeEvaluator().evaluate([other.source_path(done)], None)
                other.record(to_record(done, results.candidates[0], results, "other"))
            if len(naps) == 3:
                other.log("generation_done", 0)  # it closed generation 0 first

        code = run(1, sleep=sleep)
    finally:
        sleeper.kill()
        sleeper.wait()
    text = run.out.getvalue()
    assert code == 0, text
    assert len(naps) == 5
    assert f"gen 0/1 | wait     | c0001 being evaluated by another run (pid {sleeper.pid})" in text
    # c0001 is the other run's to evaluate; this run evaluates only what it wrote
    assert run.evaluator.calls == [["c0003", "c0004", "c0005"]]
    # Its generation-1 candidate c0002 is part of generation 1: waited for before the close.
    assert f"gen 1/1 | wait     | c0002 being evaluated by another run (pid {sleeper.pid})" in text
    closes = [e.generation for e in run.pop.events() if e.kind == "generation_done"]
    assert closes == [0, 1]  # generation 0 closed once, by the run that closed it first
    table = text[text.index("kscientist toy: generation 1"):]
    assert "c0002  -       (no plan)                     passed" in table
    assert "0 failed, 0 pending" in table


def test_a_killed_runs_seed_is_evaluated_not_waited_for(tmp_path: Path) -> None:
    run = Run(tmp_path)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    _other_run(run, int(dead.stdout))

    def sleep(seconds: float) -> None:
        raise AssertionError("waited on a run that is no longer alive")

    assert run(1, sleep=sleep) == 0, run.out.getvalue()
    assert run.evaluator.calls[0] == ["c0001", "c0002"]  # resumed: its run is gone
    assert "wait" not in run.out.getvalue()


class WideEvaluator(FakeEvaluator):
    """Speedups beside the parent measured with an interval of a factor 4 either way: nothing
    the synthetic kernels gain is confirmed."""

    def _beside(self, result, beside):
        result = super()._beside(result, beside)
        for name, ratio in result.speedups.items():
            result.speedup_intervals[name] = [ratio / 4, ratio * 4]
        return result


def test_the_ending_says_why_a_lower_geomean_is_not_the_best(tmp_path: Path) -> None:
    """Issue 29: "best so far: the seed" beside a lower geomean in a later generation read as
    "evolution found nothing"; the ending names the lower one, its interval, and the run that
    would settle it."""
    run = Run(tmp_path)
    assert run(2, evaluator=WideEvaluator()) == 0
    members = run.pop.members()
    top = best_member(members)
    low = min((m for m in members if m.geomean_us), key=lambda m: m.geomean_us or 0)
    assert top is not None and top.meta.origin == "seed" and low.id != top.id
    text = run.out.getvalue()
    assert (f"why {low.id} is not the best: its {low.geomean_us:.1f} us (gen "
            f"{low.meta.generation}) against {top.id}'s {top.geomean_us:.1f} us compares "
            "geomeans of different sessions; ") in text, text[-2000:]
    assert "an interval that holds 1: not confirmed faster" in text
    assert (f"to settle it, time both in one run: pytest <task folder> -k bench --kernel "
            f"{run.pop.source_path(low.id)} --kernel {run.pop.source_path(top.id)}; or go on: "
            f"pytest --evolve 5 <task folder> --ks-population {run.pop.root.parent}") in text
    assert "stopped: 2 generation(s) done (" in text and " s this run)" in text


def test_the_ending_of_a_run_stopped_short_goes_on_with_the_same_command(
        tmp_path: Path) -> None:
    class Interrupted(OfflineWriter):
        def write(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            raise KeyboardInterrupt

    run = Run(tmp_path)
    assert run(2, evaluator=WideEvaluator()) == 0
    roles = Roles(OfflineSelector(), OfflineDesigner(), Interrupted())
    assert run(6, roles, evaluator=WideEvaluator()) == int(pytest.ExitCode.INTERRUPTED)
    text = run.out.getvalue()
    assert "why c0" in text  # the ending that names a command to go on
    assert (f"or go on: pytest --evolve 6 <task folder> --ks-population {run.pop.root.parent}"
            in text), text[-1500:]


def test_a_second_ctrl_c_cuts_the_ending_short_without_a_traceback(tmp_path: Path) -> None:
    class Impatient(io.StringIO):  # Ctrl-C pressed again while the lineage is printed
        def write(self, text: str) -> int:
            if "lineage of the best" in text and "cut short" not in self.getvalue():
                raise KeyboardInterrupt
            return super().write(text)

    run = Run(tmp_path)
    run.out = Impatient()
    assert run(1) == int(pytest.ExitCode.INTERRUPTED)
    text = run.out.getvalue()
    assert (f"ending cut short (Ctrl-C); everything is saved in {run.root}; rerun the same "
            "command to see it or go on") in text
    assert run.done() == [0, 1]  # the generations stay done


def test_an_ending_whose_best_is_the_lowest_adds_nothing(tmp_path: Path) -> None:
    run = Run(tmp_path)
    assert run(2) == 0
    assert "is not the best" not in run.out.getvalue()
