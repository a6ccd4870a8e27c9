"""Every candidate of a session timed in the same rounds per case (harness/rounds.py)."""

from __future__ import annotations

import re
import shutil
import types
from pathlib import Path
from typing import Any

import pytest
from helpers import AXPY, DATA, run_pytest
from test_baselines import _FakeEvaluator, _FakePartner

from pytest_kscientist.errors import CandidateFailure
from pytest_kscientist.harness.baselines import Turns
from pytest_kscientist.harness.rounds import (
    Member,
    bench_together,
    order_items,
    round_order,
    spread,
)
from pytest_kscientist.harness.session import auto_counts
from pytest_kscientist.harness.stats import geomean, rounds_centre, spread_interval


def test_members_and_partners_share_mirrored_rounds_and_pair_up() -> None:
    ev = _FakeEvaluator({"a": [1.0, 2.0], "b": [2.0, 2.0], "p": [4.0, 4.0]}, rounds=2)
    dropped: list[str] = []
    members = [Member("a", lambda turn: "a"),
               Member("b", lambda turn: "b", on_failure=dropped.append)]
    done = bench_together(ev, members, [_FakePartner("p")], {"n": 1, "seed": 1}, "cpu",  # type: ignore[arg-type, list-item]
                          budget_s=1.0)
    assert ev.log == ["a", "b", "p", "p", "b", "a"]
    a, b = done["a"].result, done["b"].result
    assert a is not None and b is not None and not dropped
    # per round b/a = 2/1 then 2/2: a's speedup over b is their geomean; b's over a the inverse
    assert a.fellows["b"].speedup == pytest.approx(geomean([2.0, 1.0]))
    assert b.fellows["a"].speedup == pytest.approx(1 / geomean([2.0, 1.0]))
    assert a.baselines["p"].speedup == pytest.approx(geomean([4.0, 2.0]))
    assert b.baselines["p"].speedup == pytest.approx(2.0)
    full = ev.task.spec.bench.verify_samples  # axpy's 2 a round (of four or fewer rounds)
    assert ev.samples["a"] == {full} and ev.samples["p"] == {1}  # members keep the full sample


def test_a_kernel_beside_is_verified_like_a_candidate() -> None:
    """A trusted baseline verifies one output a round; a kernel timed beside as the
    candidates' own kind (--ks-beside, --ks-compare's saved copy) the task's full sample, so
    both sides of an A/A do the same untimed work between calls."""
    ev = _FakeEvaluator({"a": [1.0, 1.0], "saved": [1.0, 1.0], "cublas": [2.0, 2.0]},
                        rounds=2)
    saved = _FakePartner("saved")
    saved.full_sample = True  # type: ignore[attr-defined]
    bench_together(ev, [Member("a", lambda turn: "a")], [saved, _FakePartner("cublas")],  # type: ignore[list-item]
                   {"n": 1, "seed": 1}, "cpu", budget_s=1.0)
    full = ev.task.spec.bench.verify_samples
    assert ev.samples == {"a": {full}, "saved": {full}, "cublas": {1}}


def test_rounds_in_two_workers_put_a_workers_bias_into_the_interval() -> None:
    """--ks-bench-workers 2: each member's rounds alternate between its two workers. One worker
    of "a" runs 20% slower for its whole life (as a process on the 2-core CPU did): the ratio
    of a to its identical twin b moves, but the rounds disagree, and the interval, widened to
    their spread, holds no difference."""
    ev = _FakeEvaluator({"a0": [1.0, 1.0], "a1": [1.2, 1.2], "b0": [1.0, 1.0],
                         "b1": [1.0, 1.0]}, rounds=4)
    members = [Member("a", lambda turn: f"a{turn % 2}"),
               Member("b", lambda turn: f"b{turn % 2}")]
    done = bench_together(ev, members, [], {"n": 1, "seed": 1}, "cpu", budget_s=1.0)  # type: ignore[arg-type]
    assert ev.log == [f"{'ab'[i]}{r % 2}" for r in range(4) for i in round_order(2, r)]
    a = done["a"].result
    assert a is not None
    ab = a.fellows["b"]
    assert ab.speedup == pytest.approx(geomean([1.0, 1 / 1.2, 1.0, 1 / 1.2]))
    assert ab.speedup_low < 0.8 and ab.speedup_high > 1.0, ab  # each round alone: exact
    # the same bias in one worker of each kind would have read as a difference
    ev = _FakeEvaluator({"a": [1.2] * 4, "b": [1.0] * 4}, rounds=4)
    members = [Member("a", lambda turn: "a"), Member("b", lambda turn: "b")]
    done = bench_together(ev, members, [], {"n": 1, "seed": 1}, "cpu", budget_s=1.0)  # type: ignore[arg-type]
    one = done["a"].result
    assert one is not None and one.fellows["b"].speedup_high == pytest.approx(1 / 1.2)


