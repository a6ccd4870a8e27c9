"""Kernel attribution (issue 30 point 4): a candidate whose own kernel never runs is told apart
from one whose kernel does the work, and a task can refuse it.

The GPU side (device kernels from torch's profiler) is judged from recorded kernel names here;
the whole path runs on the CPU, where Triton's interpreter runs a kernel's Python body.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import torch

from pytest_kscientist.harness.attribution import (
    declared_kernels,
    is_own,
    judge,
    qualified_name,
    refusal,
)

AXPY = Path(__file__).parent / "data" / "axpy"

TRITON_AXPY = '''
import triton
import triton.language as tl


@triton.jit
def axpy_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, 2 * x + y, mask=mask)


def custom_kernel(data):
    x, y, out = data
    n = x.numel()
    axpy_kernel[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)
    return out
'''

# The kernel compiles and would be right, but a branch never taken guards it: torch does it all.
DEAD_BRANCH = TRITON_AXPY.replace(
    '''    axpy_kernel[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)
    return out''', '''    if n < 0:
        axpy_kernel[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)
    return torch.add(y, x, alpha=2, out=out)''').replace(
    "import triton\n", "import torch\nimport triton\n", 1)

CUDA_SOURCE = r'''
cuda_src = """
template <int BM>
__global__ void __launch_bounds__(256) gemm_tiles(const float* a, float* c) { }
extern "C" __global__ void fixup(float* c) { }
__global__ __cluster_dims__(2, 1, 1) void clustered(float* c);
"""
'''


def test_declared_kernels_are_triton_functions_and_global_functions() -> None:
    source = TRITON_AXPY + '''
from triton import jit

@triton.autotune(configs=[], key=["n"])
@triton.jit
def tuned(x_ptr):
    pass

@jit
def bare(x_ptr):
    pass

def helper():
    pass
''' + CUDA_SOURCE
    assert declared_kernels(source) == ["axpy_kernel", "bare", "clustered", "fixup",
                                        "gemm_tiles", "tuned"]


def test_a_library_kernel_is_never_own_even_under_a_declared_name() -> None:
    declared = {"gemm_tiles", "vectorized_elementwise_kernel"}
    assert qualified_name("void gemm_tiles<128>(float const*, float*)") == "gemm_tiles"
    assert is_own("void gemm_tiles<128>(float const*, float*)", declared)
    assert is_own("axpy_kernel", {"axpy_kernel"})  # Triton kernels keep their plain name
    elementwise = ("void at::native::vectorized_elementwise_kernel<4, "
                   "at::native::CUDAFunctor_add<float>, std::array<char*, 3ul> >(int, "
                   "at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>)")
    assert qualified_name(elementwise) == "at::native::vectorized_elementwise_kernel"
    assert not is_own(elementwise, declared)
    assert not is_own("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", declared)
    assert not is_own("void (anonymous namespace)::helper<int>(int)", declared)


def test_device_time_shares_and_the_refusal_name_what_ran() -> None:
    report = {"device": "gpu", "wall_us": 120.0, "kernels": [
        ["void gemm_tiles<128>(float const*, float*)", 30.0, 1],
        ["sm90_xmma_gemm_f32f32_tn", 60.0, 1],
        ["Memset (Device)", 10.0, 2]]}
    att = judge(report, ["gemm_tiles", "unused"])
    assert att.total_us == 100.0 and att.own_us == 30.0 and att.own_share == pytest.approx(0.3)
    assert [k.name for k in att.kernels][0] == "sm90_xmma_gemm_f32f32_tn"  # longest first
    assert att.line() == ("own 30% of device time (gemm_tiles 30%); library 70% "
                          "(sm90_xmma_gemm_f32f32_tn 60%, Memset 10%)")
    assert refusal(att, 0.3, "the task's [kernel] min_own_share") is None
    why = refusal(att, 0.5, "the task's [kernel] min_own_share")
    assert why is not None
    assert why.startswith("kernel attribution: 30% of its device time in kernels its file "
                          "declares, expected at least 50% (the task's [kernel] min_own_share)")
    assert "declared: gemm_tiles, unused" in why


def test_a_call_that_ran_no_kernel_has_no_own_share() -> None:
    att = judge({"device": "gpu", "wall_us": 5.0, "kernels": []}, ["k"])
    assert att.own_share == 0.0
    assert att.line() == "own 0% of device time (no kernel it declares ran)"


needs_triton = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None or importlib.util.find_spec("numpy") is None,
    reason="the Triton interpreter needs triton and numpy")


# TRITON_INTERPRET=1 runs a Triton kernel on the host: on a GPU machine the profiler then sees
# only the copies around it, so the interpreter's tests time on the CPU, as on CI.
INTERPRETED = ("--ks-device", "cpu")


def _task(tmp: Path, toml_extra: str = "") -> Path:
    task = tmp / "axpy"
    shutil.copytree(AXPY, task)
    shutil.rmtree(task / "seeds")
    (task / "seeds").mkdir()
    (task / "seeds" / "own_kernel.py").write_text(TRITON_AXPY)
    (task / "seeds" / "dead_branch.py").write_text(DEAD_BRANCH)
    if toml_extra:
        spec = task / "task.toml"
        spec.write_text(spec.read_text() + toml_extra)
    return task


@needs_triton
def test_attribution_tells_a_dead_branch_kernel_from_one_that_runs(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    task = _task(pytester.path)
    out = pytester.path / "r.json"
    result = pytester.runpytest_subprocess(str(task), "-p", "no:cacheprovider", "-k", "check",
                                           *INTERPRETED,
                                           "--ks-attribution", "--ks-json", str(out),
                                           "--ks-device", "cpu")  # interpreted: the CPU's
    result.assert_outcomes(passed=4)
    text = result.stdout.str()
    assert "kernels of own_kernel: own " in text and "(axpy_kernel " in text
    assert ("kernels of dead_branch: own 0% of call time (no kernel it declares ran); "
            "torch ops ") in text
    found = {c["name"]: [r["attribution"] for r in c["cases"] if r["attribution"]]
             for c in json.loads(out.read_text())["candidates"]}
    assert len(found["own_kernel"]) == 1 and len(found["dead_branch"]) == 1  # one call each
    own, dead = found["own_kernel"][0], found["dead_branch"][0]
    assert own["device"] == "cpu" and own["own_share"] > 0.5, own
    assert dead["own_share"] == 0.0 and dead["declared"] == ["axpy_kernel"], dead
    assert any(k["name"] == "aten::add" for k in dead["kernels"]), dead


def test_attribution_is_not_measured_unless_asked(pytester: pytest.Pytester) -> None:
    out = pytester.path / "r.json"
    result = pytester.runpytest_subprocess(str(AXPY), "-p", "no:cacheprovider", "-k", "check",
                                           "--ks-json", str(out))
    result.assert_outcomes(passed=2)
    assert "kernels of" not in result.stdout.str()
    cases = [r for c in json.loads(out.read_text())["candidates"] for r in c["cases"]]
    assert cases and all(r["attribution"] is None for r in cases)


@needs_triton
def test_a_task_asking_for_an_own_kernel_refuses_the_dead_branch(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    task = _task(pytester.path, "\n[kernel]\nmin_own_share = 0.5\n")
    result = pytester.runpytest_subprocess(str(task), "-p", "no:cacheprovider", *INTERPRETED)
    text = result.stdout.str()
    # the dead branch fails its first check, so its bench is not timed (its second check is
    # not profiled again); the kernel that runs passes its two checks and its bench, beside the
    # task's validation and the reference's bench
    result.assert_outcomes(passed=1 + 1 + 3 + 1, failed=2)
    assert ("dead_branch check n1000-s1: kernel attribution: 0% of its call time in kernels its "
            "file declares, expected at least 50% (the task's [kernel] min_own_share); what ran: "
            "own 0% of call time (no kernel it declares ran); torch ops ") in text
    assert "own_kernel check n1000-s1: kernel attribution" not in text


@needs_triton
def test_the_command_line_asks_for_an_own_kernel_where_the_task_cannot(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """GPU MODE and KernelBench folders have no task.toml: --ks-min-own-share sets the minimum
    for every task, over the task's own, and the refusal names the flag."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    task = _task(pytester.path, "\n[kernel]\nmin_own_share = 0.0\n")
    result = pytester.runpytest_subprocess(str(task), "-p", "no:cacheprovider", "-k", "check",
                                           "--ks-min-own-share", "0.5", *INTERPRETED)
    # own_kernel's two checks and dead_branch's second (the first check is the profiled one)
    result.assert_outcomes(passed=2 + 1, failed=1)
    assert ("dead_branch check n1000-s1: kernel attribution: 0% of its call time in kernels its "
            "file declares, expected at least 50% (--ks-min-own-share); ") in result.stdout.str()
    bad = pytester.runpytest_subprocess(str(task), "--ks-min-own-share", "50")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*--ks-min-own-share expects a share of the candidate's time "
                              "between 0 and 1 (e.g. 0.5 for half), got '50'*"])


