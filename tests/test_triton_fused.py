"""The second fp8_gemm Triton seed (triton_fused.py) against the reference, under the Triton
interpreter on the CPU, at knob points that together take every value of every knob that
changes what the kernel computes.

As in test_triton_seed.py, the kernel runs in one subprocess: TRITON_INTERPRET must be set
before the kernel module is imported and must not leak into this process. The subprocess also
records each launch's grid and constexprs, so the tests can show that the paths they claim to
cover (TMA descriptors, persistent programs walking several tiles, split-K) really ran.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_kscientist.evolve.offline.knobs import read_space, read_tunables, rewrite_tunables

TASK = Path(__file__).resolve().parents[1] / "tasks" / "fp8_gemm"
SEED = TASK / "seeds" / "triton_fused.py"

# The CPU profile's test cases, then odd ones: m and n off every tile size, n with a partial
# last scale block, k off BLOCK_K (200: a partial last scale block too); 48x208x200 and
# 96x320x256 have 16-byte row pitches in fp8, so TMA takes them with partial tiles and K.
SHAPES = [
    (64, 64, 128, 6635),
    (32, 200, 384, 1236),
    (96, 320, 256, 1234),
    (33, 200, 384, 7),
    (130, 129, 640, 8),
    (40, 136, 200, 9),
    (48, 208, 200, 10),
]
# The seed's first defaults (fp16 upcast, TMA, 128x128x64, 8 warps): most points below change
# a few knobs from here; "default" is the seed as it is (its TUNABLES and the rules of
# TUNABLES_BY_SHAPE, which give these small shapes their own knobs), "tunables" its TUNABLES
# alone; every other point runs without the rules.
FIRST = dict(LAYOUT="fp16", TMA=True, BLOCK_M=128, BLOCK_N=128, BLOCK_K=64,
             GROUP_M=8, PERSISTENT=0, SPLIT_K=1, num_warps=8, num_stages=3)
POINTS = {
    "default": {},
    "tunables": {},
    "fp16-tma": FIRST,
    "fused-ptr": dict(FIRST, LAYOUT="fused", TMA=False),
    "fused-ptr-256wide-g1": dict(FIRST, LAYOUT="fused", TMA=False, BLOCK_N=256, BLOCK_K=128,
                                 GROUP_M=1),
    "fp16-tma-64x64-persistent2": dict(FIRST, BLOCK_M=64, BLOCK_N=64, PERSISTENT=2, GROUP_M=4),
    "fused-tma-64x256x128-split2": dict(
        FIRST, LAYOUT="fused", BLOCK_M=64, BLOCK_N=256, BLOCK_K=128, SPLIT_K=2, GROUP_M=16
    ),
    "fp16-ptr-128x64x128-split4-persistent1": dict(
        FIRST, TMA=False, BLOCK_N=64, BLOCK_K=128, SPLIT_K=4, PERSISTENT=1
    ),
    "fused-tma-splitauto-persistent1": dict(
        FIRST, LAYOUT="fused", SPLIT_K=0, PERSISTENT=1, num_warps=4
    ),
    "fp16-tma-128x128x128-splitauto": dict(FIRST, BLOCK_K=128, SPLIT_K=0),
    "b16-tma-64x128x128-split2": dict(
        FIRST, LAYOUT="b16", BLOCK_M=64, BLOCK_K=128, SPLIT_K=2, num_warps=4
    ),
    "a16-tma-64x128x128-splitauto": dict(
        FIRST, LAYOUT="a16", BLOCK_M=64, BLOCK_K=128, SPLIT_K=0, num_warps=4
    ),
    "a16-ptr-128x256x64-persistent1-g1": dict(
        FIRST, LAYOUT="a16", TMA=False, BLOCK_N=256, PERSISTENT=1, GROUP_M=1
    ),
    "b16-tma-64x64x128": dict(
        FIRST, LAYOUT="b16", BLOCK_M=64, BLOCK_N=64, BLOCK_K=128, num_warps=4
    ),
    "a16-ptr-64x128x64-split2": dict(
        FIRST, LAYOUT="a16", TMA=False, BLOCK_M=64, SPLIT_K=2, num_warps=4
    ),
}
ATOL, RTOL = 1e-3, 2e-2

RUNNER = """
import importlib.util, json, sys, time
import torch

