"""The CUDA seed (tasks/fp8_gemm/seeds/cuda_wgmma.py, issue 15).

On any machine with nvcc, the two files load_inline builds (issue 32): cuda.cu (the kernels
and their raw-pointer launcher) compiles and links with no torch header or library, its kernels
(both N tiles, both upcasts) for sm_90a with no spills and no wgmma serialisation (ptxas remarks
C7513, C7514, C7520...: the MMAs would then run one at a time, a slow kernel that still passes
every check); main.cpp (the torch wrapper) compiles against torch's headers as load_inline
compiles it and calls only what cuda.cu defines. Without a GPU: its knobs parse,
its declaration makes the harness skip it, one build serves every knob, its shape rules and the
stages that fit do what they say, the upcast's byte transpose transposes (on a model of
__byte_perm). On an sm_90 GPU: it passes the task's checks through the harness at every
schedule (stream-K fixups included).
"""

from __future__ import annotations

import functools
import inspect
import re
import shutil
import subprocess
import sysconfig
import types
from pathlib import Path

import pytest
import torch
import torch.utils.cpp_extension
from helpers import REPO, run_pytest

from pytest_kscientist.evolve.offline.knobs import read_space, read_tunables, rewrite_tunables
from pytest_kscientist.formats.requires import declared

SEED = REPO / "tasks" / "fp8_gemm" / "seeds" / "cuda_wgmma.py"
NVCC = shutil.which("nvcc")


def seed_namespace(monkeypatch: pytest.MonkeyPatch, source: str,
                   load_inline=torch.utils.cpp_extension.load_inline) -> types.SimpleNamespace:
    """The seed's module-level names, its load_inline call recorded instead of run (the build
    needs a CUDA torch; its two files are compiled below), under ``load_inline``'s signature."""
    calls: list[dict] = []

    @functools.wraps(load_inline)
    def record(**kwargs):
        inspect.signature(load_inline).bind(**kwargs)  # a keyword it lacks: TypeError, as a call
        calls.append(kwargs)
        return types.SimpleNamespace()

    monkeypatch.setattr(torch.utils.cpp_extension, "load_inline", record)
    namespace: dict = {"__name__": "cuda_wgmma"}
    exec(compile(source, str(SEED), "exec"), namespace)
    assert len(calls) == 1, calls
    return types.SimpleNamespace(**namespace, build=calls[0])


def test_knobs_parse_and_every_default_is_in_the_space() -> None:
    source = SEED.read_text()
    tunables, space = read_tunables(source), read_space(source)
    assert set(tunables) == set(space)
    for knob, value in tunables.items():
        assert value in space[knob], knob


def test_the_harness_skips_it_off_sm90() -> None:
    assert declared(SEED) == ["sm_90"]


def byte_perm(x: int, y: int, selector: int) -> int:
    """CUDA's __byte_perm: result byte i is byte (selector >> 4i) & 7 of y:x."""
    pool = (x | y << 32).to_bytes(8, "little")
    return int.from_bytes(bytes(pool[(selector >> 4 * i) & 7] for i in range(4)), "little")


def test_the_upcasts_byte_transpose_transposes() -> None:
    """transpose4x4 (B's upcast) as written in the seed, run on a model of __byte_perm: word j
    of its output holds byte j of each input row, row 0 lowest."""
    body = SEED.read_text().split("void transpose4x4(", 1)[1].split("\n}", 1)[0]
    steps = re.findall(r"(\w+(?:\[\d\])?) = __byte_perm\((\w+(?:\[\d\])?), "
                       r"(\w+(?:\[\d\])?), (0x[0-9A-Fa-f]+)\)", body)
    assert len(steps) == 8, body
    rows = [0x03020100, 0x13121110, 0x23222120, 0x33323130]  # byte j of row i: 0x<i><j>
    values = {f"r[{i}]": row for i, row in enumerate(rows)}
    for out, x, y, selector in steps:
        values[out] = byte_perm(values[x], values[y], int(selector, 16))
    for j in range(4):
        assert values[f"out[{j}]"] == int.from_bytes(bytes(16 * i + j for i in range(4)),
                                                     "little"), j


def test_one_build_serves_every_knob(monkeypatch) -> None:
    """Knob values reach the kernels at each call, never the build: a seed with other knobs
    builds the same sources with the same flags (so evolving it costs no minute-long build)."""
    built = seed_namespace(monkeypatch, SEED.read_text()).build
    moved = seed_namespace(monkeypatch, rewrite_tunables(
        SEED.read_text(), {"BLOCK_N": 64, "STAGE_DROP": 2, "GROUP_M": 1, "STREAM_K": 2,
                           "PERSISTENT": 0, "PINGPONG": 0, "TMA_STORE": 0, "OVERLAP": 0,
                           "C_BUFFERS": 2})).build
    assert moved == built
    assert "-gencode=arch=compute_90a,code=sm_90a" in built["extra_cuda_cflags"]  # wgmma


