"""Benchmarks a candidate is not timed on because it runs another kernel's code there
(``--ks-same-as``; ``--evolve`` passes it for knob moves and grafts: issue 32)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import session_server
from helpers import AXPY, PYTEST, run_pytest
from test_baselines import _FakeEvaluator

from pytest_kscientist.evolve.sessions import ChildSession, same_as_entries
from pytest_kscientist.formats.task import load_task
from pytest_kscientist.harness.rounds import Member, bench_together

ROOT = Path(__file__).resolve().parent.parent
CASE = {"n": 1, "seed": 1}


def _members(*names: str) -> list[Member]:
    return [Member(n, lambda turn, n=n: n) for n in names]  # type: ignore[misc]


def test_a_member_running_anothers_code_is_not_timed_and_reads_as_it() -> None:
    ev = _FakeEvaluator({"a": [1.0, 2.0], "b": [9.0, 9.0], "c": [2.0, 2.0], "d": [9.0, 9.0]},
                        rounds=2)
    done = bench_together(ev, _members("a", "b", "c", "d"), [], CASE, "cpu",  # type: ignore[arg-type]
                          budget_s=1.0, same={"b": "a", "d": "a"})
    assert sorted(set(ev.log)) == ["a", "c"]  # b and d make no timed call
    a, b, c, d = (done[n].result for n in "abcd")
    assert a is not None and b is not None and c is not None and d is not None
    assert (b.timed_as, d.timed_as, a.timed_as, c.timed_as) == ("a", "a", "", "")
    assert b.stats == a.stats and b.stats is not a.stats
    one = (b.fellows["a"].speedup, b.fellows["a"].speedup_low, b.fellows["a"].speedup_high)
    assert one == (1.0, 1.0, 1.0)
    assert a.fellows["b"].speedup == b.fellows["d"].speedup == d.fellows["b"].speedup == 1.0
    # over the others: a's ratios, and theirs over b are theirs over a
    assert b.fellows["c"] == a.fellows["c"] and b.fellows["c"].speedup == pytest.approx(
        a.fellows["c"].speedup)
    assert c.fellows["b"] == c.fellows["a"] == c.fellows["d"]
    assert set(b.fellows) == {"a", "c", "d"} and set(c.fellows) == {"a", "b", "d"}


def test_a_member_whose_twin_failed_in_the_rounds_is_timed_on_its_own() -> None:
    ev = _FakeEvaluator({"b": [3.0, 3.0]}, rounds=2)
    members = [Member("a", lambda turn: "broken"), Member("b", lambda turn: "b")]
    done = bench_together(ev, members, [], CASE, "cpu", budget_s=1.0,  # type: ignore[arg-type]
                          same={"b": "a"})
    assert done["a"].failure is not None
    b = done["b"].result
    assert b is not None and b.timed_as == "" and ev.log.count("b") == 2


def test_entries_naming_no_member_or_a_chain_are_ignored() -> None:
    ev = _FakeEvaluator({"a": [1.0, 1.0], "b": [2.0, 2.0]}, rounds=2)
    done = bench_together(ev, _members("a", "b"), [], CASE, "cpu",  # type: ignore[arg-type]
                          budget_s=1.0, same={"b": "gone", "x": "a"})
    assert sorted(set(ev.log)) == ["a", "b"] and "x" not in done
    assert all(o.result is not None and not o.result.timed_as for o in done.values())


@pytest.fixture(scope="module")
def axpy_two(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The axpy task with two benchmarks, and three copies of its kernel."""
    root = tmp_path_factory.mktemp("same_as")
    shutil.copytree(AXPY, root / "axpy", ignore=shutil.ignore_patterns("seeds"))
    spec = root / "axpy" / "task.toml"
    spec.write_text(spec.read_text().replace(
        "benchmarks = [{ n = 4096, seed = 3 }]",
        "benchmarks = [{ n = 4096, seed = 3 }, { n = 8192, seed = 4 }]"))
    for name in ("a", "b", "c"):
        shutil.copy(AXPY / "seeds" / "good.py", root / f"{name}.py")
    return root


