"""compile[sm_XY] items: a CUDA candidate that cannot run here (a CPU CI runner) is compiled by
nvcc from the load_inline call its import makes, instead of checked by nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import DATA, REPO, run_pytest

from pytest_kscientist.cuda import compile_gate as cuda_gate
from pytest_kscientist.harness import compiles

TASK = REPO / "tasks" / "fp8_gemm"
SEED = TASK / "seeds" / "cuda_wgmma.py"
CUDA = DATA / "cuda"
needs_nvcc = pytest.mark.skipif(cuda_gate.nvcc() is None, reason="nvcc not found")

PTXAS = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z5scalePfi' for 'sm_90'
ptxas info    : Function properties for _Z5scalePfi
    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 2048 bytes smem, 364 bytes cmem[0]
ptxas info    : Function properties for _Z6helperv
    16 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function '_Z4copyv' for 'sm_90'
ptxas info    : Function properties for _Z4copyv
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 8 registers, used 0 barriers, 352 bytes cmem[0]
"""


def test_ptxas_reports_each_entry_functions_resources() -> None:
    scale, copy = cuda_gate.parse_ptxas(PTXAS)  # the device function between is not a kernel
    assert scale.name.startswith("scale") and copy.name.startswith("copy")
    assert (scale.registers, scale.shared_bytes, scale.stack_bytes, scale.spill_store_bytes,
            scale.spill_load_bytes) == (40, 2048, 8, 4, 12)
    assert (copy.registers, copy.shared_bytes, copy.spill_store_bytes) == (8, 0, 0)
    line = compiles.resource_line(compiles.CompileResult(
        arch="sm_90", outcome="passed", seconds=1.0, kernels=[scale]))
    assert line == (f"compile[sm_90] {scale.name}: 40 registers, spills 4 B stored 12 B loaded, "
                    "stack 8 B, static shared 2048 B (1.0 s)")


def test_the_targets_come_from_ks_requires_and_none_where_the_candidate_runs(
        tmp_path: Path) -> None:
    assert cuda_gate.targets(SEED) == ["sm_90"]
    assert cuda_gate.compile_items(None, SEED, runs_here=True) == []  # the worker's build checks
    plain = tmp_path / "nvidia_only.py"
    plain.write_text('KS_REQUIRES = "nvidia"\ndef custom_kernel(data):\n    return data[-1]\n')
    assert cuda_gate.targets(plain) == []