def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

task, seed_path, points, shapes, atol, rtol = json.loads(sys.argv[1])
reference = load("reference", task + "/reference.py")
seed = load("triton_fused", seed_path)
kernel, launches = seed._fp8_block_scaled_gemm, []

class Spy:  # records each launch's programs, work items and constexprs, then launches
    def __getitem__(self, grid):
        def launch(*args, **kw):
            m, n = args[5], args[6]
            items = -(-m // kw["BLOCK_M"]) * -(-n // kw["BLOCK_N"]) * kw["SPLIT_K"]
            launches.append({"programs": grid[0], "items": items,
                             **{k: v for k, v in kw.items() if k.isupper()}})
            return kernel[grid](*args, **kw)
        return launch

seed._fp8_block_scaled_gemm = Spy()
default, rules = dict(seed.TUNABLES), list(seed.TUNABLES_BY_SHAPE)
results = {}
for name, point in points.items():
    seed.TUNABLES.clear()
    seed.TUNABLES.update(default, **point)
    seed.TUNABLES_BY_SHAPE[:] = rules if name == "default" else []
    for m, n, k, s in shapes:
        data = reference.generate_input(m, n, k, s)
        expected = reference.ref_kernel(data).float()
        data[4].fill_(float("nan"))  # an element the kernel forgets to write fails the check
        launches.clear()
        start = time.perf_counter()
        out = seed.custom_kernel(data)
        seconds = time.perf_counter() - start
        ratio = ((out.float() - expected).abs() / (atol + rtol * expected.abs())).max().item()
        results[f"{name}|{m}x{n}x{k}"] = {
            "ratio": ratio, "dtype": str(out.dtype), "shape": list(out.shape),
            "seconds": seconds, "launch": launches[0],
        }
# other layouts than the task's: row-major A, B and scales, c a transposed view
for name in ("default", "fp16-ptr-128x64x128-split4-persistent1",
             "a16-tma-64x128x128-splitauto"):
    seed.TUNABLES.clear()
    seed.TUNABLES.update(default, **points[name])
    seed.TUNABLES_BY_SHAPE[:] = rules if name == "default" else []
    data = list(reference.generate_input(96, 320, 256, 3))
    expected = reference.ref_kernel(data).float()
    data[:4] = [t.contiguous() for t in data[:4]]
    data[4] = torch.full((320, 96), float("nan"), dtype=torch.bfloat16).T
    out = seed.custom_kernel(data)
    ratio = ((data[4].float() - expected).abs() / (atol + rtol * expected.abs())).max().item()
    results[f"layouts|{name}"] = {"ratio": ratio, "same": out is data[4]}
print(json.dumps(results))
"""


def test_tunables_are_literals_inside_their_space() -> None:
    """The offline scientist reads both dicts from the source (evolve/knobs.py) and moves
    knobs inside the space."""
    source = SEED.read_text()
    tunables, space = read_tunables(source), read_space(source)
    assert set(tunables) == set(space)
    for knob, value in tunables.items():
        assert value in space[knob], knob
        assert all(isinstance(v, type(value)) for v in space[knob]), knob
    # Each step must sit inside one 128-wide scale block.
    assert all(128 % bk == 0 for bk in space["BLOCK_K"])


def test_points_take_every_value_of_the_knobs_that_change_the_result() -> None:
    space = read_space(SEED.read_text())
    default = read_tunables(SEED.read_text())
    for knob in set(space) - {"num_warps", "num_stages"}:  # the interpreter ignores these two
        taken = {dict(default, **point)[knob] for point in POINTS.values()}
        assert taken == set(space[knob]), knob


@pytest.fixture(scope="module")
def interpreted_results() -> dict:
    if importlib.util.find_spec("triton") is None or importlib.util.find_spec("numpy") is None:
        pytest.skip("the Triton interpreter needs triton and numpy")
    env = dict(os.environ, TRITON_INTERPRET="1")
    args = json.dumps([str(TASK), str(SEED), POINTS, SHAPES, ATOL, RTOL])
    proc = subprocess.run(
        [sys.executable, "-c", RUNNER, args], env=env, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}x{s[2]}")
@pytest.mark.parametrize("point", POINTS)
def test_fused_seed_matches_reference(interpreted_results, point, shape) -> None:
    m, n, k, _ = shape
    result = interpreted_results[f"{point}|{m}x{n}x{k}"]
    assert result["dtype"] == "torch.bfloat16"
    assert result["shape"] == [m, n]
    # ratio = max |out - ref| / (atol + rtol |ref|); NaN (an unwritten element) also fails.
    assert result["ratio"] <= 1.0, result


def test_the_checked_runs_took_every_path(interpreted_results) -> None:
    """TMA descriptors in both layouts (with partial tiles and a partial last K step), the
    pointer fallback for rows off 16 bytes, persistent programs that walk several work items,
    split-K chosen by the knob and by the SM count."""
    launches = {key: r["launch"] for key, r in interpreted_results.items() if "launch" in r}
    tma = {key.split("|")[1] for key, launch in launches.items() if launch["TMA"]}
    assert {"48x208x200", "96x320x256"} <= tma
    # 33-byte fp8 (66-byte fp16) rows of A^T: the pointer path in every layout
    assert "33x200x384" not in tma
    assert any(key.endswith("33x200x384") for key in launches)
    default = read_tunables(SEED.read_text())
    layouts_with_tma = {dict(default, **POINTS[key.split("|")[0]])["LAYOUT"]
                        for key, launch in launches.items()
                        if launch["TMA"] and not key.startswith("default|")}
    assert layouts_with_tma == {"fused", "fp16", "b16", "a16"}
    assert any(not launch["EVEN_K"] and launch["TMA"] for launch in launches.values())
    walked = [launch for launch in launches.values() if launch["PERSISTENT"]]
    assert any(launch["programs"] < launch["items"] for launch in walked)
    assert all(launch["programs"] == launch["items"] for launch in launches.values()
               if not launch["PERSISTENT"])
    auto = [launches[key] for key in launches if "splitauto" in key]
    assert {launch["SPLIT_K"] for launch in auto} > {1}  # the SM count asked for slices


@pytest.mark.parametrize("point", ["default", "fp16-ptr-128x64x128-split4-persistent1",
                                   "a16-tma-64x128x128-splitauto"])
def test_other_layouts_are_copied_to_the_tasks(interpreted_results, point) -> None:
    """Row-major operands and scales, c a transposed view: still within tolerance, in c."""
    result = interpreted_results[f"layouts|{point}"]
    assert result["ratio"] <= 1.0 and result["same"], result


def _seed_module():
    spec = importlib.util.spec_from_file_location("fused_plan", SEED)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_offline_scientist_can_give_it_knobs_per_class_of_shapes(tmp_path) -> None:
    """evolve/compose.py writes TUNABLES_BY_SHAPE; the kernel's tunables_for applies them."""
    rules = [{"when": {"m": [None, 2509]}, "knobs": {"BLOCK_M": 128, "SPLIT_K": 0}}]
    path = tmp_path / "composed.py"
    path.write_text(rewrite_tunables(SEED.read_text(), {"PERSISTENT": 1}, by_shape=rules))
    spec = importlib.util.spec_from_file_location("composed", path)
    composed = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(composed)
    small = composed.tunables_for(m=1024, n=4096, k=512)
    assert (small["BLOCK_M"], small["SPLIT_K"], small["PERSISTENT"]) == (128, 0, 1)
    assert composed.tunables_for(m=6144, n=4096, k=512)["BLOCK_M"] == 64  # the seed's own


def test_plan_splits_small_grids_and_caps_persistent_programs() -> None:
    seed = _seed_module()
    cfg = dict(seed.TUNABLES, BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, PERSISTENT=0, SPLIT_K=0)
    # m1024-n512-k7168: 8 x 4 = 32 tiles on 132 SMs -> 4 slices of 14 steps each
    programs, split, consts = seed.plan(cfg, 1024, 512, 7168, 132, True)
    assert (programs, split, consts["SPLIT_K"], consts["TMA"]) == (128, 4, 4, True)
    # m6144-n4608-k7168: 1728 tiles, no split; persistent: one program per SM
    assert seed.plan(cfg, 6144, 4608, 7168, 132, False)[:2] == (1728, 1)
    persistent = dict(cfg, PERSISTENT=1)
    programs, _, consts = seed.plan(persistent, 6144, 4608, 7168, 132, False)
    assert (programs, consts["PERSISTENT"]) == (132, True)
    # fewer work items than programs asked for: one program per item
    assert seed.plan(dict(persistent, PERSISTENT=2), 64, 64, 128, 132, False)[0] == 1
    # never more slices than K steps
    assert seed.plan(dict(cfg, SPLIT_K=4), 64, 64, 256, 132, False)[1] == 2


def test_the_split_model_counts_whole_rounds_of_programs() -> None:
    """m1024-n576-k7168 in 64x128 tiles: 80 tiles of 56 steps. Two slices (160 programs on
    132 SMs) take two rounds of 28 steps, no fewer than one slice; three take two rounds of 19.
    A grid that fills the SMs is not split (the partials cost more than they save)."""
    seed = _seed_module()
    assert seed.modelled_split(64, 128, 128, 1024, 576, 7168, 132) == 3
    assert seed.modelled_split(64, 128, 128, 6144, 4608, 7168, 132) == 1
    # slices of at least two steps: k 256 in 128-wide steps is never split
    assert seed.modelled_split(64, 64, 128, 64, 64, 256, 132) == 1
    cfg = dict(seed.TUNABLES, BLOCK_M=64, BLOCK_N=128, BLOCK_K=128, SPLIT_K=0)
    assert seed.plan(cfg, 1024, 576, 7168, 132, True)[:2] == (240, 3)


def test_stages_are_lowered_until_the_tiles_fit_in_shared_memory() -> None:
    seed = _seed_module()
    h200 = 232448
    point = dict(seed.TUNABLES, BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_stages=4)
    assert seed.fitting_stages(dict(point, LAYOUT="fp16", BLOCK_K=128), h200) == 3
    assert seed.fitting_stages(dict(point, LAYOUT="fp16"), h200) == 4
    # fp8 tiles: one buffer fewer, plus the converted B tile (132096 B modelled at 4 stages)
    fused = dict(point, LAYOUT="fused", BLOCK_K=128)
    assert seed.fitting_stages(fused, 132096) == 4
    assert seed.fitting_stages(fused, 132095) == 3
    assert seed.fitting_stages(dict(point, LAYOUT="fp16", num_stages=2), h200) == 2  # never up
    # One operand upcast first: its fp16 tiles in every buffer, the fp8 one in one fewer
    # (triton 3.6 compiled 114736 B for b16 64x128x128 at 3 stages: modelled 115712); 4
    # stages fit only above 156672 B; a16 is the same kernel on B's rows
    b16 = dict(point, LAYOUT="b16", BLOCK_M=64, BLOCK_K=128)
    assert seed.fitting_stages(b16, 156672) == 4
    assert seed.fitting_stages(dict(b16, LAYOUT="a16"), 156672) == 4
    assert seed.fitting_stages(b16, 156671) == 3
