"""One knob of the CUDA seed on one sm_90 GPU: the seed's checks at each value, then its time at
each value beside the seed as committed before a change (notes/fp8_gemm_h200.md).

    python3 bench/knob_probe.py KNOB V1 V2 ... [--old PATH] [--reps 30] [--seed PATH]

First every (shape, knobs) below once at each value against the task's reference and tolerance
(C filled with NaN first; exit status 3 on any element outside it, before any timing):
stream-K, one CTA a tile (more CTAs than SMs), no programmatic launch, BLOCK_N 64, partial tiles
and K blocks, two stream-K waves, and B in a layout the fast upcast does not take (a copy's
rows, so every knob falls back). Then per benchmark shape a plain event loop (synchronise,
start, call, end, synchronise; median of --reps calls on one input) of the old seed (--old: the
seed before the change under another build name, e.g. `git show
HEAD:tasks/fp8_gemm/seeds/cuda_wgmma.py | sed s/ks_cuda_wgmma_v8/ks_cuda_wgmma_old/`) and the
seed at each value, with the mean durations of its launches (torch.profiler, us, each kernel
by its function's name). The harness is what to quote for a verdict; this loop says where the
time went. Last, two shapes captured in a CUDA graph at each value and replayed on two inputs
in turn (exit status 4 on any element outside the tolerance or a capture that fails). The
tolerance is the task's (task.toml's [check]). --seed: a variant file in the seed's place (its
knob is read from it), so a change can be probed before it is written into the seed.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from cuda_sweep import launch_us  # noqa: E402  (after the path)

from pytest_kscientist.api import (  # noqa: E402  (after the path)
    geomean,
    judge,
    load_module,
    load_reference,
    load_task,
    read_tunables,
)

TASK = ROOT / "tasks" / "fp8_gemm"
SEED = TASK / "seeds" / "cuda_wgmma.py"
CHECKS = [((1024, 512, 7168), {}), ((1024, 4608, 7168), {}), ((6144, 7168, 256), {}),
          ((96, 7168, 256), {"PERSISTENT": 0, "STREAM_K": 0}),
          ((1024, 1536, 7168), {"OVERLAP": 0}), ((6144, 576, 7168), {"BLOCK_N": 64}),
          ((64, 200, 384), {}), ((100, 1000, 300), {"STREAM_K": 2}),
          ((256, 1000, 640), {"b_copy": 1})]
GRAPHS = [(1024, 1536, 7168), (256, 1000, 640)]
SHAPES = [(1024, 1536, 7168), (1024, 4608, 7168), (1024, 512, 7168), (1024, 7168, 256),
          (1024, 4096, 512), (1024, 7168, 2304), (6144, 7168, 256), (6144, 4608, 7168),
          (6144, 576, 7168)]


def inputs(ref, m: int, n: int, k: int, seed: int, b_copy: bool = False) -> list:
    data = list(ref.generate_input(m, n, k, seed, device="cuda"))
    if b_copy:  # B row-major: not the fast upcast's layout
        data[1] = data[1].contiguous()
    return data


def outside(got: torch.Tensor, want: torch.Tensor, check) -> int:
    """Elements of ``got`` outside the task's tolerance (``check``: its atol and rtol) of
    ``want``, as the harness judges them (a NaN where the reference has none, C's fill never
    written, counts); all of them where the shapes differ."""
    miss = judge(got.float(), want.float(), check.atol, check.rtol)
    return (miss.count or got.numel()) if miss else 0


def misses(seed, ref, check, shape, extra: dict, knob: str, values: list[int]) -> list[int]:
    """Elements outside the tolerance at each value."""
    m, n, k = shape
    extra = dict(extra)
    data = inputs(ref, m, n, k, 7, bool(extra.pop("b_copy", 0)))
    want = ref.ref_kernel(data).float()
    out = []
    for value in values:
        data[4].fill_(float("nan"))
        seed.fp8_gemm(*data, {**seed.tunables_for(m=m, n=n, k=k), **extra, knob: value})
        torch.cuda.synchronize()
        out.append(outside(data[4], want, check))
    return out


def graph_misses(seed, ref, check, shape, knob: str, values: list[int]) -> list[int]:
    """Elements outside the tolerance at each value when the call is captured in a CUDA graph
    and replayed on two inputs in turn (a replay reuses everything the capture fixed)."""
    m, n, k = shape
    first, second = inputs(ref, m, n, k, 5), inputs(ref, m, n, k, 6)
    wants = [ref.ref_kernel(data).float() for data in (first, second)]
    out = []
    for value in values:
        static = [t.clone() for t in first]
        knobs = {**seed.tunables_for(m=m, n=n, k=k), knob: value}
        seed.fp8_gemm(*static, knobs)  # built and warm before the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            seed.fp8_gemm(*static, knobs)
        bad = 0
        for data, want in [(first, wants[0]), (second, wants[1]), (first, wants[0])]:
            for target, source in zip(static[:4], data[:4], strict=True):
                target.copy_(source)
            static[4].fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            bad += outside(static[4], want, check)
        out.append(bad)
    return out


def event_us(fn, data, calls: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(calls):
        torch.cuda.synchronize()
        start.record()
        fn(data)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return sorted(times)[calls // 2]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("knob", help="a TUNABLES name of the seed")
    parser.add_argument("values", type=int, nargs="+", help="its values to check and time")
    parser.add_argument("--old", type=Path, help="the seed before the change, another build name")
    parser.add_argument("--reps", type=int, default=30, help="calls a timed cell (median)")
    parser.add_argument("--seed", type=Path, default=SEED,
                        help="the kernel file probed in the seed's place (default: the seed)")
    args = parser.parse_args()
    if not args.seed.is_file():
        parser.error(f"--seed {args.seed}: no such file (a copy of "
                     f"{SEED.relative_to(ROOT)} with the change)")
    knobs = read_tunables(args.seed.read_text())  # before the build: a misspelt knob costs nothing
    if args.knob not in knobs:
        shown = args.seed.relative_to(ROOT) if args.seed.is_relative_to(ROOT) else args.seed
        parser.error(f"{args.knob} is not a knob of {shown} (its TUNABLES: "
                     f"{', '.join(knobs)}); apply the change that adds it first")
    if args.old is not None and not args.old.is_file():
        parser.error(f"--old {args.old}: no such file (the seed before the change, e.g. git show "
                     f"HEAD:tasks/fp8_gemm/seeds/cuda_wgmma.py | sed "
                     f"s/ks_cuda_wgmma_v8/ks_cuda_wgmma_old/ >{args.old})")
    started = time.perf_counter()
    seed = load_module(args.seed, "cuda_wgmma")
    old = load_module(args.old, "cuda_wgmma_old") if args.old else None
    task = load_task(TASK)
    ref, check = load_reference(task), task.spec.check
    print(f"built in {time.perf_counter() - started:.1f} s", flush=True)
    bad = 0
    for shape, extra in CHECKS:
        found = misses(seed, ref, check, shape, extra, args.knob, args.values)
        bad += any(found)
        print("check m{}-n{}-k{} {}: outside at {} {}: {}".format(
            *shape, extra, args.knob, args.values, found), flush=True)
    if bad:
        return 3
    names = ["old"] + [f"{args.knob} {v}" for v in args.values]
    print("| shape | " + " | ".join(f"{name} us" for name in names) + " | old / best | "
          + " | ".join(f"launches at {v} (us, mean of 5 calls)" for v in args.values) + " |")
    print("|---" * (2 * len(names) + 1) + "|")
    columns: list[list[float]] = [[] for _ in names]
    for m, n, k in SHAPES:
        data = inputs(ref, m, n, k, 11)
        knobs = seed.tunables_for(m=m, n=n, k=k)
        fns = [old.custom_kernel if old else None] + [
            lambda d, v=v, kn=knobs: seed.fp8_gemm(*d, {**kn, args.knob: v}) for v in args.values]
        times = []
        for i, fn in enumerate(fns):
            if fn is None:
                times.append(float("nan"))
                continue
            fn(data)
            times.append(event_us(fn, data, args.reps))
            columns[i].append(times[-1])
        launches = [" / ".join(f"{name} {us:.1f}" for name, us in launch_us(fn, data, 5).items())
                    for fn in fns[1:]]
        print(f"| m{m}-n{n}-k{k} | " + " | ".join(f"{t:.2f}" for t in times)
              + f" | {times[0] / min(times[1:]):.3f} | " + " | ".join(launches) + " |",
              flush=True)
    means = [geomean(column) if column else float("nan") for column in columns]
    print("| geomean | " + " | ".join(f"{t:.2f}" for t in means) + " | | "
          + " | ".join("" for _ in args.values) + " |")
    for shape in GRAPHS:
        try:
            found = graph_misses(seed, ref, check, shape, args.knob, args.values)
        except Exception as exc:  # a capture the call does not survive is a finding too
            found = [f"{type(exc).__name__}: {exc}"]
        bad += not all(x == 0 for x in found)
        print("graph m{}-n{}-k{}, three replays: outside at {} {}: {}".format(
            *shape, args.knob, args.values, found), flush=True)
    return 4 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
