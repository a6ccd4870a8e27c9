"""The fp8_gemm Triton seed against the reference, under the Triton interpreter on the CPU.

The kernel runs in one subprocess because TRITON_INTERPRET must be set before the kernel module
is imported (NOTES.md) and must not leak into this process.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TASK = Path(__file__).resolve().parents[1] / "tasks" / "fp8_gemm"
SEED = TASK / "seeds" / "triton_blockscaled.py"

# The CPU profile's test cases, then odd ones: m and n off every tile size, n with a partial
# last scale block, k off BLOCK_K (200: a partial last scale block too).
SHAPES = [
    (64, 64, 128, 6635),
    (32, 200, 384, 1236),
    (96, 320, 256, 1234),
    (33, 200, 384, 7),
    (130, 129, 640, 8),
    (40, 136, 200, 9),
]
# Points of TUNABLE_SPACE beyond the default, chosen so every value of every knob that changes
# the result appears at least once (an exhaustive sweep of the 768 such points passed once,
# but takes ~20 min here).
POINTS = {
    "default": {},
    "direct-32x256x64": dict(LAYOUT="direct", BLOCK_M=32, BLOCK_N=256, BLOCK_K=64, GROUP_M=1),
    "kmajor-64x32x64-split2": dict(
        LAYOUT="kmajor", BLOCK_M=64, BLOCK_N=32, BLOCK_K=64, GROUP_M=4, SPLIT_K=2
    ),
    "direct-128x64x128-split8": dict(
        LAYOUT="direct", BLOCK_M=128, BLOCK_N=64, BLOCK_K=128, GROUP_M=16, SPLIT_K=8
    ),
    "kmajor-32x128x128-split4": dict(
        LAYOUT="kmajor", BLOCK_M=32, BLOCK_N=128, BLOCK_K=128, GROUP_M=1, SPLIT_K=4
    ),
    "fp16-64x128x64": dict(LAYOUT="fp16", BLOCK_M=64, BLOCK_N=128, BLOCK_K=64),
    "fp16_kmajor-128x32x128-split2": dict(
        LAYOUT="fp16_kmajor", BLOCK_M=128, BLOCK_N=32, BLOCK_K=128, SPLIT_K=2
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

task, points, shapes, atol, rtol = json.loads(sys.argv[1])
reference = load("reference", task + "/reference.py")
seed = load("triton_blockscaled", task + "/seeds/triton_blockscaled.py")
default = dict(seed.TUNABLES)
results = {}
for name, point in points.items():
    seed.TUNABLES.clear()
    seed.TUNABLES.update(default, **point)
    for m, n, k, s in shapes:
        data = reference.generate_input(m, n, k, s)
        expected = reference.ref_kernel(data).float()
        data[4].fill_(float("nan"))  # an element the kernel forgets to write fails the check
        start = time.perf_counter()
        out = seed.custom_kernel(data)
        seconds = time.perf_counter() - start
        ratio = ((out.float() - expected).abs() / (atol + rtol * expected.abs())).max().item()
        results[f"{name}|{m}x{n}x{k}"] = {
            "ratio": ratio, "dtype": str(out.dtype), "shape": list(out.shape), "seconds": seconds,
        }
print(json.dumps(results))
"""


def _literal(name: str) -> dict:
    """A module-level dict literal of the seed, read without importing it."""
    for node in ast.parse(SEED.read_text()).body:
        targets = [getattr(t, "id", None) for t in getattr(node, "targets", [])]
        if isinstance(node, ast.Assign) and targets == [name]:
            return ast.literal_eval(node.value)
    raise AssertionError(f"{SEED.name} defines no {name} literal")


def test_tunables_are_literals_inside_their_space():
    tunables, space = _literal("TUNABLES"), _literal("TUNABLE_SPACE")
    assert set(tunables) == set(space)
    for knob, value in tunables.items():
        assert isinstance(value, (int, str, bool)), knob
        assert value in space[knob], knob
        assert all(isinstance(v, type(value)) for v in space[knob]), knob
    # Each step must sit inside one 128-wide scale block.
    assert all(128 % bk == 0 for bk in space["BLOCK_K"])


@pytest.fixture(scope="module")
def interpreted_results() -> dict:
    if importlib.util.find_spec("triton") is None or importlib.util.find_spec("numpy") is None:
        pytest.skip("the Triton interpreter needs triton and numpy")
    env = dict(os.environ, TRITON_INTERPRET="1")
    args = json.dumps([str(TASK), POINTS, SHAPES, ATOL, RTOL])
    proc = subprocess.run(
        [sys.executable, "-c", RUNNER, args], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}x{s[2]}")
@pytest.mark.parametrize("point", POINTS)
def test_seed_matches_reference(interpreted_results, point, shape):
    m, n, k, _ = shape
    result = interpreted_results[f"{point}|{m}x{n}x{k}"]
    assert result["dtype"] == "torch.bfloat16"
    assert result["shape"] == [m, n]
    # ratio = max |out - ref| / (atol + rtol |ref|); NaN (an unwritten element) also fails.
    assert result["ratio"] <= 1.0, result


def test_stages_are_lowered_until_the_tiles_fit_in_shared_memory() -> None:
    """Knob points asking for more shared memory than an H200 block has run with fewer stages
    (bench/triton_compile_check.py compiled each of these within 232448 B for sm_90)."""
    spec = importlib.util.spec_from_file_location("seed_stages", SEED)
    seed = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(seed)
    h200 = 232448
    point = dict(seed.TUNABLES, BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, num_stages=4)
    assert seed.fitting_stages(dict(point, LAYOUT="fp16"), h200) == 3  # 4 x 64 KiB do not fit
    assert seed.fitting_stages(dict(point, LAYOUT="fp16_kmajor", BLOCK_N=256), h200) == 2
    assert seed.fitting_stages(dict(point, LAYOUT="direct", BLOCK_N=256), h200) == 4
    assert seed.fitting_stages(dict(point, LAYOUT="fp16", num_stages=2), h200) == 2  # never up
    assert seed.fitting_stages(dict(point, LAYOUT="fp16", BLOCK_N=256), 100_000) == 1
