"""The offline scientist's composition move: per-shape-class winners composed into one kernel."""

from __future__ import annotations

import ast
import importlib.util
import json
import math
from pathlib import Path

import pytest
from helpers import run_pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_kscientist.evolve.offline.compose import (
    Point,
    compose,
    dispatch,
    shape_classes,
    threshold,
)
from pytest_kscientist.evolve.offline.knobs import (
    read_by_shape,
    read_tunables,
    rewrite_tunables,
    skeleton_sha,
)
from pytest_kscientist.evolve.offline.scientist import (
    OfflineDesigner,
    OfflineSelector,
    OfflineWriter,
)
from pytest_kscientist.evolve.roles import CandidateSummary, ExperimentPlan, ShapeRule, TaskBrief

REPO = Path(__file__).parent.parent

# The per-shape reader a composable seed carries (as the fp8_gemm seeds do).
TUNABLES_FOR = '''def tunables_for(**shape):
    for rule in TUNABLES_BY_SHAPE:
        if all((low is None or low <= shape[key]) and (high is None or shape[key] < high)
               for key, (low, high) in rule["when"].items()):
            return {**TUNABLES, **rule["knobs"]}
    return TUNABLES
'''

# A kernel of the tunable toy whose knobs may differ per class of shapes (its only shape key: n).
SHAPED = '''"""A tunable seed running other knobs per class of n, as the fp8_gemm Triton seed."""

TUNABLES = {"tile": 16, "unroll": 1}
TUNABLE_SPACE = {"tile": [8, 16, 32, 64, 128], "unroll": [1, 2, 4, 8]}
SHAPE_KEYS = ["n"]
TUNABLES_BY_SHAPE = []


''' + TUNABLES_FOR + '''

def custom_kernel(data):
    return data, tunables_for(n=len(data))
'''
CASES = {"n1024-s3": {"n": 1024, "seed": 3}, "n4096-s4": {"n": 4096, "seed": 4}}
BRIEF = TaskBrief(
    name="toy",
    description="",
    reference_source="",
    hardware="cpu",
    benchmark_ids=list(CASES),
    benchmark_cases=CASES,
)


def shaped_us(knobs: dict, n: int) -> float:
    """One benchmark's time: best at tile = n / 64 (16 for n=1024, 64 for n=4096), unroll 4."""
    tile, unroll = knobs["tile"], knobs["unroll"]
    return (n / 10) * (1 + abs(math.log2(tile * 64 / n)) * 0.6) * (
        1 + abs(math.log2(unroll / 4)) * 0.3)


def cand(cid: str, source: str, gen: int = 0, parents: tuple[str, ...] = (),
         passed: bool = True) -> CandidateSummary:
    """A candidate timed per benchmark by ``shaped_us`` on the knobs it runs for that shape."""
    values, rules = read_tunables(source), read_by_shape(source) or []
    times = {b: shaped_us(dispatch(values, rules, case), case["n"]) for b, case in CASES.items()}
    return CandidateSummary(
        id=cid, generation=gen, parents=list(parents), source=source,
        status="passed" if passed else "failed",
        geomean_us=math.sqrt(math.prod(times.values())) if passed else None,
        bench_median_us=times if passed else {},
    )


def knobbed(cid: str, knobs: dict, **kw: object) -> CandidateSummary:
    return cand(cid, rewrite_tunables(SHAPED, knobs), **kw)  # type: ignore[arg-type]


# -- the rule ------------------------------------------------------------------------------------
def test_thresholds_lie_between_the_values_geometrically() -> None:
    assert threshold(1024, 6144) == 2509  # ceil(sqrt(1024 * 6144)) = ceil(2508.3)
    assert threshold(256, 65536) == 4096
    assert threshold(2048, 2049) == 2049  # low < t <= high, even for neighbours
    assert threshold(0, 3) == 2 and threshold(-4, -2) == -2  # not positive: the mean
    assert threshold(0.5, 2.0) == pytest.approx(1.0)


GRID = {f"m{m}-k{k}": {"m": m, "k": k} for m in (1024, 6144) for k in (256, 2048, 7168)}


