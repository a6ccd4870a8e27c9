"""The CUDA seed (tasks/fp8_gemm/seeds/cuda_wgmma.py, issue 15).

On any machine with nvcc, the two files load_inline builds (issue 32): cuda.cu (the kernels
and their raw-pointer launcher) compiles and links with no torch header or library, its kernels
(both N tiles, both upcasts) for sm_90a with no spills and no wgmma serialisation (ptxas remarks
C7513, C7514, C7520...: the MMAs would then run one at a time, a slow kernel that still passes
every check); main.cpp (the Python wrapper) compiles with no torch header either and links
with it into a module that imports and names a wrong call. Without a GPU: its knobs parse,
its declaration makes the harness skip it, one build serves every knob, its shape rules, its
schedule and the stages that fit do what they say, a wrong input is named, the upcast's byte
transpose transposes (on a model of __byte_perm). On an sm_90 GPU: it passes the task's
checks through the harness at every schedule (stream-K fixups included).
"""

from __future__ import annotations

import functools
import inspect
import random
import re
import shutil
import subprocess
import sys
import sysconfig
import types
from pathlib import Path

import pytest
import tomllib
import torch
import torch.utils.cpp_extension
from helpers import REPO, fixup_text, load_file, run_pytest

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


def test_neither_file_it_builds_includes_a_torch_header(monkeypatch) -> None:
    """Issue 32: torch's headers cost 9-40 s a build; the kernels and launchers (cuda.cu) and
    the Python wrapper (main.cpp) include none, and load_inline adds none."""
    build = seed_namespace(monkeypatch, SEED.read_text()).build
    assert build["no_implicit_headers"] is True
    assert "functions" not in build and "use_pch" not in build  # no pybind11 module, no PCH
    for source in (*build["cpp_sources"], *build["cuda_sources"]):
        included = re.findall(r"#include\s*[<\"]([^>\"]+)", source)
        assert included and not [h for h in included if h.split("/")[0] in
                                 ("torch", "ATen", "c10", "pybind11")], included

    def older(name, cpp_sources, cuda_sources=None, functions=None, extra_cuda_cflags=None):
        """load_inline before no_implicit_headers (the build is then slower, the module the
        same)."""

    build = seed_namespace(monkeypatch, SEED.read_text(), older).build
    assert "no_implicit_headers" not in build