def test_one_slowed_round_moves_the_ratio_little_and_a_slower_kernel_fully() -> None:
    """Two copies of one kernel, one round of four where "a" alone was slowed by 45% for its
    whole turn (the 2-core CPU: one round read 0.69 while the others read 0.99-1.01): the
    rounds' median keeps the ratio at 1 where their geomean read 0.91; the interval, widened to
    the rounds' spread, still says the rounds disagreed. A kernel 10% slower in every round
    reads 10% slower."""
    ev = _FakeEvaluator({"a": [1.0, 1.45, 1.0, 1.0], "b": [1.0] * 4}, rounds=4)
    members = [Member("a", lambda turn: "a"), Member("b", lambda turn: "b")]
    done = bench_together(ev, members, [], {"n": 1, "seed": 1}, "cpu", budget_s=1.0)  # type: ignore[arg-type]
    ab = done["a"].result.fellows["b"]  # type: ignore[union-attr]
    assert ab.round_speedups == pytest.approx([1.0, 1 / 1.45, 1.0, 1.0])
    assert ab.speedup == pytest.approx(1.0)
    assert geomean(ab.round_speedups) < 0.92  # what the geomean would have said
    assert ab.speedup_low < 0.8 and ab.speedup_high >= 1.0, ab
    # a's own median interval takes in its rounds' disagreement too: the copies' intervals
    # overlap (pooled calls alone, nine at 1.0 and three at 1.45, would not say it)
    a_stats, b_stats = done["a"].result.stats, done["b"].result.stats  # type: ignore[union-attr]
    assert a_stats.median_us == pytest.approx(1.0) and b_stats.ci_high_us == pytest.approx(1.0)
    assert a_stats.ci_low_us < 0.9 < 1.4 < a_stats.ci_high_us, a_stats
    ev = _FakeEvaluator({"a": [1.1] * 4, "b": [1.0] * 4}, rounds=4)
    done = bench_together(ev, members, [], {"n": 1, "seed": 1}, "cpu", budget_s=1.0)  # type: ignore[arg-type]
    ab = done["a"].result.fellows["b"]  # type: ignore[union-attr]
    assert ab.speedup == pytest.approx(1 / 1.1) and ab.speedup_high < 1.0, ab


def test_rounds_centre_is_the_median_on_the_log_scale() -> None:
    assert rounds_centre([2.0]) == pytest.approx(2.0)
    assert rounds_centre([2.0, 0.5]) == pytest.approx(1.0)  # two rounds: their geomean
    assert rounds_centre([1.0, 4.0, 1.0]) == pytest.approx(1.0)
    assert rounds_centre([1.0, 2.0, 4.0, 100.0]) == pytest.approx(geomean([2.0, 4.0]))
    with pytest.raises(ValueError, match="positive ratios"):
        rounds_centre([1.0, 0.0])


