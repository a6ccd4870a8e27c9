"""Where a short benchmark's call-to-call spread comes from (issue 32: why its rounds never reach
the 1% stop; issue 31: how wide its verdicts are).

    python3 bench/spread_probe.py [--shapes m1024-n7168-k256 m6144-n4608-k7168] [--calls 300]
                                  [--kernel tasks/fp8_gemm/seeds/cuda_wgmma.py] [--dump FILE]

On one H200 (2026-12-04, `bench/call_path.py`) the CUDA seed's calls on m1024-n7168-k256 spread
12-14% (interquartile range over the median), in the worker and with the worker's timer alone,
so a 0.25 s round's median is known to ~5%, never to the 1% that would stop it. Is that the
kernel or the protocol around it? Per shape, in one process, the calls of every (kernel,
protocol) pair interleaved one by one (fresh inputs are not drawn: one input a shape):
- kernels: ``--kernel`` (checked once first) and cuBLAS bf16 (``torch.mm`` of converted,
  K-major operands; the same m, n, k);
- protocols: ``harness``: the worker's own timer (``make_timer``: spin, event, L2 flush by
  zeroing 256 MB, start event, call, end event, synchronisation); ``no-flush``: the same
  without the flush (a warm L2); ``read-flush``: the flush made by reading 256 MB (a sum)
  instead of writing it, so no dirty lines are left for the call to write back.
``--variant OVERLAP=0`` adds the kernel with those knobs as another row. ``--clock`` adds a
table: each call's SM clock read just before its flush (events around a fixed spin), with the
worker's warm-up spin and with 8 times it, and the median call below and above the median clock
(are two groups of calls two clock states?). ``--steps`` replaces the flush protocols by the
worker's timer rebuilt step by step with one step left out in turn (the event before the flush,
the tail's synchronisation and event) or a spin added before the flush. Prints per shape,
kernel and protocol: median us, interquartile range over the median (%), the half-width of the
median's 95% interval over the first 150 calls (%), the measure that the harness's 1% stop
reads, the same for the interquartile mean (``centre_replay.py``), and the deciles over the
median (two groups of calls show as a jump between deciles). ``--dump FILE`` writes every
call's time as JSON (shape -> "kernel / protocol" -> microseconds, in call order), for
replaying estimators offline (``bench/centre_replay.py``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import tomllib
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from centre_replay import interquartile_interval, interquartile_mean  # noqa: E402

from pytest_kscientist.api import load_module, make_timer, median_interval  # noqa: E402  (after the path)

TASK = ROOT / "tasks" / "fp8_gemm"
SCRATCH_BYTES = 256 * 1024 * 1024
WARM_CYCLES = 400_000
CLOCK_CYCLES = 20_000



Timed = Callable[[Callable[[], object]], tuple[float, float]]


def protocol(scratch: torch.Tensor, flush: str = "write", mark: bool = False,
             sleep: bool = False, clock: bool = False, tail: bool = False,
             warm: int = 1) -> Timed:
    """One timed call under the worker's protocol with each step chosen: ``warm`` times its
    warm-up spin; ``sleep``, CLOCK_CYCLES more of spin before the flush, between two events when
    ``clock`` (they give the SM clock just before the call); ``mark``, an event before the flush;
    the flush writes 256 MB (``write``, the worker's), reads them (``read``) or is left out
    (``none``); ``tail``, a device synchronisation and an event after the end (else the end
    event is waited for). mark, write and tail: the worker's timer. Returns (us of the call,
    MHz or nan)."""

    def once(fn: Callable[[], object]) -> tuple[float, float]:
        c0, c1, flushed, start, end, after = (
            torch.cuda.Event(enable_timing=True) for _ in range(6))
        torch.cuda.synchronize()
        torch.cuda._sleep(warm * WARM_CYCLES)
        if clock:
            c0.record()
        if sleep or clock:
            torch.cuda._sleep(CLOCK_CYCLES)
        if clock:
            c1.record()
        if mark:
            flushed.record()
        if flush == "write":
            scratch.zero_()
        elif flush == "read":
            scratch.sum()
        start.record()
        fn()
        end.record()
        if tail:
            torch.cuda.synchronize()
            after.record()
            after.synchronize()
        else:
            end.synchronize()
        mhz = CLOCK_CYCLES / (c0.elapsed_time(c1) * 1000.0) if clock else float("nan")
        return start.elapsed_time(end) * 1000.0, mhz

    return once


def spread(times: list[float]) -> tuple[float, float, float, float]:
    """(median, IQR / median %, the median's and the interquartile mean's 95% interval
    half-widths over 150 calls %)."""
    ordered = sorted(times)
    middle = statistics.median(ordered)
    q1, q3 = (ordered[(q * (len(ordered) - 1)) // 4] for q in (1, 3))
    first = times[:150]
    low, high = median_interval(first)
    i_low, i_high = interquartile_interval(first)
    return (middle, 100 * (q3 - q1) / middle,
            100 * (high - low) / 2 / statistics.median(first),
            100 * (i_high - i_low) / 2 / interquartile_mean(first))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["m1024-n7168-k256", "m1024-n4096-k512",
                                                        "m6144-n7168-k256", "m6144-n4608-k7168"])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--kernel", type=Path, default=TASK / "seeds" / "cuda_wgmma.py")
    parser.add_argument("--steps", action="store_true",
                        help="time under the worker's timer rebuilt step by step, each step "
                             "left out in turn, in place of the three flush protocols")
    parser.add_argument("--clock", action="store_true",
                        help="also: each call's SM clock read just before its flush, with the "
                             "worker's warm-up spin and with 8 times it")
    parser.add_argument("--variant", nargs="*", default=[], metavar="KNOB=V[,KNOB=V]",
                        help="more rows: the kernel with these knobs over its own for the "
                             "shape (a seed with fp8_gemm(..., knobs) and tunables_for)")
    parser.add_argument("--dump", type=Path, default=None,
                        help="write every call's time as JSON: shape -> 'kernel / protocol' -> "
                             "microseconds in call order")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU: the spread it measures is a device's")
    cases = {f"m{c['m']}-n{c['n']}-k{c['k']}": dict(c) for c in tomllib.loads(
        (TASK / "task.toml").read_text())["profiles"]["full"]["benchmarks"]}
    reference = load_module(TASK / "reference.py", "fp8_reference")
    kernel = load_module(args.kernel.resolve(), f"spread_{args.kernel.stem}")
    harness = make_timer("cuda")
    scratch = torch.ones(SCRATCH_BYTES // 4, dtype=torch.float32, device="cuda")
    protocols: dict[str, Callable[[Callable[[], object]], float]] = {
        "harness": lambda fn: harness.time_call(lambda _: fn(), None)[1] - harness.overhead_us}
    chosen = ({"steps": {"mark": True, "tail": True}, "steps, no mark": {"tail": True},
               "steps, sleep": {"mark": True, "sleep": True, "tail": True},
               "steps, no tail": {"mark": True}} if args.steps
              else {"no-flush": {"flush": "none"}, "read-flush": {"flush": "read"}})
    for name, steps in chosen.items():
        timed = protocol(scratch, **steps)
        protocols[name] = lambda fn, timed=timed: timed(fn)[0]
    clock_rows: list[str] = []
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {args.calls} calls a "
          f"cell, interleaved\n")
    print("| shape | kernel | protocol | median us | IQR / median % | median CI half-width "
          "% (150 calls) | IQM CI half-width % (150 calls) | deciles 1-9 over the median |")
    print("|---|---|---|---|---|---|---|---|")
    dumped: dict[str, dict[str, list[float]]] = {}
    for label in args.shapes:
        if label not in cases:
            raise SystemExit(f"no full-profile benchmark {label}; known: {', '.join(cases)}")
        c = cases[label]
        data = reference.generate_input(c["m"], c["n"], c["k"], c["seed"], device="cuda")
        expected = reference.ref_kernel(data).float()
        got = kernel.custom_kernel(data).float()
        bad = int(((got - expected).abs() > 1e-3 + 2e-2 * expected.abs()).sum())
        if bad:
            raise SystemExit(f"{args.kernel} fails the check on {label}: {bad} elements")
        a16, b16 = data[0].to(torch.bfloat16).contiguous(), data[1].to(torch.bfloat16).contiguous()
        c16 = torch.empty((c["m"], c["n"]), dtype=torch.bfloat16, device="cuda")
        kernels = {args.kernel.stem: lambda data=data: kernel.custom_kernel(data),
                   "cublas_bf16": lambda a16=a16, b16=b16, c16=c16: torch.mm(a16, b16.T,
                                                                             out=c16)}
        for variant in args.variant:
            knobs = {**kernel.tunables_for(m=c["m"], n=c["n"], k=c["k"]),
                     **{k: int(v) for k, v in (p.split("=") for p in variant.split(","))}}
            kernels[variant] = lambda data=data, knobs=knobs: kernel.fp8_gemm(*data, knobs)
        times: dict[tuple[str, str], list[float]] = {
            (k, p): [] for k in kernels for p in protocols}
        for _ in range(args.calls):
            for (k, p), out in times.items():
                out.append(protocols[p](kernels[k]))
        if args.clock:
            clock_rows.extend(clock_table(label, kernels, scratch, args.calls))
        dumped[label] = {f"{k} / {p}": out for (k, p), out in times.items()}
        for (k, p), out in times.items():
            middle, iqr, half, iqm_half = spread(out)
            ordered = sorted(out)
            deciles = " ".join(f"{ordered[(d * (len(out) - 1)) // 10] / middle:.3f}"
                               for d in range(1, 10))
            print(f"| {label} | {k} | {p} | {middle:.2f} | {iqr:.2f} | {half:.2f} | "
                  f"{iqm_half:.2f} | {deciles} |")
    if args.dump:
        args.dump.write_text(json.dumps(dumped))
    if clock_rows:
        print("\n| shape | kernel | warm-up spin | MHz deciles 1, 5, 9 | median us, calls under "
              "the median clock | median us, calls over it | IQR / median % |")
        print("|---|---|---|---|---|---|---|")
        print("\n".join(clock_rows))
    return 0


def clock_table(label: str, kernels: dict[str, Callable[[], object]], scratch: torch.Tensor,
                calls: int) -> list[str]:
    """Rows: each kernel's calls split by the SM clock read before them."""
    protocols = {f"{n}x": protocol(scratch, clock=True, warm=n) for n in (1, 8)}
    got: dict[tuple[str, str], list[tuple[float, float]]] = {
        (k, p): [] for k in kernels for p in protocols}
    for _ in range(calls):
        for (k, p), out in got.items():
            out.append(protocols[p](kernels[k]))
    rows = []
    for (k, p), pairs in got.items():
        mhz = sorted(m for _, m in pairs)
        cut = statistics.median(mhz)
        low = [t for t, m in pairs if m < cut] or [float("nan")]
        high = [t for t, m in pairs if m >= cut] or [float("nan")]
        _, iqr, _, _ = spread([t for t, _ in pairs])
        rows.append(f"| {label} | {k} | {p} | {mhz[len(mhz) // 10]:.0f}, {cut:.0f}, "
                    f"{mhz[(9 * len(mhz)) // 10]:.0f} | {statistics.median(low):.2f} "
                    f"| {statistics.median(high):.2f} | {iqr:.2f} |")
    return rows


if __name__ == "__main__":
    sys.exit(main())
