"""Does the harness time the kernel and nothing else? The harness beside a plain loop, one run.

    python bench/fidelity.py [--reps 40] [--budget 0.3] [--out fidelity.json]

On a GPU, for the Triton seed and cuBLAS on K-major copies (``cublas_kmajor``, its prepare
untimed), over the fp8_gemm ``full`` benchmarks:
1. a plain in-process loop with the GPU MODE protocol (synchronise, 256 MB L2 flush, start
   event, call, end event, synchronise; inputs made before the synchronisation), median of
   ``--reps`` calls after 3 warm-up calls;
   and ``triton.testing.do_bench`` (L2 flush between calls, median) on the same kernel;
2. the harness: ``pytest tasks/fp8_gemm -k bench --kernel <seed> --ks-baselines cublas_kmajor``
   in a child process (the baseline timed interleaved beside the seed), medians from its JSON.
Prints per shape both medians and harness/plain, then the geomeans, and the harness's wall
time. Target (issue 10): every shape within max(3%, 2 us), geomeans within 3%.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
TASK = ROOT / "tasks" / "fp8_gemm"
SEED = TASK / "seeds" / "triton_blockscaled.py"


def plain_loop(kernels, ref, cases, reps):
    """(name, case id) -> median us with the GPU MODE protocol, all in this process."""
    import torch
    from triton.testing import do_bench

    scratch = torch.empty(256 * 1024 * 1024, dtype=torch.int8, device="cuda")
    out = {}
    for name, (fn, prep) in kernels.items():
        for case in cases:
            inputs = [prep(list(ref.generate_input(case["m"], case["n"], case["k"],
                                                   case["seed"] + i, device="cuda")))
                      for i in range(4)]
            times = []
            for i in range(reps + 3):
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize()
                scratch.zero_()
                start.record()
                fn(inputs[i % 4])
                end.record()
                torch.cuda.synchronize()
                if i >= 3:
                    times.append(start.elapsed_time(end) * 1000.0)
            out[(name, case_id(case))] = statistics.median(times)
            out[(name + "/do_bench", case_id(case))] = do_bench(
                lambda fn=fn, x=inputs[0]: fn(x), warmup=25, rep=100, return_mode="median"
            ) * 1000.0
    return out


def case_id(case: dict[str, int]) -> str:
    return f"m{case['m']}-n{case['n']}-k{case['k']}-s{case['seed']}"


def harness(budget: float, json_path: Path) -> tuple[dict[tuple[str, str], float], float]:
    """(name, case id) -> the harness's median, and the run's wall seconds."""
    cmd = [sys.executable, "-m", "pytest", str(TASK), "-p", "no:cacheprovider", "-q", "-k",
           "bench", "--kernel", str(SEED), "--ks-skip-reference", "--ks-baselines",
           "cublas_kmajor", "--ks-bench-budget", str(budget), "--ks-json", str(json_path)]
    began = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.monotonic() - began
    if not json_path.exists():
        raise SystemExit(f"harness run wrote no results:\n{proc.stdout[-3000:]}{proc.stderr}")
    data = json.loads(json_path.read_text())
    out = {}
    for cand in data["candidates"]:
        for case in cand["cases"]:
            if case["kind"] != "bench" or not case.get("stats"):
                continue
            out[("triton_seed", case["case_id"])] = case["stats"]["median_us"]
            side = case["baselines"].get("cublas_kmajor", {})
            if side.get("stats"):
                out[("cublas_kmajor", case["case_id"])] = side["stats"]["median_us"]
    return out, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=40)
    parser.add_argument("--budget", type=float, default=0.3)
    parser.add_argument("--out", type=Path, default=Path("fidelity.json"))
    args = parser.parse_args()
    from pytest_kscientist.runner import _load_module
    from pytest_kscientist.task import load_task

    cases = load_task(TASK).profile("full").benchmarks
    ref = _load_module(str(TASK / "reference.py"), "_fid_ref")
    seed = _load_module(str(SEED), "_fid_seed")
    cub = _load_module(str(TASK / "baselines" / "cublas_blockscaled.py"), "_fid_cublas")
    kernels = {"triton_seed": (seed.custom_kernel, lambda d: d),
               "cublas_kmajor": (cub.run, cub.prepare)}
    plain = plain_loop(kernels, ref, cases, args.reps)
    timed, wall = harness(args.budget, args.out.with_suffix(".harness.json"))
    rows, worst = [], {}
    for name in kernels:
        for case in cases:
            key = (name, case_id(case))
            p, h = plain[key], timed.get(key, math.nan)
            ok = abs(h - p) <= max(0.03 * p, 2.0)
            rows.append((name, key[1], p, h, h / p, ok, plain[(name + "/do_bench", key[1])]))
            worst[name] = max(worst.get(name, 0.0), abs(h / p - 1))
    print("| kernel | shape | plain loop us | harness us | harness/plain | within max(3%,2us) "
          "| do_bench us | harness/do_bench |")
    print("|---|---|---|---|---|---|---|---|")
    for name, shape, p, h, r, ok, d in rows:
        print(f"| {name} | {shape} | {p:.1f} | {h:.1f} | {r:.3f} | {'yes' if ok else 'NO'} | "
              f"{d:.1f} | {h / d:.3f} |")
    for name in kernels:
        ps = [r[2] for r in rows if r[0] == name]
        hs = [r[3] for r in rows if r[0] == name]
        gp = math.exp(sum(map(math.log, ps)) / len(ps))
        gh = math.exp(sum(map(math.log, hs)) / len(hs))
        ds = [r[6] for r in rows if r[0] == name]
        gd = math.exp(sum(map(math.log, ds)) / len(ds))
        within = sum(r[5] for r in rows if r[0] == name)
        print(f"| {name} | geomean | {gp:.1f} | {gh:.1f} | {gh / gp:.3f} | "
              f"{within}/{len(ps)} shapes | {gd:.1f} | {gh / gd:.3f} |")
    print(f"\nharness run (seed beside cublas_kmajor, 18 benchmarks, budget {args.budget} s): "
          f"{wall:.1f} s wall")
    args.out.write_text(json.dumps({"rows": rows, "harness_wall_s": wall}, indent=1))


if __name__ == "__main__":
    main()