def grid_point(pid: str, times: dict[tuple[int, int], float], default: float) -> Point:
    medians = {b: times.get((c["m"], c["k"]), default) for b, c in GRID.items()}
    return Point(pid, {"BLOCK_M": pid}, medians)


# P1 is even everywhere; P2 wins small m with long k; P3 wins small m with short k.
P1 = grid_point("c0001", {}, 100.0)
P2 = grid_point("c0002", {(1024, 256): 120, (1024, 2048): 60, (1024, 7168): 60}, 150.0)
P3 = grid_point("c0003", {(1024, 256): 50}, 130.0)


def test_classes_split_where_different_points_win() -> None:
    classes = shape_classes([P1, P2, P3], GRID, ["m", "k"], list(GRID))
    found = {(tuple(sorted(c.when.items())), c.point.id): sorted(c.benches) for c in classes}
    assert found == {
        ((("k", (None, 725)), ("m", (None, 2509))), "c0003"): ["m1024-k256"],
        ((("k", (725, None)), ("m", (None, 2509))), "c0002"): ["m1024-k2048", "m1024-k7168"],
        ((("m", (2509, None)),), "c0001"): ["m6144-k2048", "m6144-k256", "m6144-k7168"],
    }
    # The first split is the one that gains most (m: 3 benchmarks improve); a cap stops there.
    two = shape_classes([P1, P2, P3], GRID, ["m", "k"], list(GRID), max_classes=2)
    assert [(c.when, c.point.id) for c in two] == [
        ({"m": (None, 2509)}, "c0002"), ({"m": (2509, None)}, "c0001")]


def test_the_largest_class_becomes_tunables_and_every_benchmark_runs_its_winner() -> None:
    comp = compose([P1, P2, P3], GRID, ["m", "k"], list(GRID), {"BLOCK_M": "c0002"})
    assert comp is not None and comp.default.point.id == "c0001"
    rules = [r.model_dump(exclude={"note"}) for r in comp.rules()]
    winners = {b: min((P1, P2, P3), key=lambda p: p.times[b]).id for b in GRID}
    for bench, case in GRID.items():
        assert dispatch({"BLOCK_M": "c0001"}, rules, case)["BLOCK_M"] == winners[bench]
    # A shape between or beyond the benchmarks falls in exactly one class.
    assert dispatch({"BLOCK_M": "c0001"}, rules, {"m": 32, "k": 128})["BLOCK_M"] == "c0003"
    assert dispatch({"BLOCK_M": "c0001"}, rules, {"m": 9000, "k": 128})["BLOCK_M"] == "c0001"
    assert comp.rules()[0].note.startswith("m < 2509, k < 725: c0003's knobs, fastest on 1 ")


def test_no_composition_below_the_noise_or_from_one_winner() -> None:
    close = grid_point("c0004", {(1024, 256): 98.5}, 101.0)  # 1.5% better on one benchmark
    assert compose([P1, close], GRID, ["m", "k"], list(GRID), {}) is None
    assert compose([P1, grid_point("c0005", {}, 120.0)], GRID, ["m", "k"], list(GRID), {}) is None
    assert compose([P1, P2, P3], GRID, [], list(GRID), {}) is None  # no shape keys: no classes
    # A point timed on some benchmarks only (a composed kernel's class) serves only those.
    partial = Point("c0006", {"BLOCK_M": 1}, {"m1024-k256": 1.0})
    comp = compose([P1, P2, partial], GRID, ["m", "k"], list(GRID), {})
    assert comp is not None
    served = {c.point.id: sorted(c.benches) for c in (comp.default, *comp.ruled)}
    assert served == {"c0001": ["m6144-k2048", "m6144-k256", "m6144-k7168"],
                      "c0002": ["m1024-k2048", "m1024-k7168"], "c0006": ["m1024-k256"]}
    # Points that each cover part of the benchmarks compose only where together they tile them.
    left = Point("c0007", {"BLOCK_M": 7}, {b: 50.0 for b in GRID if b.startswith("m1024")})
    right = Point("c0008", {"BLOCK_M": 8}, {b: 50.0 for b in GRID if b.startswith("m6144")})
    comp = compose([left, right], GRID, ["m", "k"], list(GRID), {"BLOCK_M": 8})
    assert comp is not None and comp.text() == (
        "m < 2509 -> c0007 (m1024-k256, m1024-k2048, m1024-k7168); other shapes -> c0008 "
        "(m6144-k256, m6144-k2048, m6144-k7168)")
    assert compose([left, partial], GRID, ["m", "k"], list(GRID), {}) is None  # m6144 unserved


