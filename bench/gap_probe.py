"""Why do the harness's GPU medians exceed a plain loop's? Protocols and idle gaps, in-process.

    python bench/gap_probe.py [--reps 40] [--gap-ms 2]

Times the Triton seed and cuBLAS on K-major copies (prepare untimed) on a few fp8_gemm shapes,
each in several modes, all in this one process:
- ``plain``: the GPU MODE protocol back to back (sync, L2 flush, start, call, end, sync);
- ``strict``: the harness's own timer (``worker/timing.py``; up to 2026-11-30 that was
  flush, sync, start, call, sync, end), its empty-call cost subtracted;
- ``events``: sync, flush, start, call, end, sync, then an ``after`` event: the kernel time
  between start and end, with the tail (end -> after) and the flush printed beside it;
- ``gap``: ``events`` with ``--gap-ms`` of host sleep between calls (the GPU idles, as it does
  between the harness's per-call requests);
- ``gap+warm``: the same, with a 400,000-cycle spin kernel (~0.2 ms at 1.98 GHz) queued before the
  flush.
The SM clock (NVML) is read after the last calls of each mode. Prints a table, us medians.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pytest_kscientist.api import load_module, make_timer  # noqa: E402

TASK = ROOT / "tasks" / "fp8_gemm"
SHAPES = [(1024, 7168, 256, 5364), (1024, 4096, 512, 17512), (1024, 3072, 1536, 6251),
          (1024, 512, 7168, 6563), (6144, 4608, 7168, 65436)]


def sm_clock() -> float:
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        return float(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM))
    except Exception:  # noqa: BLE001 - diagnostics only
        return float("nan")


def run_mode(mode, fn, prep, ref, shape, reps, gap_s, scratch, timer):
    m, n, k, seed = shape
    times, tails, flushes, clocks = [], [], [], []
    for i in range(reps + 3):
        data = ref.generate_input(m, n, k, seed + i, device="cuda")
        data = [t.clone() for t in data]
        data[4].fill_(float("nan"))
        arg = prep(data)
        if gap_s:
            torch.cuda.synchronize()
            time.sleep(gap_s)
        if mode == "strict":
            _, raw, _ = timer.time_call(fn, arg)
            us = raw - timer.overhead_us
        else:
            f0, s, e, a = (torch.cuda.Event(enable_timing=True) for _ in range(4))
            torch.cuda.synchronize()
            if mode == "gap+warm":
                torch.cuda._sleep(400_000)  # ~0.2 ms at 1.98 GHz
            f0.record()
            scratch.zero_()
            s.record()
            fn(arg)
            e.record()
            torch.cuda.synchronize()
            if mode != "plain":
                a.record()
                a.synchronize()
                tails.append(e.elapsed_time(a) * 1e3)
                flushes.append(f0.elapsed_time(s) * 1e3)
            us = s.elapsed_time(e) * 1e3
        if i >= 3:
            times.append(us)
        if i >= reps:
            clocks.append(sm_clock())
    med = statistics.median
    return (med(times), med(tails) if tails else float("nan"),
            med(flushes) if flushes else float("nan"), med(clocks))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=40)
    parser.add_argument("--gap-ms", type=float, default=2.0)
    args = parser.parse_args()
    ref = load_module(TASK / "reference.py", "_probe_ref")
    seed = load_module(TASK / "seeds" / "triton_blockscaled.py", "_probe_seed")
    cub = load_module(TASK / "baselines" / "cublas_blockscaled.py", "_probe_cublas")
    kernels = {"triton_seed": (seed.custom_kernel, lambda d: d),
               "cublas_kmajor": (cub.run, cub.prepare)}
    scratch = torch.empty(256 * 1024 * 1024, dtype=torch.int8, device="cuda")
    timer = make_timer("cuda")
    modes = ["plain", "strict", "events", "gap", "gap+warm"]
    rows = []
    for name, (fn, prep) in kernels.items():
        for shape in SHAPES:
            cells = {}
            for mode in modes:
                gap = args.gap_ms / 1e3 if mode.startswith("gap") else 0.0
                cells[mode] = run_mode(mode, fn, prep, ref, shape, args.reps, gap, scratch, timer)
            label = f"{name} m{shape[0]}-n{shape[1]}-k{shape[2]}"
            rows.append((label, cells))
            print(label, {k: tuple(round(x, 1) for x in v) for k, v in cells.items()}, flush=True)
    print(f"\nmedian us of {args.reps} calls; (time, tail, flush, SM MHz after); "
          f"gap {args.gap_ms} ms")
    print("| kernel shape | " + " | ".join(modes) + " | tail(events) | flush | MHz plain/gap |")
    print("|---" * (len(modes) + 4) + "|")
    for label, cells in rows:
        print(f"| {label} | " + " | ".join(f"{cells[m][0]:.1f}" for m in modes)
              + f" | {cells['events'][1]:.1f} | {cells['events'][2]:.1f} | "
              f"{cells['plain'][3]:.0f}/{cells['gap'][3]:.0f} |")


if __name__ == "__main__":
    main()
