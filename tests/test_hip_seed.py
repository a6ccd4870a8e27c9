"""The HIP seed's portable form, run on CPU threads, against the task's reference.

tasks/fp8_gemm/seeds/hip_mfma.py compiled for anything but gfx942 replaces the MFMA by a software
emulation with the instruction's lane layout. Its kernel source (cut before the torch wrapper)
is compiled here with g++ against tests/data/hip/cpu_threads/cuda_runtime.h, which runs every
GPU thread as a std::thread: staging, fragment gathering, the C layout, per-block scaling,
edges and rounding are checked on the task's CPU cases. The MFMA instruction itself is not.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import DATA, REPO

from pytest_kscientist.evolve.offline.knobs import read_tunables, rewrite_tunables
from pytest_kscientist.formats.task import load_task
from pytest_kscientist.hip import source as hip

TASK = REPO / "tasks" / "fp8_gemm"
SEED = TASK / "seeds" / "hip_mfma.py"
SHIM = DATA / "hip" / "cpu_threads"
WRAPPER = "torch::Tensor fp8_gemm("

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ (C++20)")


def _reference() -> tuple[object, object]:
    import importlib.util

    spec = importlib.util.spec_from_file_location("fp8_gemm_reference", TASK / "reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.generate_input, module.ref_kernel


def _build(tmp: Path, knobs: dict[str, object]) -> Path:
    """g++ build of the seed's kernel (with ``knobs`` written into its TUNABLES) and the
    driver; returns the program."""
    seed = tmp / "hip_mfma.py"
    text = SEED.read_text()
    seed.write_text(rewrite_tunables(text, knobs) if knobs else text)
    source = hip.read_source(seed)
    kernel = "\n".join(c.text for c in source.chunks)
    assert WRAPPER in kernel, f"{SEED.name}: the torch wrapper '{WRAPPER}...' moved"
    unit = tmp / "unit.cpp"
    unit.write_text(kernel.split(WRAPPER)[0] + (SHIM / "main.cpp").read_text())
    program = tmp / "fp8_gemm_cpu"
    defines = [f for f in source.flags if f.startswith("-D")]
    proc = subprocess.run(["g++", "-std=c++20", "-O1", "-pthread", f"-I{SHIM}", *defines,
                           str(unit), "-o", str(program)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return program


def _run(program: Path, tmp: Path, data: tuple, fnuz: bool) -> torch.Tensor:
    a, b, a_scale, b_scale, c = data
    m, k = a.shape
    n = b.shape[0]
    # The task's column-major operands are transposed views of contiguous [k, m], [k, n].
    for name, tensor in (("a", a.T), ("b", b.T), ("as", a_scale.T), ("bs", b_scale.T)):
        assert tensor.is_contiguous()
        raw = tensor.view(torch.uint8) if tensor.element_size() == 1 else tensor
        raw.numpy().tofile(tmp / f"{name}.bin")
    proc = subprocess.run([str(program), str(tmp), str(m), str(n), str(k), str(int(fnuz))],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    bits = np.fromfile(tmp / "c.bin", dtype=np.int16).reshape(m, n)
    return torch.from_numpy(bits).view(torch.bfloat16)


KNOB_POINTS = [
    {},  # the seed's own TUNABLES
    {"BLOCK_M": 32, "BLOCK_N": 128, "WAVES_M": 4, "WAVES_N": 1, "LDS_PAD": 0},
    {"BLOCK_M": 128, "BLOCK_N": 32, "WAVES_M": 1, "WAVES_N": 2, "LDS_PAD": 16},
]


@pytest.mark.parametrize("knobs", KNOB_POINTS, ids=lambda k: "-".join(
    f"{v}" for v in k.values()) or "seed")
def test_portable_form_matches_reference(tmp_path: Path, knobs: dict[str, object]) -> None:
    generate_input, ref_kernel = _reference()
    task = load_task(TASK)
    check = task.spec.check
    program = _build(tmp_path, knobs)
    cases = [*task.profile("cpu").tests, task.profile("cpu").benchmarks[0]]
    for case in cases:
        data = generate_input(**case, device="cpu")
        out = _run(program, tmp_path, data, fnuz=False)
        ref = ref_kernel(data)
        close = torch.isclose(out.float(), ref.float(), atol=check.atol, rtol=check.rtol)
        assert close.all(), (f"{case}: {int((~close).sum())} of {close.numel()} elements off, "
                             f"first at {(~close).nonzero()[0].tolist()}")


def test_portable_form_decodes_e4m3fnuz(tmp_path: Path) -> None:
    """The same values as e4m3fnuz bytes (bias 8) give the same product."""
    generate_input, ref_kernel = _reference()
    program = _build(tmp_path, {})
    a, b, a_scale, b_scale, c = generate_input(m=96, n=320, k=256, seed=7, device="cpu")
    # randn never reaches fnuz's limit of 240, so every e4m3fn value is exact in e4m3fnuz.
    fnuz = (a.float().to(torch.float8_e4m3fnuz), b.float().to(torch.float8_e4m3fnuz))
    data = (fnuz[0].T.contiguous().T, fnuz[1].T.contiguous().T, a_scale, b_scale, c)
    assert not torch.equal(data[0].view(torch.uint8), a.view(torch.uint8))
    out = _run(program, tmp_path, data, fnuz=True)
    ref = ref_kernel((a, b, a_scale, b_scale, c))
    assert torch.isclose(out.float(), ref.float(), atol=1e-3, rtol=2e-2).all()


def test_knob_space_reads_back() -> None:
    """Every TUNABLES knob has a space, and the seed's values lie in it (offline scientist)."""
    from pytest_kscientist.evolve.offline.knobs import read_space

    text = SEED.read_text()
    tunables, space = read_tunables(text), read_space(text)
    assert set(tunables) == set(space)
    assert all(tunables[k] in space[k] for k in tunables)
