"""The offline scientist: selection from the numbers, designs learned from history, ast writing."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest
from evolve_fakes import PLAIN, SEED, synthetic_us

from pytest_kscientist.evolve.offline.knobs import KnobError, read_tunables, rewrite_tunables
from pytest_kscientist.evolve.offline.scientist import (
    NothingToMove,
    OfflineDesigner,
    OfflineSelector,
    OfflineWriter,
)
from pytest_kscientist.evolve.roles import CandidateSummary, ExperimentPlan, TaskBrief

BRIEF = TaskBrief(
    name="toy", description="", reference_source="", hardware="cpu", benchmark_ids=["b1", "b2"]
)
FP8_SEED = Path(__file__).parent.parent / "tasks" / "fp8_gemm" / "seeds" / "torch_dequant.py"


def cand(
    cid: str,
    knobs: dict | None = None,
    times: tuple[float, float] | None = (100.0, 300.0),
    gen: int = 0,
    parents: tuple[str, ...] = (),
    source: str = SEED,
) -> CandidateSummary:
    if knobs is not None:
        source = rewrite_tunables(source, knobs)
    bench = dict(zip(["b1", "b2"], times, strict=True)) if times else {}
    return CandidateSummary(
        id=cid,
        generation=gen,
        parents=list(parents),
        source=source,
        status="passed" if times else "failed",
        geomean_us=math.sqrt(times[0] * times[1]) if times else None,
        bench_median_us=bench,
        failure="" if times else "check n16-s1: mismatch",
    )


def config(c: CandidateSummary) -> tuple:
    return tuple(sorted(read_tunables(c.source).items()))


def test_selector_takes_the_fastest_passing_base_and_a_rival_that_wins_a_shape() -> None:
    pop = [
        cand("c0001", {"tile": 16}, (100, 400)),
        cand("c0002", {"tile": 32}, (80, 300), gen=1, parents=("c0001",)),
        cand("c0003", {"tile": 64}, (60, 500), gen=1, parents=("c0001",)),  # wins b1
        cand("c0004", {"tile": 8}, None, gen=1, parents=("c0001",)),  # failed: never chosen
    ]
    sel = OfflineSelector().select(BRIEF, pop, "")
    assert sel.base_id == "c0002"
    assert sel.reference_id == "c0003"
    assert "rank 1 of 3" in sel.reason and "fastest on 1 of 2 benchmarks" in sel.reason


def test_selector_falls_back_to_another_lineage_as_reference() -> None:
    pop = [
        cand("c0001", {"tile": 16}, (100, 300)),
        cand("c0002", None, (200, 600), source=PLAIN),
        cand("c0003", {"tile": 32}, (90, 250), gen=1, parents=("c0001",)),
    ]
    sel = OfflineSelector().select(BRIEF, pop, "")
    assert (sel.base_id, sel.reference_id) == ("c0003", "c0002")
    assert "another lineage" in sel.reason


def test_selector_moves_off_a_stalled_best_to_another_family() -> None:
    other = SEED.replace("return data", "return list(data)")
    pop = [cand("c0001", {"tile": 16}, (100, 300))]
    pop.append(cand("c0002", {"tile": 16}, (150, 400), source=other))
    pop += [
        cand(f"c01{g:02d}", {"tile": 8, "unroll": 2 ** (g % 4)}, (500, 900), gen=g)
        for g in range(1, 5)
    ]
    sel = OfflineSelector(stall=3).select(BRIEF, pop, "")
    assert sel.base_id == "c0002" and "unbeaten for 4 generations" in sel.reason


def test_selector_without_a_passing_candidate_refuses() -> None:
    with pytest.raises(ValueError, match="no candidate has passed"):
        OfflineSelector().select(BRIEF, [cand("c0001", {"tile": 16}, None)], "")


def test_designer_never_proposes_a_configuration_already_present() -> None:
    base = cand("c0001", {"tile": 16, "unroll": 1})
    pop = [base, cand("c0002", {"tile": 32, "unroll": 1}), cand("c0003", {"tile": 8, "unroll": 2})]
    design = OfflineDesigner().design(BRIEF, base, None, pop, "", 3)
    assert len(design.avenues) == 10 and len(design.plans) == 5 and len(design.kept) == 3
    present = {config(c) for c in pop}
    for plan in design.plans:
        after = tuple(sorted((read_tunables(base.source) | plan.knobs).items()))
        assert after not in present
        assert plan.expected_gain_min_pct <= plan.expected_gain_max_pct
        assert 0 <= plan.innovation <= 10


def test_designer_predicts_gains_from_observed_knob_effects() -> None:
    # tile 16 -> 32 halved the time and unroll 1 -> 2 doubled it, in earlier generations
    pop = [
        cand("c0001", {"tile": 16, "unroll": 1}, (100, 100)),
        cand("c0002", {"tile": 32, "unroll": 1}, (50, 50), gen=1),
        cand("c0003", {"tile": 16, "unroll": 2}, (200, 200), gen=1),
    ]
    design = OfflineDesigner().design(BRIEF, pop[1], None, pop, "", 3)
    plans = {tuple(sorted(p.knobs.items())): p for p in design.plans + design.kept}
    by_title = {p.title: p for p in plans.values()}
    mids = {t: (p.expected_gain_min_pct + p.expected_gain_max_pct) / 2 for t, p in by_title.items()}
    assert mids["tile 32 -> 64"] > 0  # continues the helpful trend
    assert mids["unroll 1 -> 2"] < 0  # repeats a move that hurt
    assert design.findings_update.count("`tile`") == 1


def test_designer_novelty_scores_unseen_values_higher() -> None:
    pop = [cand("c0001", {"tile": 16, "unroll": 1}), cand("c0002", {"tile": 32, "unroll": 2})]
    design = OfflineDesigner().design(BRIEF, pop[0], None, pop, "", n_keep=100)  # every plan
    plans = {p.title: p for p in design.plans}
    assert plans["tile 16 -> 8"].innovation == 10  # never tried
    assert plans["tile 16 -> 32"].innovation == 5  # tried once
    assert plans["unroll 1 -> 2"].innovation == 5
    assert len(design.kept) == 100 or len(design.kept) == len(design.plans)


def test_designer_crosses_over_with_a_reference_of_the_same_family() -> None:
    base = cand("c0001", {"tile": 16, "unroll": 1})
    ref = cand("c0002", {"tile": 128, "unroll": 8}, (50, 900))
    design = OfflineDesigner().design(BRIEF, base, ref, [base, ref], "", 3)
    assert any("reference c0002" in p.changes for p in design.plans)


def test_designer_cannot_vary_a_kernel_without_knobs() -> None:
    base = cand("c0001", None, source=PLAIN)
    with pytest.raises(NothingToMove, match=r"nothing to move in task '.*': its base c0001 "
                       r"declares no knobs .* with the LLM scientist \(--ks-llm gemini"):
        OfflineDesigner().design(BRIEF, base, None, [base], "", 3)


def test_writer_rewrites_only_knobs_and_explains() -> None:
    base = cand("c0001", None, source=FP8_SEED.read_text())
    plan = ExperimentPlan(
        title="k_group 1 -> 2",
        changes="because",
        expected_gain_min_pct=0,
        expected_gain_max_pct=10,
        innovation=5,
        knobs={"k_group": 2},
    )
    draft = OfflineWriter().write(BRIEF, base, plan)
    ast.parse(draft.source)
    assert read_tunables(draft.source) == {"k_group": 2, "m_chunk": 0}
    assert len(draft.source) == len(base.source)
    assert "k_group 1 -> 2" in draft.explanation
    with pytest.raises(KnobError, match="names no knob values"):
        OfflineWriter().write(BRIEF, base, plan.model_copy(update={"knobs": {}}))


def test_offline_scientist_improves_the_seed_over_generations() -> None:
    """Five generations of three on the synthetic landscape beat the seed by over 1.5x."""
    pop = [cand("c0001", None, tuple(synthetic_us({"tile": 16, "unroll": 1})))]
    selector, designer, writer = OfflineSelector(), OfflineDesigner(), OfflineWriter()
    for g in range(1, 6):
        sel = selector.select(BRIEF, pop, "")
        base = next(c for c in pop if c.id == sel.base_id)
        design = designer.design(BRIEF, base, None, pop, "", 3)
        assert len(design.kept) == 3
        for plan in design.kept:
            source = writer.write(BRIEF, base, plan).source
            times = tuple(synthetic_us(read_tunables(source)))
            pop.append(cand(f"c{len(pop) + 1:04d}", None, times, g, (base.id,), source))
    assert len({config(c) for c in pop}) == len(pop) == 16
    best = min(c.geomean_us or math.inf for c in pop)
    assert (pop[0].geomean_us or 0) / best > 1.5


def test_builtin_scientists_are_trylast_hooks_a_plugin_can_replace_one_by_one(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_kscientist.evolve.assemble import register_builtin_roles

    for key in ("GEMINI_API_KEY", "GOOGLE_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(key, raising=False)
    config = pytester.parseconfigure()
    builtin = register_builtin_roles(config, pytester.path)
    assert register_builtin_roles(config, pytester.path) is builtin  # registered once
    for role in ("selector", "designer", "writer"):
        hook = getattr(config.hook, f"pytest_kscientist_make_{role}")
        ours = [impl for impl in hook.get_hookimpls() if impl.plugin is builtin]
        assert len(ours) == 1 and ours[0].trylast

    mine = OfflineSelector()

    class OnlyASelector:
        def pytest_kscientist_make_selector(self, config, task):  # type: ignore[no-untyped-def]
            return mine

    config.pluginmanager.register(OnlyASelector())
    brief = TaskBrief(name="toy", description="", reference_source="", hardware="",
                      benchmark_ids=[])
    assert config.hook.pytest_kscientist_make_selector(config=config, task=brief) is mine
    designer = config.hook.pytest_kscientist_make_designer(config=config, task=brief)
    assert isinstance(designer, OfflineDesigner)  # no LLM configured: the offline scientist
    assert builtin.made(brief)[0][1] is designer


def test_keep_three_never_keeps_the_same_plan_twice() -> None:
    from pytest_kscientist.evolve.roles import keep_three

    def plan(title: str, innovation: int, gain: float) -> ExperimentPlan:
        return ExperimentPlan(title=title, changes="use a 2-stage pipeline",
                              expected_gain_min_pct=gain, expected_gain_max_pct=gain + 10,
                              innovation=innovation)

    same = [plan("Pipeline K", 5, 10), plan("pipeline  k", 5, 10), plan("PIPELINE K ", 5, 10)]
    assert len(keep_three(same)) == 1
    assert [p.title for p in keep_three([*same, plan("Split K", 3, 1)])] == [
        "Pipeline K", "Split K"]
