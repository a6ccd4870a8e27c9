"""The hardware line the scientist's prompts carry."""

from __future__ import annotations

from pytest_kscientist.evolve.hardware import describe


def test_known_families_carry_arch_fp8_dtype_and_features() -> None:
    h200 = describe("NVIDIA H200", "cuda:0")
    assert "sm_90" in h200 and "float8_e4m3fn" in h200 and "wgmma" in h200
    mi300 = describe("AMD Instinct MI300X", "cuda:0")
    assert "gfx942" in mi300 and "float8_e4m3fnuz" in mi300


def test_cpu_and_unknown_devices_say_so() -> None:
    assert "Triton interpreter" in describe("x86_64", "cpu")
    assert describe("Some GPU 9000", "cuda:1").endswith("no recorded facts for this family")
