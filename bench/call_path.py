"""Where one benchmark call's time goes, outside the kernel (issue 32: a generation's rounds).

    python3 bench/call_path.py [--device cuda] [--kernel tasks/fp8_gemm/seeds/cuda_wgmma.py]
                               [--shapes m1024-n7168-k256 m6144-n4608-k7168] [--calls 40]

Three views of the same path, per shape:
1. Round trips from this process to a real worker (``start_worker``), as the harness asks:
   ``call`` and ``probe`` requests, each one's wall against the time the worker reports and
   the CPU time the worker spent on it (all its threads; CUDA synchronisations spin), and
   ``fetch`` of a call's whole output, taken into this process as the harness takes it.
2. Rounds of ``Evaluator.bench`` (its default share, 0.25 s of a 1 s budget in 4 rounds; one
   round first, not counted, for the reference's first use): how many calls it timed, its wall
   per timed call (probes included), how much went to verifying the kept outputs (fetch,
   reference, judge), the half-width of its median's 95% interval (the 1% stop's measure) and
   the calls' spread (interquartile range over the median); medians of ``--rounds``.
   ``--profile N``: this process's N costliest functions over those rounds of the first shape.
3. The worker's steps, replayed in this process with the worker's own timer (``make_timer``):
   inputs drawn, cloned, output poisoned, the timed call, the output's snapshot, the inputs
   compared, the output poisoned again. Each step's host wall, first as the worker runs them
   (no synchronisation between steps: device work shows at the next step that waits), then
   with a device synchronisation after each step (device work shows at its own step); then
   the timed call's own times there (the worker's timer with no pipe around it): their median
   and spread, to set beside view 2's.
Prints one table per view; ms per call, medians. ``--device cpu`` (shapes of the cpu profile)
checks the script without a GPU.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from pytest_kscientist.api import (
    Evaluator,
    load_module,
    load_task,
    make_timer,
    received,
    round_quota,
    start_worker,
)

ROOT = Path(__file__).resolve().parent.parent
TASK = ROOT / "tasks" / "fp8_gemm"


def _ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1e3:.3f}" if values else "-"


def _iqr_pct(values: list[float]) -> float:
    """The interquartile range over the median, in percent."""
    ordered = sorted(values)
    q1, q3 = (ordered[(q * (len(ordered) - 1)) // 4] for q in (1, 3))
    return 100 * (q3 - q1) / statistics.median(ordered)


def _case(task, case_id: str, profile: str) -> dict:  # type: ignore[no-untyped-def]
    for case in task.profile(profile).benchmarks:
        if task.case_id(case).startswith(case_id):
            return dict(case)
    known = ", ".join(task.case_id(c) for c in task.profile(profile).benchmarks)
    raise SystemExit(f"no benchmark of profile '{profile}' starts with '{case_id}'; known: {known}")


def round_trips(worker, case: dict, calls: int, device: str) -> dict[str, list[float]]:  # type: ignore[no-untyped-def]
    out: dict[str, list[float]] = {"call wall": [], "call reported": [], "probe wall": [],
                                   "fetch wall": [], "call worker cpu": []}
    spec = received.spec(worker, device)
    for i in range(calls):
        cpu0 = worker.cpu_us()
        t0 = time.perf_counter()
        header, _ = worker.request("call", case=case, seed=1000 + i)
        wall = time.perf_counter() - t0
        cpu1 = worker.cpu_us()
        assert header.get("ok"), header
        out["call wall"].append(wall)
        if cpu0 is not None and cpu1 is not None:
            out["call worker cpu"].append((cpu1 - cpu0) / 1e6)
        out["call reported"].append((float(header["raw_us"]) - float(worker.overhead_us)) / 1e6)
        t0 = time.perf_counter()
        header, payload = worker.request("fetch", handover=spec)
        assert header.get("ok"), header
        received.output(worker, header["output"], payload, device)
        out["fetch wall"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        header, _ = worker.request("call", case=case, seed=2000 + i, probe=True, busy_us=20.0)
        out["probe wall"].append(time.perf_counter() - t0)
        assert header.get("ok"), header
    return out


def one_round(ev, worker, case: dict, device_name: str) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """One round of the harness's bench at its default share; the verification's part timed
    by wrapping this Evaluator's own method (a bench script's object, not the harness's)."""
    spent = [0.0]
    verify = ev._verify_sample

    def timed_verify(run, tolerate):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        try:
            return verify(run, tolerate)
        finally:
            spent[0] += time.perf_counter() - t0

    ev._verify_sample = timed_verify
    spec = ev.task.spec.bench
    rounds = spec.rounds_on(ev.device)
    t0 = time.perf_counter()
    result = ev.bench(worker, case, device_name, spec.budget_s / rounds,
                      **round_quota(spec, rounds))
    wall = time.perf_counter() - t0
    ev._verify_sample = verify
    stats = result.stats
    runs = stats.runs
    half = ((stats.ci_high_us - stats.ci_low_us) / 2 if stats.ci_low_us is not None
            and stats.ci_high_us is not None else float("nan"))
    return {"wall s": wall, "timed calls": runs, "ms a timed call": wall / runs * 1e3,
            "verify s": spent[0], "median us": stats.median_us,
            "median CI half-width %": 100 * half / stats.median_us,
            "IQR / median %": _iqr_pct(stats.samples_us)}