def test_turns_give_each_round_its_worker_and_start_twins_once() -> None:
    """Turns (--ks-bench-workers 3): round r takes turn r % 3; turn 0 is the kernel's own
    worker, the twins are started on first use and again only once one died."""
    class FakeWorker:
        def __init__(self, name: str) -> None:
            self.name, self.up = name, True

        def alive(self) -> bool:
            return self.up

        def close(self) -> None:
            self.up = False

    started: list[FakeWorker] = []

    def start() -> FakeWorker:
        started.append(FakeWorker(f"twin{len(started)}"))
        return started[-1]

    own = FakeWorker("own")
    turns = Turns(3)
    names = [turns.worker(r, own, start).name for r in range(6)]  # type: ignore[arg-type]
    assert names == ["own", "twin0", "twin1", "own", "twin0", "twin1"]
    started[0].up = False  # twin0 died: the next round of its turn starts another
    assert turns.worker(1, own, start).name == "twin2"  # type: ignore[arg-type]
    turns.close()
    assert turns.twins == {} and not any(w.up for w in started) and own.up
    # started ahead (starts.start_workers): the rounds find them; a twin that failed to load
    # is left for its round, which starts it again and fails as the kernel
    ahead = Turns(3)
    ahead.start_ahead(1, start)  # type: ignore[arg-type]
    assert ahead.worker(1, own, start).name == "twin3"  # type: ignore[arg-type]

    def broken() -> FakeWorker:
        raise CandidateFailure("failed to load: boom")

    ahead.start_ahead(2, broken)  # type: ignore[arg-type]
    assert 2 not in ahead.twins
    with pytest.raises(CandidateFailure, match="boom"):
        ahead.worker(2, own, broken)  # type: ignore[arg-type]
    assert ahead.worker(2, own, start).name == "twin4"  # type: ignore[arg-type]
    ahead.close()



def test_twins_closed_while_another_starts_in_the_background() -> None:
    """On an H100 a failed check closed its kernel's twins while the others still started in
    the background: the close met the dict growing ("dictionary changed size during
    iteration", the item's verdict), and the twin that started during it was kept past it."""
    import threading

    closing, stored = threading.Event(), threading.Event()

    class FakeWorker:
        def __init__(self, name: str, slow_close: bool = False) -> None:
            self.name, self.up, self.slow_close = name, True, slow_close

        def alive(self) -> bool:
            return self.up

        def close(self) -> None:
            if self.slow_close:  # the background start ends while this close runs
                closing.set()
                stored.wait(5)
            self.up = False

    turns = Turns(3)
    first = turns.worker(1, None, lambda: FakeWorker("twin1", slow_close=True))  # type: ignore[arg-type]
    late = FakeWorker("twin2")

    def start_late() -> FakeWorker:
        closing.wait(5)
        return late

    def ahead() -> None:
        turns.start_ahead(2, start_late)  # type: ignore[arg-type]
        stored.set()

    thread = threading.Thread(target=ahead)
    thread.start()
    turns.close()
    thread.join(5)
    assert not first.up and not late.up, "a twin outlived the close"
    assert turns.twins == {}
    # started afresh after the close: kept as before
    assert turns.worker(2, None, lambda: FakeWorker("again")).name == "again"  # type: ignore[arg-type]
    # two starts of one turn (a round beside its start ahead): one is kept, the other closed
    extra = FakeWorker("extra")
    turns.twins.pop(2).close()
    kept = FakeWorker("kept")

    def racing() -> FakeWorker:
        turns.twins[2] = kept  # the other start stored its twin first
        return extra

    assert turns.worker(2, None, racing) is kept and not extra.up  # type: ignore[arg-type]

def test_the_spread_interval_is_students_t_on_the_rounds_logs() -> None:
    assert spread_interval([1.1]) is None  # one round: no spread to read
    low, high = spread_interval([1.0, 1.0, 1.0])  # type: ignore[misc]
    assert low == high == pytest.approx(1.0)
    # logs 0 and log 1.21: mean log 1.1, sd log(1.21) / sqrt 2, t(1) = 12.71
    low, high = spread_interval([1.0, 1.21])  # type: ignore[misc]
    half = 12.71 * (2 * 0.09531017980432493 / 2 ** 0.5) / 2 ** 0.5
    assert (low, high) == pytest.approx((1.1 * 2.718281828 ** -half, 1.1 * 2.718281828 ** half))