def test_min_own_share_is_a_share(tmp_path: Path) -> None:
    from pytest_kscientist.errors import TaskSpecError
    from pytest_kscientist.formats.task import load_task

    task = tmp_path / "axpy"
    shutil.copytree(AXPY, task)
    spec = task / "task.toml"
    spec.write_text(spec.read_text() + "\n[kernel]\nmin_own_share = 50\n")
    with pytest.raises(TaskSpecError, match="min_own_share"):
        load_task(task)


# -- on a GPU: device kernels from torch's profiler -------------------------------------------

CUDA_AXPY = r'''
import torch
from torch.utils.cpp_extension import load_inline

KS_REQUIRES = "nvidia"

_SRC = """
template <int UNROLL>
__global__ void axpy_cuda(const float* x, const float* y, float* out, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = 2.0f * x[i] + y[i];
}

torch::Tensor axpy(torch::Tensor x, torch::Tensor y, torch::Tensor out) {
    long n = x.numel();
    axpy_cuda<1><<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(),
                                          out.data_ptr<float>(), n);
    return out;
}
"""

_ext = load_inline("ks_attribution_axpy", cpp_sources="torch::Tensor axpy(torch::Tensor x, "
                   "torch::Tensor y, torch::Tensor out);", cuda_sources=_SRC,
                   functions=["axpy"])


def custom_kernel(data):
    x, y, out = data
    return _ext.axpy(x, y, out)
'''

