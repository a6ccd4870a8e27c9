"""The offline scientist on a composed base: knob moves inside one shape class at a time, and
compositions that take a class's point from a composed child."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from test_evolve_compose import (
    BLOCKS_SEED,
    BRIEF,
    CASES,
    SHAPED,
    cand,
    evolve_blocks,
    shaped_us,
)

from pytest_kscientist.evolve.offline.class_moves import rule_notes
from pytest_kscientist.evolve.offline.compose import dispatch, key_of
from pytest_kscientist.evolve.offline.knobs import (
    read_by_shape,
    read_space,
    read_tunables,
    rewrite_tunables,
    skeleton_sha,
)
from pytest_kscientist.evolve.offline.scientist import (
    OfflineDesigner,
    OfflineSelector,
    OfflineWriter,
)
from pytest_kscientist.evolve.roles import CandidateSummary
from pytest_kscientist.harness.stats import geomean

REPO = Path(__file__).parent.parent

# Three classes of n: two rules (one sets only "tile") and TUNABLES for n >= 2048.
THREE = {"n256-s1": {"n": 256, "seed": 1}, **CASES}
BRIEF3 = BRIEF.model_copy(update={"benchmark_ids": list(THREE), "benchmark_cases": THREE})
RULES = [
    {"when": {"n": [None, 512]}, "knobs": {"tile": 8}},
    {"when": {"n": [512, 2048]}, "knobs": {"tile": 32, "unroll": 4}},
]
NOTES = ["n < 512: by hand, the small class", "512 <= n < 2048: by hand"]
COMPOSED = rewrite_tunables(SHAPED, {"tile": 64, "unroll": 2}, RULES, NOTES)


def timed(cid: str, source: str, cases: dict, gen: int = 0,
          parents: tuple[str, ...] = ()) -> CandidateSummary:
    """A passed candidate timed by ``shaped_us`` on the knobs it runs for each case."""
    values, rules = read_tunables(source), read_by_shape(source) or []
    times = {b: shaped_us(dispatch(values, rules, c), c["n"]) for b, c in cases.items()}
    return CandidateSummary(id=cid, generation=gen, parents=list(parents), source=source,
                            status="passed", geomean_us=geomean(list(times.values())),
                            bench_median_us=times)


def runs(source: str, cases: dict) -> dict[str, str]:
    """Benchmark -> the knob point the kernel runs there."""
    values, rules = read_tunables(source), read_by_shape(source) or []
    return {b: key_of(dispatch(values, rules, c)) for b, c in cases.items()}


def test_rule_notes_are_read_back_as_the_writer_writes_them() -> None:
    assert rule_notes(COMPOSED) == NOTES
    two_lines = COMPOSED.replace("    # 512 <= n < 2048: by hand\n",
                                 "    # 512 <= n < 2048:\n    #   by hand\n")
    assert rule_notes(two_lines) == NOTES
    assert rule_notes(COMPOSED.replace("    # n < 512: by hand, the small class\n", "")) == [
        "", NOTES[1]]
    assert rule_notes(rewrite_tunables(SHAPED, {})) == []


def test_a_composed_fastest_is_the_base_and_its_moves_stay_inside_one_class() -> None:
    seed = timed("c0001", COMPOSED, THREE)
    slower = timed("c0002", rewrite_tunables(SHAPED, {"tile": 128, "unroll": 1}), THREE)
    assert seed.geomean_us < slower.geomean_us  # type: ignore[operator]
    pop = [seed, slower]
    sel = OfflineSelector().select(BRIEF3, pop, "")
    assert sel.base_id == "c0001" and "its moves go inside one class" in sel.reason

    design = OfflineDesigner().design(BRIEF3, seed, slower, pop, "", n_keep=100)
    assert len(design.plans) > 20
    labels = ("n < 512: ", "512 <= n < 2048: ", "other shapes: ")
    space, base_runs = read_space(COMPOSED), runs(COMPOSED, THREE)
    classes = {"n < 512: ": "n256-s1", "512 <= n < 2048: ": "n1024-s3",
               "other shapes: ": "n4096-s4"}
    seen = {key_of(read_tunables(c.source)) + json.dumps(read_by_shape(c.source)) for c in pop}
    children = set()
    for plan in design.plans:
        label = next(x for x in labels if plan.title.startswith(x))
        assert re.fullmatch(r"(\w+ \d+ -> \d+)(, \w+ \d+ -> \d+)?", plan.title[len(label):])
        assert "of the geomean's weight" in plan.changes, plan.changes
        child = OfflineWriter().write(BRIEF3, seed, plan).source
        assert skeleton_sha(child) == skeleton_sha(COMPOSED)
        values, rules = read_tunables(child), read_by_shape(child) or []
        assert all(values[k] in space[k] for k in space)
        assert all(r["knobs"][k] in space[k] for r in rules for k in r["knobs"])
        # The moved class runs a new point; every other benchmark runs what it ran.
        child_runs = runs(child, THREE)
        moved = classes[label]
        assert child_runs[moved] != base_runs[moved]
        assert {b: p for b, p in child_runs.items() if b != moved} == {
            b: p for b, p in base_runs.items() if b != moved}
        # The other rules keep their bounds, knobs (pinned where TUNABLES moved) and notes.
        assert [r["when"] for r in rules] == [r["when"] for r in RULES]
        kept = [i for i, r in enumerate(RULES) if not label.startswith(_where(r))]
        assert all(f"    # {NOTES[i]}\n" in child for i in kept), child
        config = key_of(values) + json.dumps(rules)
        assert config not in seen and config not in children  # nothing proposed twice
        children.add(config)
    assert {next(x for x in labels if p.title.startswith(x)) for p in design.kept[:3]} == set(
        labels)  # with n_keep 100, every plan is kept; the first three take the classes in turn
    assert "- `tile` vs 8 in n < 512 (speed-up, fitted)" in design.findings_update


def _where(rule: dict) -> str:
    low, high = rule["when"]["n"]
    return f"n < {high}: " if low is None else f"{low} <= n < {high}: "


def test_a_class_move_already_in_the_population_is_not_proposed_again() -> None:
    seed = timed("c0001", COMPOSED, THREE)
    design = OfflineDesigner().design(BRIEF3, seed, None, [seed], "", n_keep=100)
    plan = next(p for p in design.plans if p.title == "n < 512: tile 8 -> 16")
    child = timed("c0002", OfflineWriter().write(BRIEF3, seed, plan).source, THREE, 1, ("c0001",))
    assert "    # n < 512: c0001's knobs there, tile 8 -> 16\n" in child.source
    # The same point on every benchmark, written as a kernel of one configuration: also known.
    flat = timed("c0003", rewrite_tunables(SHAPED, {"tile": 64, "unroll": 2}, [
        {"when": {"n": [None, 512]}, "knobs": {"tile": 8}},
        {"when": {"n": [512, 2048]}, "knobs": {"tile": 32, "unroll": 4}},
        {"when": {"n": [2048, 4096]}, "knobs": {"unroll": 1}}]), THREE)  # a rule no case holds
    again = OfflineDesigner().design(BRIEF3, seed, None, [seed, child, flat], "", n_keep=100)
    titles = [p.title for p in again.plans]
    assert "n < 512: tile 8 -> 16" not in titles and "n < 512: tile 8 -> 32" in titles
    assert len(titles) == len(design.plans) - 1


def test_the_next_composition_takes_each_class_from_the_composed_child_that_improved_it() -> None:
    """Two class moves of one composed seed, each faster on its own class: the composition of
    their classes is proposed (no kernel of one configuration exists in the family)."""
    seed = cand("c0001", rewrite_tunables(SHAPED, {"tile": 128, "unroll": 4},
                                          [{"when": {"n": [None, 2048]}, "knobs": {"tile": 32}}]))
    pop = [seed]
    design = OfflineDesigner().design(BRIEF, seed, None, pop, "", n_keep=100)
    for title in ("n < 2048: tile 32 -> 16", "other shapes: tile 128 -> 64"):
        plan = next(p for p in design.plans if p.title == title)
        source = OfflineWriter().write(BRIEF, seed, plan).source
        pop.append(cand(f"c000{len(pop) + 1}", source, 1, ("c0001",)))
    left, right = pop[1], pop[2]  # each the fastest on one benchmark, neither on both
    assert left.bench_median_us["n1024-s3"] < right.bench_median_us["n1024-s3"]
    assert right.bench_median_us["n4096-s4"] < left.bench_median_us["n4096-s4"]

    base_id = OfflineSelector().select(BRIEF, pop, "").base_id
    base = next(c for c in pop if c.id == base_id)
    assert base_id in ("c0002", "c0003")
    design = OfflineDesigner().design(BRIEF, base, None, pop, "", 3)
    composition = design.plans[0]
    assert composition.title.startswith("per shape class: ") and composition.by_shape
    assert "composed from the per-shape winners of 3 passed kernel(s)" in composition.changes
    assert "(0 kernels of one configuration, the classes of 3 composed)" in (
        design.findings_update)
    child = cand("c0004", OfflineWriter().write(BRIEF, base, composition).source, 2)
    for bench in CASES:
        assert child.bench_median_us[bench] == min(c.bench_median_us[bench] for c in pop)
    assert runs(child.source, CASES) == {"n1024-s3": runs(left.source, CASES)["n1024-s3"],
                                         "n4096-s4": runs(right.source, CASES)["n4096-s4"]}


def test_evolve_moves_knobs_inside_a_composed_seed(pytester: pytest.Pytester) -> None:
    """A generation on the CPU whose base is a composed seed: the child moves one class's knob,
    keeps the other rule and its note, and passes its checks in a child session."""
    wide = BLOCKS_SEED.replace('"block": [256, 65536]', '"block": [256, 1024, 8192, 65536]')
    seed = rewrite_tunables(wide, {"block": 65536}, [
        {"when": {"n": [None, 1024]}, "knobs": {"block": 256}},
        {"when": {"n": [1024, 4096]}, "knobs": {"block": 1024}}],
        ["n < 1024: by hand", "1024 <= n < 4096: by hand, no benchmark here"])
    result = evolve_blocks(pytester, {"composed.py": seed})
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines([
        "*gen 1/1 | select   | base c0001: *it runs knob points per shape class: its moves go "
        "inside one class*",
    ])
    root = pytester.path / "population" / "blocks"
    meta = json.loads((root / "c0002" / "meta.json").read_text())
    title = meta["plan"]["title"]
    assert meta["parents"][0] == "c0001"
    assert re.fullmatch(r"(n < 1024|other shapes): block \d+ -> \d+", title), title
    source = (root / "c0002" / "c0002.py").read_text()
    rules = read_by_shape(source)
    assert rules is not None and rules[1] == {"when": {"n": [1024, 4096]}, "knobs": {"block": 1024}}
    assert "    # 1024 <= n < 4096: by hand, no benchmark here\n" in source
    assert runs(source, {"n": {"n": 256}, "N": {"n": 65536}}) != runs(
        seed, {"n": {"n": 256}, "N": {"n": 65536}})
    record = json.loads((root / "c0002" / "results.json").read_text())
    assert record["status"] == "passed", record["failure"]
