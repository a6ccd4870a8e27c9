"""Where a kernel's warps stall, by reason and by SASS instruction, from ncu's source page.

    ncu --section SourceCounters --kernel-name regex:gemm_kernel --launch-skip 2 \
        --launch-count 1 -o REP python3 bench/cuda_profile.py m6144-n4608-k7168
    ncu --import REP.ncu-rep --page source --csv --print-source sass > REP.sass.csv
    python3 bench/sass_stalls.py REP.sass.csv [--top 25]

Prints the share of all warp-stall samples per reason, then the instructions holding the most
samples with their three largest reasons (the instruction a warp was waiting to issue: a stall
on a register written by a load lands on the first instruction that reads it).
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections import Counter

SAMPLES = "Warp Stall Sampling (All Samples)"


def read(path: str) -> tuple[list[str], list[list[str]]]:
    """The header row and the instruction rows of ncu's ``--page source --csv`` output."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    for at, row in enumerate(rows):
        if SAMPLES in row:
            header = row
            return header, [r for r in rows[at + 1:] if len(r) == len(header)]
    raise SystemExit(f"{path}: no {SAMPLES!r} column; was the report taken with "
                     "--section SourceCounters and exported with --page source --csv?")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("csv", help="ncu --page source --csv --print-source sass output")
    parser.add_argument("--top", type=int, default=25, help="instructions to list")
    args = parser.parse_args(argv)
    header, rows = read(args.csv)
    col = {name: i for i, name in enumerate(header)}
    reasons = [h for h in header if h.startswith("stall_") and "(Not Issued)" not in h]
    count = lambda row, name: int(row[col[name]] or 0)  # noqa: E731
    total = sum(count(r, SAMPLES) for r in rows)
    if total == 0:
        raise SystemExit(f"{args.csv}: no stall samples")
    by_reason = Counter({h[len("stall_"):]: sum(count(r, h) for r in rows) for h in reasons})
    print(f"{total} samples")
    for reason, n in by_reason.most_common():
        if n:
            print(f"  {reason:20s} {100 * n / total:5.1f}%")
    print(f"top {args.top} instructions (address, share, SASS, largest reasons):")
    for row in sorted(rows, key=lambda r: -count(r, SAMPLES))[:args.top]:
        top = sorted(((count(row, h), h[len("stall_"):]) for h in reasons), reverse=True)[:3]
        why = " ".join(f"{name}:{n}" for n, name in top if n)
        print(f"  {row[col['Address']][-6:]} {100 * count(row, SAMPLES) / total:5.1f}% "
              f"{row[col['Source']].strip()[:64]:64s} {why}")


if __name__ == "__main__":
    sys.exit(main())