@pytest.mark.parametrize("n", range(1, 8))
def test_every_member_takes_every_place_and_follows_every_other_alike(n: int) -> None:
    """Mirrored rounds alone (A B C, C B A) keep the middle member in the middle, always after
    the same neighbours; round_order's 2n rounds put each member in each place twice and
    right after each other member twice, and any four rounds give equal mean places."""
    orders = [round_order(n, r) for r in range(2 * n)]
    assert all(sorted(o) == list(range(n)) for o in orders)
    for member in range(n):
        assert sorted(o.index(member) for o in orders) == sorted(list(range(n)) * 2)
    follows = [(o[i], o[i + 1]) for o in orders for i in range(n - 1)]
    assert all(follows.count((a, b)) == 2 for a in range(n) for b in range(n) if a != b)
    assert orders[1] == orders[0][::-1]  # the first two rounds are the mirrored pair
    places = [sum(round_order(n, r).index(m) for r in range(4)) for m in range(n)]
    assert len(set(places)) == 1, places
    assert round_order(n, 2 * n) == orders[0]  # then the design repeats


def test_a_member_that_fails_is_its_own_verdict_and_leaves_the_rounds() -> None:
    ev = _FakeEvaluator({"a": [1.0, 1.0]}, rounds=2)
    dropped: list[CandidateFailure] = []
    members = [Member("a", lambda turn: "a"), Member("broken", lambda turn: "broken",
                                                on_failure=dropped.append)]
    done = bench_together(ev, members, [], {"n": 1, "seed": 1}, "cpu", budget_s=1.0)  # type: ignore[arg-type]
    assert ev.log == ["a", "broken", "a"]  # not asked again
    failure = done["broken"].failure
    assert failure is not None and failure.reason == "timed call 0: wrong result"
    assert dropped == [failure]
    a = done["a"].result
    assert a is not None and a.stats is not None and a.fellows["broken"].speedup is None
    assert a.fellows["broken"].reason == "'broken' failed on n1-s1: timed call 0: wrong result"


def test_bench_items_of_a_case_run_back_to_back_after_the_checks() -> None:
    items = ["a.check1", "a.bench1", "a.bench2", "a.gate", "b.check1", "b.bench1", "b.bench2",
             "b.gate"]
    ordered = order_items(items, lambda i: i.split(".")[1] if "bench" in i else None,
                          lambda i: i.endswith("gate"))
    assert ordered == ["a.check1", "b.check1", "a.bench1", "b.bench1", "a.bench2", "b.bench2",
                       "a.gate", "b.gate"]


@pytest.fixture(scope="module")
def two_copies(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, str, Any]:
    """One run of two copies of one kernel and a wrong one, as a user compares them on a CPU
    (two workers a kernel, the README's advice there; one worker is every other test's)."""
    root = tmp_path_factory.mktemp("rounds")
    shutil.copytree(AXPY, root / "axpy")
    for name in ("a", "b"):
        shutil.copy(AXPY / "seeds" / "good.py", root / f"{name}.py")
    shutil.copy(DATA / "candidates" / "wrong.py", root / "wrong.py")
    return run_pytest(["axpy", "-v", "--ks-baselines", "none", "--ks-bench-workers", "2",
                       "--kernel", "a.py", "--kernel", "b.py", "--kernel", "wrong.py"], cwd=root,
                      timeout=300)


def test_two_kernels_are_timed_in_the_same_rounds_and_compared(two_copies) -> None:
    code, output, data = two_copies
    assert code == 1 and data is not None, output  # wrong.py fails
    order = [line.split("::")[1:3] for line in output.splitlines()
             if "::" in line and ("PASSED" in line or "FAILED" in line) and "bench[" in line]
    # the bench items of the case run back to back, after every check
    assert [o[0] for o in order[:4]] == ["reference", "a", "b", "wrong"], order
    by_name = {c["name"]: c for c in data["candidates"]}
    a_case = next(c for c in by_name["a"]["cases"] if c["kind"] == "bench")
    assert set(a_case["fellows"]) == {"reference", "b"}  # wrong.py failed its checks: not timed
    pair = a_case["fellows"]["b"]
    assert pair["speedup"] > 0 and pair["speedup_low"] <= pair["speedup"] <= pair["speedup_high"]
    assert pair["rounds"] == 4  # the task's 4 rounds, in two workers each, all paired
    assert by_name["b"]["fellow_speedups"]["a"] == pytest.approx(
        1 / by_name["a"]["fellow_speedups"]["b"])
    assert "side by side, timed in the same rounds" in output
    faster, slower = sorted(("a", "b"), key=lambda n: by_name[n]["geomean_us"])
    # the ratio with its interval and what it says, as the README shows it (issue 29)
    assert re.search(rf"  {faster} vs {slower}: \d+\.\d{{3}}x \(\d+\.\d{{3}}-\d+\.\d{{3}}\); "
                     rf"(the interval holds 1: no difference measured|{faster} is faster|"
                     rf"{slower} is faster on the paired rounds)\n", output), output
    wrong_bench = next(c for c in by_name["wrong"]["cases"] if c["kind"] == "bench")
    assert wrong_bench["reason"].startswith("not timed: check")