@needs_nvcc
def test_the_cuda_seed_compiles_where_it_cannot_run(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KS_COMPILE_CACHE", str(tmp_path / "kept"))
    code, output, data = run_pytest([str(TASK), "-v", "-k", "compile", "--kernel", str(SEED),
                                     "--ks-device", "cpu"], cwd=tmp_path)
    assert code == 0, output
    assert "cuda_wgmma::compile[sm_90] PASSED" in output
    line = next(x for x in output.splitlines() if x.strip().startswith("cuda_wgmma compile[sm_90]"))
    assert "gemm_kernel<128, 1>: " in line and "spills 0 B stored 0 B loaded" in line, line
    (seed,) = [c for c in data["candidates"] if c["name"] == "cuda_wgmma"]
    (result,) = seed["compiles"]
    assert result["outcome"] == "passed" and result["compiler"].startswith("Cuda compilation")
    gemms = [k for k in result["kernels"] if k["name"].startswith("gemm_kernel")]
    assert len(gemms) == 4 and all(k["registers"] > 0 and k["spill_store_bytes"] == 0
                                   for k in gemms)
    assert ("candidate 'cuda_wgmma' requires sm_90 (an NVIDIA GPU of compute capability 9.0 or "
            "newer, its KS_REQUIRES), this run's device is cpu") in output  # still not run


@needs_nvcc
def test_a_compile_error_fails_and_a_gpu_asked_for_at_import_skips(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KS_COMPILE_CACHE", str(tmp_path / "kept"))
    gpu = torch.cuda.is_available()  # there the import reaches load_inline: no skip to see
    code, output, _ = run_pytest(
        [str(TASK), "-v", "-rs", "-k", "compile", "--kernel", str(CUDA / "syntax_error.py"),
         *([] if gpu else ["--kernel", str(CUDA / "gpu_at_import.py")]), "--ks-device", "cpu"],
        cwd=tmp_path)
    assert code == 1, output
    assert ('syntax_error does not compile for sm_90:\ncuda.cu(6): error: expected a ";"\n'
            "     6 | }   (syntax_error.py line 14)\n"
            "(cuda.cu: the file's cuda_sources as load_inline writes them)") in output
    if not gpu:
        assert "gpu_at_import::compile[sm_90] SKIPPED" in output
        assert ("not compiled here: its import stopped before load_inline on this machine "
                "(exit 1): AssertionError: Torch not compiled with CUDA enabled") in output


def test_an_error_line_is_placed_in_the_candidates_file() -> None:
    """cuda.cu's quoted line gets the line of the .py file it was written on, told apart from
    its twins by its neighbours; a line the file builds at import, or holds too often, gets
    none."""
    file_text = "\n".join([
        'SRC = r"""',                      # 1
        "__global__ void a(float* x) {",   # 2
        "    x[0] = 1.0f;",                # 3
        "}",                               # 4
        "__global__ void b(float* x) {",   # 5
        "    x[0] = 1.0f;",                # 6
        "}",                               # 7
        'TAIL = f"int n = {N};"',          # 8
    ])
    unit = "\n".join(["#include <cuda_runtime.h>", "__global__ void a(float* x) {",
                     "    x[0] = 1.0f;", "}", "__global__ void b(float* x) {",
                     "    x[0] = 1.0f;", "}", "int n = 4;"])
    lines = file_text.splitlines()
    assert cuda_gate.file_line(lines, unit.splitlines(), 6) == 6  # twin of 3: neighbours tell
    assert cuda_gate.file_line(lines, unit.splitlines(), 3) == 3
    assert cuda_gate.file_line(lines, unit.splitlines(), 8) is None  # built by an f-string
    assert cuda_gate.file_line(lines, unit.splitlines(), 1) is None  # the prelude's own
    assert cuda_gate.file_line(lines, unit.splitlines(), 99) is None
    reason = ('cuda.cu(6): error: expected a ";"\n     6 |     x[0] = 1.0f;\n'
              'cuda.cu(8): error: x\n     8 | int n = 4;\n(cuda.cu: ...)')
    assert cuda_gate.with_file_lines(reason, unit, file_text, "k.py").splitlines() == [
        'cuda.cu(6): error: expected a ";"', "     6 |     x[0] = 1.0f;   (k.py line 6)",
        "cuda.cu(8): error: x", "     8 | int n = 4;", "(cuda.cu: ...)"]


def test_without_nvcc_the_item_skips_and_says_how_to_name_one(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    monkeypatch.setenv("KS_NVCC", str(tmp_path / "no-nvcc"))
    result = cuda_gate.compile_candidate(SEED, "sm_90", 60)
    assert result.outcome == "skipped"
    assert result.reason.startswith("no nvcc to compile for sm_90") and "KS_NVCC" in result.reason


@pytest.mark.slow  # runs the forged file in a process
@pytest.mark.parametrize(("printed", "why"), [
    ("[1, 2]", "what its import printed as load_inline's arguments is not them"),
    ("{not json", "what its import printed as load_inline's arguments is not them"),
    ('{"cuda_sources": [1]}', "its load_inline call's cuda_sources are not all strings"),
])
def test_what_a_candidate_prints_in_the_recorders_place_is_checked(
        tmp_path: Path, printed: str, why: str) -> None:
    forged = tmp_path / "forged.py"
    forged.write_text(f"import os\nos.write(1, b'\\n{cuda_gate.MARK}{printed}\\n')\nos._exit(0)\n")
    with pytest.raises(cuda_gate.NotCaptured, match=why.replace("(", r"\(")):
        cuda_gate.capture(forged, 60)


@needs_nvcc
@pytest.mark.slow  # runs nvcc
def test_writer_drafts_in_cuda_are_compiled_before_any_gpu_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The LLM writer's draft check (evolve/llm/draft.py) returns nvcc's errors for a CUDA
    draft, passes it once fixed, and leaves a draft without load_inline or a target alone."""
    from pytest_kscientist.evolve.llm.draft import KnownSources, check

    monkeypatch.setenv("KS_COMPILE_CACHE", str(tmp_path / "kept"))
    broken = (CUDA / "syntax_error.py").read_text()
    problem = check(broken, KnownSources())
    assert problem.startswith("the CUDA source does not compile for sm_90:\n"
                              'cuda.cu(6): error: expected a ";"'), problem
    fixed = broken.replace("x[i] *= 2.0f\n", "x[i] *= 2.0f;\n")
    assert check(fixed, KnownSources()) == ""
    assert check(fixed.replace('KS_REQUIRES = "sm_90"', 'KS_REQUIRES = "nvidia"'),
                 KnownSources()) == ""  # no sm target named: nothing to compile for
    assert cuda_gate.draft_problem("def custom_kernel(data):\n    return data\n") == ""


# At import (the compile item's capture), tries to plant a file in each of TARGETS, then
# makes its load_inline call.
PLANTER = '''
import os
from torch.utils.cpp_extension import load_inline

KS_REQUIRES = "sm_90"
for folder in TARGETS:
    try:
        open(os.path.join(folder, "ks_planted"), "w").close()
    except OSError:
        pass
module = load_inline(name="ks_test_cuda_planter", cpp_sources=[""],
                     cuda_sources=["__global__ void k(float* x) { x[0] = 1.0f; }"],
                     no_implicit_headers=True)


def custom_kernel(data):
    return data[-1]
'''


@needs_nvcc
def test_the_import_a_compile_item_captures_writes_only_what_a_worker_may(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its sandbox was the project's only: the candidate's import could write another's
    load_inline build, the kept compile verdicts and the workers' folders."""
    from pytest_kscientist.harness import worker_folders
    from pytest_kscientist.harness.mounts import extension_root, sandbox_plan

    if sandbox_plan(TASK / "reference.py", None)[1] is not None:
        pytest.skip("the worker sandbox does not work here")
    monkeypatch.setenv("KS_COMPILE_CACHE", str(tmp_path / "kept"))
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    (tmp_path / "kept").mkdir()
    targets = [extension_root(), tmp_path / "kept", worker_folders.root(),
               worker_folders.store()]
    (tmp_path / "planter.py").write_text(f"TARGETS = {[str(t) for t in targets]!r}\n" + PLANTER)
    try:
        code, output, _ = run_pytest([str(TASK), "-v", "-k", "compile", "--kernel",
                                      str(tmp_path / "planter.py"), "--ks-device", "cpu"],
                                     cwd=tmp_path)
        assert "planter::compile[sm_90] PASSED" in output, output
        assert [t for t in targets if (t / "ks_planted").exists()] == []
    finally:
        for t in targets:
            (t / "ks_planted").unlink(missing_ok=True)
