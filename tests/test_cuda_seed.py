"""The CUDA seed (tasks/fp8_gemm/seeds/cuda_wgmma.py, issue 15).

On any machine with nvcc: its kernels build for sm_90a at every BLOCK_N, with no spills and no
wgmma serialisation (ptxas warnings C7513/C7514: the MMAs would then run one at a time, a slow
kernel that still passes every check). Without a GPU: its knobs parse, its declaration makes
the harness skip it, and the host-side choices (stages that fit, K slices) do what their
docstrings say. On an sm_90 GPU: it passes the task's checks through the harness.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import types
from pathlib import Path

import pytest
import torch
import torch.utils.cpp_extension
from helpers import REPO, run_pytest

from pytest_kscientist.evolve.knobs import read_space, read_tunables, rewrite_tunables
from pytest_kscientist.requires import declared

SEED = REPO / "tasks" / "fp8_gemm" / "seeds" / "cuda_wgmma.py"
NVCC = shutil.which("nvcc")


def seed_namespace(monkeypatch: pytest.MonkeyPatch, source: str) -> types.SimpleNamespace:
    """The seed's module-level names, its load_inline call recorded instead of run (the build
    needs CUDA torch headers and minutes; the kernels are compiled below with nvcc alone)."""
    calls: list[dict] = []
    monkeypatch.setattr(torch.utils.cpp_extension, "load_inline",
                        lambda **kwargs: calls.append(kwargs) or types.SimpleNamespace())
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


def test_flags_carry_the_compiled_knobs_with_stages_that_fit(monkeypatch) -> None:
    ns = seed_namespace(monkeypatch, rewrite_tunables(SEED.read_text(), {"STAGES": 5}))
    flags = ns.build["extra_cuda_cflags"]
    assert "-gencode=arch=compute_90a,code=sm_90a" in flags  # wgmma and setmaxnreg need 90a
    assert {"-DBLOCK_N=128", "-DGROUP_M=8", "-DSTAGES=4"} <= set(flags)  # 5 do not fit


def test_stages_and_slices(monkeypatch) -> None:
    ns = seed_namespace(monkeypatch, SEED.read_text())
    # a stage is A's fp8 tile (16 kB) and B's fp16 tile (16 or 32 kB); 227 kB a block
    assert ns.stages_that_fit(128, 5) == 4 and ns.stages_that_fit(64, 5) == 5
    assert ns.stages_that_fit(128, 3) == 3
    # few tiles and a long K: sliced; many tiles: one slice (132 SMs)
    assert ns.split_for(1024, 512, 7168, 128, sms=132) > 1
    assert ns.split_for(6144, 4608, 7168, 128, sms=132) == 1
    assert ns.split_for(1024, 512, 128, 128, sms=132) == 1  # one K block cannot be sliced


@pytest.mark.skipif(NVCC is None, reason="nvcc not found: the CUDA seed's kernels not built")
@pytest.mark.parametrize("block_n", [64, 128])
def test_kernels_build_for_sm90a_without_spills_or_serialised_wgmma(
        monkeypatch, tmp_path: Path, block_n: int) -> None:
    ns = seed_namespace(monkeypatch, rewrite_tunables(SEED.read_text(), {"BLOCK_N": block_n}))
    cu = tmp_path / "kernels.cu"
    cu.write_text(ns.KERNEL_SRC.replace("@WGMMA@", ns._wgmma(block_n)))
    proc = subprocess.run(
        [NVCC, "-cubin", "-o", str(tmp_path / "k.cubin"), str(cu), "-Xptxas", "-v",
         *ns.build["extra_cuda_cflags"]],
        capture_output=True, text=True, timeout=300)
    report = proc.stdout + proc.stderr
    assert proc.returncode == 0, report
    assert "gemm_kernel" in report, report
    assert not re.search(r"C751[34]", report), report  # wgmma serialised
    spills = [int(n) for n in re.findall(r"(\d+) bytes spill stores", report)]
    assert spills and not any(spills), report


SM90 = (torch.cuda.is_available() and torch.version.hip is None
        and torch.cuda.get_device_capability() >= (9, 0))


@pytest.mark.gpu
@pytest.mark.skipif(not (SM90 and NVCC), reason="needs an NVIDIA sm_90 GPU and nvcc")
def test_it_passes_the_tasks_checks_on_sm90(tmp_path: Path) -> None:
    shutil.copytree(REPO / "tasks" / "fp8_gemm", tmp_path / "fp8_gemm")
    code, output, data = run_pytest(
        ["fp8_gemm", "-k", "check", "--kernel", str(SEED), "--ks-timeout", "400"],
        cwd=tmp_path, timeout=900)
    assert code == 0, output
    (candidate,) = [c for c in data["candidates"] if c["name"] == "cuda_wgmma"]
    outcomes = {case["outcome"] for case in candidate["cases"]}
    assert outcomes == {"passed"}, output
