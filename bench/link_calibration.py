"""How well the links' intervals are calibrated, read from an evolve population's own records.

    python3 bench/link_calibration.py POPULATION_DIR    # e.g. population/fp8_gemm

A child that moves the knobs of some shapes only, or grafts another kernel onto some
(``evolve/offline/links.py``), runs its parent's kernel on the benchmarks it left at
the parent's knob point: there the same kernel
was timed twice, beside itself, an A/A test inside every such link. Printed: how many of those
benchmarks' 95% intervals exclude 1 (about 5% when they are calibrated); then, per child, the
mean log ratio over them divided by its standard error, the error taken two ways: as the
benchmarks' errors moving together (what a link's interval assumes: the geomean of the bounds)
and as independent (the root of the summed squares over n), with how many children lie beyond
1.96 each way (about 5% for the assumption that is calibrated; fewer for a conservative one).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pytest_kscientist.api import Member, Population, split  # noqa: E402  (after the path)

Z95 = 1.96


@dataclass(frozen=True)
class Group:
    """One child's benchmarks at its parent's knob point: how many, and its z both ways."""

    child: str
    n: int
    z_together: float
    z_independent: float


def groups(members: Sequence[Member]) -> tuple[list[Group], int, int]:
    """Per child of a knob move, its A/A group (at least two benchmarks), and over all of them
    how many per-benchmark intervals exclude 1, of how many."""
    by_id = {m.id: m for m in members}
    out, outside, total = [], 0, 0
    for m in members:
        parent = by_id.get(m.meta.parents[0]) if m.meta.parents else None
        found = split(m, parent) if parent is not None and m.status == "passed" else None
        if found is None:
            continue
        kept = found[1]
        outside += sum(low > 1 or high < 1 for _, low, high in kept)
        total += len(kept)
        if len(kept) < 2:
            continue
        logs = [math.log(r) for r, _, _ in kept]
        errors = [(math.log(high) - math.log(low)) / (2 * Z95) for _, low, high in kept]
        mean = sum(logs) / len(logs)
        together = sum(errors) / len(errors)
        independent = math.sqrt(sum(e * e for e in errors)) / len(errors)
        if together > 0 and independent > 0:
            out.append(Group(m.id, len(kept), mean / together, mean / independent))
    return out, outside, total


def report(found: list[Group], outside: int, total: int) -> list[str]:
    """The lines printed: the per-benchmark count, a row per child, the counts beyond 1.96."""
    lines = [f"benchmarks at the parent's point whose interval excludes 1: {outside} of {total}"
             + (f" ({outside / total:.1%})" if total else ""),
             "", "| child | benchmarks | z, errors together | z, errors independent |",
             "|---|---|---|---|"]
    lines += [f"| {g.child} | {g.n} | {g.z_together:+.2f} | {g.z_independent:+.2f} |"
              for g in found]
    beyond = [sum(abs(z) > Z95 for z in zs) for zs in
              ([g.z_together for g in found], [g.z_independent for g in found])]
    lines += ["", f"children beyond |z| {Z95}: {beyond[0]} of {len(found)} with the errors "
              f"together, {beyond[1]} of {len(found)} taken as independent"]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("population", type=Path, help="one task's folder of a population")
    args = parser.parse_args()
    folder = args.population.resolve()
    if not folder.is_dir():
        raise SystemExit(f"{folder}: no such population folder; pass one task's folder, "
                         "e.g. population/fp8_gemm")
    members = Population(folder, folder.name).members()
    print("\n".join(report(*groups(members))))


if __name__ == "__main__":
    main()
