"""A/A test of the forms a user reaches for first (issue 31): two copies of one kernel in one
run, and the CI gate across sessions.

    python bench/aa.py [--runs 3] [--kernel PATH] [--budget SECONDS] [--device auto]
                       [--shapes EXPR] [--no-slower] [--workers N] [--keep DIR]
                       [--task DIR]

Each run is one ``pytest tasks/fp8_gemm -k bench --kernel aa_one.py --kernel aa_two.py``
session (the plain two-``--kernel`` form; the reference is timed too, no baselines). Per run and
per shape it reads one's speedup over two from the rounds both were timed in (``fellows`` in
``--ks-json``) with its interval, and whether the two medians' intervals overlap. Runs after
the first add the README's gate, ``--ks-compare run0.json --ks-max-regression 5%``, which
must pass for both copies. A last run makes ``aa_two`` 10% slower (it spins for a tenth of
its own time after each call; on a GPU the spin is calibrated per shape) and the gate must
fail it (``--no-slower``: not run).
``--shapes`` narrows the benchmarks with a pytest ``-k`` expression over case ids (their
gates are then deselected). ``--workers N`` times each kernel in N workers
(``--ks-bench-workers``; left out: the harness's ``auto``, a worker a round on a GPU).
Targets: every shape within 5% on a CPU and 2% on a GPU,
intervals overlapping, the A/A gates passing, the slower one caught.
Prints one table per run and a summary last.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TASK = ROOT / "tasks" / "fp8_gemm"

# Appended to a copy of the kernel: the same result, a tenth of its own time spent after it.
# On a GPU the tenth is a spin kernel queued after the call, calibrated per shape against the
# call as events time it: sized from one event-timed call (the host's launch latency in it) and
# the clock rate, with the spin's own launch on top, it made m1024-n4096-k512 2.66x slower
# (the slower run read 1.39-1.50x on H100s and an H200; calibrated, 1.109 on an H100).
SLOWER = '''

import time as _time

import torch as _torch

_honest = custom_kernel
_spin = {}  # shape -> the spin's cycles (GPU) or seconds (CPU)


def _event_us(call, data, reps=15):
    start = _torch.cuda.Event(enable_timing=True)
    end = _torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        _torch.cuda.synchronize()
        _torch.cuda._sleep(400_000)  # the queue busy while the call is launched, as timed
        start.record()
        call(data)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return sorted(times)[reps // 2]


def _spun(cycles):
    def call(data):
        out = _honest(data)
        _torch.cuda._sleep(cycles)
        return out
    return call


def _calibrate(data):
    for _ in range(3):  # the first calls of a shape may compile
        _honest(data)
    own = _event_us(_honest, data)
    want = 0.1 * own
    probe = 100_000
    bare = _event_us(_spun(0), data)  # the spin's launch alone
    rate = probe / max(_event_us(_spun(probe), data) - bare, 1e-3)
    cycles = max(0, int((want - (bare - own)) * rate))
    for _ in range(2):  # correct by what the spun call adds, as events time it
        extra = _event_us(_spun(cycles), data) - own
        cycles = max(0, int(cycles + (want - extra) * rate))
    return cycles


def custom_kernel(data):
    key = tuple(t.shape for t in data if hasattr(t, "shape"))
    if data[0].is_cuda:
        if key not in _spin:
            _spin[key] = _calibrate(data)
        return _spun(_spin[key])(data)
    if key not in _spin:
        _honest(data)  # the first call of a shape may compile: measure the next five
        times = []
        for _ in range(5):  # their median: one slow call no longer sets the spin
            began = _time.perf_counter()
            _honest(data)
            times.append(_time.perf_counter() - began)
        _spin[key] = sorted(times)[2] * 0.1
    out = _honest(data)
    until = _time.perf_counter() + _spin[key]
    while _time.perf_counter() < until:
        pass
    return out
'''


def one_run(copies: list[Path], budget: str, device: str, out: Path,
            gate_on: Path | None, shapes: str = "", workers: int = 0,
            task: Path = TASK) -> tuple[dict, str]:
    select = f"(bench or gate) and ({shapes})" if shapes else "bench or gate"
    cmd = [sys.executable, "-m", "pytest", str(task), "-p", "no:cacheprovider", "-q", "-rA",
           "-k", select, "--ks-baselines", "none", "--ks-device", device,
           "--kernel", str(copies[0]), "--kernel", str(copies[1]), "--ks-json", str(out)]
    if budget:
        cmd += ["--ks-bench-budget", budget]
    if workers > 0:
        cmd += ["--ks-bench-workers", str(workers)]
    if gate_on is not None:
        cmd += ["--ks-compare", str(gate_on), "--ks-max-regression", "5%"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if not out.exists():
        raise SystemExit(f"run wrote no results:\n{proc.stdout[-3000:]}{proc.stderr[-2000:]}")
    data = json.loads(out.read_text())
    return {c["name"]: c for c in data["candidates"]}, proc.stdout


def shapes(one: dict, two: dict) -> list[tuple[str, float, float, float, bool, list[float]]]:
    """Per shape: case id, one's speedup over two with its interval, medians' CIs overlap, and
    each shared round's ratio (``round_speedups``, schema 9)."""
    theirs = {c["case_id"]: c for c in two["cases"] if c["kind"] == "bench"}
    rows = []
    for case in one["cases"]:
        other = theirs.get(case["case_id"])
        pair = case.get("fellows", {}).get("aa_two")
        if case["kind"] != "bench" or other is None or not pair or not pair.get("speedup"):
            continue
        a, b = case["stats"], other["stats"]
        overlap = a["ci_low_us"] <= b["ci_high_us"] and b["ci_low_us"] <= a["ci_high_us"]
        rounds = pair.get("round_speedups") or [pair["speedup"]]
        rows.append((case["case_id"], pair["speedup"], pair["speedup_low"] or math.nan,
                     pair["speedup_high"] or math.nan, overlap, rounds))
    return rows


