"""bench/dense_yardstick.py without a GPU: on the CPU, with fp8_gemm's torch seed on the cpu
profile, every benchmark gets a row of numbers, the GPU-only column says so, and the geomean
row covers what every benchmark timed."""

from __future__ import annotations

import subprocess
import sys

from helpers import REPO


def test_the_table_prints_on_the_cpu() -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "dense_yardstick.py"), "--device", "cpu",
         "--profile", "cpu", "--reps", "2", "--kernel",
         str(REPO / "tasks" / "fp8_gemm" / "seeds" / "torch_dequant.py")],
        capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line.strip("|").split("|") for line in proc.stdout.splitlines()
            if line.startswith("| m")]
    assert len(rows) == 3, proc.stdout  # the cpu profile's three benchmarks
    for cells in rows:
        floor, bf16, fp16, fp8, kernel, ratio = (c.strip() for c in cells[1:])
        assert fp8 == "GPU only"
        assert all(float(v) > 0 for v in (floor, bf16, fp16, kernel, ratio)), cells
    mean = next(line for line in proc.stdout.splitlines() if line.startswith("| **geomean**"))
    assert "| - |" in mean and float(mean.split("|")[3]) > 0, mean


def test_an_unknown_profile_names_the_known_ones() -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "dense_yardstick.py"), "--device", "cpu",
         "--profile", "nope"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode != 0
    assert "--profile 'nope': fp8_gemm has" in proc.stderr and "full" in proc.stderr