def steps(kernel, generate, case: dict, device: str, calls: int,  # type: ignore[no-untyped-def]
          synced: bool) -> dict[str, list[float]]:
    import torch

    timer = make_timer(device)
    sync = torch.cuda.synchronize if device.startswith("cuda") and synced else (lambda: None)
    names = ("draw", "clone inputs", "poison output", "timed call", "snapshot",
             "inputs compared", "poison again")
    out: dict[str, list[float]] = {n: [] for n in (*names, "whole", "kernel us")}
    for i in range(calls):
        marks = [time.perf_counter()]
        pristine = generate(case, 3000 + i, device)
        marks.append(_after(sync))
        given = tuple(t.clone() if isinstance(t, torch.Tensor) else t for t in pristine)
        marks.append(_after(sync))
        given[-1].fill_(float("nan"))
        marks.append(_after(sync))
        result, reported, _ = timer.time_call(kernel, given)
        marks.append(_after(sync))
        out["kernel us"].append(reported * 1e-3)  # _ms prints it back in us
        snap = result.clone()
        marks.append(_after(sync))
        # As the worker compares them: same-size integers, one synchronisation for all.
        flags = torch.stack([torch.ne(_ints(p), _ints(g)).any()
                             for p, g in zip(pristine[:-1], given[:-1], strict=True)])
        assert not flags.any().item()
        marks.append(_after(sync))
        result.fill_(float("nan"))
        marks.append(_after(sync))
        del snap
        for name, a, b in zip(names, marks[:-1], marks[1:], strict=True):
            out[name].append(b - a)
        out["whole"].append(marks[-1] - marks[0])
    return out


def _after(sync) -> float:  # type: ignore[no-untyped-def]
    sync()
    return time.perf_counter()