def gate_of(cand: dict) -> tuple[str, str]:
    gates = [g for g in cand.get("gates", []) if g["gate"] == "max-regression"]
    return (gates[0]["outcome"], gates[0]["message"]) if gates else ("-", "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="A/A runs (then one slower run)")
    parser.add_argument("--kernel", type=Path, default=None)
    parser.add_argument("--budget", default="")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--shapes", default="", help="a -k expression over case ids")
    parser.add_argument("--no-slower", action="store_true", help="skip the slower run")
    parser.add_argument("--workers", type=int, default=0,
                        help="--ks-bench-workers: worker processes each kernel is timed in "
                             "(0: the harness's auto)")
    parser.add_argument("--task", type=Path, default=TASK,
                        help="the task folder (a copy of fp8_gemm with other [bench] settings)")
    parser.add_argument("--keep", type=Path, default=None,
                        help="a folder to keep each run's pytest output and --ks-json in")
    args = parser.parse_args()
    gpu = args.device.startswith("cuda")
    if args.device == "auto":
        import torch

        gpu = torch.cuda.is_available()
    tol = 0.02 if gpu else 0.05
    default = "triton_fused.py" if gpu else "torch_dequant.py"
    kernel = args.kernel or args.task / "seeds" / default
    summary = []
    with tempfile.TemporaryDirectory(prefix="ks-aa-") as tmp:
        copies = [Path(tmp) / f"aa_{n}.py" for n in ("one", "two")]
        for copy in copies:
            shutil.copy(kernel, copy)
        first = Path(tmp) / "run0.json"
        for i in range(args.runs + (0 if args.no_slower else 1)):
            slower = i == args.runs
            if slower:
                copies[1].write_text(kernel.read_text() + SLOWER)
            began = time.monotonic()
            cands, log = one_run(copies, args.budget, args.device, Path(tmp) / f"run{i}.json",
                               first if i else None, args.shapes, args.workers, args.task)
            one, two = cands["aa_one"], cands["aa_two"]
            rows = shapes(one, two)
            label = "slower aa_two" if slower else "A/A"
            print(f"\nrun {i} ({label}), {time.monotonic() - began:.0f} s")
            print("| shape | one/two speedup | 95% interval | medians' CIs overlap | rounds |")
            print("|---|---|---|---|---|")
            for case_id, ratio, low, high, overlap, rounds in rows:
                print(f"| {case_id} | {ratio:.4f} | {low:.4f}-{high:.4f} | {overlap} | "
                      f"{' '.join(f'{r:.3f}' for r in rounds)} |")
            shown = {r[0] for r in rows}
            for who in (one, two):  # a shape without a ratio: say why, never drop it silently
                for case in who["cases"]:
                    if case["kind"] == "bench" and case["case_id"] not in shown:
                        brief = {k: v for k, v in case.items() if k not in ("stats", "fellows")}
                        print(f"| {case['case_id']} | no ratio ({who['name']}) | "
                              f"{json.dumps(brief)[:600]} | - |")
            for line in log.splitlines():  # a failed item says why a shape may lack a ratio
                if line.startswith(("FAILED ", "ERROR ")) and "::gate[" not in line.split()[1]:
                    print(f"  {line[:300]}")
            if args.keep:
                args.keep.mkdir(parents=True, exist_ok=True)
                (args.keep / f"run{i}.log").write_text(log)
                shutil.copy(Path(tmp) / f"run{i}.json", args.keep / f"run{i}.json")
            worst = max((abs(r[1] - 1) for r in rows), default=math.nan)
            # What the rounds' geometric mean (the harness's centre before schema 9) would read.
            worst_geo = max((abs(math.exp(statistics.fmean(map(math.log, r[5]))) - 1)
                             for r in rows), default=math.nan)
            apart = sum(not r[4] for r in rows)
            excluded = sum(not r[2] <= 1 <= r[3] for r in rows)  # a difference read
            g1, g2 = gate_of(one), gate_of(two)
            geo = one.get("fellow_speedups", {}).get("aa_two", math.nan)
            print(f"geomean one/two {geo:.4f}; worst shape {worst:.2%} off (rounds' geomean: "
                  f"{worst_geo:.2%}); {apart} shape(s) "
                  f"with disjoint CIs, {excluded} whose ratio's interval excludes 1; gate one: "
                  f"{g1[0]}, gate two: {g2[0]}")
            for who, g in (("one", g1), ("two", g2)):
                if g[1]:
                    print(f"  gate {who}: {g[1]}")
            summary.append((i, label, f"{geo:.4f}", f"{worst:.2%}", f"{worst_geo:.2%}", apart,
                            excluded, g1[0], g2[0]))
    print(f"\nkernel {kernel.name}, device {'cuda' if gpu else 'cpu'}, per-shape target "
          f"{tol:.0%}, {args.workers or 'auto'} worker(s) a kernel")
    print("| run | form | geomean one/two | worst shape | worst, rounds' geomean | disjoint CIs "
          "| ratio CI excludes 1 | gate one | gate two |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in summary:
        print("| " + " | ".join(str(x) for x in row) + " |")


if __name__ == "__main__":
    main()