def test_dispatch_takes_the_first_rule_that_holds_on_half_open_bounds() -> None:
    rules = [
        {"when": {"n": [None, 100]}, "knobs": {"a": 1}},
        {"when": {"n": [50, 200], "m": [1, None]}, "knobs": {"a": 2}},
    ]
    assert dispatch({"a": 0, "b": 9}, rules, {"n": 99, "m": 5}) == {"a": 1, "b": 9}
    assert dispatch({"a": 0}, rules, {"n": 100, "m": 5}) == {"a": 2}  # high is excluded
    assert dispatch({"a": 0}, rules, {"n": 100, "m": 0}) == {"a": 0}
    assert dispatch({"a": 0}, rules, {"n": 200, "m": 5}) == {"a": 0}


def _seed_helpers() -> list[Path]:
    """Every seed that declares SHAPE_KEYS (its tunables_for must follow compose.dispatch)."""
    return [p for p in sorted(REPO.glob("tasks/*/seeds/*.py")) if "\nSHAPE_KEYS = " in
            p.read_text(encoding="utf-8")]


def _helper(path_or_source: Path | str):  # type: ignore[no-untyped-def]
    """The kernel's tunables_for, taken out of its file (no torch, no GPU) with fresh globals."""
    source = path_or_source if isinstance(path_or_source, str) else path_or_source.read_text()
    tree = ast.parse(source)
    func = next(n for n in tree.body if isinstance(n, ast.FunctionDef)
                and n.name == "tunables_for")
    namespace: dict = {}
    exec(compile(ast.Module([func], []), "<tunables_for>", "exec"), namespace)  # noqa: S102
    return namespace


bounds = st.one_of(st.none(), st.integers(0, 8192))
rule_sets = st.lists(st.fixed_dictionaries({
    "when": st.dictionaries(st.sampled_from(["m", "n", "k"]), st.tuples(bounds, bounds)),
    "knobs": st.dictionaries(st.sampled_from(["BLOCK_M", "SPLIT_K"]), st.integers(1, 8)),
}), max_size=4)
shapes = st.fixed_dictionaries({k: st.integers(0, 8192) for k in ("m", "n", "k")})


@pytest.mark.parametrize("seed", [*_seed_helpers(), "toy"], ids=lambda p: getattr(p, "name", p))
@settings(max_examples=60, deadline=None)
@given(rules=rule_sets, shape=shapes)
def test_the_seeds_read_their_rules_as_the_designer_composes_them(
        seed: Path | str, rules: list, shape: dict) -> None:
    namespace = _helper(SHAPED if seed == "toy" else seed)
    default = {"BLOCK_M": 128, "SPLIT_K": 1}
    namespace.update(TUNABLES=default, TUNABLES_BY_SHAPE=rules)
    assert namespace["tunables_for"](**shape) == dispatch(default, rules, shape)


def test_the_triton_seed_dispatches_per_shape() -> None:
    seeds = [p.name for p in _seed_helpers()]
    assert "triton_blockscaled.py" in seeds
    source = (REPO / "tasks/fp8_gemm/seeds/triton_blockscaled.py").read_text()
    assert "cfg = tunables_for(m=m, n=n, k=k)" in source
    assert read_by_shape(source) == []