def test_shape_rules_and_stages(monkeypatch) -> None:
    ns = seed_namespace(monkeypatch, SEED.read_text())
    # a short K runs whole tiles, a long one cuts the last wave's tiles among the SMs
    assert ns.tunables_for(m=6144, n=7168, k=256)["STREAM_K"] == 0
    assert ns.tunables_for(m=1024, n=512, k=7168)["STREAM_K"] == ns.TUNABLES["STREAM_K"] > 0
    # a stage is A's fp8 tile (16 kB), B's fp16 tile (16 or 32 kB) and 544 bytes of scales and
    # barriers; C's tile 16 or 32 kB beside them in 227 kB a block
    assert [ns.stages_for(128, d) for d in (0, 1, 2)] == [4, 3, 2]
    assert [ns.stages_for(64, d) for d in (0, 1, 2)] == [6, 5, 4]
    # C_BUFFERS 2: C's tiles twice over, a stage fewer
    assert [ns.stages_for(128, d, 2) for d in (0, 1, 2)] == [3, 2, 1]
    assert [ns.stages_for(64, d, 2) for d in (0, 1, 2)] == [5, 4, 3]
    # every value of every knob is another kernel at either N tile: a move is never a no-op
    for block_n in ns.TUNABLE_SPACE["BLOCK_N"]:
        for c_buffers in ns.TUNABLE_SPACE["C_BUFFERS"]:
            stages = [ns.stages_for(block_n, d, c_buffers)
                      for d in ns.TUNABLE_SPACE["STAGE_DROP"]]
            assert len(set(stages)) == len(stages), (block_n, c_buffers, stages)


def test_it_builds_without_torch_headers_in_cuda_cu_and_with_the_pch_where_torch_has_them(
        monkeypatch) -> None:
    assert seed_namespace(monkeypatch, SEED.read_text()).build["no_implicit_headers"] is True
    # the PCH is written beside torch's headers: off where they are read-only
    monkeypatch.setattr("os.access", lambda path, mode: False)
    assert seed_namespace(monkeypatch, SEED.read_text()).build["use_pch"] is False

    def older(name, cpp_sources, cuda_sources=None, functions=None, extra_cuda_cflags=None):
        """load_inline before either keyword (the build is then the unsplit one's speed)."""

    build = seed_namespace(monkeypatch, SEED.read_text(), older).build
    assert "use_pch" not in build and "no_implicit_headers" not in build


def load_inline_files(build: dict, folder: Path) -> tuple[Path, Path]:
    """main.cpp and cuda.cu as torch's load_inline writes them for ``build`` (its keyword
    arguments): each list of sources joined by newlines, the pybind11 module after the C++
    ones, torch's headers first unless no_implicit_headers."""
    cpp, cu = list(build["cpp_sources"]), list(build["cuda_sources"])
    if not build.get("no_implicit_headers"):
        cpp.insert(0, "#include <torch/extension.h>")
        cu[:0] = ["#include <torch/types.h>", "#include <cuda.h>", "#include <cuda_runtime.h>"]
    cpp += ["PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {",
            *(f'm.def("{f}", torch::wrap_pybind_function({f}), "{f}");'
              for f in build["functions"]), "}"]
    (folder / "main.cpp").write_text("\n".join(cpp))
    (folder / "cuda.cu").write_text("\n".join(cu))
    return folder / "main.cpp", folder / "cuda.cu"


@pytest.fixture(scope="module")
def cuda_part(tmp_path_factory) -> types.SimpleNamespace:
    """The seed's cuda.cu compiled with load_inline's nvcc flags but no torch include path at
    all, ptxas reporting: its object, nvcc's output and exit status."""
    if NVCC is None:
        pytest.skip("nvcc not found: the CUDA seed's cuda.cu not built")
    with pytest.MonkeyPatch.context() as monkeypatch:
        ns = seed_namespace(monkeypatch, SEED.read_text())
    folder = tmp_path_factory.mktemp("cuda_part")
    _, cu = load_inline_files(ns.build, folder)
    proc = subprocess.run(
        [NVCC, "-c", "-o", str(folder / "cuda.o"), str(cu),
         *torch.utils.cpp_extension.COMMON_NVCC_FLAGS, "-Xcompiler", "-fPIC",
         *ns.build["extra_cuda_cflags"], "-std=c++20", "-Xptxas", "-v"],
        capture_output=True, text=True, timeout=600)
    return types.SimpleNamespace(obj=folder / "cuda.o", report=proc.stdout + proc.stderr,
                                 returncode=proc.returncode, build=ns.build)


def test_kernels_build_for_sm90a_without_spills_or_serialised_wgmma(cuda_part) -> None:
    report = cuda_part.report
    assert cuda_part.returncode == 0, report
    for block_n in (64, 128):  # both N tiles, with one and two C buffers, are built
        for c_buffers in (1, 2):
            assert f"_Z11gemm_kernelILi{block_n}ELi{c_buffers}E" in report, report
    for vec in (0, 1):  # both upcasts
        assert f"_Z13upcast_kernelILb{vec}E" in report, report
    assert "wgmma.mma_async instructions are serialized" not in report, report  # C75xx
    spills = [int(n) for n in re.findall(r"(\d+) bytes spill stores", report)]
    assert spills and not any(spills), report