def test_a_session_times_a_benchmark_once_for_two_kernels_of_one_code(axpy_two: Path) -> None:
    (axpy_two / "same.json").write_text(json.dumps({"b": {"as": "a", "cases": ["n4096-s3"]}}))
    code, output, data = run_pytest(
        ["axpy", "--ks-device", "cpu", "--kernel", "a.py", "--kernel", "b.py", "--kernel",
         "c.py", "--ks-same-as", "same.json"], cwd=axpy_two, timeout=300)
    assert code == 0 and data is not None, output
    cases = {(c["name"], case["case_id"]): case for c in data["candidates"]
             for case in c["cases"] if case["kind"] == "bench"}
    b_same, a_same = cases[("b", "n4096-s3")], cases[("a", "n4096-s3")]
    assert b_same["timed_as"] == "a" and b_same["stats"] == a_same["stats"]
    assert b_same["fellows"]["a"]["speedup"] == 1.0
    assert cases[("b", "n8192-s4")]["timed_as"] == ""  # timed there: its own calls
    assert cases[("b", "n8192-s4")]["stats"] != cases[("a", "n8192-s4")]["stats"]
    assert cases[("c", "n4096-s3")]["fellows"]["b"] == cases[("c", "n4096-s3")]["fellows"]["a"]
    median = f"{a_same['stats']['median_us']:.2f}"
    assert any(median in line and "=a" in line for line in output.splitlines()), output
    assert "b: 1 of 2 benchmarks not timed (marked =a in the table)" in output


@pytest.mark.parametrize(("entries", "said"), [
    ("[1]", "expected a JSON object, found list"),
    ("{", "not JSON"),
    ('{"b": {"as": "b", "cases": []}}', "'b' is named as running its own code"),
    ('{"b": {"as": "a", "cases": ["n4096-s3"]}, "a": {"as": "c", "cases": []}}',
     "which is itself named as running 'c''s"),
    ('{"b": {"as": "a"}}', "the entry of 'b' is"),
    ('{"b": {"as": "nobody", "cases": ["n4096-s3"]}}', "'nobody', which is not timed beside it"),
    ('{"b": {"as": "a", "cases": ["n4096-s9"]}}', "names case id(s) n4096-s9 that no profile"),
    ('{"nobody": {"as": "a", "cases": []}}', "'nobody' names no candidate of this session"),
])
def test_a_bad_same_as_file_is_a_usage_error(axpy_two: Path, entries: str, said: str) -> None:
    (axpy_two / "bad.json").write_text(entries)
    code, output, _ = run_pytest(
        ["axpy", "--ks-device", "cpu", "--kernel", "a.py", "--kernel", "b.py", "--ks-same-as",
         "bad.json", "--co"], cwd=axpy_two, timeout=120)
    assert code == int(pytest.ExitCode.USAGE_ERROR) and said in output, output


def test_a_missing_same_as_file_is_a_usage_error(axpy_two: Path) -> None:
    code, output, _ = run_pytest(["axpy", "--kernel", "a.py", "--ks-same-as", "gone.json"],
                                 cwd=axpy_two, timeout=120)
    assert code == int(pytest.ExitCode.USAGE_ERROR)
    assert "--ks-same-as gone.json: cannot be read" in output, output


# A kernel of axpy with knobs and one shape rule, as the offline scientist reads them.
KNOBBED = '''import torch

TUNABLES = {"CHUNK": 0}
TUNABLE_SPACE = {"CHUNK": [0, 512, 1024]}
SHAPE_KEYS = ["n"]
TUNABLES_BY_SHAPE = [
    {'when': {'n': [None, 6000]}, 'knobs': {'CHUNK': SMALL}},
]


def custom_kernel(data):
    x, y, out = data
    knobs = TUNABLES_BY_SHAPE[0]["knobs"] if x.numel() < 6000 else TUNABLES  # its one rule
    chunk = knobs["CHUNK"] or x.numel()
    for i in range(0, x.numel(), chunk):
        torch.add(y[i:i + chunk], x[i:i + chunk], alpha=2, out=out[i:i + chunk])
    return out
'''