# -- the designer and the writer ---------------------------------------------------------------
def test_designer_composes_the_per_shape_winners_and_the_writer_writes_them() -> None:
    base = knobbed("c0001", {"tile": 16, "unroll": 4})  # wins n=1024
    rival = knobbed("c0002", {"tile": 64, "unroll": 4}, gen=1, parents=("c0001",))  # wins 4096
    slow = knobbed("c0003", {"tile": 128, "unroll": 1}, gen=1, parents=("c0001",))
    broken = knobbed("c0004", {"tile": 32, "unroll": 4}, gen=1, passed=False)
    pop = [base, rival, slow, broken]
    design = OfflineDesigner().design(BRIEF, base, rival, pop, "", 3)
    plan = design.plans[0]
    assert plan.by_shape and plan in design.kept
    assert plan.title == "per shape class: n >= 2048 c0002; other shapes c0001"
    assert "composed from the per-shape winners of 3 passed kernel(s)" in plan.changes
    assert 0 < plan.expected_gain_min_pct < plan.expected_gain_max_pct
    assert plan.innovation == 5.0  # one of two benchmarks runs a knob point new to it
    assert plan.knobs == {}  # one benchmark each: the class of the base's point is TUNABLES
    assert "- fastest per shape class (3 kernels of one configuration): " in (
        design.findings_update)

    draft = OfflineWriter().write(BRIEF, base, plan)
    composed = cand("c0005", draft.source, gen=2, parents=("c0001",))
    assert skeleton_sha(draft.source) == skeleton_sha(base.source)  # one family
    assert read_tunables(draft.source) == read_tunables(base.source)
    assert read_by_shape(draft.source) == [
        {"when": {"n": [2048, None]}, "knobs": {"tile": 64, "unroll": 4}}]
    assert "# n >= 2048: c0002's knobs, fastest on 1 benchmark there" in draft.source
    for bench in CASES:  # each benchmark runs its winner: the fastest passed point there
        assert composed.bench_median_us[bench] == min(
            c.bench_median_us[bench] for c in (base, rival, slow))
    ns = _helper(draft.source)
    ns.update(TUNABLES=read_tunables(draft.source), TUNABLES_BY_SHAPE=read_by_shape(draft.source))
    assert ns["tunables_for"](n=100) == {"tile": 16, "unroll": 4}
    assert ns["tunables_for"](n=10**6) == {"tile": 64, "unroll": 4}

    # Once present, the same composition is not proposed again, the composed kernel (now the
    # fastest) is the next base, and the knob model does not read its geomean as a knob point's.
    pop.append(composed)
    assert OfflineSelector().select(BRIEF, pop, "").base_id == "c0005"
    again = OfflineDesigner().design(BRIEF, rival, base, pop, "", n_keep=100)  # every plan
    assert not any(p.by_shape for p in again.plans)
    without = OfflineDesigner().design(BRIEF, rival, base, pop[:-1], "", n_keep=100)
    assert any(p.by_shape for p in without.plans)
    assert sorted(p.changes for p in again.plans) == sorted(
        p.changes for p in without.plans if not p.by_shape)


def test_selector_takes_a_composed_fastest_as_the_base_and_says_so() -> None:
    base = knobbed("c0001", {"tile": 16, "unroll": 4})
    rival = knobbed("c0002", {"tile": 64, "unroll": 4})
    plan = OfflineDesigner().design(BRIEF, base, rival, [base, rival], "", 3).plans[0]
    composed = cand("c0003", OfflineWriter().write(BRIEF, base, plan).source, gen=1)
    sel = OfflineSelector().select(BRIEF, [base, rival, composed], "")
    assert sel.base_id == "c0003"
    assert sel.reason.startswith("base c0003: ") and "rank 1 of 3 passing; it runs knob points " \
        "per shape class: its moves go inside one class" in sel.reason


def test_no_composition_for_a_kernel_that_cannot_dispatch_or_an_unknown_shape() -> None:
    from evolve_fakes import SEED  # declares TUNABLES but no TUNABLES_BY_SHAPE

    base = cand("c0001", rewrite_tunables(SEED, {"tile": 16, "unroll": 4}))
    rival = cand("c0002", rewrite_tunables(SEED, {"tile": 64, "unroll": 4}))
    design = OfflineDesigner().design(BRIEF, base, rival, [base, rival], "", 3)
    assert design.plans and not any(p.by_shape for p in design.plans)
    shaped = [knobbed("c0001", {"tile": 16, "unroll": 4}), knobbed("c0002", {"tile": 64})]
    blind = BRIEF.model_copy(update={"benchmark_cases": {}})  # a brief without the shapes
    design = OfflineDesigner().design(blind, shaped[0], shaped[1], shaped, "", 3)
    assert not any(p.by_shape for p in design.plans)


