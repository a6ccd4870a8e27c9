"""Where does the harness's per-call time go? One kernel, a few shapes, several ways of timing it.

    python bench/protocol_probe.py [--kernel PATH] [--device cuda] [--reps 30] \
        [--cases 1024,4096,512,17512 ...]

On the H200 (2026-11-29) the harness reported 200-220 us for Triton seed calls that take 62-73 us
in a plain event-timed loop, and 199.6 us geomean for cuBLAS on K-major inputs against 49.0 us
measured the plain way (notes/fp8_gemm_h200.md). This prints, per shape, the median of:
- ``loop``: this process, the same timer object the worker uses (worker/timing.py), fresh
  inputs and a poisoned output per call, back to back;
- ``loop+ctx``: the same while another process holds an idle CUDA context (as the pytest process
  does beside its workers);
- ``worker``/``worker-nosandbox``: the real worker (spawned runner, HMAC channel), with and
  without the OS sandbox, reported time minus its calibrated overhead; and the round trip.
Read the rows against each other: the first mode that jumps is where the time goes.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pytest_kscientist.formats.task import load_task  # noqa: E402
from pytest_kscientist.harness.evaluate import load_reference  # noqa: E402
from pytest_kscientist.harness.spawn import Worker, sandbox_available  # noqa: E402
from pytest_kscientist.worker.runner import _load_module  # noqa: E402
from pytest_kscientist.worker.timing import make_timer  # noqa: E402

TASK = ROOT / "tasks" / "fp8_gemm"
IDLE_CONTEXT = (
    "import time, torch; torch.zeros(1, device='cuda'); print('up', flush=True); time.sleep(3600)"
)


def parse_case(text: str) -> dict[str, int]:
    try:
        m, n, k, seed = (int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"case {text!r}: expected four integers m,n,k,seed, e.g. 1024,4096,512,17512"
        ) from None
    return {"m": m, "n": n, "k": k, "seed": seed}


def loop_us(kernel, ref, case: dict[str, int], device: str, reps: int) -> float:
    timer = make_timer(device)
    times = []
    for i in range(reps + 2):
        data = ref.generate_input(case["m"], case["n"], case["k"], 1000 + i, device=device)
        data = [t.clone() for t in data]
        data[4].fill_(float("nan"))
        _, raw, _ = timer.time_call(kernel, data)
        if i >= 2:  # two warm-up calls
            times.append(raw - timer.overhead_us)
    return statistics.median(times)


def worker_us(
    task, kernel_path: Path, case: dict[str, int], device: str, reps: int, sandbox: bool
) -> tuple[float, float]:
    worker = Worker(task.reference, device, task.spec.output_index, 120.0, sandbox=sandbox)
    try:
        header, _ = worker.request(
            "load", timeout=600, path=str(kernel_path), entry="custom_kernel", prepare=None
        )
        if not header.get("ok"):
            raise SystemExit(f"{kernel_path} did not load in the worker: {header.get('reason')}")
        times, trips = [], []
        for i in range(reps + 2):
            t0 = time.perf_counter()
            header, _ = worker.request("call", case=case, seed=2000 + i)
            trip = (time.perf_counter() - t0) * 1e6
            if not header.get("ok"):
                raise SystemExit(f"call failed in the worker: {header.get('reason')}")
            if i >= 2:
                times.append(float(header["raw_us"]) - float(worker.overhead_us))
                trips.append(trip)
        return statistics.median(times), statistics.median(trips)
    finally:
        worker.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", type=Path, default=TASK / "seeds" / "triton_blockscaled.py")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument(
        "--cases",
        type=parse_case,
        nargs="+",
        default=[parse_case("1024,4096,512,17512"), parse_case("6144,4608,7168,65436")],
    )
    args = parser.parse_args()
    args.kernel = args.kernel.resolve()  # the worker runs in its own folder
    if not args.kernel.is_file():
        raise SystemExit(f"--kernel {args.kernel}: no such file; give a candidate .py file")
    task = load_task(TASK)
    ref = load_reference(task)
    kernel = _load_module(str(args.kernel), "_probe_candidate").custom_kernel
    sandbox_ok = sandbox_available() is None
    rows = []
    for case in args.cases:
        label = f"m{case['m']}-n{case['n']}-k{case['k']}"
        row = {"shape": label, "loop": loop_us(kernel, ref, case, args.device, args.reps)}
        if args.device.startswith("cuda"):
            other = subprocess.Popen(
                [sys.executable, "-c", IDLE_CONTEXT], stdout=subprocess.PIPE, text=True
            )
            try:
                other.stdout.readline()  # its context is up
                row["loop+ctx"] = loop_us(kernel, ref, case, args.device, args.reps)
            finally:
                other.kill()
                other.wait()
        row["worker"], row["worker trip"] = worker_us(
            task, args.kernel, case, args.device, args.reps, sandbox=sandbox_ok
        )
        row["worker-nosandbox"], row["nosandbox trip"] = worker_us(
            task, args.kernel, case, args.device, args.reps, sandbox=False
        )
        rows.append(row)
        print(
            " ".join(f"{k}={v:.1f}" if isinstance(v, float) else str(v) for k, v in row.items()),
            flush=True,
        )
    print(
        f"\nsandbox available: {sandbox_ok}; median us per call, {args.reps} calls after 2 warm-up"
    )
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |")
    for row in rows:
        print(
            "| "
            + " | ".join(f"{row[k]:.1f}" if isinstance(row[k], float) else row[k] for k in keys)
            + " |"
        )


if __name__ == "__main__":
    main()
