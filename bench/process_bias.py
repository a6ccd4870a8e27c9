"""Does one process time the same kernel differently from another, for a whole session?
(issue 31: on the 2-core CPU two copies of one kernel read up to 24% apart in a session.)

    python bench/process_bias.py [--pairs 6] [--rounds 12] [--calls 40] [--jitter] [--thp-off]
                                  [--pin CPU]

Starts pairs of processes that each load fp8_gemm's torch seed; each round, the parent asks
both (in mirrored order) for the median of ``--calls`` calls on m256-n384-k256 with fresh
inputs, as the harness's rounds do. Per pair it prints the median of the per-round ratios
(first/second) and in how many rounds the first was slower. A per-process effect shows as a
pair whose ratios stay on one side of 1 in nearly every round; plain noise as ratios that
cross 1. ``--jitter`` allocates a random-sized buffer (up to 1 MiB) before each call's inputs,
so each call's data lands at other addresses (the alignment hypothesis). ``--thp-off`` turns
transparent huge pages off in each process (``prctl(PR_SET_THP_DISABLE)``) before torch loads:
with the kernel's THP on ``always``, whether a process's heap happens to sit in huge pages is
a property of that process (the huge-page hypothesis); each process reports its
``AnonHugePages`` at the end beside the ratio. ``--pin CPU`` pins every process to that one
core (the core hypothesis: a process that keeps to the slower of two vCPUs). CPU only; no
harness code is used.
"""

from __future__ import annotations

import argparse
import importlib.util
import multiprocessing as mp
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

TASK = Path(__file__).resolve().parent.parent / "tasks" / "fp8_gemm"
SHAPE = {"m": 256, "n": 384, "k": 256}


PR_SET_THP_DISABLE = 41


def _huge_kb() -> int:
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    return -1


def _serve(conn: Any, jitter: bool, seed: int, thp_off: bool, pin: int | None) -> None:
    if pin is not None:
        os.sched_setaffinity(0, {pin})
    if thp_off:
        import ctypes
        if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_THP_DISABLE) failed")
    import torch

    torch.set_num_threads(1)  # as the harness's CPU workers
    sys.path.insert(0, str(TASK))
    import reference

    spec = importlib.util.spec_from_file_location("seed", TASK / "seeds" / "torch_dequant.py")
    assert spec is not None and spec.loader is not None
    kernel = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kernel)
    rng = random.Random(seed)
    call = 0
    while (calls := conn.recv()) is not None:
        times = []
        for _ in range(calls):
            call += 1
            pad = torch.empty(rng.randrange(1, 1 << 20), dtype=torch.int8) if jitter else None
            data = reference.generate_input(**SHAPE, seed=call)
            began = time.perf_counter()
            kernel.custom_kernel(data)
            times.append(time.perf_counter() - began)
            del pad
        conn.send(statistics.median(times) * 1e6)
    conn.send(_huge_kb())


def pair(rounds: int, calls: int, jitter: bool, tag: int, thp_off: bool,
         pin: int | None, warmup: int = 5) -> tuple[float, int, list[int]]:
    """(median of first/second over the rounds, rounds where the first was slower, each
    process's AnonHugePages in KiB at the end)."""
    ends = []
    for who in range(2):
        mine, theirs = mp.Pipe()
        proc = mp.Process(target=_serve, args=(theirs, jitter, 2 * tag + who, thp_off, pin))
        proc.start()
        ends.append((proc, mine))
    for _, conn in ends:  # warm-up
        conn.send(warmup)
        conn.recv()
    ratios = []
    for r in range(rounds):
        got = {}
        for i, (_, conn) in (list(enumerate(ends)) if r % 2 == 0 else list(enumerate(ends))[::-1]):
            conn.send(calls)
            got[i] = conn.recv()
        ratios.append(got[0] / got[1])
    huge = []
    for proc, conn in ends:
        conn.send(None)
        huge.append(conn.recv())
        proc.join()
    return statistics.median(ratios), sum(1 for x in ratios if x > 1), huge


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--jitter", action="store_true")
    parser.add_argument("--thp-off", action="store_true")
    parser.add_argument("--pin", type=int, default=None, metavar="CPU")
    parser.add_argument("--warmup", type=int, default=5, help="untimed calls per process")
    args = parser.parse_args()
    print(f"{'pair':>4}  median first/second  rounds first slower  AnonHugePages KiB")
    worst = 0.0
    for tag in range(args.pairs):
        median, slower, huge = pair(args.rounds, args.calls, args.jitter, tag, args.thp_off,
                                    args.pin, args.warmup)
        worst = max(worst, abs(median - 1))
        print(f"{tag:>4}  {median:>20.3f}  {slower:>6}/{args.rounds}  {huge[0]:>8} {huge[1]:>8}")
    print(f"worst pair {worst:.1%} off 1")


if __name__ == "__main__":
    main()
