"""Performance gates for CI: a ``gate[...]`` item per candidate, collected after its benchmarks.

- ``--ks-min-speedup NAME=FACTOR``: the candidate's geomean speedup over baseline NAME (timed
  interleaved with it) or over the ``reference`` must be at least FACTOR.
- ``--ks-max-regression PERCENT`` with ``--ks-compare PATH``: the candidate's geomean over the
  benchmarks it shares with PATH (a ``--ks-json`` file of an earlier run) may be at most
  PERCENT slower than it was there.

A gate passes, fails with a one-line reason, or is skipped when it cannot be judged in this
run (its benchmarks deselected, a baseline this device cannot run, no earlier result).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest
from pydantic import ValidationError

from pytest_kscientist.harness.results import CandidateResult, CaseResult, RunResults
from pytest_kscientist.harness.stats import geomean

REFERENCE = "reference"


@dataclass(frozen=True)
class Verdict:
    outcome: Literal["passed", "failed", "skipped"]
    message: str


def read_saved(path: Path) -> list[RunResults]:
    """The runs in a ``--ks-json`` file; a usage error naming the flag when it is not one."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise pytest.UsageError(
            f"--ks-compare {path}: no such file; expected the --ks-json file of an earlier run "
            "(e.g. pytest tasks/fp8_gemm --ks-json baseline.json)"
        ) from None
    except (OSError, ValueError) as exc:
        raise pytest.UsageError(
            f"--ks-compare {path}: not readable as JSON ({exc}); pass a file written by --ks-json"
        ) from None
    try:
        items = raw if isinstance(raw, list) else [raw]
        return [RunResults.model_validate(item) for item in items]
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise pytest.UsageError(
            f"--ks-compare {path}: not a pytest-kscientist results file (field '{where}': "
            f"{first['msg']}); pass a file written by --ks-json"
        ) from None


def _timed(cand: CandidateResult | None, who: str) -> tuple[list[CaseResult], Verdict | None]:
    """The benchmarks of ``cand`` in this run, or the verdict when they cannot be judged."""
    bench = [c for c in cand.cases if c.kind == "bench"] if cand else []
    if not bench:
        return [], Verdict("skipped", f"no benchmark of '{who}' ran in this session; select its "
                                      f"bench items too (e.g. -k '{who}')")
    failed = [c for c in bench if c.outcome != "passed" or c.stats is None]
    if failed:
        return [], Verdict("failed", f"{len(failed)} of {len(bench)} benchmark(s) of '{who}' "
                                     f"failed ({failed[0].case_id}: {failed[0].reason}); "
                                     "nothing to gate on")
    return bench, None


def min_speedup(cand: CandidateResult | None, name: str, factor: float,
                results: dict[str, CandidateResult], skipped: dict[str, str]) -> Verdict:
    """Is the geomean speedup of ``cand`` over baseline ``name`` at least ``factor``?"""
    who = cand.name if cand else "the candidate"
    bench, verdict = _timed(cand, who)
    if verdict:
        return verdict
    flag = f"--ks-min-speedup {name}={factor:g}"
    if name == REFERENCE:
        ref = {c.case_id: c for c in results[REFERENCE].cases} if REFERENCE in results else {}
        pairs = [(ref[c.case_id], c) for c in bench if c.case_id in ref]
        missing = [c.case_id for c in bench if c.case_id not in ref]
        if missing or any(r.outcome != "passed" or r.stats is None for r, _ in pairs):
            return Verdict("skipped", f"the reference was not timed on every benchmark of "
                                      f"'{who}' in this session; select its bench items too")
        ratios = {c.case_id: r.stats.median_us / c.stats.median_us  # type: ignore[union-attr]
                  for r, c in pairs}
    else:
        if name in skipped:
            return Verdict("skipped", f"{flag} not judged: {skipped[name]}")
        ratios = {}
        for c in bench:
            timing = c.baselines.get(name)
            if timing is None or timing.speedup is None:
                why = timing.reason if timing else f"baseline '{name}' was not timed beside it"
                return Verdict("failed", f"{who}: no speedup over {name} on {c.case_id}: {why}")
            ratios[c.case_id] = timing.speedup
    speedup = geomean(list(ratios.values()))
    worst = min(ratios, key=lambda k: ratios[k])
    text = (f"{who}: geomean speedup over {name} is {speedup:.3f}x over {len(ratios)} "
            f"benchmark(s)")
    if any(not t.verified for c in bench if (t := c.baselines.get(name)) is not None):
        text += f" ({name} missed the check beside it: a yardstick only, verify = \"report\")"
    if speedup < factor:
        return Verdict("failed", f"{text}, below the required {factor:g}x ({flag}); slowest "
                                 f"relative to it: {worst} at {ratios[worst]:.3f}x")
    return Verdict("passed", f"{text} (required {factor:g}x)")


def ratios_to_saved(bench: list[CaseResult], then: CandidateResult) -> dict[str, float]:
    """case id -> median now / median then, over the passed benchmarks both runs timed."""
    old = {c.case_id: c.stats.median_us for c in then.cases
           if c.kind == "bench" and c.outcome == "passed" and c.stats and c.stats.median_us > 0}
    return {c.case_id: c.stats.median_us / old[c.case_id] for c in bench
            if c.case_id in old and c.outcome == "passed" and c.stats and c.stats.median_us > 0}


def saved_change(cand: CandidateResult, task: str,
                 saved: tuple[RunResults, ...]) -> float | None:
    """Geomean time change against the same candidate in ``saved`` (+0.05: 5% slower)."""
    then_run = next((r for r in saved if r.task == task), None)
    then = next((c for c in then_run.candidates if c.name == cand.name), None) if then_run else None
    if then is None:
        return None
    ratios = ratios_to_saved([c for c in cand.cases if c.kind == "bench"], then)
    return geomean(list(ratios.values())) - 1.0 if ratios else None


def max_regression(cand: CandidateResult | None, task: str, profile: str, limit: float,
                   path: Path, saved: tuple[RunResults, ...]) -> Verdict:
    """Is ``cand`` at most ``limit`` (a fraction) slower than its result in ``saved``?"""
    who = cand.name if cand else "the candidate"
    bench, verdict = _timed(cand, who)
    if verdict:
        return verdict
    flag = f"--ks-max-regression {limit * 100:.4g}%"
    then_run = next((r for r in saved if r.task == task), None)
    if then_run is None:
        held = ", ".join(sorted({r.task for r in saved})) or "none"
        return Verdict("failed", f"--ks-compare {path} holds no results for task '{task}' "
                                 f"(it has: {held}); pass the --ks-json file of a run of this task")
    then_cand = next((c for c in then_run.candidates if c.name == who), None)
    if then_cand is None:
        return Verdict("skipped", f"'{who}' has no result in {path}; nothing to compare with")
    ratios = ratios_to_saved(bench, then_cand)
    if not ratios:
        return Verdict("failed", f"{who}: no benchmark in common with {path} (profile {profile} "
                                 f"now, {then_run.profile} then); compare runs of one profile")
    change = geomean(list(ratios.values())) - 1.0
    worst = max(ratios, key=lambda k: ratios[k])
    text = (f"{who}: {abs(change):.1%} {'slower' if change > 0 else 'faster'} than in {path} "
            f"(geomean over {len(ratios)} common benchmark(s))")
    if change > limit:
        return Verdict("failed", f"{text}, more than the allowed {flag}; worst: {worst} "
                                 f"{ratios[worst] - 1:+.1%}")
    return Verdict("passed", f"{text}; allowed {flag}")
