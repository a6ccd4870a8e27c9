"""A child's link to its parent: over the whole run, or, for a move of knob values, over the
benchmarks whose knob point it changed (the others run the parent's kernel, ratio 1)."""

from __future__ import annotations

import math

import pytest
from test_evolve_compose import SHAPED

from pytest_kscientist.evolve import findings, progress
from pytest_kscientist.evolve.offline.knobs import rewrite_tunables
from pytest_kscientist.evolve.offline.links import link, split
from pytest_kscientist.evolve.population import CandidateMeta, EvaluationRecord, Member
from pytest_kscientist.evolve.roles import ExperimentPlan
from pytest_kscientist.harness.results import BaselineTiming, CandidateResult, CaseResult
from pytest_kscientist.harness.stats import geomean

# n < 2048 is the small class: 2 of the 6 benchmarks.
CASES = {f"n{n}-s{i}": {"n": n, "seed": i}
         for i, n in enumerate([256, 1024, 4096, 8192, 16384, 32768])}
SMALL = {b for b, c in CASES.items() if c["n"] < 2048}
SEED = rewrite_tunables(SHAPED, {"tile": 64}, [{"when": {"n": [None, 2048]},
                                               "knobs": {"tile": 16}}], ["n < 2048"])
SMALL_MOVE = rewrite_tunables(SEED, {}, [{"when": {"n": [None, 2048]},
                                          "knobs": {"tile": 16, "unroll": 4}}], ["n < 2048"])
OTHER_CODE = SMALL_MOVE.replace("return data, tunables_for", "return data[::-1], tunables_for")


def member(cid: str, source: str, parent: str = "",
           ratios: dict[str, tuple[float, float, float]] | None = None) -> Member:
    """A passed member; ``ratios``: per benchmark (ratio, low, high) timed beside ``parent``."""
    plan = ExperimentPlan(title=f"move {cid}", changes="-", expected_gain_min_pct=1,
                          expected_gain_max_pct=2, innovation=1) if parent else None
    meta = CandidateMeta(id=cid, task="toy", generation=1 if parent else 0,
                         parents=[parent] if parent else [], sha256=cid,
                         origin="writer" if parent else "seed", seed_file="" if parent else "s.py",
                         created_at="t", plan=plan)
    cases = [CaseResult(kind="bench", case=case, case_id=b, outcome="passed",
                        baselines={parent: BaselineTiming(speedup=ratios[b][0],
                                                          speedup_low=ratios[b][1],
                                                          speedup_high=ratios[b][2])}
                        if ratios and b in ratios else {})
             for b, case in CASES.items()]
    speedups, intervals = {}, {}
    if ratios:
        speedups[parent] = geomean([r[0] for r in ratios.values()])
        intervals[parent] = [geomean([r[i] for r in ratios.values()]) for i in (1, 2)]
    ev = EvaluationRecord(
        id=cid, evaluated_at="t", status="passed", geomean_us=10.0,
        bench_median_us=dict.fromkeys(CASES, 10.0), speedups=speedups,
        speedup_intervals=intervals,
        result=CandidateResult(name=cid, path=cid, sha256=cid, cases=cases))
    return Member(meta, source, ev)


def noisy(gain: float) -> dict[str, tuple[float, float, float]]:
    """``gain`` (+-1%) on the small class; on the rest noise of +-4% around 1 (one reading
    0.97 [0.93-1.01]), which hides the gain in the whole-run interval."""
    out = {}
    for i, b in enumerate(CASES):
        r = gain if b in SMALL else (0.97 if i % 2 else 1.03)
        width = 0.01 if b in SMALL else 0.04
        out[b] = (r, r - width, r + width)
    return out