GREEDY = """import torch

checked = False


def custom_kernel(data):
    global checked
    x, y, out = data
    if x.numel() < 4096:
        checked = True
    elif not checked:  # a twin of the rounds, started for them: its turns find no memory
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 512.00 MiB")
    out.copy_(2 * x + y)
    return out
"""


def test_rounds_that_run_out_of_device_memory_go_on_in_one_worker_a_kernel(
        tmp_path: Path) -> None:
    """On an 80 GB H100, GPU MODE's vectoradd (a 16384 x 16384 case) in 4 workers a kernel (the
    auto default when kernels are compared) ran out of memory and failed its reference's
    benchmark: the rounds' own workers had filled the device. Here a kernel's twins run out of
    memory in their turns: the twins go and the turn is taken again in its own worker."""
    shutil.copytree(AXPY, tmp_path / "axpy")
    (tmp_path / "greedy.py").write_text(GREEDY)
    shutil.copy(AXPY / "seeds" / "good.py", tmp_path / "a.py")
    code, output, data = run_pytest(
        ["axpy", "--ks-baselines", "none", "--ks-bench-workers", "2", "--kernel", "greedy.py",
         "--kernel", "a.py"], cwd=tmp_path, timeout=300)
    assert code == 0, output
    assert ("2 workers a kernel, 1 from n4096-s3 on (the device's memory ran out; "
            "--ks-bench-workers 1 times all in one)") in output, output
    assert (data["bench_workers"], data["fewer_workers_from"]) == (2, "n4096-s3"), data
    greedy = next(c for c in data["candidates"] if c["name"] == "greedy")
    bench = next(c for c in greedy["cases"] if c["kind"] == "bench")
    assert bench["outcome"] == "passed" and bench["fellows"]["a"]["speedup"] > 0, bench


def test_a_reference_out_of_memory_while_judging_goes_on_in_one_worker_a_kernel(
        tmp_path: Path) -> None:
    """The pytest process judges the rounds' outputs against the reference on the device, beside
    the workers: its OutOfMemoryError there was the task's ReferenceFailed ("fix the task's
    reference.py"), and no kernel was judged. Here the reference runs out once in the pytest
    process, on the benchmark's case."""
    shutil.copytree(AXPY, tmp_path / "axpy")
    reference = tmp_path / "axpy" / "reference.py"
    reference.write_text(reference.read_text().replace(
        "    x, y, _ = data\n",
        "    x, y, _ = data\n"
        "    import sys\n"
        "    if '_pytest' in sys.modules and x.numel() == 4096 and not RAN_OUT:\n"
        "        RAN_OUT.append(1)\n"
        "        raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 2 GiB')\n")
        + "\n\nRAN_OUT = []\n")
    for name in ("a", "b"):
        shutil.copy(AXPY / "seeds" / "good.py", tmp_path / f"{name}.py")
    code, output, _ = run_pytest(
        ["axpy", "--ks-baselines", "none", "--ks-bench-workers", "2", "--kernel", "a.py",
         "--kernel", "b.py"], cwd=tmp_path, timeout=300)
    assert code == 0, output
    assert "1 from n4096-s3 on (the device's memory ran out" in output, output


