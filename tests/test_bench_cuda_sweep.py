"""bench/cuda_sweep.py's patched builds of the CUDA seed (no GPU needed): every probe and
variant applies to the seed as committed, and the turns_lapse variant's turn-taking, run on a
model of named barriers, neither deadlocks nor lets an arrival complete a barrier alone."""

from __future__ import annotations

import random
import re

import pytest
from helpers import REPO, load_file


def _module():
    return load_file(REPO / "bench" / "cuda_sweep.py", "cuda_sweep")


def test_every_probe_and_variant_applies_under_its_own_build_name(tmp_path) -> None:
    sweep = _module()
    for name in [*sweep.PROBES, *sweep.VARIANTS]:
        source = sweep.probe_file(name, tmp_path).read_text()
        assert f'name="ks_{name}' in source and 'name="ks_cuda_wgmma' not in source


def test_a_seed_without_a_patchs_text_is_named(tmp_path, monkeypatch) -> None:
    sweep = _module()
    monkeypatch.setitem(sweep.VARIANTS, "broken", [("no such line\n", "")])
    with pytest.raises(SystemExit, match="0 copies of 'no such line"):
        sweep.probe_file("broken", tmp_path)


def _condition(variant: list[tuple[str, str]], comment: str):
    """The C condition before `comment` in the variant's new lines, as a Python function of
    half, kb, kb0, kb1 (the ternary rewritten)."""
    text = next(new for _, new in variant if comment in new)
    cond = re.search(r"if \((.+?)\)\s*(?:\n\s*)?named_", text, re.S).group(1)
    cond = re.sub(r"\((\w+ == \d) \? (.+?) : (.+?)\)", r"((\2) if \1 else (\3))", cond)
    cond = cond.replace("&&", "and").replace("g.kb0", "kb0").replace("g.kb1", "kb1")
    return lambda half, kb, kb0, kb1: eval(cond, {}, dict(pingpong=1, half=half, kb=kb, kb0=kb0,
                                                           kb1=kb1))


@pytest.mark.parametrize("segments", [[2] * 5, [1, 3, 1, 4], [56], [3, 2, 2, 7, 1]])
def test_turns_lapse_neither_deadlocks_nor_lets_one_side_fill_a_barrier(segments) -> None:
    """Two consumers walk the same runs of K steps; before a step a consumer waits on named
    barrier 3 + half when the variant's condition holds, after it arrives on 4 - half when its
    other condition holds. A barrier's phase completes once both consumers are in it; an
    arrival by a consumer already in the pending phase would complete it without the other
    (256 arrivals from one side's 128 threads twice): that must never happen."""
    variant = _module().VARIANTS["turns_lapse"]
    waits, arrives = _condition(variant, "// my turn"), _condition(variant, "// the other's turn")
    program = {half: [(kb, 0, len_) for len_ in segments for kb in range(len_)]
               for half in (0, 1)}
    for seed in range(50):
        rng = random.Random(seed)
        pending: dict[int, set[int]] = {3: set(), 4: set()}  # barrier -> consumers in its phase
        waiting: dict[int, int | None] = {0: None, 1: None}  # consumer -> barrier it waits on
        pc, stage = {0: 0, 1: 0}, {0: "before", 1: "before"}
        while pc[0] < len(program[0]) or pc[1] < len(program[1]):
            ready = [h for h in (0, 1) if pc[h] < len(program[h]) and waiting[h] is None]
            assert ready, f"deadlock at steps {pc} of {segments}"
            h = rng.choice(ready)
            kb, kb0, kb1 = program[h][pc[h]]
            if stage[h] == "before":
                stage[h] = "after"
                if waits(h, kb, kb0, kb1):
                    bar = 3 + h
                    assert h not in pending[bar]
                    pending[bar].add(h)
                    waiting[h] = bar
            else:
                stage[h] = "before"
                pc[h] += 1
                if arrives(h, kb, kb0, kb1):
                    bar = 4 - h
                    assert h not in pending[bar], f"{h} arrives twice on {bar}: {segments}"
                    pending[bar].add(h)
            for bar in (3, 4):
                if pending[bar] == {0, 1}:  # the phase completes: its waiter goes on
                    pending[bar] = set()
                    for c in (0, 1):
                        if waiting[c] == bar:
                            waiting[c] = None
        assert pending == {3: set(), 4: set()}, (segments, pending)


def test_shapes_and_one_knob_point_as_the_profile_and_timeline_scripts_read_them() -> None:
    sweep = _module()
    cases = sweep.benchmark_cases(["m6144-n7168-k256", "m1024-n512-k7168"])
    assert [(c["m"], c["n"], c["k"]) for c in cases.values()] == [(6144, 7168, 256),
                                                                    (1024, 512, 7168)]
    with pytest.raises(SystemExit, match=r"\['m1-n2-k3'\]: not benchmark shapes"):
        sweep.benchmark_cases(["m1-n2-k3"])
    space = {"STREAM_K": [0, 1, 2], "PINGPONG": [0, 1]}
    assert sweep.one_point([], space) == {}
    assert sweep.one_point(["STREAM_K=0", "PINGPONG=1"], space) == {"STREAM_K": 0, "PINGPONG": 1}
    with pytest.raises(SystemExit, match="one value a knob"):
        sweep.one_point(["STREAM_K=0,1"], space)
