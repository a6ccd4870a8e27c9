"""compile[<arch>] items of HIP candidates (issue 14): reading the source, the verdicts, skips.

The end-to-end tests need the AMDGPU toolchain (tools/install_hip_toolchain.sh; .ci/run
installs it). Without it they skip, unless KS_HIP_REQUIRED=1 (CI) makes its absence a failure.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest
from helpers import DATA, REPO, run_pytest

from pytest_kscientist.harness import compiles
from pytest_kscientist.harness.results import RESULTS_SCHEMA_VERSION
from pytest_kscientist.hip import compile_gate, prelude
from pytest_kscientist.hip import source as hip

HIP = DATA / "hip"
SEED = REPO / "tasks" / "fp8_gemm" / "seeds" / "hip_mfma.py"
TASK = REPO / "tasks" / "fp8_gemm"


def _write(tmp_path: Path, body: str, name: str = "k.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


# -- reading a candidate without importing it ---------------------------------------------------

@pytest.mark.parametrize(("value", "expected"), [
    ('"gfx942"', ["gfx942"]),
    ('["gfx942", "gfx950", "gfx942"]', ["gfx942", "gfx950"]),
    ('["gfx942:xnack-"]', ["gfx942:xnack-"]),
])
def test_declared_archs(tmp_path: Path, value: str, expected: list[str]) -> None:
    assert hip.declared_archs(_write(tmp_path, f"KS_HIP_ARCH = {value}\n")) == expected


@pytest.mark.parametrize(("value", "message"), ids=["cuda-arch", "empty", "name"], argvalues=[
    ('"sm_90"', "k.py:1: KS_HIP_ARCH names 'sm_90', which is not an AMD GPU target; expected "
                "a name such as gfx90a, gfx942"),
    ("[]", "k.py:1: KS_HIP_ARCH must be a target or a non-empty list of them"),
    ("ARCHS", "must be a target or a non-empty list of them such as 'gfx942' or ['gfx942', "
              "'gfx950'], got ARCHS"),
])
def test_bad_declarations_say_what_is_expected(tmp_path: Path, value: str, message: str) -> None:
    with pytest.raises(hip.HipDeclarationError) as info:
        hip.declared_archs(_write(tmp_path, f"KS_HIP_ARCH = {value}\n"))
    assert message in str(info.value)


def test_no_declaration_is_not_a_hip_candidate(tmp_path: Path) -> None:
    assert hip.declared_archs(_write(tmp_path, "def custom_kernel(data):\n    return 1\n")) == []
    assert hip.unmet_on(_write(tmp_path, "X = 1\n"), "cpu") == ""


def test_template_source_maps_onto_the_file_lines() -> None:
    source = hip.read_source(HIP / "syntax_error.py")
    assert [c.label for c in source.chunks] == ["HIP_SRC"]
    unit = hip.translation_unit(source, "syntax_error.py").splitlines()
    directive = next(i for i, line in enumerate(unit) if line.startswith("#line"))
    file_lines = (HIP / "syntax_error.py").read_text().splitlines()
    start = source.chunks[0].line
    assert unit[directive] == f'#line {start} "syntax_error.py"'
    # line N after the directive is file line start + N: the compiler's line numbers are the file's
    for offset in range(1, 5):
        assert unit[directive + 1 + offset] == file_lines[start - 1 + offset]


def test_seed_flags_come_from_tunables_and_the_target_from_the_item() -> None:
    source = hip.read_source(SEED)
    assert source.flags == ["-std=c++20", "-O3", "-DBLOCK_M=64", "-DBLOCK_N=64", "-DWAVES_M=2",
                            "-DWAVES_N=2", "-DLDS_PAD=4"]
    assert source.ignored_flags == ["--offload-arch=gfx942"]
    assert source.module_name == "ks_hip_mfma_64x64_w2x2_p4"


def test_escaped_source_gets_a_labelled_line_directive(tmp_path: Path) -> None:
    path = _write(tmp_path, '''
        from torch.utils.cpp_extension import load_inline
        PART = "__global__ void k(float* x) {\\n  x[0] = 1;\\n}\\n"
        m = load_inline(name="k", cpp_sources="", cuda_sources=[PART + "// end"])
    ''')
    source = hip.read_source(path)
    assert source.chunks[0].line is None
    assert '#line 1 "k.py (cuda_sources[0])"' in hip.translation_unit(source, "k.py")


@pytest.mark.parametrize(("body", "message"), ids=["no-call", "runtime", "unbound", "syntax"],
                         argvalues=[
    ("KS_HIP_ARCH = 'gfx942'\n",
     "k.py declares KS_HIP_ARCH but calls no load_inline(...)"),
    ("from torch.utils.cpp_extension import load_inline\n"
     "SRC = open('kernel.hip').read()\n"
     "m = load_inline(name='k', cpp_sources='', cuda_sources=SRC)\n",
     "k.py:2: the load_inline(...) call at line 3 cannot be read without running the file: "
     "'open('kernel.hip').read()' is computed when the module runs; bind the source"),
    ("from torch.utils.cpp_extension import load_inline\n"
     "m = load_inline(name='k', cpp_sources='', cuda_sources=SRC)\n",
     "'SRC' is not bound at module level"),
    ("def f(:\n", "k.py:1: the file does not parse"),
])
def test_unreadable_sources_say_why(tmp_path: Path, body: str, message: str) -> None:
    with pytest.raises(hip.HipSourceError) as info:
        hip.read_source(_write(tmp_path, body))
    assert message in str(info.value)


def test_hip_candidates_do_not_run_off_rocm(tmp_path: Path) -> None:
    reason = hip.unmet_on(HIP / "lds_overflow.py", "cpu")
    assert reason == ("candidate 'lds_overflow' is HIP for gfx942, gfx950 (its KS_HIP_ARCH), "
                      "this run's device is cpu; its compile items check it here, run it on "
                      "such a ROCm GPU")


# -- the compiler's output ----------------------------------------------------------------------

# clang 22.1.8's remarks for the seed at its default knobs (2026-11-30), shortened paths.
TAG = " [-Rpass-analysis=kernel-resource-usage]"
REMARKS = "\n".join([
    "hip_mfma.py:160:1: remark: Function Name: _Z15fp8_gemm_kernelPKhS0_PKfS2_Ptiiillllllliii"
    + TAG,
    "  160 | fp8_gemm_kernel(const uint8_t* __restrict__ a, const uint8_t* __restrict__ b,",
    "      | ^",
    "hip_mfma.py:160:1: note: could not determine the original source location for "
    "hip_mfma.py:160:0",
    *(f"hip_mfma.py:160:1: remark:     {field}{TAG}" for field in (
        "TotalSGPRs: 68", "VGPRs: 100", "AGPRs: 0", "ScratchSize [bytes/lane]: 0",
        "Dynamic Stack: False", "Occupancy [waves/SIMD]: 3", "SGPRs Spill: 0", "VGPRs Spill: 2",
        "LDS Size [bytes/block]: 17408")),
]) + "\n"


def test_resources_are_read_from_the_remarks() -> None:
    (kernel,) = compile_gate.parse_resources(REMARKS)
    assert kernel.name in ("fp8_gemm_kernel", "_Z15fp8_gemm_kernelPKhS0_PKfS2_Ptiiillllllliii")
    assert (kernel.vgprs, kernel.agprs, kernel.sgprs, kernel.lds_bytes) == (100, 0, 68, 17408)
    assert (kernel.occupancy_waves_per_simd, kernel.vgpr_spills, kernel.sgpr_spills) == (3, 2, 0)
    assert compile_gate.without_remarks(REMARKS) == ""


def test_first_errors_are_trimmed() -> None:
    errors = "".join(f"k.py:{n}:5: error: use of undeclared identifier 'x{n}'\n"
                     f"   {n} |     x{n} = 1;\n      |     ^\n" for n in range(10, 15))
    out = compile_gate.first_errors("In file included from k.hip:1:\n" + errors +
                                    "5 errors generated when compiling for gfx942.\n")
    lines = out.splitlines()
    assert lines[0] == "k.py:10:5: error: use of undeclared identifier 'x10'"
    assert lines[1] == "   10 |     x10 = 1;"
    assert "k.py:12:5: error" in out and "k.py:13:5" not in out
    assert lines[-1] == "... and 2 more error(s)"


def test_missing_toolchain_skips_with_the_install_command(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KS_HIP_ROOT", str(tmp_path / "none"))
    monkeypatch.setenv("ROCM_PATH", str(tmp_path / "rocm"))
    result = compile_gate.compile_candidate(SEED, "gfx942", 60)
    assert result.outcome == "skipped"
    assert result.reason.startswith(
        f"no AMDGPU toolchain to compile for gfx942 (no HIP headers under {tmp_path}/none/")
    assert f"no ROCm install at {tmp_path}/rocm); install it with: bash " in result.reason
    assert result.reason.endswith("tools/install_hip_toolchain.sh")
    assert (REPO / "tools" / "install_hip_toolchain.sh").is_file()


def test_no_sandbox_is_said_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_kscientist.harness import mounts as worker

    monkeypatch.setattr(worker, "sandbox_available", lambda protect: "unshare: not permitted")
    compiles._warn_unsandboxed.cache_clear()
    with pytest.warns(worker.KsSandboxUnavailable, match="compile items run the compiler "
                      "without the OS sandbox"):
        assert compiles.compiler_sandbox(SEED) == []
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        compiles.compiler_sandbox(SEED)
    assert again == []  # said once per reason


# -- compiling (needs the toolchain) ------------------------------------------------------------

def test_a_compiler_that_overruns_the_timeout_is_killed(toolchain) -> None:
    result = compile_gate.compile_candidate(SEED, "gfx942", 0.3)
    assert result.outcome == "failed"
    assert result.reason.startswith("the compiler did not finish within 0.3 s (--ks-timeout)")


def test_compile_items_in_a_cpu_session(toolchain, tmp_path: Path) -> None:
    """The issue's bar: a syntax error and an LDS overflow fail compile[gfx942] with the
    compiler's message, the HIP seed passes with its resource line (also in --ks-json), and
    every run item skips with the reason."""
    code, output, data = run_pytest(
        [str(TASK), "--ks-baselines", "none", "--ks-skip-reference", "-v",
         "--kernel", str(HIP / "syntax_error.py"), "--kernel", str(HIP / "lds_overflow.py"),
         "--kernel", str(SEED)], cwd=tmp_path)
    assert code == 1, output
    assert "syntax_error::compile[gfx942] FAILED" in output
    assert "lds_overflow::compile[gfx942] FAILED" in output
    assert "lds_overflow::compile[gfx950] PASSED" in output
    assert "hip_mfma::compile[gfx942] PASSED" in output
    assert ("syntax_error does not compile for gfx942:\n"
            "syntax_error.py:13:28: error: expected ';' after expression\n"
            "   13 |     if (i < n) x[i] *= 2.0f\n") in output
    assert ("lds_overflow does not compile for gfx942:\nlds_overflow.py:13:17: error: local "
            "memory (131072) exceeds limit (65536) in 'reverse_tile(float*)'") in output
    rows = {line.split()[0]: line.split()[1:3] for line in output.splitlines()
            if line.startswith("  ") and line.split()[0] in (
                "syntax_error", "lds_overflow", "hip_mfma") and line.split()[1].isdigit()}
    # passed and failed count the compile items (issue 29: the seed's row read 0 0)
    assert rows == {"syntax_error": ["0", "1"], "lds_overflow": ["1", "1"],
                    "hip_mfma": ["1", "0"]}, output
    seed_line = next(line for line in output.splitlines()
                     if line.strip().startswith("hip_mfma compile[gfx942] "))
    assert "fp8_gemm_kernel: " in seed_line and " VGPRs, " in seed_line
    assert " B LDS, occupancy " in seed_line and "spills 0 VGPR 0 SGPR" in seed_line
    for name in ("syntax_error", "lds_overflow", "hip_mfma"):
        assert (f"candidate '{name}' requires rocm (a ROCm GPU, its KS_REQUIRES), this run's "
                "device is cpu") in output
    assert "check[m64-n64-k128-s6635] SKIPPED" in output and " PASSED" not in output.replace(
        "compile[gfx942] PASSED", "").replace("compile[gfx950] PASSED", "").replace(
        "task::validate PASSED", "")  # the task's own item runs on any device
    compiles = {c["name"]: c["compiles"] for c in data["candidates"]}
    assert data["schema_version"] == RESULTS_SCHEMA_VERSION
    (seed,) = compiles["hip_mfma"]
    assert seed["outcome"] == "passed" and seed["arch"] == "gfx942"
    (kernel,) = seed["kernels"]
    assert kernel["name"] == "fp8_gemm_kernel" and kernel["lds_bytes"] == 2 * 128 * (64 + 4)
    assert kernel["vgpr_spills"] == 0 and seed["compiler"].startswith(("Debian clang", "AMD"))
    by_arch = {c["arch"]: c for c in compiles["lds_overflow"]}
    assert by_arch["gfx942"]["outcome"] == "failed"
    assert by_arch["gfx950"]["kernels"][0]["lds_bytes"] == 131072
    assert "expected ';'" in compiles["syntax_error"][0]["reason"]


def test_a_source_including_torch_extension_compiles_in_a_virtualenv(toolchain,
                                                                    tmp_path: Path) -> None:
    """GPU MODE's HIP submissions include <torch/extension.h> (Python.h through pybind11), which
    load_inline finds with torch's include_paths() and the interpreter's include folder. A
    virtualenv's sys.prefix has no headers (they stay under the base's): the gate failed there
    with "'Python.h' file not found" while load_inline compiled the same source."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip",
                    str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    prefixes = subprocess.run([str(python), "-c", "import sys; print(sys.prefix != "
                               "sys.base_prefix)"], capture_output=True, text=True, check=True)
    assert prefixes.stdout.strip() == "True"  # the case at issue: a prefix without Python.h
    proc = subprocess.run(
        [str(python), "-m", "pytest", "-p", "no:cacheprovider", "-v", str(TASK), "--ks-baselines",
         "none", "--ks-skip-reference", "-k", "compile",
         "--kernel", str(HIP / "torch_extension_hip.py")],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
        env=dict(os.environ, KS_COMPILE_CACHE="off"))  # a real compile, no PCH to build for one
    output = proc.stdout + proc.stderr
    assert "torch_extension_hip::compile[gfx942] PASSED" in output, output
    line = next(line for line in output.splitlines()
                if line.strip().startswith("torch_extension_hip compile[gfx942] "))
    assert "naive_fp8_mm: " in line and " VGPRs, " in line, line


