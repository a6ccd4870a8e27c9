"""A/A test: copies of one honest kernel timed in one run must come out equal. Repeated.

    python bench/aa.py [--runs 10] [--kernel PATH] [--budget SECONDS] [--device auto]

Each run is one ``pytest tasks/fp8_gemm -k bench`` session with three copies of the kernel
(default: the torch seed on a CPU, the Triton seed on a GPU): ``aa_one`` and ``aa_two`` as
candidates, timed one after the other, and ``aa_three`` beside both (``--ks-beside``, timed
interleaved in rounds). Per run it prints the geomean ratio one/two (sequential) and the
interleaved speedups over aa_three with their intervals; then the range over runs. Target
(issue 10): the sequential ratios within [0.95, 1.05] on a CPU, [0.98, 1.02] on a GPU.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TASK = ROOT / "tasks" / "fp8_gemm"


def one_run(copies: list[Path], budget: str, device: str, out: Path) -> dict:
    cmd = [sys.executable, "-m", "pytest", str(TASK), "-p", "no:cacheprovider", "-q", "-k",
           "bench", "--ks-skip-reference", "--ks-baselines", "none", "--ks-device", device,
           "--kernel", str(copies[0]), "--kernel", str(copies[1]), "--ks-beside", str(copies[2]),
           "--ks-json", str(out)]
    if budget:
        cmd += ["--ks-bench-budget", budget]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if not out.exists():
        raise SystemExit(f"run wrote no results:\n{proc.stdout[-3000:]}{proc.stderr[-2000:]}")
    data = json.loads(out.read_text())
    return {c["name"]: c for c in data["candidates"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--kernel", type=Path, default=None)
    parser.add_argument("--budget", default="")
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()
    gpu = args.device.startswith("cuda")
    if args.device == "auto":
        import torch

        gpu = torch.cuda.is_available()
    default = "triton_blockscaled.py" if gpu else "torch_dequant.py"
    kernel = args.kernel or TASK / "seeds" / default
    with tempfile.TemporaryDirectory(prefix="ks-aa-") as tmp:
        copies = [Path(tmp) / f"aa_{n}.py" for n in ("one", "two", "three")]
        for copy in copies:
            shutil.copy(kernel, copy)
        ratios, rows = [], []
        for i in range(args.runs):
            began = time.monotonic()
            cands = one_run(copies, args.budget, args.device, Path(tmp) / f"run{i}.json")
            one, two = cands["aa_one"], cands["aa_two"]
            ratio = one["geomean_us"] / two["geomean_us"]
            ratios.append(ratio)
            cells = [f"{ratio:.3f}"]
            for c in (one, two):
                low, high = c["speedup_intervals"].get("aa_three", [float("nan")] * 2)
                cells.append(f"{c['speedups'].get('aa_three', float('nan')):.3f} "
                             f"[{low:.3f}-{high:.3f}]")
            rows.append((i, *cells, f"{time.monotonic() - began:.0f}"))
            print(f"run {i}: one/two {cells[0]}, one vs three {cells[1]}, two vs three "
                  f"{cells[2]}", flush=True)
    print(f"\nkernel {kernel.name}, {args.runs} runs, device {'cuda' if gpu else 'cpu'}")
    print("| run | one/two (sequential) | one vs three (interleaved) | two vs three | s |")
    print("|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(str(x) for x in row) + " |")
    print(f"sequential ratio range: {min(ratios):.3f} - {max(ratios):.3f}")


if __name__ == "__main__":
    main()