def test_a_kernel_out_of_memory_in_its_own_worker_still_fails(tmp_path: Path) -> None:
    """With one worker a kernel there is nothing to retire: the kernel's OutOfMemoryError is
    its verdict."""
    shutil.copytree(AXPY, tmp_path / "axpy")
    (tmp_path / "greedy.py").write_text(GREEDY.replace("elif not checked:", "else:"))
    shutil.copy(AXPY / "seeds" / "good.py", tmp_path / "a.py")
    code, output, _ = run_pytest(
        ["axpy", "--ks-baselines", "none", "--kernel", "greedy.py", "--kernel", "a.py",
         "--ks-bench-workers", "1"],  # a GPU's auto would give two kernels four each
        cwd=tmp_path, timeout=300)
    assert code == 1, output
    assert "greedy bench n4096-s3: warm-up call 0: OutOfMemoryError: CUDA out of memory" in output
    assert "memory ran out" not in output, output


def _node(task: str, name: str, role: str = "candidate", rounds: int | None = None) -> Any:
    from pytest_kscientist.formats.task import BenchSpec

    spec = types.SimpleNamespace(bench=BenchSpec(rounds=rounds))
    return types.SimpleNamespace(task=types.SimpleNamespace(name=task, spec=spec), name=name,
                                 role=role)


def test_auto_workers_go_to_tasks_that_compare_kernels() -> None:
    """--ks-bench-workers auto (on a GPU): a worker a round for every kernel of a task whose
    rounds hold two or more kernels to compare; one candidate beside the reference (or alone)
    keeps one worker."""
    two = [_node("gemm", "a"), _node("gemm", "b"), _node("gemm", "reference", "reference")]
    one = [_node("axpy", "good"), _node("axpy", "reference", "reference", rounds=6)]
    assert auto_counts([two, two[:2], one], set()) == {"gemm": 4}
    # a candidate beside its saved copy (--ks-compare) or a --ks-beside kernel is a comparison
    assert auto_counts([one], {("axpy", "good_saved")}) == {"axpy": 6}
    assert auto_counts([[_node("x", "a", rounds=1), _node("x", "b", rounds=1)]], set()) == {
        "x": 2}
    assert auto_counts([[_node("x", "a", rounds=12), _node("x", "b", rounds=12)]], set()) == {
        "x": 8}


def test_evolve_children_time_in_one_worker_unless_asked(pytester: pytest.Pytester) -> None:
    """auto would double a generation's bench time on a GPU: the children get one worker a
    kernel unless the user set the option (flag or ini)."""
    from pytest_kscientist.evolve.sessions import ChildSession

    def args(*flags: str) -> str:
        config = pytester.parseconfig(*flags)
        return " ".join(ChildSession.for_config(config, pytester.path, pytester.path).args)

    assert "--ks-bench-workers 1" in args()
    assert "--ks-bench-workers auto" in args("--ks-bench-workers", "auto")
    assert "--ks-bench-workers 1" not in args("--ks-bench-workers", "auto")
    pytester.makeini("[pytest]\nks_bench_workers = 2\n")
    assert "--ks-bench-workers" not in args()  # the child reads the same ini (-c)