def test_a_knob_move_is_taken_over_the_benchmarks_it_changed_raised_to_their_share() -> None:
    seed, child = member("c0001", SEED), member("c0002", SMALL_MOVE, "c0001", noisy(1.05))
    whole = child.evaluation.speedup_intervals["c0001"]  # type: ignore[union-attr]
    assert whole[0] < 1 < whole[1]  # the whole run cannot tell
    found = link(child, seed, "c0001")
    assert found is not None and (found.changed, found.total) == (2, 6)
    assert found.speedup == pytest.approx(1.05 ** (2 / 6))
    assert found.low == pytest.approx(1.04 ** (2 / 6)) and found.low > 1
    assert found.high == pytest.approx(1.06 ** (2 / 6))
    assert found.short() == f"{found.speedup:.3f}x({found.low:.3f}-{found.high:.3f}) 2/6"


def test_the_parents_kernel_on_every_benchmark_is_a_ratio_of_exactly_one() -> None:
    # a rule for shapes no benchmark has: every benchmark keeps the parent's knob point
    unseen = rewrite_tunables(SEED, {}, [{"when": {"n": [None, 2048]}, "knobs": {"tile": 16}},
                                         {"when": {"n": [None, 100]}, "knobs": {"tile": 8}}],
                              ["n < 2048", "n < 100"])
    found = link(member("c0002", unseen, "c0001", noisy(1.0)), member("c0001", SEED), "c0001")
    assert found is not None and (found.speedup, found.low, found.high) == (1.0, 1.0, 1.0)
    assert (found.changed, found.total) == (0, 6)
    assert found.short() == "1x(same) 0/6" and "the parent's kernel on all 6" in found.text()


@pytest.mark.parametrize("why", ["other code", "no per-benchmark ratio", "no parent",
                                 "a rule on a key the cases lack", "every benchmark moved"])
def test_anything_else_is_the_whole_run_link(why: str) -> None:
    source, ratios, parent = SMALL_MOVE, noisy(1.05), member("c0001", SEED)
    if why == "other code":
        source = OTHER_CODE
    elif why == "every benchmark moved":
        source = rewrite_tunables(SMALL_MOVE, {"tile": 32}, None)
    elif why == "a rule on a key the cases lack":
        two_keys = SEED.replace('SHAPE_KEYS = ["n"]', 'SHAPE_KEYS = ["n", "m"]')
        parent = member("c0001", two_keys)
        source = rewrite_tunables(two_keys, {}, [{"when": {"m": [None, 2048]},
                                                  "knobs": {"tile": 16}}], ["m < 2048"])
    child = member("c0002", source, "c0001", ratios)
    if why == "no per-benchmark ratio":
        child.evaluation.result.cases[0].baselines.clear()  # type: ignore[union-attr]
    found = link(child, None if why == "no parent" else parent, "c0001")
    whole = child.evaluation.speedup_intervals["c0001"]  # type: ignore[union-attr]
    assert found is not None and (found.low, found.high) == tuple(whole)
    assert not found.partial and found.short().count("x(") == 1 and "/" not in found.short()


def test_a_class_gain_the_whole_run_hides_confirms_the_child_as_best() -> None:
    seed = member("c0001", SEED)
    child = member("c0002", SMALL_MOVE, "c0001", noisy(1.05))
    slower = member("c0003", SMALL_MOVE, "c0001", noisy(0.95))
    members = [seed, child, slower]
    assert findings.best(members) is child
    speedup, low, _ = findings.confirmed(child, {m.id: m for m in members}) or (0, 0, 0)
    assert math.isclose(speedup, 1.05 ** (1 / 3)) and low > 1
    verdict, text, _ = findings.versus_parent(child, seed)
    assert verdict == "helped" and "(1.050x on the 2 of 6 benchmarks it moved)" in text
    assert findings.versus_parent(slower, seed)[0] == "hurt"
    table = "\n".join(progress.generation_table(members, 1))
    assert f"{child.id}  c0001" in table and " 2/6" in table
    assert "best so far: c0002" in table


def test_reading_which_benchmarks_moved_needs_both_sources_to_parse() -> None:
    child = member("c0002", "def custom_kernel(data):\n    return data\n", "c0001", noisy(1.05))
    assert split(child, member("c0001", SEED)) is None
