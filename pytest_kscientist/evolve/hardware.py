"""What is known about a device family, for the scientist's prompts (no device access here)."""

from __future__ import annotations

# Facts from vendor datasheets and from measurements recorded in notes/ (dated there).
FAMILIES: list[tuple[str, str]] = [
    ("H200", "NVIDIA Hopper, sm_90, 132 SMs, 141 GB HBM3e at 4.8 TB/s, ~50 MB L2, up to 227 KB "
             "shared memory per block; fp8 e4m3fn/e5m2 tensor cores through wgmma (1979 TFLOP/s "
             "dense), TMA bulk copies, thread-block clusters; fp8 wgmma accumulates with reduced "
             "precision (promote partial sums to fp32, or use fp16 operands, to meet tight "
             "tolerances)"),
    ("H100", "NVIDIA Hopper, sm_90, 132 SMs (SXM), 80 GB HBM3 at 3.35 TB/s, ~50 MB L2; fp8 "
             "e4m3fn/e5m2 tensor cores through wgmma, TMA bulk copies; fp8 wgmma accumulates "
             "with reduced precision"),
    ("MI300", "AMD CDNA3, gfx942, 304 CUs, 192 GB HBM3 at 5.3 TB/s, 256 MB Infinity Cache; fp8 "
              "e4m3fnuz/e5m2fnuz MFMA with fp32 accumulation, 64 KB LDS per CU"),
]


def describe(device_name: str, device: str) -> str:
    """One line for prompts: the device, its fp8 format and what is known of the family."""
    fp8 = "float8_e4m3fnuz" if "MI3" in device_name.upper() else "float8_e4m3fn"
    if not device.startswith("cuda"):
        return (f"{device_name} CPU ({device}); Triton kernels run in the Triton interpreter "
                f"(fp8 and fp32 dots exact, bf16 dots unusable); fp8 dtype {fp8}")
    for key, facts in FAMILIES:
        if key.lower() in device_name.lower():
            return f"{device_name} ({device}); fp8 dtype {fp8}; {facts}"
    return f"{device_name} ({device}); fp8 dtype {fp8}; no recorded facts for this family"
