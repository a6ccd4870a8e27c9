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
import os
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


def harness(budget: float, json_path: Path,
            launch: str) -> tuple[dict[tuple[str, str], float], float]:
    """(name, case id) -> the harness's median, and the run's wall seconds. ``launch``: the
    timer's placement (``KSBENCH_TIMER_LAUNCH``: "hidden" or "counted", timing.py)."""
    cmd = [sys.executable, "-m", "pytest", str(TASK), "-p", "no:cacheprovider", "-q", "-k",
           "bench", "--kernel", str(SEED), "--ks-skip-reference", "--ks-baselines",
           "cublas_kmajor", "--ks-bench-budget", str(budget), "--ks-json", str(json_path)]
    began = time.monotonic()
    env = {**os.environ, "KSBENCH_TIMER_LAUNCH": launch}
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
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


def geomean(values: list[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values))


def table(label: str, kernels, cases, plain, timed) -> dict:
    """Per-shape rows of one harness run against the plain loop, printed; returns a summary."""
    rows = []
    for name in kernels:
        for case in cases:
            key = (name, case_id(case))
            p, h = plain[key], timed.get(key, math.nan)
            ok = abs(h - p) <= max(0.03 * p, 2.0)
            rows.append((name, key[1], p, h, h / p, ok, plain[(name + "/do_bench", key[1])]))
    print(f"\n### harness ({label}) against the plain loop")
    print("| kernel | shape | plain loop us | harness us | harness/plain | within max(3%,2us) "
          "| do_bench us | harness/do_bench |")
    print("|---|---|---|---|---|---|---|---|")
    for name, shape, p, h, r, ok, d in rows:
        print(f"| {name} | {shape} | {p:.1f} | {h:.1f} | {r:.3f} | {'yes' if ok else 'NO'} | "
              f"{d:.1f} | {h / d:.3f} |")
    summary = {}
    for name in kernels:
        mine = [r for r in rows if r[0] == name]
        gp, gh = geomean([r[2] for r in mine]), geomean([r[3] for r in mine])
        gd = geomean([r[6] for r in mine])
        within = sum(r[5] for r in mine)
        summary[name] = {"plain": gp, "harness": gh, "do_bench": gd, "within": within}
        print(f"| {name} | geomean | {gp:.1f} | {gh:.1f} | {gh / gp:.3f} | "
              f"{within}/{len(mine)} shapes | {gd:.1f} | {gh / gd:.3f} |")
    return {"rows": rows, "summary": summary}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=40)
    parser.add_argument("--budget", type=float, default=0.3)
    parser.add_argument("--launch", nargs="+", default=["counted"],
                        choices=["hidden", "counted"],
                        help="timer placements to run the harness with (KSBENCH_TIMER_LAUNCH)")
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
    report = {}
    for launch in args.launch:
        timed, wall = harness(args.budget, args.out.with_suffix(f".{launch}.json"), launch)
        report[launch] = table(launch, kernels, cases, plain, timed)
        report[launch]["wall_s"] = wall
    # The anchor's own repeatability: the plain loop again, after the harness runs.
    again = plain_loop(kernels, ref, cases, args.reps)
    print("\n### the plain loop again (its own repeatability)")
    print("| kernel | shapes within max(3%,2us) of the first plain loop | geomean second/first |")
    print("|---|---|---|")
    for name in kernels:
        firsts = [plain[(name, case_id(c))] for c in cases]
        seconds = [again[(name, case_id(c))] for c in cases]
        within = sum(abs(b - a) <= max(0.03 * a, 2.0) for a, b in zip(firsts, seconds, strict=True))
        print(f"| {name} | {within}/{len(cases)} | {geomean(seconds) / geomean(firsts):.3f} |")
    print("\n| placement | kernel | plain geomean | harness geomean | harness/plain | "
          "shapes within | harness wall s |")
    print("|---|---|---|---|---|---|---|")
    for launch, got in report.items():
        for name, summ in got["summary"].items():
            print(f"| {launch} | {name} | {summ['plain']:.1f} | {summ['harness']:.1f} | "
                  f"{summ['harness'] / summ['plain']:.3f} | {summ['within']}/{len(cases)} | "
                  f"{got['wall_s']:.0f} |")
    args.out.write_text(json.dumps({
        "launch": report,
        "plain": {f"{k[0]} {k[1]}": v for k, v in plain.items()},
        "plain_again": {f"{k[0]} {k[1]}": v for k, v in again.items()},
    }, indent=1))


if __name__ == "__main__":
    main()