def test_cuda_cu_needs_no_torch_header_or_library(cuda_part, tmp_path: Path) -> None:
    """Built above with no torch include path, it also links alone against CUDA's runtime."""
    assert cuda_part.returncode == 0, cuda_part.report[-4000:]
    proc = subprocess.run(
        [NVCC, "-shared", "-o", str(tmp_path / "cuda.so"), str(cuda_part.obj), "--cudart",
         "shared", "-Xlinker", "--no-undefined"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def cuda_include_dir(folder: Path) -> str:
    """The folder nvcc takes cuda_runtime_api.h from (load_inline puts it on main.cpp's include
    path too, with_cuda)."""
    probe = folder / "probe.cu"
    probe.write_text("#include <cuda_runtime_api.h>\n")
    out = subprocess.run([NVCC, "-E", str(probe)], capture_output=True, text=True,
                         timeout=120).stdout
    return re.search(r'^# \d+ "(.+)/cuda_runtime_api\.h"', out, re.M).group(1)


def symbols(obj: Path, which: str) -> set[str]:
    """The launcher's symbols (mangled, so with their parameter types) ``obj`` defines or
    needs (``which``: nm's --defined-only or --undefined-only)."""
    out = subprocess.run(["nm", which, str(obj)], capture_output=True, text=True,
                         check=True).stdout
    return {line.split()[-1] for line in out.splitlines() if "ks_wgmma" in line}


@pytest.mark.skipif(shutil.which("nm") is None, reason="nm not found: symbols not compared")
def test_main_cpp_compiles_with_torchs_headers_and_calls_only_what_cuda_cu_defines(
        cuda_part, tmp_path: Path) -> None:
    """main.cpp as load_inline compiles it (the host compiler, torch's JIT flags and headers,
    CUDA's), so a slip in the wrapper costs CI time, not device time; the launchers it calls
    are the ones cuda.cu defines, parameter types and all (a mismatch would link on the GPU
    machine only to fail at import, a minute's build later). The CPU wheel lacks one header a
    CUDA build of torch generates, c10/cuda/impl/cuda_cmake_macros.h; a one-line one stands in."""
    assert cuda_part.returncode == 0, cuda_part.report[-4000:]
    build = cuda_part.build
    macros = tmp_path / "include" / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h"
    macros.parent.mkdir(parents=True)
    macros.write_text("#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
    cpp, _ = load_inline_files(build, tmp_path)
    includes = [str(macros.parents[3]), *torch.utils.cpp_extension.include_paths(),
                cuda_include_dir(tmp_path), sysconfig.get_paths()["include"]]
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    proc = subprocess.run(
        [torch.utils.cpp_extension.get_cxx_compiler(), "-c", "-o", str(tmp_path / "main.o"),
         str(cpp), f"-DTORCH_EXTENSION_NAME={build['name']}", "-DTORCH_API_INCLUDE_EXTENSION_H",
         *(f"-isystem{i}" for i in includes), f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-fPIC",
         "-std=c++20", *build.get("extra_cflags", [])],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    needed = symbols(tmp_path / "main.o", "--undefined-only")
    defined = symbols(cuda_part.obj, "--defined-only")
    assert needed and needed <= defined, (needed, defined)


SM90 = (torch.cuda.is_available() and torch.version.hip is None
        and torch.cuda.get_device_capability() >= (9, 0))


@pytest.mark.gpu
@pytest.mark.skipif(not (SM90 and NVCC), reason="needs an NVIDIA sm_90 GPU and nvcc")
def test_it_passes_the_tasks_checks_on_sm90(tmp_path: Path) -> None:
    """Every schedule: whole tiles, one CTA a tile, and both stream-K cuts (whose fixups
    sum partials across CTAs), at both N tiles, with one or two C buffers; one build serves
    them all."""
    shutil.copytree(REPO / "tasks" / "fp8_gemm", tmp_path / "fp8_gemm")
    points = {"cuda_sk0": {"STREAM_K": 0, "PERSISTENT": 0, "PINGPONG": 0, "OVERLAP": 0},
              "cuda_sk1": {"STREAM_K": 1, "BLOCK_N": 64},
              "cuda_sk2": {"STREAM_K": 2, "C_BUFFERS": 2}}
    kernels = []
    for name, knobs in points.items():
        path = tmp_path / f"{name}.py"
        path.write_text(rewrite_tunables(SEED.read_text(), knobs))
        kernels += ["--kernel", str(path)]
    code, output, data = run_pytest(["fp8_gemm", "-k", "check", *kernels, "--ks-timeout", "400"],
                                    cwd=tmp_path, timeout=900)
    assert code == 0, output
    for name in points:
        (candidate,) = [c for c in data["candidates"] if c["name"] == name]
        outcomes = {case["outcome"] for case in candidate["cases"]}
        assert outcomes == {"passed"}, output