def test_a_compile_is_kept_by_its_inputs_and_answers_only_them(
        toolchain, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cache around the compiler (the compiler itself: the tests above). A stand-in for
    the compiler's process counts the compiles: an error for the first source, a pass for the
    fixed one, and no finish under a 0.05 s timeout."""
    ran: list[list[str]] = []

    def compiler(cmd: list[str], cwd: Path, timeout_s: float,
                 env: dict[str, str] | None = None) -> tuple[int | None, str]:
        ran.append(cmd)
        if timeout_s < 0.1:
            return None, ""
        time.sleep(0.2)  # the kept result's seconds, above the short timeout below
        unit = Path(cmd[-1]).read_text()
        if "2.0f;" in unit:
            return 0, ""
        return 1, f"{cwd}/syntax_error.hip:13:28: error: expected ';' after expression\n"

    monkeypatch.setattr(compiles, "run", compiler)
    monkeypatch.setattr(prelude, "built", lambda *args: None)  # its own tests: test_hip_prelude
    monkeypatch.setenv("KS_COMPILE_CACHE", str(tmp_path / "kept"))
    broken = tmp_path / "syntax_error.py"
    broken.write_text((HIP / "syntax_error.py").read_text())
    first = compile_gate.compile_candidate(broken, "gfx942", 60)
    assert first.outcome == "failed" and not first.cached and len(ran) == 1
    (entry,) = (tmp_path / "kept").glob("*.json")
    again = compile_gate.compile_candidate(broken, "gfx942", 60)  # another temporary folder
    assert len(ran) == 1 and again.cached
    assert again.model_copy(update={"cached": False}) == first
    assert compiles.resource_line(again.model_copy(update={"outcome": "passed"})).endswith(
        f"({first.seconds:.1f} s, kept from an earlier compile)")
    # Another target, another source: compiled, not answered from the first entry.
    assert not compile_gate.compile_candidate(broken, "gfx950", 60).cached and len(ran) == 2
    broken.write_text(broken.read_text().replace("x[i] *= 2.0f\n", "x[i] *= 2.0f;\n"))
    fixed = compile_gate.compile_candidate(broken, "gfx942", 60)
    assert fixed.outcome == "passed" and not fixed.cached and len(ran) == 3
    assert compile_gate.compile_candidate(broken, "gfx942", 60).cached and len(ran) == 3
    # A timeout shorter than the kept compile took: compiled again, killed, and not kept.
    late = compile_gate.compile_candidate(broken, "gfx942", 0.05)
    assert len(ran) == 4 and late.outcome == "failed" and "within 0.05 s" in late.reason
    assert compile_gate.compile_candidate(broken, "gfx942", 60).cached and len(ran) == 4
    entry.write_text("{not json")  # a damaged entry is a miss, not an error
    assert compiles.cached(entry.stem, 60) is None
    monkeypatch.setenv("KS_COMPILE_CACHE", "off")
    assert compiles.cache_folder() is None
    assert not compile_gate.compile_candidate(broken, "gfx942", 60).cached and len(ran) == 5


def test_compile_items_skip_without_a_toolchain(tmp_path: Path) -> None:
    env = {"KS_HIP_ROOT": str(tmp_path / "none"), "ROCM_PATH": str(tmp_path / "rocm")}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        code, output, data = run_pytest(
            [str(TASK), "--ks-baselines", "none", "--ks-skip-reference", "-rs",
             "--kernel", str(HIP / "template_hip.py")], cwd=tmp_path)
    finally:
        for key, value in old.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    assert code == 0, output
    assert "SKIPPED [1] " in output and "no AMDGPU toolchain to compile for gfx942" in output
    assert "install it with: bash " in output and "tools/install_hip_toolchain.sh" in output
    assert {c["arch"]: c["outcome"] for c in data["candidates"][0]["compiles"]} == {
        "gfx942": "skipped", "gfx950": "skipped"}


def test_writer_drafts_in_hip_are_compiled_before_any_gpu_time(toolchain) -> None:
    """The LLM writer's draft check (evolve/llm/draft.py) returns the compiler's errors."""
    from pytest_kscientist.evolve.llm.draft import KnownSources, check

    broken = (HIP / "syntax_error.py").read_text()
    problem = check(broken, KnownSources())
    assert problem.startswith("the HIP source does not compile for gfx942:\n"
                              "draft.py:13:28: error: expected ';' after expression")
    fixed = broken.replace("x[i] *= 2.0f\n", "x[i] *= 2.0f;\n")
    assert check(fixed, KnownSources()) == ""
    assert check("def custom_kernel(data):\n    return data\n", KnownSources()) == ""


def test_a_sessions_compiles_run_ahead_at_once_each_keeping_its_result(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """compile_ahead runs the compile items' compiles ``jobs`` at a time before the first item
    (a barrier only two compiles at once pass), and each item then holds its own result."""
    import threading

    from pytest_kscientist.harness.results import CompileResult

    both = threading.Barrier(2, timeout=30)

    def compile(item: compiles.CompileItem) -> CompileResult:
        both.wait()  # raises BrokenBarrierError when the compiles run one after another
        return CompileResult(arch=item.arch, outcome="passed")

    monkeypatch.setattr(compiles.CompileItem, "compile", compile)
    items = []
    for arch in ("gfx942", "gfx950"):
        item = object.__new__(compiles.CompileItem)
        item.arch, item.result = arch, None
        items.append(item)
    assert compiles.compile_ahead([*items, "another item"], jobs=2) == 2
    assert [item.result.arch for item in items] == ["gfx942", "gfx950"]
    assert compiles.compile_ahead(items, jobs=2) == 0  # compiled once
