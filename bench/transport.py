"""What moving a checked output from the worker costs, per MB, and what verifying one whole
output of 25M fp32 elements costs (issue 30). On the axpy test task, on the CPU.

Transfer: a `check` request whose output comes back whole, taken into this process as the
harness takes it (a frame, or a sealed memfd above `handover.SHARED_ABOVE` bytes), against a
`call` request (same inputs and kernel, no output back), outputs of 4 to 100 MB.
Verification: a timed call's output fetched (`fetch`) and judged against the reference
(`Evaluator._judge`), the reference's own time apart; a whole check item (`Evaluator.check`).
`--pipe`: every output in its frame, as before the handover existed.
Usage: python bench/transport.py [--repeats 5] [--pipe]"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from pytest_kscientist.api import Evaluator, load_task, received, start_worker

AXPY = Path(__file__).resolve().parent.parent / "tests" / "data" / "axpy"


def _output(worker, spec, op: str, **fields):  # type: ignore[no-untyped-def]
    header, payload = worker.request(op, handover=spec, **fields)
    assert header["ok"], header
    return received.output(worker, header["output"], payload, "cpu")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--pipe", action="store_true", help="no handover: outputs in frames")
    args = parser.parse_args()
    task = load_task(AXPY)
    worker = start_worker(task, AXPY / "seeds" / "good.py", "custom_kernel", None, "cpu", 300)
    if args.pipe:
        received.spec = lambda worker, device: None  # the Evaluator's requests too
    spec = received.spec(worker, "cpu")
    print(f"handover: {spec}")
    try:
        print("| output MB | check ms | call ms | transfer ms per MB |")
        print("|---|---|---|---|")
        for n in (1 << 20, 1 << 22, 1 << 24, 25_000_000):
            case = {"n": n, "seed": 1}
            checks, calls = [], []
            for i in range(args.repeats):
                t0 = time.perf_counter()
                _output(worker, spec, "check", case=case, seed=i)
                checks.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                worker.request("call", case=case, seed=i)
                calls.append(time.perf_counter() - t0)
            mb = 4 * n / 2**20
            check, call = statistics.median(checks) * 1e3, statistics.median(calls) * 1e3
            print(f"| {mb:.0f} | {check:.1f} | {call:.1f} | {(check - call) / mb:.2f} |")
        ev = Evaluator(task, "cpu", salt=1)
        case = {"n": 25_000_000, "seed": 1}
        fetch, judge, reference = [], [], []
        for i in range(args.repeats):
            worker.request("call", case=case, seed=i)
            t0 = time.perf_counter()
            out = _output(worker, spec, "fetch")
            t1 = time.perf_counter()
            expected = ev.expected(case, i)
            t2 = time.perf_counter()
            ev._judge(expected, out)
            t3 = time.perf_counter()
            fetch.append(t1 - t0)
            reference.append(t2 - t1)
            judge.append(t3 - t2)
        checks = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            assert ev.check(worker, case).outcome == "passed"
            checks.append(time.perf_counter() - t0)
        print("\n| 25M fp32 elements | ms |\n|---|---|")
        for name, values in (("one timed call's output: fetch, whole", fetch),
                             ("its judge, whole", judge),
                             ("its reference (paid before too)", reference),
                             ("a check item: call, re-run, references, judges", checks)):
            print(f"| {name} | {statistics.median(values) * 1e3:.0f} |")
    finally:
        worker.close()


if __name__ == "__main__":
    main()
