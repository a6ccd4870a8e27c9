"""bench/cuda_timeline.py: the clock-stamped build of the CUDA seed (no GPU needed).

The patch applies to the seed as committed (every anchor once), its kernels build for sm_90a
with no spills and no serialised wgmma, and the stamps' sums are read back as shares of the
consumers' cycles.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import types

import pytest
import torch.utils.cpp_extension
from helpers import REPO, load_file

SEED = REPO / "tasks" / "fp8_gemm" / "seeds" / "cuda_wgmma.py"


def _module():
    return load_file(REPO / "bench" / "cuda_timeline.py", "cuda_timeline")


def test_the_patch_applies_to_the_committed_seed_under_its_own_build_name() -> None:
    tl = _module()
    source = tl.patched(SEED.read_text())
    assert 'name="ks_timeline_cuda_wgmma' in source
    # in the Python wrapper, bound beside fp8_gemm
    assert "static PyObject* ks_timeline(PyObject*" in source
    assert '{"ks_timeline", (PyCFunction)' in source
    assert "const char* ks_timeline_copy(void* out, bool reset) {" in source  # in cuda.cu
    # a mark after each stage of a K step (the next stage's wait and ldmatrix under the MMAs),
    # one a tile, and the producer's waits
    assert [int(e) for e in re.findall(r"KS_MARK\((\d+)\);", source)] == [
        6, 0, 1, 2, 3, 0, 1, 4, 5, 10, 11, 12, 6]
    assert "ks_pw += ks_clk() - ks_p" in source


def test_a_seed_without_an_anchor_is_named() -> None:
    tl = _module()
    source = SEED.read_text().replace("wgmma_wait();\n", "wgmma_wait_all();\n")
    with pytest.raises(SystemExit, match="0 copies of .*wgmma_wait"):
        tl.patched(source)


def test_the_sums_become_shares_of_the_consumers_cycles() -> None:
    tl = _module()
    raw = [0] * (tl.CTAS * 3 * tl.EVENTS)

    def put(cta: int, role: int, event: int, value: int) -> None:
        raw[(cta * 3 + role) * tl.EVENTS + event] += value

    for cta in (0, 5):  # two CTAs, each consumer 2 tiles of 4 steps
        for role in (0, 1):
            for bucket, cycles in zip(tl.BUCKETS, [100, 50, 30, 20, 400, 100, 150, 60, 40, 50],
                                      strict=True):
                put(cta, role, tl.BUCKETS[bucket], cycles)
            put(cta, role, tl.TOTAL, 1000)
            put(cta, role, tl.STEPS, 8)
            put(cta, role, tl.TILES, 2)
        put(cta, 2, 0, 250)
        put(cta, 2, tl.TOTAL, 1000)
        put(cta, 2, tl.STEPS, 8)
    rows = tl.summary(raw)
    assert set(rows) == {"consumer 0", "consumer 1", "producer"}
    c0 = rows["consumer 0"]
    assert c0["mma_wait"] == pytest.approx(0.4) and c0["epi_wait"] == pytest.approx(0.15)
    assert c0["steps"] == 16 and c0["tiles"] == 4
    assert c0["cycles/step"] == pytest.approx((2000 - 600) / 16)
    assert c0["epilogue/tile"] == pytest.approx(600 / 4)
    assert rows["producer"]["empty"] == pytest.approx(0.25)
    text = tl.table("m6144-n7168-k256", rows, 56.4, 57.0)
    assert ("| consumer 1 | 10.0% | 5.0% | 3.0% | 2.0% | 40.0% | 10.0% | 15.0% | 6.0% | 4.0% | "
            "5.0% | 88 | 150 |") in text
    assert "producer: 25.0% of its cycles waiting" in text


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
def test_the_stamped_kernels_build_for_sm90a_without_spills_or_serialised_wgmma(
        monkeypatch, tmp_path) -> None:
    calls: list[dict] = []
    monkeypatch.setattr(torch.utils.cpp_extension, "load_inline",
                        lambda **kwargs: calls.append(kwargs) or types.SimpleNamespace())
    namespace: dict = {"__name__": "cuda_wgmma_timeline"}
    exec(compile(_module().patched(SEED.read_text()), str(SEED), "exec"), namespace)
    (build,) = calls
    assert "ks_timeline_copy(out, reset != 0)" in build["cpp_sources"][0]
    assert "const char* ks_timeline_copy(void* out, bool reset) {" in build["cuda_sources"][0]
    cu = tmp_path / "stamped.cu"
    cu.write_text(namespace["kernel_source"]())
    proc = subprocess.run(
        [shutil.which("nvcc"), "-cubin", "-o", str(tmp_path / "k.cubin"), str(cu), "-Xptxas",
         "-v", *build["extra_cuda_cflags"]], capture_output=True, text=True, timeout=300)
    report = proc.stdout + proc.stderr
    assert proc.returncode == 0, report
    assert "wgmma.mma_async instructions are serialized" not in report, report
    spills = [int(n) for n in re.findall(r"(\d+) bytes spill stores", report)]
    assert spills and not any(spills), report