CUDA_DEAD = CUDA_AXPY.replace("    return _ext.axpy(x, y, out)",
                              "    if x.numel() < 0:\n        return _ext.axpy(x, y, out)\n"
                              "    return torch.add(y, x, alpha=2, out=out)")


@pytest.mark.gpu
@pytest.mark.skipif(not (torch.cuda.is_available() and torch.version.hip is None),
                    reason="needs an NVIDIA GPU")
def test_device_kernels_of_triton_and_cuda_candidates_on_the_gpu(
        pytester: pytest.Pytester) -> None:
    task = _task(pytester.path, "\n[kernel]\nmin_own_share = 0.5\n")
    (task / "seeds" / "cuda_own.py").write_text(CUDA_AXPY)
    (task / "seeds" / "cuda_dead.py").write_text(CUDA_DEAD)
    out = pytester.path / "r.json"
    result = pytester.runpytest_subprocess(str(task), "-p", "no:cacheprovider", "-k", "check",
                                           "--ks-device", "cuda", "--ks-json", str(out),
                                           timeout=600)
    text = result.stdout.str()
    found = {c["name"]: next(r["attribution"] for r in c["cases"] if r["attribution"])
             for c in json.loads(out.read_text())["candidates"] if c["role"] == "candidate"}
    assert found["own_kernel"]["device"] == "gpu" and found["own_kernel"]["own_share"] > 0.9, text
    assert found["cuda_own"]["own_share"] > 0.9, text
    assert any(k["own"] and "axpy_cuda" in k["name"] for k in found["cuda_own"]["kernels"])
    for dead in ("dead_branch", "cuda_dead"):
        assert found[dead]["own_share"] == 0.0, found[dead]
        assert any("elementwise" in k["name"] for k in found[dead]["kernels"]), found[dead]
        assert f"{dead} check n1000-s1: kernel attribution: 0% of its device time" in text
