"""Prompt templates are data files; the blocks that fill them carry times, history and errors."""

from __future__ import annotations

import pytest
from fake_scientist import sample_population

from pytest_kscientist.evolve.llm import prompts
from pytest_kscientist.evolve.roles import CandidateSummary, ExperimentPlan


@pytest.mark.parametrize("name", prompts.TEMPLATES)
def test_every_template_is_valid_and_a_missing_value_is_an_error(name):
    template = prompts.template(name)
    assert template.is_valid()
    if not template.get_identifiers():
        assert "$" not in prompts.render(name)
        return
    with pytest.raises(KeyError):  # never a literal "$name" sent to the model
        prompts.render(name)


def test_the_population_table_lists_the_fastest_passing_first_and_failures_last():
    table = prompts.population_table(sample_population()).splitlines()
    assert table[2].startswith("| `g1-kgroup4` | 1 | passed | 120.0 us | `seed-torch` |")
    assert table[3].startswith("| `seed-torch` | 0 | passed | 150.0 us | - | seed |")
    assert table[4].startswith("| `g1-broken` | 1 | failed | - |")


def test_history_shows_outcomes_changes_against_the_parent_and_errors():
    text = prompts.history(sample_population())
    assert (
        "- gen 1 `g1-kgroup4`: group 4 K blocks -> passed, geomean 120.0 us, "
        "1.25x the speed of `seed-torch`" in text
    )
    assert "- gen 1 `g1-broken`: fused triton kernel -> failed: SyntaxError" in text
    assert text.index("g1-") < text.index("gen 0")  # newest first


def test_long_failures_are_cut_and_the_history_is_bounded():
    many = [
        CandidateSummary(id=f"c{i}", generation=i, source="", status="failed", failure="x" * 5000)
        for i in range(40)
    ]
    text = prompts.history(many)
    assert len(text.splitlines()) == prompts.HISTORY_LIMIT
    assert "[...]" in text and len(text) < prompts.HISTORY_LIMIT * (prompts.FAILURE_CHARS + 80)


def test_a_candidate_card_holds_per_shape_times_and_the_full_source():
    seed = sample_population()[0]
    card = prompts.candidate_card(seed, "Base kernel")
    assert card.startswith("### Base kernel: `seed-torch` (generation 0, passed, geomean 150.0 us)")
    assert "| m6144-n7168-k2048-s76547 | 187.5 us |" in card
    assert f"```python\n{seed.source.rstrip()}\n```" in card
    assert prompts.candidate_card(None, "Reference kernel") == "### Reference kernel\n(none chosen)"


def test_a_plan_reads_with_gains_innovation_and_knobs():
    plan = ExperimentPlan(
        title="t",
        changes="c",
        expected_gain_min_pct=-2,
        expected_gain_max_pct=15,
        innovation=7,
        knobs={"k_group": 4},
    )
    assert prompts.plan_text(plan) == (
        "**t**\n\nc\n\nExpected gain: -2% to 15%; innovation 7/10.\nKnob settings: k_group=4"
    )


def test_a_long_traceback_keeps_its_whole_message_its_last_frames_and_its_causes():
    from pytest_kscientist.evolve.failure_text import FRAMES_KEPT, trim

    frames = "".join(f'  File "/k/c0009.py", line {i}, in f{i}\n    call_{i}()\n'
                     for i in range(40))
    text = (
        "Traceback (most recent call last):\n  File \"/k/c0009.py\", line 3, in inner\n"
        "    raise ValueError('x')\nValueError: arange's range must be a power of 2\n\n"
        "The above exception was the direct cause of the following exception:\n\n"
        "Traceback (most recent call last):\n" + frames +
        "triton.compiler.errors.CompilationError: at 3:4:\n    offs = tl.arange(0, 3)\n"
        "    ^\nValueError(\"arange's range must be a power of 2\")\n"
    )
    short = trim(text, 800)
    assert len(short) <= 800
    assert short.startswith(f"Traceback (last {FRAMES_KEPT} of 40 frames):")
    assert "call_39()" in short and "call_36()" not in short
    assert short.endswith("(raised from ValueError: arange's range must be a power of 2)")
    assert "CompilationError: at 3:4:\n    offs = tl.arange(0, 3)\n    ^\nValueError(" in short
    mismatch = "mismatch at [3, 7]: " + "x" * 5000 + " (worst of 120 elements)"
    cut = trim(mismatch, 600)
    assert cut.startswith("mismatch at [3, 7]:") and cut.endswith("(worst of 120 elements)")
    assert "characters left out" in cut and len(cut) < 700


def test_the_selector_sees_per_benchmark_times_side_by_side_with_the_fastest_in_bold():
    table = prompts.shape_table(sample_population()).splitlines()
    assert table[0] == "| benchmark | `g1-kgroup4` | `seed-torch` |"
    assert table[2] == "| m1024-n1536-k7168-s8135 | **100.0 us** | 120.0 us |"
    assert table[3] == "| m6144-n7168-k2048-s76547 | **144.0 us** | 187.5 us |"
    assert prompts.shape_table(sample_population()[2:]) == "(no benchmark times yet)"


def test_the_writer_is_told_the_fast_load_inline_build() -> None:
    """Issue 32: a CUDA candidate spent 95% of its evaluation compiling torch's headers; the
    writer's rules name the build the CUDA seed uses, and the seed follows them."""
    from pathlib import Path

    rules = prompts.template("writer").template
    for piece in ("`cuda_sources` with\n  `no_implicit_headers=True`", "a launcher taking raw "
                  "pointers", "includes no torch header\n  (Python's C API"):
        assert piece in rules, piece
    seed = (Path(__file__).parent.parent / "tasks" / "fp8_gemm" / "seeds" / "cuda_wgmma.py")
    source = seed.read_text()
    assert "no_implicit_headers=True" in source and "#include <Python.h>" in source
