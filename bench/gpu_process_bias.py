"""Does one GPU process time the same kernel differently from another for its whole life, and
does moving each call's data (``[bench] placement = "vary"``) take that away? (issue 31: on
the H200 two copies of one kernel read 1.7-3.0% apart on m6144-n576-k7168 in all four rounds
of a run, and the split-K shapes 0.64x-1.33x apart before the lead.)

    python bench/gpu_process_bias.py [--pairs 4] [--rounds 10] [--calls 40]
                                     [--kernel tasks/fp8_gemm/seeds/triton_fused.py]
                                     [--shapes m6144-n576-k7168 m1024-n576-k7168 ...]

Pairs of processes, each loading the kernel, in two forms taken in turn (fixed, vary, fixed,
...): each round the parent asks both processes of a pair (mirrored order) for the median of
``--calls`` calls per shape on fresh inputs, timed as the harness's worker does at its core
(synchronise, a 256 MB writing flush, start event, call, end event, synchronise). In the vary
form every call allocates a spacer of 1-33 MiB before its inputs, as the worker does under
``placement = "vary"``. Per pair and shape: the median over rounds of first/second and in how
many rounds the first was slower. A per-process effect shows as a pair whose ratio stays on
one side of 1 in nearly every round; the last table compares the forms by the pairs' spread.
No harness code is used.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import multiprocessing as mp
import random
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TASK = ROOT / "tasks" / "fp8_gemm"
SHAPES = ["m6144-n576-k7168", "m1024-n576-k7168", "m1024-n512-k7168", "m1024-n7168-k256"]
FLUSH_BYTES = 256 * 1024 * 1024


def parse(shape: str) -> dict[str, int]:
    return {part[0]: int(part[1:]) for part in shape.split("-")}


def _load(path: Path, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _serve(conn: Any, kernel_path: str, vary: bool, seed: int) -> None:
    import torch

    sys.path.insert(0, str(TASK))
    reference = _load(TASK / "reference.py", "reference")
    kernel = _load(Path(kernel_path), "candidate")
    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    rng = random.Random(seed)
    call = 0
    while (ask := conn.recv()) is not None:
        shape, calls = ask
        times = []
        for _ in range(calls):
            call += 1
            spacer = (torch.empty((1 << 20) + 512 * rng.randrange(1 << 16), dtype=torch.uint8,
                                  device="cuda") if vary else None)
            data = reference.generate_input(**parse(shape), seed=call, device="cuda")
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            flush.zero_()
            start.record()
            kernel.custom_kernel(data)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
            del data, spacer
        conn.send(statistics.median(times))


def pair(args: argparse.Namespace, vary: bool, tag: int) -> dict[str, tuple[float, int]]:
    """Per shape: (median over rounds of first/second, rounds where the first was slower)."""
    ctx = mp.get_context("spawn")
    ends = []
    for who in range(2):
        mine, theirs = ctx.Pipe()
        proc = ctx.Process(target=_serve, args=(theirs, str(args.kernel), vary, 2 * tag + who))
        proc.start()
        ends.append((proc, mine))
    for shape in args.shapes:  # warm-up: compiles, the allocator's segments
        for _, conn in ends:
            conn.send((shape, 5))
        for _, conn in ends:
            conn.recv()
    ratios: dict[str, list[float]] = {s: [] for s in args.shapes}
    for r in range(args.rounds):
        for shape in args.shapes:
            got = {}
            order = list(enumerate(ends))
            for i, (_, conn) in (order if r % 2 == 0 else order[::-1]):
                conn.send((shape, args.calls))
                got[i] = conn.recv()
            ratios[shape].append(got[0] / got[1])
    for proc, conn in ends:
        conn.send(None)
        proc.join()
    return {s: (statistics.median(x), sum(1 for v in x if v > 1)) for s, x in ratios.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=4, help="pairs per form")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--kernel", type=Path, default=TASK / "seeds" / "triton_fused.py")
    parser.add_argument("--shapes", nargs="+", default=SHAPES)
    args = parser.parse_args()
    spread: dict[tuple[str, str], list[float]] = {}
    print(f"{'form':<6} {'pair':>4}  " + "  ".join(f"{s:>22}" for s in args.shapes), flush=True)
    for tag in range(args.pairs):
        for form in ("fixed", "vary"):
            got = pair(args, form == "vary", tag)
            cells = []
            for shape, (ratio, slower) in got.items():
                spread.setdefault((form, shape), []).append(math.log(ratio))
                cells.append(f"{ratio:>12.4f} {slower:>3}/{args.rounds:<3}")
            print(f"{form:<6} {tag:>4}  " + "  ".join(f"{c:>22}" for c in cells), flush=True)
    print("\nper shape: the pairs' first/second, root mean square and worst distance from 1")
    for shape in args.shapes:
        line = [f"{shape:<20}"]
        for form in ("fixed", "vary"):
            logs = spread[(form, shape)]
            rms = math.exp(math.sqrt(statistics.fmean(x * x for x in logs))) - 1
            worst = math.exp(max(abs(x) for x in logs)) - 1
            line.append(f"{form} rms {rms:6.2%} worst {worst:6.2%}")
        print("  ".join(line))


if __name__ == "__main__":
    main()