def _ints(t):  # type: ignore[no-untyped-def]
    import torch

    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return t.view(ints[t.element_size()])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--kernel", default=str(TASK / "seeds" / "cuda_wgmma.py"))
    parser.add_argument("--shapes", nargs="+", default=["m1024-n7168-k256", "m1024-n4096-k512",
                                                        "m6144-n4608-k7168"])
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=4, help="rounds of view 2 (medians)")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="also print this process's N costliest functions (cProfile, by "
                             "own time) over the rounds of the first shape")
    args = parser.parse_args()
    gpu = args.device.startswith("cuda")
    profile = "full" if gpu else "cpu"
    task = load_task(TASK)
    device_name = "H200"
    if gpu:
        import torch

        device_name = torch.cuda.get_device_name()
    cases = [_case(task, s, profile) for s in args.shapes]
    t0 = time.perf_counter()
    kernel_path = Path(args.kernel).resolve()
    worker = start_worker(task, kernel_path, "custom_kernel", None, args.device, 600)
    print(f"worker started and loaded in {time.perf_counter() - t0:.1f} s")
    ev = Evaluator(task, args.device, salt=7)
    views: list[tuple[str, dict]] = []
    try:
        for case in cases:
            cid = task.case_id(case)
            trips = round_trips(worker, case, args.calls, args.device)
            one_round(ev, worker, case, device_name)  # the reference's first use, not counted
            rounds = [one_round(ev, worker, case, device_name) for _ in range(args.rounds)]
            views.append((cid, {"trips": trips, "round": {
                k: statistics.median(r[k] for r in rounds) for k in rounds[0]}}))
        if args.profile:
            import cProfile
            import pstats

            profiler = cProfile.Profile()
            profiler.enable()
            for _ in range(args.rounds):
                one_round(ev, worker, cases[0], device_name)
            profiler.disable()
            print(f"\n## This process during {args.rounds} rounds of {task.case_id(cases[0])}\n")
            pstats.Stats(profiler).sort_stats("tottime").print_stats(args.profile)
    finally:
        worker.close()
    reference = ev.reference
    kernel = load_module(args.kernel, "ks_call_path_kernel").custom_kernel

    def generate(case, seed, device):  # type: ignore[no-untyped-def]
        return reference.generate_input(**dict(case, seed=seed), device=device)

    print("\n## 1. Round trips to a real worker (ms, medians)\n")
    print("| shape | call wall | reported | call wall - reported | the worker's CPU in a call "
          "| probe wall (20 us busy) | fetch wall (output taken) |")
    print("|---|---|---|---|---|---|---|")
    for cid, view in views:
        t = view["trips"]
        gap = [w - r for w, r in zip(t["call wall"], t["call reported"], strict=True)]
        print(f"| {cid} | {_ms(t['call wall'])} | {_ms(t['call reported'])} | {_ms(gap)} "
              f"| {_ms(t['call worker cpu'])} | {_ms(t['probe wall'])} | {_ms(t['fetch wall'])} |")
    print("\n## 2. Rounds of Evaluator.bench at its default share (medians)\n")
    print("| shape | wall s | timed calls | ms a timed call | verify s | median us "
          "| median CI half-width % | IQR / median % |")
    print("|---|---|---|---|---|---|---|---|")
    for cid, view in views:
        r = view["round"]
        print(f"| {cid} | {r['wall s']:.3f} | {r['timed calls']:.0f} | {r['ms a timed call']:.2f} "
              f"| {r['verify s']:.3f} | {r['median us']:.1f} | {r['median CI half-width %']:.2f} "
              f"| {r['IQR / median %']:.2f} |")
    spreads: list[str] = []
    for synced in (False, True):
        label = "a device synchronisation after each step" if synced else "as the worker runs them"
        print(f"\n## 3. The worker's steps in this process, {label} (ms, medians)\n")
        header = None
        for case in cases:
            got = steps(kernel, generate, case, args.device, args.calls, synced)
            if header is None:
                header = list(got)
                print("| shape | " + " | ".join(header) + " |")
                print("|---|" + "---|" * len(header))
            print(f"| {task.case_id(case)} | " + " | ".join(_ms(got[n]) for n in header) + " |")
            if not synced:
                us = got["kernel us"]
                spreads.append(f"| {task.case_id(case)} | {len(us)} "
                               f"| {statistics.median(us) * 1e3:.2f} "
                               f"| {_iqr_pct(us):.2f} |")
    print("\n## 3. The timed call in this process, the worker's timer alone\n")
    print("| shape | calls | median us | IQR / median % |")
    print("|---|---|---|---|")
    print("\n".join(spreads))


if __name__ == "__main__":
    main()
