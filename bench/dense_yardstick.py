"""What a vendor GEMM reaches on fp8_gemm's shapes at the 16-bit rate (issue 33's yardstick).

    python3 bench/dense_yardstick.py [--kernel tasks/fp8_gemm/seeds/cuda_wgmma.py]
                                     [--profile full] [--reps 30] [--device cuda]

A kernel that passes the task's check on Hopper runs its MMAs at the fp16/bf16 rate (fp8
wgmma's accumulation misses the tolerance: notes/fp8_gemm_h200.md). How fast can a GEMM of
these shapes be at that rate? Per benchmark of ``--profile``, in one process and one loop
(fused_sweep.py's: GPU MODE's protocol with the harness's spin and an L2 flush before each call;
on a CPU, perf_counter around each call):
- cuBLAS bf16 and fp16, ``torch.mm`` of the operands already converted, both K-major (no
  scales, no conversion, no output beyond C: a lower bound on what the task's work costs at the
  16-bit rate with cuBLAS's tiles);
- cuBLAS fp8 with one scale a tensor (``torch._scaled_mm``, K-major; GPU only): what the fp8
  rate buys without block scales (and without the precision the task asks for);
- ``--kernel`` (the CUDA seed by default), checked once against the task's reference first.
Prints one table (us, medians of ``--reps`` calls; the floor at 989 TFLOP/s, the H200's dense
16-bit rate) with geomeans, and the kernel's time over cuBLAS bf16's.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path

import tomllib
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from pytest_kscientist.api import load_module  # noqa: E402  (after the path)

TASK = ROOT / "tasks" / "fp8_gemm"
CUDA_SEED = TASK / "seeds" / "cuda_wgmma.py"
DENSE_16BIT_FLOPS = 989e12  # H200 dense fp16/bf16 tensor rate (datasheet), per second
COLUMNS = ["floor16", "cublas_bf16", "cublas_fp16", "cublas_fp8_tensorwise", "kernel"]



def timer(device: str, reps: int) -> Callable[[Callable[[], object]], float]:
    """The median time in us of ``reps`` calls of a no-argument function."""
    if device.startswith("cuda"):
        sys.path.insert(0, str(ROOT / "bench"))
        from fused_sweep import gpumode_us  # the sweeps' loop, so rows compare across scripts

        flush = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.float32, device=device)
        return lambda fn: gpumode_us(lambda _: fn(), None, reps, flush)

    def cpu_us(fn: Callable[[], object]) -> float:
        times = []
        for _ in range(reps):
            began = time.perf_counter()
            fn()
            times.append((time.perf_counter() - began) * 1e6)
        return statistics.median(times)

    return cpu_us


def row(case: dict, reference: types.ModuleType, kernel: types.ModuleType, device: str,
        time_us: Callable[[Callable[[], object]], float]) -> dict[str, float | str]:
    """One benchmark's times (us), or why a column has none."""
    m, n, k = case["m"], case["n"], case["k"]
    data = reference.generate_input(m, n, k, case["seed"], device=device)
    a, b = data[0], data[1]
    out: dict[str, float | str] = {"floor16": 2.0 * m * n * k / DENSE_16BIT_FLOPS * 1e6}
    for name, dtype in (("cublas_bf16", torch.bfloat16), ("cublas_fp16", torch.float16)):
        a16, b16 = a.to(dtype).contiguous(), b.to(dtype).contiguous()  # [m, k], [n, k]
        c16 = torch.empty((m, n), dtype=dtype, device=device)
        out[name] = time_us(lambda a16=a16, b16=b16, c16=c16: torch.mm(a16, b16.T, out=c16))
    if device.startswith("cuda"):
        a8, b8 = a.contiguous(), b.contiguous()
        one = torch.ones((), dtype=torch.float32, device=device)
        try:
            out["cublas_fp8_tensorwise"] = time_us(lambda: torch._scaled_mm(
                a8, b8.T, scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
        except RuntimeError as exc:
            out["cublas_fp8_tensorwise"] = f"failed: {str(exc).splitlines()[0][:80]}"
    else:
        out["cublas_fp8_tensorwise"] = "GPU only"
    expected = reference.ref_kernel(data).float()
    got = kernel.custom_kernel(data).float()
    bad = int(((got - expected).abs() > 1e-3 + 2e-2 * expected.abs()).sum())
    out["kernel"] = (time_us(lambda: kernel.custom_kernel(data)) if bad == 0
                     else f"failed the check: {bad} of {got.numel()} elements")
    return out


def table(labels: list[str], rows: list[dict[str, float | str]]) -> str:
    """Markdown: a row a benchmark, a geomean row over the columns every benchmark timed, and
    the kernel's time over cuBLAS bf16's."""
    head = ["benchmark", *COLUMNS, "kernel / bf16"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def cell(value: float | str | None) -> str:
        return f"{value:.2f}" if isinstance(value, float) else (value or "-")

    def ratio(r: dict[str, float | str]) -> float | None:
        kern, dense = r.get("kernel"), r.get("cublas_bf16")
        return kern / dense if isinstance(kern, float) and isinstance(dense, float) else None

    for label, r in zip(labels, rows, strict=True):
        lines.append("| " + " | ".join([label, *(cell(r.get(c)) for c in COLUMNS),
                                         cell(ratio(r))]) + " |")
    means: list[float | str | None] = []
    for column in [*COLUMNS, "ratio"]:
        values = [ratio(r) if column == "ratio" else r.get(column) for r in rows]
        timed = [v for v in values if isinstance(v, float) and v > 0]
        means.append(math.exp(sum(map(math.log, timed)) / len(timed))
                     if timed and len(timed) == len(values) else None)
    lines.append("| **geomean** | " + " | ".join(cell(v) for v in means) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", type=Path, default=CUDA_SEED)
    parser.add_argument("--profile", default="full", help="the task profile's benchmarks")
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA GPU here; pass --device cpu (with a CPU "
                         "kernel, e.g. tasks/fp8_gemm/seeds/torch_dequant.py, and --profile cpu)")
    spec = tomllib.loads((TASK / "task.toml").read_text())
    profiles = spec["profiles"]
    if args.profile not in profiles:
        raise SystemExit(f"--profile {args.profile!r}: fp8_gemm has {', '.join(profiles)}")
    cases = [dict(c) for c in profiles[args.profile]["benchmarks"]]
    reference = load_module(TASK / "reference.py", "fp8_reference")
    kernel = load_module(args.kernel.resolve(), f"yardstick_{args.kernel.stem}")
    time_us = timer(args.device, args.reps)
    labels = [f"m{c['m']}-n{c['n']}-k{c['k']}" for c in cases]
    rows = [row(c, reference, kernel, args.device, time_us) for c in cases]
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    print(f"{name}, torch {torch.__version__}, kernel {args.kernel}, {args.reps} calls a cell, "
          f"us (floor16: 2mnk at {DENSE_16BIT_FLOPS / 1e12:.0f} TFLOP/s)\n")
    print(table(labels, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