@pytest.mark.gpu
def test_two_kernels_compared_on_a_gpu_get_a_worker_a_round(tmp_path) -> None:
    """--ks-bench-workers auto on a GPU: two candidates of one task give each kernel a worker a
    round (the summary says so), and the rounds still pair every shape."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA or ROCm device")
    shutil.copytree(AXPY, tmp_path / "axpy")
    for name in ("a", "b"):
        shutil.copy(AXPY / "seeds" / "good.py", tmp_path / f"{name}.py")
    code, output, data = run_pytest(["axpy", "-v", "-k", "bench", "--ks-baselines", "none",
                                     "--ks-device", "cuda", "--ks-profile", "full",
                                     "--kernel", "a.py", "--kernel", "b.py"], cwd=tmp_path)
    assert code == 0, output
    assert "| 4 workers a kernel (--ks-bench-workers auto: kernels compared)" in output, output
    a = next(c for c in data["candidates"] if c["name"] == "a")
    assert all(case["fellows"]["b"]["speedup"] for case in a["cases"]), a


def test_past_four_rounds_each_round_takes_its_share_of_the_minimums() -> None:
    """Sixteen rounds cost twice the calls of four while every round took the task's whole
    warm-up, minimum and verified sample; past four a round takes its share of four rounds'
    (rounded down, at least one where the task asks for any)."""
    assert [spread(5, r) for r in (1, 2, 4)] == [5, 5, 5]  # as the task gives them
    assert [spread(5, r) for r in (5, 8, 16, 20, 40)] == [4, 2, 1, 1, 1]
    assert [spread(2, r) for r in (8, 16)] == [1, 1] and spread(3, 6) == 2
    assert spread(0, 16) == 0  # no warm-up asked, none made


def test_rounds_unset_are_sixteen_on_a_cpu_and_four_on_a_gpu() -> None:
    from pytest_kscientist.formats.task import BenchSpec

    assert BenchSpec().rounds_on("cpu") == 16
    assert BenchSpec().rounds_on("cuda:0") == BenchSpec().rounds_on("cuda") == 4
    assert BenchSpec(rounds=2).rounds_on("cpu") == BenchSpec(rounds=2).rounds_on("cuda:0") == 2


def test_a_cpu_takes_sixteen_rounds_each_verifying_a_share_of_the_sample(tmp_path: Path) -> None:
    """With no rounds set, a CPU times a case in sixteen rounds (a burst of the machine's falls
    into more, shorter turns). axpy asks for 2 verified outputs a round: four rounds verify 8,
    sixteen 16 (one each) where they verified 32."""
    shutil.copytree(AXPY, tmp_path / "axpy")
    toml = tmp_path / "axpy" / "task.toml"
    lines = toml.read_text().splitlines(keepends=True)
    toml.write_text("".join(line for line in lines if not line.startswith("rounds =")))
    shutil.copy(AXPY / "seeds" / "good.py", tmp_path / "good.py")
    code, output, data = run_pytest(["axpy", "-k", "bench", "--ks-baselines", "none",
                                     "--kernel", "good.py", "--ks-device", "cpu"],
                                    cwd=tmp_path, timeout=300)
    assert code == 0 and data is not None, output
    (good,) = [c for c in data["candidates"] if c["name"] == "good"]
    (bench,) = [c for c in good["cases"] if c["kind"] == "bench"]
    assert bench["fellows"]["reference"]["rounds"] == 16, bench
    assert bench["stats"]["verified_runs"] == 16, bench["stats"]
    assert bench["stats"]["runs"] >= 16, bench["stats"]  # min_runs 5: 1 a round


class _Node:
    """collect.CandidateNode's start paths on fakes (its pytest Node parts left out)."""
    from pytest_kscientist.harness import collect as _collect

    _live = _collect.CandidateNode._live
    _start = _collect.CandidateNode._start
    _start_twin = _collect.CandidateNode._start_twin
    _spawn = _collect.CandidateNode._spawn
    start_early = _collect.CandidateNode.start_early
    timeable = _collect.CandidateNode.timeable

    def __init__(self) -> None:
        import types

        self.ks = types.SimpleNamespace(
            inline_builds={}, device="cpu", settings=types.SimpleNamespace(timeout_s=1),
            evaluator=lambda task: types.SimpleNamespace(init_seed=0), spares=None,
            shared_builds=None, holders=set(), loads={})
        self.task = types.SimpleNamespace(name="t")
        self.source, self.entry, self.prepare, self.name = None, "custom_kernel", None, "good"
        self.worker = self.load_failure = self.failed_check = self.skip_reason = None
        self.load_shown = False
        self.turns = Turns(2)


def test_a_twins_failed_start_is_its_rounds_not_the_kernels(monkeypatch) -> None:
    """A twin's start that failed in the background (CUDA out of memory at load) was recorded
    as the kernel's load failure: every later item of a kernel whose own worker had passed
    its checks failed "failed to load", and a broken kernel's first item lost its traceback."""
    from pytest_kscientist.harness import collect

    class Up:
        load_s = None

        def alive(self) -> bool:
            return True

        def close(self) -> None:
            pass

    def start_worker(*args, **kwargs):
        if twin_fails:
            raise CandidateFailure("failed to load: CUDA out of memory", "Traceback (twin)")
        return Up()

    monkeypatch.setattr(collect, "start_worker", start_worker)
    node, twin_fails = _Node(), False
    node.start_early()
    own = node._live()
    twin_fails = True
    node.turns.start_ahead(1, node._start_twin)  # in the background in a session
    assert node.load_failure is None and node._live() is own
    with pytest.raises(CandidateFailure, match="out of memory"):  # its round says so
        node.turns.worker(1, own, node._start_twin)  # type: ignore[arg-type]
    assert node.load_failure is None
    # a kernel that is not timed (a failed check) starts no twin
    node.failed_check, started = "wrong result", []
    monkeypatch.setattr(collect, "start_worker", lambda *a, **k: started.append(1) or Up())
    node.turns.start_ahead(1, node._start_twin)
    assert started == [] and node.turns.twin(1) is None


