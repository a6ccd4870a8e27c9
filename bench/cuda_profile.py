"""Run the CUDA seed on one benchmark shape a few times, for a profiler to watch.

    ncu --clock-control none --kernel-name regex:gemm_kernel --launch-skip 2 --launch-count 1 \
        --section SpeedOfLight python3 bench/cuda_profile.py m6144-n4608-k7168 [KNOB=VALUE ...]

One GPU. The shape is one of the task's benchmarks (its seed and inputs); KNOB=VALUE pairs
replace the seed's TUNABLES for every shape (its shape rules cleared), parsed as its
TUNABLE_SPACE holds them. Prints the last call's event time; quote the profiler's figures.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]


def main() -> None:
    import torch
    from cuda_sweep import benchmark_cases, one_point, set_knobs
    from fused_sweep import load

    label, *pairs = sys.argv[1:]
    task = ROOT / "tasks" / "fp8_gemm"
    case = benchmark_cases([label])[label]
    seed = load("cuda_wgmma", task / "seeds" / "cuda_wgmma.py")
    knobs = one_point(pairs, seed.TUNABLE_SPACE)
    set_knobs(seed, (seed.TUNABLES, seed.TUNABLES_BY_SHAPE), knobs)
    reference = load("fp8_reference", task / "reference.py")
    data = reference.generate_input(case["m"], case["n"], case["k"], case["seed"], device="cuda")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(4):
        start.record()
        seed.custom_kernel(data)
        end.record()
    torch.cuda.synchronize()
    print(f"{label} {knobs}: {start.elapsed_time(end) * 1e3:.1f} us (last call, events)")


if __name__ == "__main__":
    main()
