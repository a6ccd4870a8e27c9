"""Check and time knob points of the fused Triton seed (issue 15) on the 18 fp8_gemm benchmarks.

    python bench/fused_sweep.py OUT.json [--seconds 230] [--reps 30] [--points NAME ...]

One GPU, outside the harness, standard library + torch + triton only (nothing to install on
the device machine). The first row is the first Triton seed (triton_blockscaled.py) at its
defaults, so every point gets a ratio to it (`vs_seed`: seed geomean / point geomean). Each
point is checked once per shape against the task's reference (the task's tolerance, c filled
with NaN first), then timed with the GPU MODE protocol (synchronize, flush L2 by writing 256 MB,
start event, the call, end event, synchronize; median of --reps calls) plus the harness's 0.2 ms
spin queued before the flush, without which the loop does not repeat itself on the H200
(notes/timing.md, section 2a). A point that fails a shape, or raises, is marked failed and
timed no further. Points start while less than --seconds have passed (ordered most promising
first); OUT.json is rewritten after every point; the table is printed last. Figures from here
pick seed defaults; quote the harness's table.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import time
import types
from pathlib import Path

import tomllib
import torch

ROOT = Path(__file__).resolve().parent.parent
TASK = ROOT / "tasks" / "fp8_gemm"
FIRST_SEED = TASK / "seeds" / "triton_blockscaled.py"
FUSED_SEED = TASK / "seeds" / "triton_fused.py"
F16 = {"LAYOUT": "fp16", "TMA": True}  # fp16 copies read through TMA descriptors
F16_ONE = {**F16, "BLOCK_K": 128, "num_stages": 3}
F8_ONE = {"LAYOUT": "fused", "TMA": True, "BLOCK_K": 128, "num_stages": 4}
B16 = {"LAYOUT": "b16", "TMA": True, "BLOCK_K": 128}  # B upcast first
A16 = {**B16, "LAYOUT": "a16"}  # A upcast first, C^T computed
M64W4 = {"BLOCK_M": 64, "num_warps": 4}
M128W8 = {"BLOCK_M": 128, "num_warps": 8}
C0019 = {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3, "GROUP_M": 1,
         "SPLIT_K": 0}  # the best evolved kernel's knobs (notes/fp8_gemm_h200.md)
# The fused seed's first defaults: every fused point is these knobs with its changes, whatever
# the seed's TUNABLES are now (the rows record each point's knobs in full).
FUSED_BASE = {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 128, "GROUP_M": 8, "PERSISTENT": 0,
              "SPLIT_K": 1, "LAYOUT": "fused", "TMA": True, "num_warps": 4,
              "num_stages": 4}
# name -> changes to FUSED_BASE ("seed": to triton_blockscaled.py's defaults).
# Most promising first: --seconds cuts the tail. Every point compiled without spills for sm_90
# (bench/triton_compile_check.py, triton 3.6); "2/SM", "3/SM": programs an SM holds (shared
# memory and registers). Within one warpgroup the scaling cannot overlap the next MMA (ptxas
# serialises it: notes/fp8_gemm_h200.md), so other programs on the SM are what hides it.
# The PAIR points of the first sweep (181-271 us) are gone with the knob, and the KMAJOR points
# (183-203 us in both 2026-12-01 sweeps, slower than the same point without it) with theirs.
# The second sweep (2026-12-01), around the first one's best point (b16 64x128x128, 4 warps,
# 3 stages, split chosen from the shape: 118.7 us there): SPLIT_K 0 is now the split-K model
# (modelled_split); 8 warps over 64 rows put two warpgroups side by side along N (64x256: each
# m64n128, 210 registers, no spills); GROUP_M; fused and a16 beside it.
M = {"SPLIT_K": 0, "BLOCK_K": 128, "TMA": True}
B16M, A16M, F8M = ({**M, "LAYOUT": x} for x in ("b16", "a16", "fused"))
W4S3, W8S3 = {"num_warps": 4, "num_stages": 3}, {"num_warps": 8, "num_stages": 3}
ROUND2: dict[str, dict[str, object]] = {
    "r2_b16_64x128_w4s3": {**B16M, **W4S3},
    "r2_b16_64x256_w8s3": {**B16M, **W8S3, "BLOCK_N": 256},
    "r2_b16_64x256_w8s2": {**B16M, **W8S3, "BLOCK_N": 256, "num_stages": 2},
    "r2_b16_64x128_w8s3": {**B16M, **W8S3},
    "r2_b16_64x128_w8s4": {**B16M, **W8S3, "num_stages": 4},
    "r2_b16_64x128_w4s3_g4": {**B16M, **W4S3, "GROUP_M": 4},
    "r2_b16_64x128_w4s3_g16": {**B16M, **W4S3, "GROUP_M": 16},
    "r2_b16_64x128_w4s3_g1": {**B16M, **W4S3, "GROUP_M": 1},
    "r2_b16_64x64_w4s3": {**B16M, **W4S3, "BLOCK_N": 64},
    "r2_b16_64x64_w4s4": {**B16M, **W4S3, "BLOCK_N": 64, "num_stages": 4},
    "r2_b16_128x64_w8s3": {**B16M, **W8S3, "BLOCK_M": 128, "BLOCK_N": 64},
    "r2_b16_128x128_w8s3": {**B16M, **W8S3, "BLOCK_M": 128},
    "r2_b16_64x128_w4s4": {**B16M, **W4S3, "num_stages": 4},
    "r2_b16_64x128_w4s2": {**B16M, **W4S3, "num_stages": 2},
    "r2_b16_64x256x64_w8s4": {**B16M, **W8S3, "BLOCK_N": 256, "BLOCK_K": 64, "num_stages": 4},
    "r2_a16_64x128_w4s3": {**A16M, **W4S3},
    "r2_a16_64x256_w8s3": {**A16M, **W8S3, "BLOCK_N": 256},
    "r2_a16_64x128_w8s3": {**A16M, **W8S3},
    "r2_f8_c0019": {**F8M, **W8S3, "BLOCK_M": 128, "BLOCK_N": 64, "GROUP_M": 1},
    "r2_f8_64x256_w8s3": {**F8M, **W8S3, "BLOCK_N": 256},
    "r2_f8_64x128_w8s3": {**F8M, **W8S3},
    "r2_f8_64x128_w4s4": {**F8M, "num_warps": 4, "num_stages": 4},
    "r2_f8_128x128_w8s3": {**F8M, **W8S3, "BLOCK_M": 128},
    "r2_a16_128x64_w8s3": {**A16M, **W8S3, "BLOCK_M": 128, "BLOCK_N": 64},
    "r2_a16_64x64_w4s3": {**A16M, **W4S3, "BLOCK_N": 64},
}
POINTS: dict[str, dict[str, object]] = {
    **ROUND2,
    "seed": {},
    "f8_tma_one_64x128x128_w4s4": {**F8_ONE, **M64W4},  # the fused seed's defaults, 2/SM
    "f8_c0019": {**F8_ONE, **C0019},
    # one operand upcast first, the other converted into the MMA's registers
    "b16_tma_64x128x128_w4s4": {**B16, **M64W4, "num_stages": 4},
    "b16_tma_64x128x128_w4s2": {**B16, **M64W4, "num_stages": 2},  # 2/SM
    "a16_tma_64x128x128_w4s2": {**A16, **M64W4, "num_stages": 2},  # 2/SM
    "b16_tma_64x64x128_w4s3": {**B16, **M64W4, "BLOCK_N": 64, "num_stages": 3},  # 3/SM
    "a16_tma_64x64x128_w4s3": {**A16, **M64W4, "BLOCK_N": 64, "num_stages": 3},  # 3/SM
    "b16_tma_128x128x128_w8s3": {**B16, **M128W8, "num_stages": 3},
    "a16_tma_128x128x128_w8s3": {**A16, **M128W8, "num_stages": 3},
    "b16_c0019": {**B16, **C0019},
    "a16_c0019": {**A16, **C0019},
    "b16_tma_64x128x128_w4s3_split0": {**B16, **M64W4, "num_stages": 3, "SPLIT_K": 0},
    "a16_tma_64x128x128_w4s3_split0": {**A16, **M64W4, "num_stages": 3, "SPLIT_K": 0},
    "b16_tma_128x128x128_w8s4": {**B16, **M128W8, "num_stages": 4},
    "b16_tma_64x64x128_w4s4": {**B16, **M64W4, "BLOCK_N": 64, "num_stages": 4},
    "f8_tma_one_128x128x128_w8s4": {**F8_ONE, **M128W8},
    "f16_tma_one_128x128x128_w8s3": {**F16_ONE, **M128W8},
    "f8_ptr_one_128x128x128_w8s4": {**F8_ONE, **M128W8, "TMA": False},
    "f16_tma_one_64x128x128_w4s2": {**F16_ONE, **M64W4, "num_stages": 2},  # 2/SM
    "f16_ptr_one_128x128x128_w8s3": {**F16_ONE, **M128W8, "TMA": False},
    "f16_tma_one_128x128x128_w8s3_split0": {**F16_ONE, **M128W8, "SPLIT_K": 0},
    "f16_tma_one_128x128x128_w8s3_pers1": {**F16_ONE, **M128W8, "PERSISTENT": 1},
}


def load(name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def gpumode_us(fn, data, reps: int, flush: torch.Tensor) -> float:
    """Median of ``reps`` calls, each: synchronize, spin, flush L2, start event, call, end
    event, synchronize (GPU MODE 2026: no synchronisation between the flush and the start)."""
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        # The harness's 0.2 ms spin before the flush: the GPU MODE loop alone does not repeat
        # itself on the H200 (notes/timing.md, section 2a); with it, it matches the harness.
        torch.cuda._sleep(400_000)
        flush.zero_()
        start.record()
        fn(data)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000.0)
    times.sort()
    return times[len(times) // 2]


def run_point(module, changes, default, shapes, inputs, refs, reps, flush) -> dict:
    """Check then time one knob point (``default`` with ``changes``, one configuration for
    every shape) on every shape; stops at the first failure."""
    module.TUNABLES.clear()
    module.TUNABLES.update(default, **changes)
    if hasattr(module, "TUNABLES_BY_SHAPE"):
        module.TUNABLES_BY_SHAPE.clear()
    row: dict[str, object] = {"changes": changes, "knobs": dict(module.TUNABLES), "us": {},
                              "failed": None}
    t0 = time.monotonic()
    try:
        for s, data, ref in zip(shapes, inputs, refs, strict=True):
            data[4].fill_(float("nan"))
            out = module.custom_kernel(data).float()
            bad = int(((out - ref).abs() > 1e-3 + 2e-2 * ref.abs()).sum()) + int(
                out.isnan().sum()
            )
            if bad:
                row["failed"] = f"{s['label']}: {bad} of {out.numel()} outside tolerance"
                break
            row["us"][s["label"]] = gpumode_us(module.custom_kernel, data, reps, flush)
    except Exception as exc:  # a point that does not compile or launch is a result too
        row["failed"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    row["seconds"] = time.monotonic() - t0
    if not row["failed"]:
        row["geomean_us"] = math.exp(sum(math.log(v) for v in row["us"].values()) / len(shapes))
    return row


def table(results: dict, labels: list[str]) -> list[str]:
    ok = {n: r for n, r in results.items() if not n.startswith("_") and not r["failed"]}
    seed = ok.get("seed", {}).get("geomean_us")
    lines = ["| point | geomean_us | vs_seed | " + " | ".join(labels) + " |",
             "|---" * (len(labels) + 3) + "|"]
    for name, r in sorted(ok.items(), key=lambda item: item[1]["geomean_us"]):
        ratio = f"{seed / r['geomean_us']:.2f}" if seed else "-"
        lines.append(f"| {name} | {r['geomean_us']:.1f} | {ratio} | "
                     + " | ".join(f"{r['us'][label]:.1f}" for label in labels) + " |")
    for name, r in results.items():
        if not name.startswith("_") and r["failed"]:
            lines.append(f"| {name} | failed: {r['failed'][:120]} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--seconds", type=float, default=230.0)
    parser.add_argument("--points", nargs="+", choices=list(POINTS), default=list(POINTS))
    parser.add_argument("--profile", default="full", help="the task profile's benchmarks")
    args = parser.parse_args()
    t0 = time.monotonic()
    spec = tomllib.loads((TASK / "task.toml").read_text())
    shapes = [dict(c) for c in spec["profiles"][args.profile]["benchmarks"]]
    for s in shapes:
        s["label"] = f"m{s['m']}-n{s['n']}-k{s['k']}"
    reference = load("fp8_reference", TASK / "reference.py")
    inputs, refs = [], []
    for s in shapes:
        data = reference.generate_input(s["m"], s["n"], s["k"], s["seed"], device="cuda")
        inputs.append(data)
        refs.append(reference.ref_kernel(data).float())
    flush = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.float32, device="cuda")
    modules: dict[str, types.ModuleType | str] = {}
    for key, path in (("seed", FIRST_SEED), ("fused", FUSED_SEED)):
        try:  # a seed that does not import on this Triton still leaves the other one's rows
            modules[key] = load(path.stem, path)
        except Exception as exc:
            modules[key] = f"import failed: {type(exc).__name__}: {str(exc)[:300]}"
    defaults = {key: dict(m.TUNABLES) for key, m in modules.items() if not isinstance(m, str)}
    defaults["fused"] = FUSED_BASE
    results: dict[str, dict] = {"_env": {
        "torch": torch.__version__, "triton": __import__("triton").__version__,
        "device": torch.cuda.get_device_name(), "reps": args.reps, "fused_base": FUSED_BASE}}
    print(f"inputs and references ready (+{time.monotonic() - t0:.0f}s)", flush=True)
    for name in args.points:
        if time.monotonic() - t0 > args.seconds:
            print(f"{name}: not run, {args.seconds:.0f} s used", flush=True)
            continue
        key = "seed" if name == "seed" else "fused"
        module = modules[key]
        if isinstance(module, str):
            row = {"changes": POINTS[name], "us": {}, "failed": module, "seconds": 0.0}
        else:
            row = run_point(module, POINTS[name], defaults[key], shapes, inputs, refs,
                            args.reps, flush)
        results[name] = row
        args.out.write_text(json.dumps(results, indent=1))
        print(f"{name}: {row.get('geomean_us', row['failed'])} ({row['seconds']:.0f}s, "
              f"+{time.monotonic() - t0:.0f}s)", flush=True)
    labels = [s["label"] for s in shapes]
    ok = {n: r for n, r in results.items() if not n.startswith("_") and not r["failed"]}
    if ok:
        best = min(ok, key=lambda n: ok[n]["geomean_us"])
        per_shape = {label: min(ok, key=lambda n: ok[n]["us"][label]) for label in labels}
        # what a configuration per shape would reach with these points (TUNABLES per class)
        composed = math.exp(sum(math.log(ok[per_shape[label]]["us"][label]) for label in labels)
                            / len(labels))
        results["_best"] = {"name": best, "changes": ok[best]["changes"], "per_shape": per_shape,
                            "per_shape_geomean_us": composed}
        args.out.write_text(json.dumps(results, indent=1))
        print(f"best point: {best} {ok[best]['geomean_us']:.1f} us; the best point per shape "
              f"{composed:.1f} us: {per_shape}")
    print("\n".join(["", *table(results, labels)]), flush=True)


if __name__ == "__main__":
    main()