def test_offline_scientist_composes_past_the_best_single_configuration() -> None:
    """Generations of three on a landscape whose best tile depends on n: the composition of
    the winners beats every kernel of one configuration, and runs on each benchmark only a
    point that passed there in an earlier kernel."""
    pop = [knobbed("c0001", {"tile": 16, "unroll": 1})]
    selector, designer, writer = OfflineSelector(), OfflineDesigner(), OfflineWriter()
    compositions = []
    for g in range(1, 6):
        sel = selector.select(BRIEF, pop, "")
        base = next(c for c in pop if c.id == sel.base_id)
        ref = next((c for c in pop if c.id == sel.reference_id), None)
        for plan in designer.design(BRIEF, base, ref, pop, "", 3).kept:
            source = writer.write(BRIEF, base, plan).source
            pop.append(cand(f"c{len(pop) + 1:04d}", source, g, (base.id,)))
            if plan.title.startswith("per shape class: "):
                compositions.append(pop[-1])
    single = [c for c in pop if not read_by_shape(c.source)]
    assert compositions

    def ran(c: CandidateSummary, case: dict) -> str:
        values, rules = read_tunables(c.source), read_by_shape(c.source) or []
        return json.dumps(dispatch(values, rules, case), sort_keys=True)

    for c in compositions:
        earlier = [e for e in pop if e.generation < c.generation and e.status == "passed"]
        for case in CASES.values():
            assert ran(c, case) in {ran(e, case) for e in earlier}
    composed = [c for c in pop if read_by_shape(c.source)]
    best_single = min(c.geomean_us or math.inf for c in single)
    assert min(c.geomean_us or math.inf for c in composed) < best_single / 1.05


# -- end to end: a real child session checks and times the composed kernel ----------------------
BLOCKS_TOML = """name = "blocks"
description = "out = 2*x + y over float32 vectors, block by block"
case_keys = ["n", "seed"]
output_index = 2

[check]
atol = 1e-6
rtol = 1e-6

[bench]
warmup = 1
min_runs = 5
max_runs = 30
budget_s = 0.05

[[floor]]
device = "*"
peak_tflops = 5000.0
peak_tbps = 10.0

[profiles.full]
tests = [{ n = 1000, seed = 1 }, { n = 33, seed = 2 }, { n = 5000, seed = 5 }]
benchmarks = [{ n = 256, seed = 3 }, { n = 65536, seed = 4 }]

[profiles.cpu]
tests = [{ n = 1000, seed = 1 }, { n = 33, seed = 2 }, { n = 5000, seed = 5 }]
benchmarks = [{ n = 256, seed = 3 }, { n = 65536, seed = 4 }]
"""

# Each step computes one whole block, padded past the end: a big block wastes work on a short
# vector, a small one takes many steps on a long vector (ratios of 3x and more on 2 CPU cores).
BLOCKS_SEED = '''"""out = 2*x + y, one padded block per step."""

import torch

TUNABLES = {"block": 256}
TUNABLE_SPACE = {"block": [256, 65536]}
SHAPE_KEYS = ["n"]
TUNABLES_BY_SHAPE = []


''' + TUNABLES_FOR + '''

def custom_kernel(data):
    x, y, out = data
    n = x.numel()
    block = tunables_for(n=n)["block"]
    buf = torch.zeros(2, block)
    for i in range(0, n, block):
        w = min(block, n - i)
        buf[0, :w] = x[i:i + w]
        buf[1, :w] = y[i:i + w]
        out[i:i + w] = (2 * buf[0] + buf[1])[:w]
    return out
'''


def evolve_blocks(pytester: pytest.Pytester, seeds: dict[str, str]) -> pytest.RunResult:
    """One generation of one candidate by the offline scientist on the CPU, over a copy of the
    blocks task whose seeds are ``seeds`` (file name -> source)."""
    task = pytester.mkdir("blocks")
    (task / "task.toml").write_text(BLOCKS_TOML)
    (task / "reference.py").write_text((REPO / "tests/data/axpy/reference.py").read_text())
    (task / "seeds").mkdir()
    for name, source in seeds.items():
        (task / "seeds" / name).write_text(source)
    return pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--evolve", "1", "blocks", "--ks-candidates", "1",
        "--ks-llm", "offline", "--ks-profile", "cpu", "--ks-device", "cpu", timeout=600,
    )