def test_evolve_child_sessions_time_a_class_move_only_where_it_moved(axpy_two: Path) -> None:
    """A child that moves the knob of one class of shapes runs its parent's code on the other
    class: its child session times it on the moved benchmark only (each child here moves
    another class)."""
    task = load_task(axpy_two / "axpy")
    benchmarks = [(task.case_id(c), c) for c in task.spec.profiles["cpu"].benchmarks]
    parent, child, other = (axpy_two / f"{n}.py" for n in ("p0001", "c0002", "c0003"))
    parent.write_text(KNOBBED.replace("SMALL", "512"))
    child.write_text(KNOBBED.replace("SMALL", "1024"))  # n < 6000 only: n4096 moved
    other.write_text(KNOBBED.replace("SMALL", "512").replace('"CHUNK": 0}', '"CHUNK": 1024}'))
    assert same_as_entries([child, other], [parent], benchmarks) == {
        "c0002": {"as": "p0001", "cases": ["n8192-s4"]},
        "c0003": {"as": "p0001", "cases": ["n4096-s3"]}}  # it moved the other class
    session = ChildSession(axpy_two / "axpy", axpy_two / "logs",
                           ["-q", "-p", "no:cacheprovider", "--ks-device", "cpu",
                            "--ks-skip-reference", "--ks-baselines", "none"],
                           cwd=axpy_two, benchmarks=benchmarks)
    run = session.evaluate([child, other], 300, beside=(parent,))
    by = {c.name: {case.case_id: case for case in c.cases if case.kind == "bench"}
          for c in run.candidates}
    assert by["c0002"]["n8192-s4"].timed_as == "p0001"
    beside = by["c0002"]["n8192-s4"].baselines["p0001"]  # the parent: a kernel timed beside
    assert by["c0002"]["n8192-s4"].stats == beside.stats and beside.speedup == 1.0
    assert by["c0002"]["n4096-s3"].baselines["p0001"].speedup != 1.0  # timed: its own calls
    assert by["c0003"]["n4096-s3"].timed_as == "p0001"
    assert by["c0002"]["n4096-s3"].timed_as == "" and by["c0003"]["n8192-s4"].timed_as == ""
    assert "--ks-same-as" in next((axpy_two / "logs").glob("*.log")).read_text()


def test_the_cuda_seeds_class_move_runs_its_parents_code_on_the_other_class() -> None:
    """On the CUDA seed's two classes (k < 1792: 6 of the 18 GPU benchmarks), a move inside
    the short-K rule leaves the 12 others on the parent's point; a move of TUNABLES that no
    rule pins moves every benchmark; another family shares none."""
    task = load_task(ROOT / "tasks" / "fp8_gemm")
    benchmarks = [(task.case_id(c), c) for c in task.spec.profiles["full"].benchmarks]
    seeds = ROOT / "tasks" / "fp8_gemm" / "seeds"
    seed = (seeds / "cuda_wgmma.py").read_text()
    rule = "{'when': {'k': [None, 1792]}, 'knobs': {'STREAM_K': 0}}"
    assert rule in seed
    moved = seed.replace(rule, rule.replace("'STREAM_K': 0}", "'STREAM_K': 0, 'GROUP_M': 4}"))
    everywhere = seed.replace('"GROUP_M": 8,', '"GROUP_M": 16,')
    from pytest_kscientist.evolve.offline.links import same_code

    same = same_code(moved, seed, [c for _, c in benchmarks])
    assert same is not None and sum(same) == 12
    assert all(kept == (case["k"] >= 1792) for kept, (_, case) in zip(same, benchmarks,
                                                                       strict=True))
    assert same_code(everywhere, seed, [c for _, c in benchmarks]) == [False] * 18
    assert same_code((seeds / "triton_fused.py").read_text(), seed,
                     [c for _, c in benchmarks]) is None


def test_evolve_refuses_a_same_as_file_of_its_own(axpy_two: Path) -> None:
    (axpy_two / "mine.json").write_text("{}")
    proc = session_server.run([*PYTEST, "--evolve", "1", "axpy", "--ks-same-as", "mine.json"],
                              cwd=axpy_two, timeout=120)
    output = proc.stdout + proc.stderr
    assert proc.returncode == int(pytest.ExitCode.USAGE_ERROR), output
    assert "--evolve cannot be combined with --ks-same-as" in output, output


def _summary(cid: str, times: dict[str, float], timed_as: dict[str, str] | None = None,
             geomean: float = 10.0) -> Any:
    from pytest_kscientist.evolve.roles import CandidateSummary

    return CandidateSummary(id=cid, generation=1, source="", status="passed",
                            geomean_us=geomean, bench_median_us=times,
                            timed_as=timed_as or {})


