"""A slow candidate import is reported with how long it took and why (issue 32): a load_inline
build that parses torch's headers in its CUDA sources is most of a CUDA candidate's first
evaluation."""

from __future__ import annotations

import shutil
from pathlib import Path

from helpers import AXPY, run_pytest

from pytest_kscientist.harness.report import SLOW_LOAD_S, build_hint, load_lines
from pytest_kscientist.harness.results import CandidateResult, InlineBuild

WHOLE = '''
from torch.utils.cpp_extension import load_inline
ext = load_inline("k", cpp_sources="torch::Tensor f(torch::Tensor x);",
                  cuda_sources=KERNELS_AND_WRAPPER, functions=["f"])
'''
SPLIT = '''
ext = load_inline("k", cpp_sources=WRAPPER, cuda_sources=KERNELS, functions=["f"],
                  no_implicit_headers=True, use_pch=True)
'''


def test_the_hint_names_what_the_build_spends_its_time_on() -> None:
    assert "no_implicit_headers=True" in build_hint(WHOLE)
    assert "Python's C API" in build_hint(WHOLE)
    no_pch = SPLIT.replace(", use_pch=True", "")
    assert "use_pch=True reuses torch's precompiled header" in build_hint(no_pch)
    assert build_hint(SPLIT) == "its load_inline build"
    # a wrapper with no torch header (the CUDA seed's) needs no precompiled header
    c_api = SPLIT.replace(', functions=["f"]', "").replace(", use_pch=True", "")
    assert build_hint(c_api) == "its load_inline build"
    seed = Path(__file__).parent.parent / "tasks" / "fp8_gemm" / "seeds" / "cuda_wgmma.py"
    assert build_hint(seed.read_text()) == "its load_inline build"
    assert build_hint("import triton\n@triton.jit\ndef k(): pass\n").startswith("Triton kernels")
    assert build_hint("import time\ntime.sleep(9)\n") == "its module-level code"


def test_only_slow_candidate_imports_get_a_line() -> None:
    def cand(name: str, load_s: float | None, role: str = "candidate") -> CandidateResult:
        return CandidateResult(name=name, path=f"{name}.py", sha256="0", role=role,  # type: ignore[arg-type]
                               load_s=load_s, source=WHOLE)

    lines = load_lines([cand("slow", SLOW_LOAD_S + 7.25), cand("quick", 0.4), cand("never", None),
                        cand("cublas", 30.0, role="baseline")])
    assert len(lines) == 1
    assert lines[0].startswith("load of slow: 12.2 s before its first call, most likely its "
                               "load_inline build, which puts torch's headers in every CUDA "
                               "source")


def test_the_line_says_where_the_build_is_kept() -> None:
    def cand(*builds: InlineBuild) -> CandidateResult:
        return CandidateResult(name="k", path="k.py", sha256="0", load_s=SLOW_LOAD_S + 1,  # type: ignore[arg-type]
                               source=SPLIT, inline_builds=list(builds))

    shared = load_lines([cand(InlineBuild(module="k", key="0" * 16, outcome="built"))])[0]
    assert shared.endswith("(1 kept by the hash of their sources and flags: any file with the "
                           "same ones loads them without building)"), shared
    own = load_lines([cand(InlineBuild(module="k", outcome="declined", why="it names include "
                                       "paths or SYCL sources"))])[0]
    assert "(k built in its own folder, kept for this file only: not shared because it names " \
        "include paths" in own, own
    unsandboxed = load_lines([cand()])[0]
    assert unsandboxed.endswith("(kept for this file: an unchanged file loads it without "
                                "building)"), unsandboxed


def test_the_results_carry_each_candidates_import_time(tmp_path: Path) -> None:
    shutil.copytree(AXPY, tmp_path / "axpy")
    (tmp_path / "slow_import.py").write_text(
        "import time\n\ntime.sleep(%s)\n\n" % (SLOW_LOAD_S + 0.5)
        + (AXPY / "seeds" / "good.py").read_text())
    code, output, data = run_pytest(["axpy", "-k", "check", "--kernel", "slow_import.py"],
                                    cwd=tmp_path)
    assert code == 0 and data is not None, output
    found = {c["name"]: c["load_s"] for c in data["candidates"]}
    assert found["slow_import"] >= SLOW_LOAD_S + 0.5, found
    # Where the session's time went: the checks waited for that import; no bench item ran.
    assert set(data["item_seconds"]) == {"check"}, data["item_seconds"]  # -k check
    assert data["item_seconds"]["check"] >= SLOW_LOAD_S - 1.0, data["item_seconds"]
    assert ("load of slow_import: " in output
            and " s before its first call, most likely its module-level code" in output)
