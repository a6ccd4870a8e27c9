"""Replay recorded calls through two centres of a benchmark's timed calls: the median the harness
reports and the interquartile mean (IQM), tried in its place and measured worse (issues 31 and
32; notes/timing.md, "The interquartile mean as the centre: tried, reverted").

    python3 bench/centre_replay.py DUMP.json [--round 150]

``DUMP.json`` is ``bench/spread_probe.py --dump``'s record (shape -> "kernel / protocol" ->
every call's microseconds in call order). Each series is cut into consecutive rounds of
``--round`` calls, as the harness's rounds of a short benchmark take them. Per series and
centre it prints:
- stops: in how many rounds the centre's 95% interval was within 1% of it after all the
  round's calls (a round that does not stop runs its whole share);
- calls at the stop: replayed call by call from every ``--round // 2``-th call, as the harness's
  stop reads it (the first count of at least 5 calls at which the interval is within 1%), the
  median count over the windows that stopped, and how many did;
- A/A: each round's centre over the next round's, the largest distance from 1 (%), as two copies
  of one kernel in neighbouring rounds would read;
- the pooled centre of the first half of the rounds over the second half's (%).
A last line counts, per centre, the series whose every A/A distance stayed within 2%.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from pytest_kscientist.api import median_interval, t95  # noqa: E402  (after the path)

PRECISION = 0.01
FIRST_STOP = 5  # the fewest calls a round of fp8_gemm's 4 may stop at (rounds.py)
AA_BAR = 2.0


def interquartile_mean(times: Sequence[float]) -> float:
    """The mean of the middle half of ``times`` (a 25% trimmed mean; under 4 values, their mean).
    Unlike the median it does not jump between two groups of calls split near half and half."""
    ordered = sorted(times)
    n = len(ordered)
    if n == 0:
        raise ValueError("interquartile_mean() needs at least one value, got none")
    cut = n // 4
    return statistics.fmean(ordered[cut:n - cut])


def interquartile_interval(times: Sequence[float]) -> tuple[float, float]:
    """A ~95% interval of the interquartile mean (Tukey and McLaughlin: the standard error from
    the winsorized sample, Student's t on the trimmed count); under 6 calls the whole range.
    It assumes independent calls, which a GPU's slower states of many calls are not."""
    ordered = sorted(times)
    n = len(ordered)
    if n == 0:
        raise ValueError("interquartile_interval() needs at least one value, got none")
    if n < 6:
        return ordered[0], ordered[-1]
    cut = n // 4
    kept = n - 2 * cut
    low_edge, high_edge = ordered[cut], ordered[n - cut - 1]
    winsorized = [min(max(t, low_edge), high_edge) for t in ordered]
    half = t95(kept - 1) * statistics.stdev(winsorized) / (kept / n) / math.sqrt(n)
    centre = statistics.fmean(ordered[cut:n - cut])
    return centre - half, centre + half


Centre = tuple[Callable[[Sequence[float]], float],
               Callable[[Sequence[float]], tuple[float, float]]]
CENTRES: dict[str, Centre] = {
    "median": (statistics.median, median_interval),
    "IQM": (interquartile_mean, interquartile_interval),
}


def precise(times: Sequence[float], centre: Centre) -> bool:
    value, interval = centre
    low, high = interval(times)
    return (high - low) / 2 <= PRECISION * value(times)


def stop_at(times: Sequence[float], centre: Centre) -> int | None:
    """The first call count (at least FIRST_STOP) at which the centre is precise, or None."""
    return next((n for n in range(FIRST_STOP, len(times) + 1) if precise(times[:n], centre)),
                None)


def replay(times: list[float], size: int, centre: Centre
           ) -> tuple[int, int, float | None, int, int, float, float]:
    """(rounds precise at their end, rounds, median calls at the stop, windows that stopped,
    windows, worst neighbouring-round distance %, half-vs-half %)."""
    value, _ = centre
    rounds = [times[i:i + size] for i in range(0, len(times) - size + 1, size)]
    precise_rounds = sum(precise(r, centre) for r in rounds)
    windows = [times[i:i + size] for i in range(0, len(times) - size + 1, max(size // 2, 1))]
    stops = [n for n in (stop_at(w, centre) for w in windows) if n is not None]
    pairs = [value(a) / value(b) for a, b in zip(rounds, rounds[1:], strict=False)]
    worst = max((abs(p - 1) * 100 for p in pairs), default=0.0)
    half = len(rounds) // 2
    split = 0.0
    if half:
        first = [t for r in rounds[:half] for t in r]
        second = [t for r in rounds[half:2 * half] for t in r]
        split = abs(value(first) / value(second) - 1) * 100
    return (precise_rounds, len(rounds), statistics.median(stops) if stops else None,
            len(stops), len(windows), worst, split)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dump", type=Path)
    parser.add_argument("--round", type=int, default=150, help="calls a round (default 150)")
    args = parser.parse_args()
    record = json.loads(args.dump.read_text())
    print("| shape | series | calls | centre | rounds precise | calls at the stop (windows "
          "that stopped) | worst A/A, neighbouring rounds % | first half vs second % |")
    print("|---|---|---|---|---|---|---|---|")
    within = {name: 0 for name in CENTRES}
    series = 0
    for shape, by_series in record.items():
        for label, times in by_series.items():
            if len(times) < 2 * args.round:
                continue
            series += 1
            for name, centre in CENTRES.items():
                precise_n, rounds, at, stopped, windows, worst, split = replay(
                    times, args.round, centre)
                within[name] += worst <= AA_BAR
                calls = "-" if at is None else f"{at:g}"
                print(f"| {shape} | {label} | {len(times)} | {name} | {precise_n} of {rounds} | "
                      f"{calls} ({stopped} of {windows}) | {worst:.2f} | {split:.2f} |")
    if not series:
        raise SystemExit(f"{args.dump}: no series of at least {2 * args.round} calls")
    print("\n" + ", ".join(f"{name}: every neighbouring-round A/A within {AA_BAR:g}% in "
                           f"{n} of {series} series" for name, n in within.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