def _member(cid: str, times: dict[str, float], timed_as: dict[str, str]) -> Any:
    from pytest_kscientist.evolve.population import CandidateMeta, EvaluationRecord, Member
    from pytest_kscientist.harness.results import CandidateResult, CaseResult

    cases = [CaseResult(kind="bench", case={}, case_id=b, outcome="passed",
                        timed_as=timed_as.get(b, "")) for b in times]
    record = EvaluationRecord(id=cid, evaluated_at="", status="passed", geomean_us=10.0,
                              bench_median_us=times,
                              result=CandidateResult(name=cid, path="", sha256="", cases=cases))
    meta = CandidateMeta(id=cid, task="t", generation=1, sha256="", origin="writer",
                         created_at="")
    return Member(meta=meta, source="", evaluation=record)


def test_who_is_fastest_on_a_benchmark_counts_own_times_only() -> None:
    """c0003 ran c0002's code on "b2" (timed as c0002, in a later session where that code read
    faster): the findings and the LLM's table credit that time to c0002's code, the selector's
    reference counts own times only, and the base loses no benchmark to a copy of its own code
    or to a slower kernel."""
    from pytest_kscientist.evolve.findings import _winners
    from pytest_kscientist.evolve.llm.prompts import shape_table
    from pytest_kscientist.evolve.offline.scientist import OfflineSelector

    times = {"c0002": {"b1": 5.0, "b2": 8.0}, "c0003": {"b1": 4.0, "b2": 7.0},
             "c0004": {"b1": 6.0, "b2": 9.0}}
    borrowed = {"c0003": {"b2": "c0002"}}
    members = [_member(c, t, borrowed.get(c, {})) for c, t in times.items()]
    # c0003's 7.0 on b2 is c0002's code timed in c0003's session: credited to c0002
    assert _winners(members) == ["- b1: c0003 (4.0 us)", "- b2: c0002 (7.0 us)"]
    base = _summary("c0002", times["c0002"], geomean=6.0)
    passed = [base, _summary("c0003", times["c0003"], borrowed["c0003"], geomean=5.0),
              _summary("c0004", times["c0004"], geomean=7.0)]
    ref, why = OfflineSelector._reference(base, passed, passed)
    assert ref is not None and ref.id == "c0003" and why == "fastest on 1 of 2 benchmarks"
    # the base itself borrowed on b2 from c0004's code: c0004's own time there is no win
    base = _summary("c0002", {"b1": 3.0, "b2": 9.5}, {"b2": "c0004"}, geomean=6.0)
    passed = [base, _summary("c0004", times["c0004"], geomean=7.0)]
    assert OfflineSelector._reference(base, passed, passed)[1] != "fastest on 1 of 2 benchmarks"
    # the base borrowed b2 (5.0, its parent's code); a slower own time (5.5) wins nothing
    base = _summary("c0002", {"b1": 3.0, "b2": 5.0}, {"b2": "c0001"}, geomean=4.0)
    passed = [base, _summary("c0004", {"b1": 6.0, "b2": 5.5}, geomean=7.0)]
    assert OfflineSelector._reference(base, passed, passed)[1] != "fastest on 1 of 2 benchmarks"
    table = shape_table([_summary("c0002", times["c0002"], geomean=6.0),
                         _summary("c0003", times["c0003"], borrowed["c0003"], geomean=5.0)])
    row = next(line for line in table.splitlines() if line.startswith("| b2 "))
    assert "**7.0 us** (=c0002's code)" in row and "| 8.0 us |" in row, table


@pytest.mark.parametrize("select", [["axpy/task.toml::second"], ["axpy", "-k", "second"]])
def test_a_stand_in_whose_kernel_is_not_selected_is_timed_itself(
        axpy_two: Path, select: list[str]) -> None:
    """By node id (the other kernel never collected) or by -k (deselected): no usage error,
    and the stand-in is timed itself."""
    for name in ("first", "second"):
        shutil.copy(axpy_two / "a.py", axpy_two / f"{name}.py")
    (axpy_two / "same.json").write_text(json.dumps(
        {"second": {"as": "first", "cases": ["n4096-s3"]}}))
    code, output, data = run_pytest(
        [*select, "--ks-device", "cpu", "--kernel", "first.py", "--kernel", "second.py",
         "--ks-same-as", "same.json"], cwd=axpy_two, timeout=300)
    assert code == 0 and data is not None, output
    assert "first::bench" not in output
    second = next(c for c in data["candidates"] if c["name"] == "second")
    bench = [case for case in second["cases"] if case["kind"] == "bench"]
    assert len(bench) == 2 and all(case["timed_as"] == "" and case["stats"] for case in bench)
