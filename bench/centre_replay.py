"""Replay recorded calls through two centres of a benchmark's timed calls: the median and the
interquartile mean (issues 31 and 32).

    python3 bench/centre_replay.py DUMP.json [--round 150]

``DUMP.json`` is ``bench/spread_probe.py --dump``'s record (shape -> "kernel / protocol" ->
every call's microseconds in call order). Each series is cut into consecutive rounds of
``--round`` calls, as the harness's rounds of a short benchmark take them. Per series and
centre it prints:
- stops: in how many rounds the centre's 95% interval was within 1% of it (the harness's early
  stop; a round that does not stop runs its whole share);
- A/A: each round's centre over the next round's, the largest distance from 1 (%), as two copies
  of one kernel in neighbouring rounds would read;
- the pooled centre of the first half of the rounds over the second half's (%), as two copies
  with half the rounds each.
A last line counts, per centre, the series whose every A/A distance stayed within 2%.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from pytest_kscientist.api import (  # noqa: E402  (after the path)
    interquartile_interval,
    interquartile_mean,
    median_interval,
)

Centre = tuple[Callable[[Sequence[float]], float],
               Callable[[Sequence[float]], tuple[float, float]]]
CENTRES: dict[str, Centre] = {
    "median": (statistics.median, median_interval),
    "IQM": (interquartile_mean, interquartile_interval),
}
PRECISION = 0.01
AA_BAR = 2.0


def replay(times: list[float], size: int, centre: Centre) -> tuple[int, int, float, float]:
    """(rounds that stop, rounds, worst neighbouring-round distance %, half-vs-half %)."""
    value, interval = centre
    rounds = [times[i:i + size] for i in range(0, len(times) - size + 1, size)]
    stops = 0
    for r in rounds:
        low, high = interval(r)
        stops += (high - low) / 2 <= PRECISION * value(r)
    pairs = [value(a) / value(b) for a, b in zip(rounds, rounds[1:], strict=False)]
    worst = max((abs(p - 1) * 100 for p in pairs), default=0.0)
    half = len(rounds) // 2
    split = 0.0
    if half:
        first = [t for r in rounds[:half] for t in r]
        second = [t for r in rounds[half:2 * half] for t in r]
        split = abs(value(first) / value(second) - 1) * 100
    return stops, len(rounds), worst, split


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dump", type=Path)
    parser.add_argument("--round", type=int, default=150, help="calls a round (default 150)")
    args = parser.parse_args()
    record = json.loads(args.dump.read_text())
    print("| shape | series | calls | centre | rounds stopped | worst A/A, neighbouring rounds % "
          "| first half vs second % |")
    print("|---|---|---|---|---|---|---|")
    within = {name: 0 for name in CENTRES}
    series = 0
    for shape, by_series in record.items():
        for label, times in by_series.items():
            if len(times) < 2 * args.round:
                continue
            series += 1
            for name, centre in CENTRES.items():
                stops, rounds, worst, split = replay(times, args.round, centre)
                within[name] += worst <= AA_BAR
                print(f"| {shape} | {label} | {len(times)} | {name} | {stops} of {rounds} | "
                      f"{worst:.2f} | {split:.2f} |")
    if not series:
        raise SystemExit(f"{args.dump}: no series of at least {2 * args.round} calls")
    print("\n" + ", ".join(f"{name}: every neighbouring-round A/A within {AA_BAR:g}% in "
                           f"{n} of {series} series" for name, n in within.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