def test_plan_gives_every_tile_to_whole_ctas_or_stream_k(monkeypatch) -> None:
    """The schedule custom_kernel passes the kernels (what the torch wrapper computed before):
    every tile either goes whole to a CTA or has its K steps cut among the stream-K CTAs."""
    ns = seed_namespace(monkeypatch, SEED.read_text())
    for m, n, k in [(1024, 512, 7168), (6144, 7168, 256), (128, 64, 128), (6144, 4608, 7168)]:
        steps = -(-k // 128)
        for block_n in (64, 128):
            for stream_k in (0, 1, 2):
                for persistent in (0, 1):
                    sched, grid, sk_tiles = ns.plan(m, n, steps, block_n, 8, stream_k,
                                                    persistent, 132)
                    (m_, n_, steps_, tiles_m, tiles_n, group_m, dp_tiles, sk_ctas,
                     sk_units) = sched
                    tiles = tiles_m * tiles_n
                    assert (m_, n_, steps_, group_m) == (m, n, steps, 8)
                    assert tiles_m * 128 >= m > (tiles_m - 1) * 128
                    assert tiles_n * block_n >= n > (tiles_n - 1) * block_n
                    assert dp_tiles + sk_tiles == tiles and sk_units == sk_tiles * steps
                    if stream_k == 0:
                        assert sk_tiles == 0
                    if sk_tiles:  # one CTA an SM, each with some of the cut K steps
                        assert grid <= 132 and 0 < sk_ctas <= min(132, sk_units)
                        assert tiles % 132 == 0 or sk_tiles >= tiles % 132
                    else:
                        assert grid == (min(tiles, 132) if persistent else tiles)
    # m1024-n512-k7168: 32 tiles for 132 SMs, all cut by K (56 steps each) among 128 CTAs
    assert ns.plan(1024, 512, 56, 128, 8, 1, 1, 132) == (
        [1024, 512, 56, 8, 4, 8, 0, 128, 32 * 56], 128, 32)


def _stream_k_walk(units: int, steps: int, sk_ctas: int, grid: int) -> dict:
    """The kernel's Walk and fixup slots, mirrored: per CTA its stream-K segments as (tile,
    kb0, kb1, slot) with slot 0 for the CTA's first segment and 1 after (what `fixup` writes)."""
    walks = {}
    for cta in range(grid):
        u, u1 = ((units * cta // sk_ctas, units * (cta + 1) // sk_ctas) if cta < sk_ctas
                 else (0, 0))
        segments, first = [], True
        while u < u1:
            tile = u // steps
            kb0 = u - tile * steps
            kb1 = min(steps, kb0 + (u1 - u))
            segments.append((tile, kb0, kb1, 0 if first else 1))
            first = False
            u += kb1 - kb0
        walks[cta] = segments
    return walks


def _longest(units: int, steps: int, ctas: int, fixup: float = 8.0) -> float:
    """The most K steps a CTA runs over ``ctas`` even ranges, each cut part counted ``fixup``
    more: sk_ctas_for's cost, written out segment by segment."""
    worst = 0.0
    for walk in _stream_k_walk(units, steps, ctas, ctas).values():
        worst = max(worst, sum(kb1 - kb0 + (fixup if kb1 - kb0 < steps else 0)
                               for _, kb0, kb1, _ in walk))
    return worst


def test_stream_k_cuts_each_tile_once_and_every_fixup_reads_the_slot_its_part_was_written_to(
        monkeypatch) -> None:
    """However many CTAs sk_ctas_for gives the cut tiles, for the task's stream-K shapes and
    drawn ones the kernel's walk (mirrored) covers every cut K step once, a CTA writes each of
    its two slots at most once, and the CTA that sums a tile (owner's range, the slot picked by
    the part's first unit) finds each part where its CTA wrote it. At m1024-n512-k7168 it takes
    128 CTAs of 14 steps, one tile each; and its three candidates lose nothing to a search of
    every count up to min(SMs, units): the longest CTA, its parts priced as sk_ctas_for prices
    them, is the search's."""
    ns = seed_namespace(monkeypatch, SEED.read_text())
    rng = random.Random(7)
    shapes = [(1024, 512, 7168), (1024, 576, 7168), (1024, 1536, 7168), (1024, 4608, 7168),
              (1024, 7168, 2048), (6144, 512, 7168), (6144, 576, 7168), (6144, 7168, 2304)]
    shapes += [(32 * rng.randint(1, 192), 64 * rng.randint(1, 112), 128 * rng.randint(14, 56))
               for _ in range(40)]
    for m, n, k in shapes:
        steps = k // 128
        sched, grid, sk_tiles = ns.plan(m, n, steps, 128, 8, 1, 1, 132)
        dp_tiles, sk_ctas, units = sched[6:9]
        if not sk_tiles:
            continue
        assert 0 < sk_ctas <= min(132, units) and grid == (132 if dp_tiles else sk_ctas)
        assert _longest(units, steps, sk_ctas) == min(
            _longest(units, steps, c) for c in range(1, min(132, units) + 1)), (m, n, k)
        walks = _stream_k_walk(units, steps, sk_ctas, grid)
        covered = [t * steps + kb for segs in walks.values() for t, kb0, kb1, _ in segs
                   for kb in range(kb0, kb1)]
        assert sorted(covered) == list(range(units)), (m, n, k)
        written = {}  # (cta, slot) -> the tile whose part is there
        for cta, segs in walks.items():
            for tile, kb0, kb1, slot in segs:
                if kb0 > 0 or kb1 < steps:
                    assert (cta, slot) not in written, (m, n, k, cta)
                    written[cta, slot] = tile
        for tile in set(written.values()):
            # the kernel's owner(): the CTA whose range holds a unit, for the tile's first and last
            lo, hi = (((u + 1) * sk_ctas - 1) // units
                      for u in (tile * steps, tile * steps + steps - 1))
            parts = {cta for (cta, _), t in written.items() if t == tile}
            assert parts == set(range(lo, hi + 1)), (m, n, k, tile)
            for cta in parts:
                slot = 0 if (units * cta // sk_ctas) // steps == tile else 1
                assert written[cta, slot] == tile, (m, n, k, tile, cta)
    # the counts the H100 runs measured, from a search of every count (notes/fp8_gemm_h200.md,
    # "The loop's offset measured, and stream-K's CTAs"); the seed's three candidates agree
    measured = {(1024, 1536, 7168): 96, (1024, 576, 7168): 120, (1024, 7168, 2048): 104,
                (1024, 4608, 7168): 120, (1024, 7168, 2304): 104, (1024, 512, 7168): 128,
                (6144, 1536, 7168): 96, (6144, 576, 7168): 108, (6144, 7168, 2048): 96,
                (6144, 4608, 7168): 132, (6144, 7168, 2304): 96, (6144, 512, 7168): 120}
    for (m, n, k), ctas in measured.items():
        assert ns.plan(m, n, k // 128, 128, 8, 1, 1, 132)[0][7] == ctas, (m, n, k)
    # m1024-n512-k7168: each of the seed's CTAs holds one part of one tile
    sched, grid, _ = ns.plan(1024, 512, 56, 128, 8, 1, 1, 132)
    assert all(len(segs) == 1 for segs in _stream_k_walk(sched[8], 56, sched[7],
                                                         grid).values())


def test_custom_kernel_names_a_wrong_input(monkeypatch) -> None:
    """Its checks run before any CUDA call, so a wrong tensor is a clear error on any device."""
    ns = seed_namespace(monkeypatch, SEED.read_text())
    m, n, k = 128, 64, 256
    fp8 = torch.float8_e4m3fn
    good = [torch.zeros(m, k).to(fp8), torch.zeros(n, k).to(fp8), torch.ones(m, 2),
            torch.ones(1, 2), torch.zeros(m, n, dtype=torch.bfloat16)]
    with pytest.raises(TypeError, match="a and b must be float8_e4m3fn, got torch.float32"):
        ns.custom_kernel([torch.zeros(m, k), *good[1:]])
    with pytest.raises(ValueError, match=r"a_scale \[m, ceil\(k/128\)\].*\(128, 3\)"):
        ns.custom_kernel([*good[:2], torch.ones(m, 3), *good[3:]])
    with pytest.raises(ValueError, match="c must be row-major bf16"):
        ns.custom_kernel([*good[:4], torch.zeros(n, m, dtype=torch.bfloat16).t()])
    with pytest.raises(ValueError, match="one CUDA device, got \\['cpu'"):
        ns.custom_kernel(good)


def load_inline_files(build: dict, folder: Path) -> tuple[Path, Path]:
    """main.cpp and cuda.cu as torch's load_inline writes them for ``build`` (its keyword
    arguments): each list of sources joined by newlines, a pybind11 module after the C++ ones
    when ``functions`` names some, torch's headers first unless no_implicit_headers."""
    cpp, cu = list(build["cpp_sources"]), list(build["cuda_sources"])
    if not build.get("no_implicit_headers"):
        cpp.insert(0, "#include <torch/extension.h>")
        cu[:0] = ["#include <torch/types.h>", "#include <cuda.h>", "#include <cuda_runtime.h>"]
    if build.get("functions"):
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
    return build_cuda_part(SEED.read_text(), tmp_path_factory.mktemp("cuda_part"))


def build_cuda_part(source: str, folder: Path) -> types.SimpleNamespace:
    """``source``'s cuda.cu (a seed or a patched seed) compiled into ``folder`` as cuda_part
    says."""
    if NVCC is None:
        pytest.skip("nvcc not found: the CUDA seed's cuda.cu not built")
    with pytest.MonkeyPatch.context() as monkeypatch:
        ns = seed_namespace(monkeypatch, source)
    _, cu = load_inline_files(ns.build, folder)
    proc = subprocess.run(
        [NVCC, "-c", "-o", str(folder / "cuda.o"), str(cu),
         *torch.utils.cpp_extension.COMMON_NVCC_FLAGS, "-Xcompiler", "-fPIC",
         *ns.build["extra_cuda_cflags"], "-std=c++20", "-Xptxas", "-v"],
        capture_output=True, text=True, timeout=600)
    return types.SimpleNamespace(obj=folder / "cuda.o", report=proc.stdout + proc.stderr,
                                 returncode=proc.returncode, build=ns.build)


def test_kernels_build_for_sm90a_without_spills_or_serialised_wgmma(cuda_part) -> None:
    assert_kernels_built_clean(cuda_part)


def assert_kernels_built_clean(cuda_part: types.SimpleNamespace) -> None:
    """The test above for ``cuda_part`` (the seed's or a variant's)."""
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


@pytest.mark.parametrize("variant", ["skew"])
def test_a_variant_owed_to_the_gpu_builds_as_the_seed_does(variant, tmp_path: Path) -> None:
    """bench/cuda_sweep.py's variants built on the CPU for the next device call (issue 33):
    every kernel for sm_90a, no spill, no serialised wgmma; its main.cpp links with it and
    names a wrong call as the seed's does."""
    sweep = load_file(REPO / "bench" / "cuda_sweep.py", "cuda_sweep")
    part = build_cuda_part(sweep.probe_file(variant, tmp_path).read_text(), tmp_path)
    assert_kernels_built_clean(part)
    (tmp_path / "main").mkdir()
    assert_main_cpp_links_and_names_a_wrong_call(part, tmp_path / "main")


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


def test_main_cpp_builds_with_pythons_headers_into_a_module_with_cuda_cu(
        cuda_part, tmp_path: Path) -> None:
    """main.cpp as load_inline compiles it (the host compiler, Python's and CUDA's headers; no
    torch include path at all) links with cuda.cu's object into the module the seed imports,
    so a slip in the wrapper costs CI time, not device time. Its fp8_gemm names a wrong call,
    and returns a CUDA error (none is queued: no device here, or zero-sized work on one) as a
    RuntimeError naming it."""
    assert_main_cpp_links_and_names_a_wrong_call(cuda_part, tmp_path)


def assert_main_cpp_links_and_names_a_wrong_call(cuda_part: types.SimpleNamespace,
                                                 tmp_path: Path) -> None:
    """The test above for ``cuda_part`` (the seed's or a variant's)."""
    assert cuda_part.returncode == 0, cuda_part.report[-4000:]
    build = cuda_part.build
    cpp, _ = load_inline_files(build, tmp_path)
    cuda_include = cuda_include_dir(tmp_path)
    proc = subprocess.run(
        [torch.utils.cpp_extension.get_cxx_compiler(), "-c", "-o", str(tmp_path / "main.o"),
         str(cpp), f"-DTORCH_EXTENSION_NAME={build['name']}", f"-isystem{cuda_include}",
         f"-isystem{sysconfig.get_paths()['include']}", "-fPIC", "-std=c++17", "-O3"],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    library = tmp_path / f"{build['name']}.so"
    proc = subprocess.run(
        [NVCC, "-shared", "-o", str(library), str(tmp_path / "main.o"), str(cuda_part.obj),
         "--cudart", "shared", "-Xlinker", f"-rpath={Path(cuda_include).parent / 'lib'}",
         "-Xlinker", f"-rpath={Path(cuda_include).parent / 'lib64'}"],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    probe = f"""
import importlib.util
spec = importlib.util.spec_from_file_location({build['name']!r}, {str(library)!r})
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
for args, error in [((1, 2), TypeError), ((0,) * 34 + ("x",), TypeError),
                    ((0,) * 35, RuntimeError)]:
    try:
        module.fp8_gemm(*args)
    except error as exc:
        print(type(exc).__name__, exc)
"""
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == ("TypeError cuda_wgmma.fp8_gemm takes 35 integers (b, b0, ..., stream), "
                        "got 2 arguments"), lines
    assert lines[1] == "TypeError cuda_wgmma.fp8_gemm: argument 'stream' must be an int, got 'x'"
    assert lines[2].startswith("RuntimeError cuda_wgmma: CUDA error: "), lines
    assert len(lines) == 3, lines


SM90 = (torch.cuda.is_available() and torch.version.hip is None
        and torch.cuda.get_device_capability() >= (9, 0))


@pytest.mark.gpu
@pytest.mark.skipif(not (SM90 and NVCC), reason="needs an NVIDIA sm_90 GPU and nvcc")
def test_it_passes_the_tasks_checks_on_sm90(tmp_path: Path) -> None:
    """Every schedule: whole tiles, one CTA a tile, and both stream-K cuts (whose fixups
    sum partials across CTAs), at both N tiles, with one or two C buffers; one build, shared
    by the pytest process, serves them all."""
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
    builds = []
    for name in points:
        (candidate,) = [c for c in data["candidates"] if c["name"] == name]
        outcomes = {case["outcome"] for case in candidate["cases"]}
        assert outcomes == {"passed"}, output
        builds += candidate["inline_builds"]
    # One build, made by the pytest process and shared (harness/shared_builds.py): the knobs
    # are read at each call, so the three files' load_inline arguments are equal.
    assert len({b["key"] for b in builds}) == 1, builds
    assert sorted(b["outcome"] for b in builds) in (["built", "reused", "reused"],
                                                    ["reused"] * 3), builds


def test_the_fixup_folds_a_cut_tile_into_acc_in_cta_order() -> None:
    """The last CTA of a cut tile sums it into `acc` itself, in CTA order: the parts before
    its own into `sum` from 0, its own added, the later ones added to that. Those are the
    additions, in the order, of summing apart and copying back (what the seed did until nvcc's
    64 moves after every tile's last K step were found): 0, then each part in CTA order, its
    own at its place (`sum + acc` is `sum += acc`, IEEE addition being commutative), so C is
    bitwise that sum, signed zeros and rounding included."""
    fixup = fixup_text(SEED.read_text())
    assert "acc[i] = sum[i];" not in fixup  # no copy back
    steps = ["sum[i] = 0.f;", "for (int cta = lo; cta < me; ++cta) add(cta, sum);",
             "acc[i] = sum[i] + acc[i];", "for (int cta = me + 1; cta <= hi; ++cta) add(cta, acc);",
             "return true;"]
    at = [fixup.index(step) for step in steps]
    assert at == sorted(at), dict(zip(steps, at, strict=True))


def _quot(div: tuple[int, int], x: int) -> int:
    """The seed's `quot` (the high word of x * mul, shifted; mul 0: x)."""
    mul, shift = div
    return ((x * mul) >> 32) >> shift if mul else x


def _div(d: int) -> tuple[int, int]:
    """The seed's launcher-side `div`: mul = ceil(2^(31 + l) / d), l the least with 2^l >= d."""
    lg = 0
    while (1 << lg) < d:
        lg += 1
    if lg == 0:
        return 0, 0
    mul = ((1 << (31 + lg)) + d - 1) // d
    assert mul < 1 << 32, d  # an unsigned
    return mul, lg - 1


def test_tile_origins_by_magic_numbers_are_the_divisions_origins() -> None:
    """The seed's magic numbers (mirrored here from its text, which the test pins) give the
    tile origins of integer division (the seed's until 2026-12) for every tile of every test
    and benchmark shape at every BLOCK_N and GROUP_M, and the quotients of 0 <= x < 2^31 by
    every divisor up to 4096 and random larger ones."""
    source = SEED.read_text()
    for line in ["return d.mul ? (int)(__umulhi((unsigned)x, d.mul) >> d.shift) : x;",
                 "return {(unsigned)(((1ull << (31 + l)) + d - 1) / d), (unsigned)(l - 1)};",
                 "while ((1ll << l) < d) ++l;", "if (l == 0) return {0u, 0u};",
                 "f.rows_last = div(s.tiles_m % s.group_m ? s.tiles_m % s.group_m : s.group_m);"]:
        assert line in source, line
    rng = random.Random(11)
    for d in [*range(1, 4097), *(rng.randrange(4097, 1 << 31) for _ in range(300))]:
        div = _div(d)
        for x in [*range(0, 600), *(rng.randrange(0, 1 << 31) for _ in range(40)), (1 << 31) - 1]:
            assert _quot(div, x) == x // d, (d, x)

    def divided_origin(tiles_m, tiles_n, group_m, tile):
        in_group = group_m * tiles_n
        first_m = (tile // in_group) * group_m
        rows = min(tiles_m - first_m, group_m)
        return first_m + (tile % in_group) % rows, (tile % in_group) // rows

    def fast_origin(tiles_m, tiles_n, group_m, tile, divs):
        band_div, rows_div, last_div = divs  # the launcher's, once a call
        band = _quot(band_div, tile)
        r, first_m = tile - band * group_m * tiles_n, band * group_m
        last = first_m + group_m > tiles_m
        rows = tiles_m - first_m if last else group_m
        col = _quot(last_div if last else rows_div, r)
        return first_m + r - col * rows, col

    spec = tomllib.loads((REPO / "tasks" / "fp8_gemm" / "task.toml").read_text())
    shapes = {(c["m"], c["n"]) for profile in spec["profiles"].values()
              for key in ("tests", "benchmarks") for c in profile.get(key, [])}
    group_ms = read_space(source)["GROUP_M"]
    assert 1 in group_ms and len(shapes) > 10, (group_ms, shapes)
    for m, n in shapes:
        for block_n in (64, 128):
            tiles_m, tiles_n = -(-m // 128), -(-n // block_n)
            for group_m in group_ms:
                divs = _div(group_m * tiles_n), _div(group_m), _div(tiles_m % group_m or group_m)
                for tile in range(tiles_m * tiles_n):
                    assert fast_origin(tiles_m, tiles_n, group_m, tile, divs) == divided_origin(
                        tiles_m, tiles_n, group_m, tile), (m, n, block_n, group_m, tile)
