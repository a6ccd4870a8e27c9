"""Where does a seed's call spend time outside its kernels? Host time and GPU time per call.

    python bench/host_time.py [SEED.py] [--shapes m1024-n1536-k7168 ...] [--reps 30]
        [--launched KERNEL ...]

For each shape (default: the three small-m shapes whose harness medians spread on 2026-12-01,
notes/fp8_gemm_h200.md) and two input regimes: "same" (one input, as GPU MODE's plain loop) and
"fresh" (a new input every call, as the harness times), each call: synchronise, 0.2 ms spin,
256 MB L2 flush, start event, call, end event, synchronise. Prints the medians and maxima of
the event time and of the host time (perf_counter from the call to its return, the GPU still
busy with the spin and flush), so a kernel whose launch work outlasts the queued spin shows
as host time close to or above its event time. The host time is split into the seed's Triton
launches (each ``kernel[grid](...)`` call of the module timed by a wrapper) and the rest.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
TASK = ROOT / "tasks" / "fp8_gemm"
SHAPES = ["m1024-n1536-k7168", "m1024-n512-k7168", "m1024-n576-k7168", "m6144-n4608-k7168"]


def load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class TimedLaunches:
    """Wraps the kernels a module launches from the host (``names``: not the ``@triton.jit``
    helpers other kernels call, which the compiler looks up by name): ``kernel[grid](...)``
    host time, summed until reset."""

    def __init__(self, module, names) -> None:
        self.spent = 0.0
        for name in names:
            if not hasattr(getattr(module, name, None), "run"):
                raise SystemExit(f"{module.__name__} has no Triton kernel {name!r}; name the "
                                 "kernels its custom_kernel launches with --launched")
            setattr(module, name, self._wrap(getattr(module, name)))

    def _wrap(self, kernel):
        timer = self

        class Launch:
            def __getitem__(self, grid):
                def launch(*args, **kwargs):
                    t0 = time.perf_counter()
                    try:
                        return kernel[grid](*args, **kwargs)
                    finally:
                        timer.spent += time.perf_counter() - t0
                return launch

        return Launch()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("seed", nargs="?", type=Path, default=TASK / "seeds" / "triton_fused.py")
    parser.add_argument("--shapes", nargs="+", default=SHAPES)
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--launched", nargs="+", default=["_fp8_block_scaled_gemm", "_sum_splits"],
                        help="the kernels custom_kernel launches (timed apart)")
    args = parser.parse_args()
    reference = load("fp8_reference", TASK / "reference.py")
    seed = load("seed_under_test", args.seed)
    launches = TimedLaunches(seed, args.launched)
    flush = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.float32, device="cuda")
    print("| shape | inputs | event median us | event max | host median us | host max "
          "| of which launches, median us |")
    print("|---|---|---|---|---|---|---|")
    for label in args.shapes:
        m, n, k = (int(x[1:]) for x in label.split("-"))
        for regime in ("same", "fresh"):
            count = args.reps + 3 if regime == "fresh" else 1
            inputs = [reference.generate_input(m, n, k, 1000 + i, device="cuda")
                      for i in range(count)]
            seed.custom_kernel(inputs[0])  # compile
            events, hosts, launched = [], [], []
            for i in range(args.reps + 3):
                data = inputs[i % count]
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize()
                torch.cuda._sleep(400_000)
                flush.zero_()
                start.record()
                launches.spent = 0.0
                t0 = time.perf_counter()
                seed.custom_kernel(data)
                host = time.perf_counter() - t0
                end.record()
                torch.cuda.synchronize()
                if i >= 3:
                    events.append(start.elapsed_time(end) * 1000.0)
                    hosts.append(host * 1e6)
                    launched.append(launches.spent * 1e6)
            print(f"| {label} | {regime} | {statistics.median(events):.1f} | {max(events):.1f} "
                  f"| {statistics.median(hosts):.1f} | {max(hosts):.1f} "
                  f"| {statistics.median(launched):.1f} |", flush=True)
            del inputs
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
