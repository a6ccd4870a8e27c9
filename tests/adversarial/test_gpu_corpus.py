"""The corpus on a GPU: attacks that need one (side streams, the caching allocator, CUDA events)
and the timing attacks in their GPU form. Skips cleanly without a CUDA or ROCm device."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import REPO, case_reasons, run_pytest

from adversarial.test_corpus import CANDIDATES, PATCHED, RERUN

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm device"),
]

CHECK_CASE = "m64-n64-k128-s6635"
BENCH_CASE = "m6144-n4608-k7168-s65436"  # the most work per call: hidden work cannot hide in noise
CHECK = {
    "stale_empty_like": RERUN,  # the caching allocator hands the same block back
    "cache_data_ptr": RERUN,
    "patch_cuda_sync": f"replaced torch.cuda.synchronize; {PATCHED}",
    "patch_cuda_event": f"replaced torch.cuda.Event.elapsed_time; {PATCHED}",
    "background_thread": "returned while a Python thread it started ('Thread-1 (_fill)'",
}
BENCH = {
    # Its reported time is the empty call's, far under the floor (H200, 2026-11-29: 23 us against
    # 205 us), so the floor rejects it before the outside measurement is consulted ...
    "work_after_event": "impossible time: fastest call",
    # ... and padded above the floor, the outside measurement does.
    "work_after_padded_event": (
        "timing disagrees with what the pytest process measures from outside"
    ),
    "rewrites_clock_reading": "impossible time: fastest call",
}
CONTROLS = ("torch_dequant", "honest_cache", "side_stream")


def _run_on_a_copy(tmp: Path, *args: str) -> tuple[int, str, Any]:
    """``pytest`` on a private copy of fp8_gemm (its ``full`` profile on the GPU) in ``tmp``."""
    task = tmp / "fp8_gemm"
    shutil.copytree(REPO / "tasks" / "fp8_gemm", task,
                    ignore=shutil.ignore_patterns("__pycache__", "population"))
    return run_pytest([str(task), *args, "--ks-device", "cuda", "--ks-profile", "full",
                       "--ks-bench-budget", "0.5"], cwd=tmp, timeout=900)


@pytest.fixture(scope="module")
def gpu_corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, str, Any]:
    tmp = tmp_path_factory.mktemp("gpu-adversarial")
    kernels = [f"--kernel={CANDIDATES / n}.py" for n in [*CHECK, *BENCH, *CONTROLS]
               if n != "torch_dequant"]
    kernels.append(f"--kernel={tmp / 'fp8_gemm' / 'seeds' / 'torch_dequant.py'}")
    select = f"not reference and ((check and {CHECK_CASE}) or (bench and {BENCH_CASE}))"
    # Timed alone, as on the CPU profile (where cuBLAS skips): the attacks are about the
    # candidate's own timing, and cuBLAS beside each of them would triple the bench time.
    return _run_on_a_copy(tmp, *kernels, "-k", select, "--ks-timeout", "120",
                          "--ks-baselines", "none")


@pytest.mark.parametrize(("case", "name"), [
    *((CHECK_CASE, n) for n in CHECK),
    *((BENCH_CASE, n) for n in BENCH),
])
def test_gpu_attack_is_rejected_with_its_reason(gpu_corpus, case: str, name: str) -> None:
    _, output, data = gpu_corpus
    assert data is not None, output[-3000:]
    outcome, reason = case_reasons(data)[(name, case)]
    assert outcome == "failed"
    assert {**CHECK, **BENCH}[name] in reason


def test_gpu_controls_pass_and_side_stream_work_is_timed(gpu_corpus) -> None:
    _, output, data = gpu_corpus
    assert data is not None, output[-3000:]
    reasons = case_reasons(data)
    for name in CONTROLS:
        for case in (CHECK_CASE, BENCH_CASE):
            assert reasons[(name, case)] == ("passed", ""), (name, case)
    medians = {
        c["name"]: case["stats"]["median_us"]
        for c in data["candidates"] for case in c["cases"]
        if case["case_id"] == BENCH_CASE and case["stats"]
    }
    # The same work on a side stream is counted by the device-wide synchronisation.
    assert medians["side_stream"] >= 0.5 * medians["honest_cache"]


@pytest.fixture(scope="module")
def cross_round(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, str, Any]:
    """The cross-round cache attack and an honest control, each beside both cuBLAS baselines."""
    return _run_on_a_copy(
        tmp_path_factory.mktemp("gpu-cross-round"),
        f"--kernel={CANDIDATES / 'cache_every_input.py'}",
        f"--kernel={CANDIDATES / 'honest_cache.py'}", "-k", f"bench and {BENCH_CASE}",
        "--ks-skip-reference", "--ks-baselines", "all")


def test_cross_round_cache_never_hits_beside_the_baselines(cross_round) -> None:
    _, output, data = cross_round
    assert data is not None, output[-3000:]
    stats = {c["name"]: case["stats"] for c in data["candidates"] for case in c["cases"]
             if case["case_id"] == BENCH_CASE}
    assert stats["honest_cache"] is not None, output[-3000:]
    attack = stats["cache_every_input"]
    # Fresh inputs on every call of every round: the cache never hits, so the attack computes
    # the product each time (plus its fingerprint) and cannot come out faster than honest code.
    assert attack is None or attack["median_us"] >= 0.9 * stats["honest_cache"]["median_us"]


# -- work started under the timer's lead -----------------------------------------------------

# An axpy of 16 Mi floats (~192 MB moved: 60-80 us on an H100), with no physical floor, as most
# tasks of other formats have none: only the timing can tell.
LEAD_TASK = """
name = "axpy_big"
case_keys = ["n", "seed"]
output_index = 2

