"""bench/call_path.py without a GPU: on the CPU, with fp8_gemm's torch seed on a cpu-profile
shape, its three views come out with numbers in every column (a real worker, real rounds)."""

from __future__ import annotations

import subprocess
import sys

from helpers import REPO


def test_the_three_views_print_on_the_cpu() -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "call_path.py"), "--device", "cpu", "--kernel",
         str(REPO / "tasks" / "fp8_gemm" / "seeds" / "torch_dequant.py"), "--shapes", "m128",
         "--calls", "3", "--rounds", "1", "--profile", "3"],
        capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    for title in ("## 1. Round trips to a real worker", "## 2. Rounds of Evaluator.bench",
                  "## 3. The worker's steps in this process, as the worker runs them",
                  "a device synchronisation after each step", "function calls",
                  "## 3. The timed call in this process, the worker's timer alone"):
        assert title in out, out
    rows = [line for line in out.splitlines() if line.startswith("| m128-n256-k512-s8135 |")]
    assert len(rows) == 5, out  # one row a view (view 3 twice, and its timed call's spread)
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")[1:]]
        assert cells and all(float(c) >= 0 for c in cells), row