def test_an_unexpected_error_of_a_background_start_is_that_kernels(monkeypatch) -> None:
    """An OSError of a worker's start (a full disk, too many open files) raised in the
    background went to whichever item waited next, another kernel's, or out of the session's
    end with no --ks-json; it is the load failure of the kernel whose start raised it."""
    from pytest_kscientist.harness import collect

    def start_worker(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(collect, "start_worker", start_worker)
    node = _Node()
    node.start_early()  # raised nothing
    assert node.load_failure is not None and not node.load_shown
    assert node.load_failure.reason == ("failed to start its worker: OSError: [Errno 28] No space "
                                        "left on device")
    assert "Traceback" in node.load_failure.detail
    with pytest.raises(CandidateFailure, match="No space left"):
        node._live()
    node.turns.start_ahead(1, lambda: start_worker())  # a twin's: left for its round


def test_only_a_kernels_own_worker_notes_its_build_answers(monkeypatch) -> None:
    """Its twins load beside its own worker, each found the record list empty when it began,
    and each noted its answers: one build read as "built", "reused", "reused"."""
    from pytest_kscientist.harness import collect

    given = []

    class Up:
        load_s = None

        def alive(self) -> bool:
            return True

    def start_worker(*args, **kwargs):
        given.append(args[-1])  # ``answered``: where the load's build answers are noted
        return Up()

    monkeypatch.setattr(collect, "start_worker", start_worker)
    node = _Node()
    node.turns.start_ahead(1, node._start_twin)
    node.start_early()
    assert given == [None, node.ks.inline_builds[("t", "good")]]


def test_this_process_running_out_of_device_memory_is_nobodys_verdict(monkeypatch) -> None:
    """On a GPU the pytest process's own allocations (an output handed over, moved here,
    judged in float64 chunks) ran out beside the workers: the handover's read as the honest
    kernel's failure ("output handover refused"), the judging's escaped the item bare; neither
    let the rounds retire their twins and try again."""
    import os
    import types

    import torch

    from pytest_kscientist.errors import ReferenceFailed
    from pytest_kscientist.harness.evaluate import Evaluator
    from pytest_kscientist.protocol import cuda_share, handover

    def full(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(handover, "their_fd", lambda pid, number: os.dup(0))
    monkeypatch.setattr(cuda_share, "take", full)
    with pytest.raises(CandidateFailure) as taken:
        handover.take({"kind": "cuda", "fd": 5, "size": 1 << 21}, 1 << 20, 4242, "cuda:0")
    assert taken.value.out_of_memory and "the pytest process ran out" in taken.value.reason
    task = types.SimpleNamespace(form="native", module=None, reference="reference.py")
    evaluator = Evaluator(task, "cpu", salt=1)  # type: ignore[arg-type]
    monkeypatch.setattr(evaluator, "_judge", full)
    with pytest.raises(ReferenceFailed) as judged:
        evaluator._verdict(None, torch.zeros(1), expected=torch.zeros(1))
    assert judged.value.out_of_memory and "judging an output" in str(judged.value)
    # a GPU MODE problem's own check running out in this process: not a wrong result either
    problem = types.SimpleNamespace(check_implementation=full)
    evaluator = Evaluator(types.SimpleNamespace(form="gpumode", module=problem,  # type: ignore[arg-type]
                                                reference=Path("reference.py")), "cpu", salt=1)
    with pytest.raises(ReferenceFailed) as judged:
        evaluator._verdict((torch.zeros(1),), torch.zeros(1))
    assert judged.value.out_of_memory