[check]
atol = 1e-6
rtol = 1e-6

[bench]
warmup = 2
min_runs = 20
verify_samples = 2

[profiles.full]
tests = [{ n = 1000, seed = 1 }]
benchmarks = [{ n = 16777216, seed = 3 }]
"""
# The work on a side stream that does not wait for the caller's: the inputs were ready before
# the timer's lead (a spin kernel on one SM) began, so the work ran beside the spin and the
# flush, and the caller's stream only waited for a finished event, then ran a one-element
# multiply. Correct code, and a natural thing for a model to write: before the worker's single
# hardware queue, the events timed the multiply alone (without it: 0 us, which the zero-time
# check fails; H100, 2026-12-06).
UNDER_THE_LEAD = """
import torch

SIDE = []


def custom_kernel(data):
    x, y, out = data
    if not SIDE:
        SIDE.append(torch.cuda.Stream())
    caller = torch.cuda.current_stream()
    with torch.cuda.stream(SIDE[0]):
        torch.add(y, x, alpha=2, out=out)
    caller.wait_stream(SIDE[0])
    out[:1].mul_(1.0)
    return out
"""


@pytest.fixture(scope="module")
def lead_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, str, Any]:
    tmp = tmp_path_factory.mktemp("gpu-lead")
    task = tmp / "axpy_big"
    task.mkdir()
    shutil.copy(REPO / "tests" / "data" / "axpy" / "reference.py", task / "reference.py")
    (task / "task.toml").write_text(LEAD_TASK)
    (tmp / "under_the_lead.py").write_text(UNDER_THE_LEAD)
    shutil.copy(REPO / "tests" / "data" / "axpy" / "seeds" / "good.py", tmp / "honest.py")
    return run_pytest([str(task), "--kernel=honest.py", "--kernel=under_the_lead.py",
                       "--ks-device", "cuda", "--ks-baselines", "none", "--ks-skip-reference",
                       "--ks-bench-budget", "0.5"], cwd=tmp, timeout=600)


def test_side_stream_work_started_under_the_lead_is_timed(lead_run) -> None:
    _, output, data = lead_run
    assert data is not None, output[-3000:]
    stats = {c["name"]: case["stats"] for c in data["candidates"] for case in c["cases"]
             if case["kind"] == "bench"}
    assert stats["honest"] and stats["under_the_lead"], output[-3000:]
    honest, attack = stats["honest"]["median_us"], stats["under_the_lead"]["median_us"]
    assert attack >= 0.8 * honest, (attack, honest)
