"""What moving a checked output from the worker costs, per MB (issue 10's throughput: whole
outputs over the pipe were ~6 ms per MB on the H200 host). Times a `check` request (the output
comes back whole) against a `call` request (same inputs and kernel, no output back) on the axpy
test task, on the CPU, with outputs of 4 to 64 MB.
Usage: python bench/transport.py [--repeats 5]"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from pytest_kscientist.formats.task import load_task
from pytest_kscientist.harness.baselines import start_worker

AXPY = Path(__file__).resolve().parent.parent / "tests" / "data" / "axpy"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    task = load_task(AXPY)
    worker = start_worker(task, AXPY / "seeds" / "good.py", "custom_kernel", None, "cpu", 120)
    try:
        print("| output MB | check ms | call ms | transfer ms per MB |")
        print("|---|---|---|---|")
        for n in (1 << 20, 1 << 22, 1 << 24):
            case = {"n": n, "seed": 1}
            checks, calls = [], []
            for i in range(args.repeats):
                t0 = time.perf_counter()
                worker.request("check", case=case, seed=i)
                checks.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                worker.request("call", case=case, seed=i)
                calls.append(time.perf_counter() - t0)
            mb = 4 * n / 2**20
            check, call = statistics.median(checks) * 1e3, statistics.median(calls) * 1e3
            print(f"| {mb:.0f} | {check:.1f} | {call:.1f} | {(check - call) / mb:.2f} |")
    finally:
        worker.close()


if __name__ == "__main__":
    main()