def assert_checked_beside_base(root: Path, cid: str) -> None:
    """The blocks task's candidate ``cid`` passed its 3 checks and was timed beside c0001."""
    record = json.loads((root / cid / "results.json").read_text())
    assert record["status"] == "passed", record["failure"]
    checks = [c for c in record["result"]["cases"] if c["kind"] == "check"]
    assert len(checks) == 3 and all(c["outcome"] == "passed" for c in checks)
    assert "c0001" in record["speedups"]


def test_evolve_writes_a_composed_kernel_that_passes_its_checks(pytester: pytest.Pytester) -> None:
    """Two seeds of one family, each fastest on one benchmark: with every knob point tried, the
    offline scientist's one plan is their composition, checked and timed in a child session."""
    result = evolve_blocks(pytester, {
        "large.py": rewrite_tunables(BLOCKS_SEED, {"block": 65536}), "small.py": BLOCKS_SEED})
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines([
        "*gen 1/1 | design   | * plans, kept 1: per shape class: n < 4096 c0002; "
        "other shapes c0001",
        "*gen 1/1 | write    | c0003 'per shape class: *': written",
    ])
    root = pytester.path / "population" / "blocks"
    meta = json.loads((root / "c0003" / "meta.json").read_text())
    assert meta["parents"][0] == "c0001" and meta["plan"]["by_shape"] == [{
        "when": {"n": [None, 4096]}, "knobs": {"block": 256},
        "note": "n < 4096: c0002's knobs, fastest on 1 benchmark there"}]
    source = (root / "c0003" / "c0003.py").read_text()
    assert read_by_shape(source) == [{"when": {"n": [None, 4096]}, "knobs": {"block": 256}}]
    assert read_tunables(source) == {"block": 65536}
    assert_checked_beside_base(root, "c0003")
    assert "per shape class: n < 4096 c0002" in (root / "lineage.md").read_text()
    assert "fastest per shape class (2 kernels of one configuration)" in (
        root / "findings.md").read_text()


def test_a_composed_triton_seed_passes_the_checks_on_every_class(tmp_path: Path) -> None:
    """The fp8_gemm Triton seed with three knob points, one per class the CPU checks fall in,
    checked by the harness under the Triton interpreter (drawn cases too)."""
    if importlib.util.find_spec("triton") is None or importlib.util.find_spec("numpy") is None:
        pytest.skip("the Triton interpreter needs triton and numpy")
    seed = REPO / "tasks/fp8_gemm/seeds/triton_blockscaled.py"
    base = CandidateSummary(id="c0001", generation=0, source=seed.read_text(), status="passed")
    plan = ExperimentPlan(
        title="three classes", changes="by hand", expected_gain_min_pct=0,
        expected_gain_max_pct=1, innovation=5, knobs={"LAYOUT": "direct"},
        by_shape=[  # m32-n200-k384; m64-n64-k128; the default: m96-n320-k256
            ShapeRule(when={"m": (None, 64)}, knobs=dict(
                LAYOUT="kmajor", BLOCK_M=64, BLOCK_N=32, BLOCK_K=64, GROUP_M=4, SPLIT_K=2)),
            ShapeRule(when={"m": (64, None), "k": (None, 200)}, knobs=dict(
                LAYOUT="fp16", BLOCK_M=64, BLOCK_N=128, BLOCK_K=64)),
        ])
    composed = tmp_path / "composed.py"
    composed.write_text(OfflineWriter().write(BRIEF, base, plan).source)
    code, out, data = run_pytest([str(REPO / "tasks/fp8_gemm"), "--kernel", str(composed),
                                  "--ks-profile", "cpu", "--ks-device", "cpu",  # interpreted
                                  "--ks-drawn", "2", "-k", "check"],
                                 cwd=tmp_path)
    assert code == 0, out
    cases = [c for c in data["candidates"] if c["name"] == "composed"][0]["cases"]
    assert len(cases) == 4 and all(c["outcome"] == "passed" for c in cases), cases
