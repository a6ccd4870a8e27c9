"""bench/sweep_seed.py: a sweep's fused points become the seed's knobs and per-shape rules."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import load_file

from pytest_kscientist.evolve.offline.compose import dispatch
from pytest_kscientist.evolve.offline.knobs import read_by_shape, read_tunables

ROOT = Path(__file__).parent.parent
SEED = ROOT / "tasks" / "fp8_gemm" / "seeds" / "triton_fused.py"


def _script():
    return load_file(ROOT / "bench" / "sweep_seed.py", "sweep_seed")


def _sweep(script, defaults, times_by_point):
    labels = list(script.cases())
    rows = {name: {"changes": changes, "failed": None, "us": {b: fn(b) for b in labels}}
            for name, (changes, fn) in times_by_point.items()}
    rows["seed"] = {"changes": {}, "failed": None, "us": {b: 1.0 for b in labels}}  # other family
    rows["broken"] = {"changes": {"LAYOUT": "fp16"}, "failed": "m1024-...: 3 of 9 outside",
                      "us": {}}
    return {"_env": {"fused_defaults": defaults}, **rows}


def test_the_winner_of_each_class_of_shapes_runs_there() -> None:
    script = _script()
    source = SEED.read_text()
    defaults = read_tunables(source)
    sweep = _sweep(script, defaults, {
        "b16": ({"LAYOUT": "b16"}, lambda b: 50.0 if b.startswith("m1024") else 200.0),
        "a16": ({"LAYOUT": "a16", "BLOCK_M": 128}, lambda b: 80.0 if b.startswith("m1024")
                else 100.0),
    })
    out, said = script.swept_source(sweep, source)
    assert read_tunables(out) == {**defaults, "LAYOUT": "a16", "BLOCK_M": 128}
    rules = read_by_shape(out)
    for label, shape in script.cases().items():
        layout = dispatch(read_tunables(out), rules, shape)["LAYOUT"]
        assert layout == ("b16" if label.startswith("m1024") else "a16"), label
    assert "composed 70.7 us" in said[-1]


def test_one_point_winning_everywhere_gives_no_rules() -> None:
    script = _script()
    source = SEED.read_text()
    defaults = read_tunables(source)
    sweep = _sweep(script, defaults, {
        "b16": ({"LAYOUT": "b16"}, lambda b: 50.0),
        "a16": ({"LAYOUT": "a16"}, lambda b: 60.0),
    })
    out, said = script.swept_source(sweep, source)
    assert read_tunables(out)["LAYOUT"] == "b16" and read_by_shape(out) == []
    assert said[-1] == "no class gains 3%: no rules"


def test_a_sweep_from_other_defaults_is_refused() -> None:
    script = _script()
    source = SEED.read_text()
    sweep = _sweep(script, {**read_tunables(source), "BLOCK_N": 64}, {})
    with pytest.raises(SystemExit, match="other defaults than this seed's TUNABLES"):
        script.swept_source(sweep, source)


def test_rows_that_record_their_knobs_are_taken_as_recorded() -> None:
    """fused_sweep.py's rows carry each point's full knobs (from its fixed first defaults),
    so a sweep made before the seed's TUNABLES changed still gives the knobs it timed."""
    script = _script()
    source = SEED.read_text()
    defaults = read_tunables(source)
    other = {**defaults, "BLOCK_N": 64, "LAYOUT": "a16", "num_stages": 2}
    sweep = _sweep(script, {}, {"a16": ({"LAYOUT": "a16"}, lambda b: 40.0)})
    sweep["a16"]["knobs"] = other
    del sweep["_env"]["fused_defaults"]
    out, _ = script.swept_source(sweep, source)
    assert read_tunables(out) == other and read_by_shape(out) == []
