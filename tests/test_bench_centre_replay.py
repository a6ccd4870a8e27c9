"""bench/centre_replay.py on made-up calls: where calls split half and half into two groups the
interquartile mean's interval narrows and the median's does not; on one peak the IQM's
t-interval stops a round after fewer calls than the median's (why it was measured worse as the
harness's centre: notes/timing.md)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

from helpers import REPO


def _series(n: int, seed: int, split: bool) -> list[float]:
    rng = random.Random(seed)
    return [(100.0 if not split or rng.random() < 0.5 else 106.0) * (1 + 0.01 * rng.gauss(0, 1))
            for _ in range(n)]


def _run(dump: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(REPO / "bench" / "centre_replay.py"), str(dump)],
                          capture_output=True, text=True, timeout=120, cwd=REPO)


def _row(out: str, series: str, centre: str) -> list[str]:
    line = next(x for x in out.splitlines() if f"| {series} |" in x and f"| {centre} |" in x)
    return [c.strip() for c in line.strip("|").split("|")]


def test_split_calls_stop_on_the_iqm_and_one_peak_stops_it_sooner(tmp_path: Path) -> None:
    dump = tmp_path / "dump.json"
    dump.write_text(json.dumps({"m1024": {"k / split": _series(1200, 1, True),
                                          "k / one peak": _series(1200, 2, False),
                                          "k / too short": _series(100, 3, False)}}))
    proc = _run(dump)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "too short" not in out  # fewer calls than two rounds: not replayed
    precise_median = int(_row(out, "k / split", "median")[4].split(" of ")[0])
    precise_iqm = int(_row(out, "k / split", "IQM")[4].split(" of ")[0])
    assert precise_iqm == 8 and precise_median < 4, out
    calls_median = float(_row(out, "k / one peak", "median")[5].split()[0])
    calls_iqm = float(_row(out, "k / one peak", "IQM")[5].split()[0])
    assert calls_iqm < calls_median, out
    assert out.splitlines()[-1].startswith("median: every neighbouring-round A/A within 2% in ")


def test_a_dump_without_a_long_enough_series_is_refused(tmp_path: Path) -> None:
    dump = tmp_path / "dump.json"
    dump.write_text(json.dumps({"m1024": {"k / p": _series(40, 1, False)}}))
    proc = _run(dump)
    assert proc.returncode != 0
    assert "no series of at least 300 calls" in proc.stderr
