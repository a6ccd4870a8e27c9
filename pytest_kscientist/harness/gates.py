"""Performance gates for CI: a ``gate[...]`` item per candidate, collected after its benchmarks.

- ``--ks-min-speedup NAME=FACTOR``: the candidate's geomean speedup over baseline NAME (timed
  interleaved with it) or over the ``reference`` must be at least FACTOR.
- ``--ks-max-regression PERCENT`` with ``--ks-compare PATH``: the candidate's geomean over the
  benchmarks it shares with PATH (a ``--ks-json`` file of an earlier run) may be at most
  PERCENT slower than it was there.

A gate passes, fails with a one-line reason (also when none of its candidate's benchmarks ran
in this session: "not judged"), or is skipped when this machine cannot judge it (a baseline this
device cannot run, no earlier result). ``-k bench`` keeps gates (their keyword); one deselected
while its candidate's benchmarks run is named in a ``KsGateDeselected`` warning.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import pytest
from pydantic import ValidationError

from pytest_kscientist.harness.results import (
    CandidateResult,
    CaseResult,
    MachineInfo,
    RunResults,
)
from pytest_kscientist.harness.stats import geomean, ratio_interval

REFERENCE = "reference"


@dataclass(frozen=True)
class Verdict:
    outcome: Literal["passed", "failed", "skipped"]
    message: str
    undecided: bool = False  # passed on the noise: the change is past the limit, its interval not


def read_saved(path: Path, name: str = "--ks-compare") -> list[RunResults]:
    """The runs in a ``--ks-json`` file; a usage error naming the option (``name``: the flag,
    or its ini key) when it is not one."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise pytest.UsageError(
            f"{name} {path}: no such file; expected the --ks-json file of an earlier run "
            "(e.g. pytest tasks/fp8_gemm --ks-json baseline.json)"
        ) from None
    except (OSError, ValueError) as exc:
        raise pytest.UsageError(
            f"{name} {path}: not readable as JSON ({exc}); pass a file written by --ks-json"
        ) from None
    try:
        items = raw if isinstance(raw, list) else [raw]
        return [RunResults.model_validate(item) for item in items]
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise pytest.UsageError(
            f"{name} {path}: not a pytest-kscientist results file (field '{where}': "
            f"{first['msg']}); pass a file written by --ks-json"
        ) from None


def _timed(cand: CandidateResult | None, who: str) -> tuple[list[CaseResult], Verdict | None]:
    """The benchmarks of ``cand`` in this run, or the verdict when they cannot be judged."""
    bench = [c for c in cand.cases if c.kind == "bench"] if cand else []
    if not bench:
        # Failed, not skipped: a gate asked for must not pass a run it could not judge (a
        # rerun with --lf or --sw selected the failed gate alone, and exited 0).
        return [], Verdict("failed", f"not judged: no benchmark of '{who}' ran in this "
                                     f"session; select its bench items too (e.g. -k '{who} and "
                                     "(bench or gate)'), or deselect the gate")
    failed = [c for c in bench if c.outcome != "passed" or c.stats is None]
    if failed:
        return [], Verdict("failed", f"{len(failed)} of {len(bench)} benchmark(s) of '{who}' "
                                     f"failed ({failed[0].case_id}: {failed[0].reason}); "
                                     "nothing to gate on")
    return bench, None


def min_speedup(who: str, cand: CandidateResult | None, name: str, factor: float,
                results: dict[str, CandidateResult], skipped: dict[str, str],
                option: str = "--ks-min-speedup") -> Verdict:
    """Is the geomean speedup of candidate ``who`` (its results ``cand``, None when none came)
    over baseline ``name`` at least ``factor``? ``option``: how the user named the gate
    (``Settings.quoted``)."""
    bench, verdict = _timed(cand, who)
    if verdict:
        return verdict
    flag = f"{option} {name}={factor:g}"
    if name == REFERENCE:
        ref = {c.case_id: c for c in results[REFERENCE].cases} if REFERENCE in results else {}
        pairs = [(ref[c.case_id], c) for c in bench if c.case_id in ref]
        missing = [c.case_id for c in bench if c.case_id not in ref]
        if missing or any(r.outcome != "passed" or r.stats is None for r, _ in pairs):
            return Verdict("failed", f"not judged: the reference was not timed on every "
                                     f"benchmark of '{who}' in this session; select its bench "
                                     "items too, or deselect the gate")
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


def saved_change(cand: CandidateResult, task: str, saved: tuple[RunResults, ...],
                 reference: CandidateResult | None = None,
                 machine: MachineInfo | None = None) -> Change | None:
    """The change against the same candidate in ``saved`` (``saved_pair``): against its saved
    file timed beside it in this run (``change_beside``) where that was timed, else through the
    reference (``change_against``); None when ``saved`` has no result for it.

    Where both were measured and they disagree beyond their intervals, either the saved copy
    does not run here as it ran then (it imports a helper module or reads a data file that
    changed since: a helper made ten times slower slowed both copies alike and read "0.1%
    faster"), or the machine's load moved the two sessions' kernels unlike each other. The
    first moves the saved copy's own time between the runs while the reference's holds; the
    second moves the reference too (on the loaded 2-core CPU an unchanged kernel read "+336%"
    through the reference, whose own time had moved -52%). So the reference decides, with the
    disagreeing reading kept (``Change.beside``), only where the saved copy's time moved more
    than twice as far as the reference's (in log terms); else the reading beside stands, with
    the other reading kept (``Change.moved``). Not where the saved run was made on another
    machine than ``machine`` (this run's): there the reference's reading holds nothing."""
    run, then, then_ref = saved_pair(task, cand, saved)
    if run is None or then is None:
        return None
    beside = change_beside(cand)
    against = change_against(cand, reference, then, then_ref)
    if beside is None:
        return against
    if (against is None or against.through != "the reference"
            or _other_machine(run.machine, machine) or not _disagree(beside, against)):
        return beside
    own, ref_moved = _time_moved(cand, then), _time_moved(reference, then_ref)
    if own is None or ref_moved is None:
        return replace(against, beside=beside)
    copy_moved = own / (1 + beside.change)  # the saved copy's own time, now / then
    if abs(math.log(copy_moved)) > 2 * abs(math.log(ref_moved)):
        return replace(against, beside=beside)
    return replace(beside, moved=(against, ref_moved, copy_moved))


def _time_moved(now: CandidateResult | None, then: CandidateResult | None) -> float | None:
    """The geomean of a kernel's median times now / then over their common passed
    benchmarks (the machine's drift included); None where they have none."""
    mine, old = _passed_bench(now), _passed_bench(then)
    ratios = [_median(mine[k]) / _median(old[k]) for k in mine if k in old]
    return geomean(ratios) if ratios else None


def _median(case: CaseResult) -> float:
    """A passed benchmark's median (``_passed_bench`` keeps only those with one above 0)."""
    assert case.stats is not None
    return case.stats.median_us


def _disagree(one: Change, other: Change) -> bool:
    """Do two readings of one change differ by more than their 95% intervals allow (the
    difference of the log-changes beyond the half-widths added in quadrature)? False where
    either has no interval."""
    halves = []
    for c in (one, other):
        if c.low is None or c.high is None:
            return False
        halves.append(math.log((1 + c.high) / (1 + c.low)) / 2)
    return abs(math.log((1 + one.change) / (1 + other.change))) > math.hypot(*halves)


# The name of the partner --ks-compare times beside a candidate: its stem and this
# (collect.TaskFile._saved_beside).
SAVED_SUFFIX = "_saved"


def change_beside(now: CandidateResult) -> Change | None:
    """``now`` against its saved file timed beside it in this run's rounds (``--ks-compare``
    with a saved result of schema 7: collect.TaskFile._saved_beside), over the benchmarks
    where both were timed: per case the inverse of the speedup over the saved copy, with its
    interval; over cases their geomean and the mean half-width. Both kernels shared every
    round, so the machine's drift between sessions never enters. None when no benchmark
    timed the saved copy (it failed to load or run here: the caller falls back)."""
    name = now.name + SAVED_SUFFIX
    ratios: dict[str, float] = {}
    widths: list[float | None] = []
    for k, case in _passed_bench(now).items():
        beside = case.baselines.get(name)
        if beside is None or not beside.speedup:
            continue
        ratios[k] = 1.0 / beside.speedup  # time now / then: > 1 when it got slower
        lo, hi = beside.speedup_low, beside.speedup_high
        widths.append(math.log(hi / lo) / 2 if lo and hi and lo > 0 else None)
    return _pooled(ratios, widths, "beside") if ratios else None


@dataclass(frozen=True)
class Change:
    """A candidate's geomean time change against a saved run (+0.05: 5% slower), with its
    95% interval, and what it was measured through."""

    change: float
    low: float | None
    high: float | None
    cases: dict[str, float]  # case id -> time ratio now / then
    # "beside" (the saved file timed in this run's rounds), "the reference" (timed in both
    # runs) or "" (raw medians: machine drift not cancelled)
    through: str
    # Through the reference, where the saved file timed beside read this and disagreed.
    beside: Change | None = None
    # Beside, where the reference's reading disagreed but the reference's own time moved as
    # far as the saved copy's: (that reading, the reference's time now / then, the copy's).
    moved: tuple[Change, float, float] | None = None


def _vs_reference(case: CaseResult, ref: dict[str, CaseResult]
                  ) -> tuple[float, float | None, float | None] | None:
    """The case's speedup over the reference (ref median / its median) with an interval:
    from the rounds both were timed in when they were (rounds.py), else from two medians."""
    paired_ = case.fellows.get(REFERENCE)
    if paired_ is not None and paired_.speedup:
        return paired_.speedup, paired_.speedup_low, paired_.speedup_high
    other = ref.get(case.case_id)
    if other is None or other.outcome != "passed" or not other.stats or not case.stats:
        return None
    if other.stats.median_us <= 0 or case.stats.median_us <= 0:
        return None
    bounds = ratio_interval(other.stats, case.stats)
    return (other.stats.median_us / case.stats.median_us, *(bounds or (None, None)))


def _passed_bench(cand: CandidateResult | None) -> dict[str, CaseResult]:
    return {c.case_id: c for c in cand.cases if c.kind == "bench" and c.outcome == "passed"
            and c.stats and c.stats.median_us > 0} if cand else {}


def change_against(now: CandidateResult, now_ref: CandidateResult | None,
                   then: CandidateResult, then_ref: CandidateResult | None) -> Change | None:
    """``now`` against ``then`` over their common passed benchmarks, through the reference
    where both runs timed it (its time cancels the machine's drift between the sessions),
    else through the raw medians. The interval is conservative: per case, the two runs'
    log half-widths added in quadrature; over cases, their mean (as the speedup intervals)."""
    mine, old = _passed_bench(now), _passed_bench(then)
    refs_now, refs_then = _passed_bench(now_ref), _passed_bench(then_ref)
    common = [k for k in mine if k in old]
    if not common:
        return None
    ratios: dict[str, float] = {}
    widths: list[float | None] = []
    through = "the reference"
    pairs = {k: (_vs_reference(mine[k], refs_now), _vs_reference(old[k], refs_then))
             for k in common}
    if not all(a and b for a, b in pairs.values()):
        through = ""
    for k in common:
        a, b = pairs[k]
        if through and a and b:
            ratios[k] = b[0] / a[0]  # speedup then / now: > 1 when it got slower
            halves = [math.log(hi / lo) / 2 for _, lo, hi in (a, b) if lo and hi and lo > 0]
            widths.append(math.hypot(*halves) if len(halves) == 2 else None)
        else:
            x, y = mine[k].stats, old[k].stats
            assert x is not None and y is not None
            ratios[k] = x.median_us / y.median_us
            bounds = ratio_interval(x, y)
            widths.append(math.log(bounds[1] / bounds[0]) / 2 if bounds else None)
    return _pooled(ratios, widths, through)


def _pooled(ratios: dict[str, float], widths: list[float | None], through: str) -> Change:
    """Per-case time ratios (now / then) and their interval's log half-widths as one Change:
    their geomean, and the mean half-width around it (None when a case has none)."""
    centre = math.log(geomean(list(ratios.values())))
    low = high = None
    if all(w is not None for w in widths):
        half = sum(w for w in widths if w is not None) / len(widths)
        low, high = math.exp(centre - half) - 1.0, math.exp(centre + half) - 1.0
    return Change(math.exp(centre) - 1.0, low, high, ratios, through)


def saved_pair(task: str, cand: CandidateResult, saved: tuple[RunResults, ...]
               ) -> tuple[RunResults | None, CandidateResult | None, CandidateResult | None]:
    """The saved run of ``task``, ``cand``'s result in it and the reference's: ``cand`` by
    its name, else a saved candidate whose file held the same text (``saved_candidate``)."""
    run = next((r for r in saved if r.task == task), None)
    if run is None:
        return None, None, None
    then = saved_candidate(run, cand.name, cand.source if cand.role == "candidate" else None)
    return run, then, saved_candidate(run, REFERENCE, None)


def saved_candidate(run: RunResults, name: str, source: str | None) -> CandidateResult | None:
    """``name``'s result in the saved ``run``, else that of a saved candidate whose file held
    ``source`` (the same file renamed since); None when it holds neither."""
    named = next((c for c in run.candidates if c.name == name), None)
    if named is not None or not source:
        return named
    return next((c for c in run.candidates if c.role == "candidate" and c.source == source),
                None)


def not_beside(now: CandidateResult) -> str:
    """Why the saved copy of ``now`` was not timed beside it in any benchmark (its first
    reason: it failed to load or run here), or "" where it was not asked for."""
    name = now.name + SAVED_SUFFIX
    for case in now.cases:
        timing = case.baselines.get(name)
        if timing is not None and timing.reason:
            return f"{case.case_id}: {timing.reason}"
    return ""


def max_regression(who: str, cand: CandidateResult | None, task: str, profile: str,
                   limit: float, path: Path, saved: tuple[RunResults, ...],
                   reference: CandidateResult | None = None,
                   option: str = "--ks-max-regression",
                   compare_option: str = "--ks-compare",
                   machine: MachineInfo | None = None) -> Verdict:
    """Is candidate ``who`` (its results ``cand``) at most ``limit`` (a fraction) slower than
    its result in ``saved``? ``option`` and ``compare_option``: how the user named the gate and
    the saved file (``Settings.quoted``); ``machine``: this run's.

    Measured against the saved file timed beside it in this run (``change_beside``), else
    through the reference timed in both sessions (``change_against``), which holds only on
    one machine; the gate fails only when the change is beyond the limit and its 95% interval
    excludes no change, so an unchanged kernel on a noisy machine passes (issue 31:
    pytest-benchmark's median:5% check failed an unchanged kernel on the 2-core CPU at +7.4%).
    A kernel the saved run does not hold fails: a gate asked for must not pass unjudged.
    """
    bench, verdict = _timed(cand, who)
    if verdict:
        return verdict
    assert cand is not None
    flag = f"{option} {limit * 100:.4g}%"
    then_run, then_cand, then_ref = saved_pair(task, cand, saved)
    if then_run is None:
        held = ", ".join(sorted({r.task for r in saved})) or "none"
        return Verdict("failed", f"{compare_option} {path} holds no results for task '{task}' "
                                 f"(it has: {held}); pass the --ks-json file of a run of this task")
    if then_cand is None and then_run.interrupted:
        return Verdict("failed", f"'{who}' has no result in {path}, written by a run that was "
                                 "interrupted before its items ran (Ctrl-C, a cancelled CI job, "
                                 "-x): not a run to compare with; save one that finished")
    if then_cand is None:
        held = ", ".join(c.name for c in then_run.candidates if c.role == "candidate") or "none"
        return Verdict("failed", f"'{who}' has no result in {path} (its candidates: {held}; "
                                 "none ran this file's text either): nothing to gate it on; "
                                 "name the kernel's file as the saved run did, or save a run "
                                 "of it with --ks-json")
    found = saved_change(cand, task, saved, reference, machine)
    then_failed = [c for c in then_cand.cases if c.kind == "bench" and c.outcome != "passed"]
    if found is None and then_failed and not _passed_bench(then_cand):
        first = then_failed[0]
        return Verdict("failed", f"{who}: no benchmark of it passed in {path} (first: "
                                 f"{first.case_id}: {first.reason}); nothing to compare with; "
                                 "save a run in which it passes")
    if found is None:
        return Verdict("failed", f"{who}: no benchmark in common with {path} (profile {profile} "
                                 f"now, {then_run.profile} then); compare runs of one profile")
    renamed = f" (saved as '{then_cand.name}')" if then_cand.name != who else ""
    why = _why(cand, found, path)
    elsewhere = _other_machine(then_run.machine, machine)
    if found.through != "beside" and elsewhere:
        return Verdict("failed", f"{who}: not judged: {path} was run on {elsewhere}, and its "
                                 "file was not timed beside it here; speedups over the reference "
                                 "do not carry from one machine to another; save a run on this "
                                 f"machine (--ks-json).{why}")
    worst = max(found.cases, key=lambda k: found.cases[k])
    how = {"beside": f"against its file as {path} ran it, timed beside it in this run",
           "the reference": "through the reference timed in both runs"}.get(
        found.through, "from raw medians (the reference was not timed in both runs: machine "
                       "drift between the sessions is not cancelled)")
    text = (f"{who}{renamed}: {_reading(found, f' than in {path}')} (geomean over "
            f"{len(found.cases)} common benchmark(s), {how})")
    beyond = found.change > limit and (found.low is None or found.low > 0)
    if beyond:
        return Verdict("failed", f"{text}, more than the allowed {flag}; worst: {worst} "
                                 f"{found.cases[worst] - 1:+.1%}.{why}")
    if found.change > limit:
        return Verdict("passed", f"{text}; beyond {flag} but within the noise measured (the "
                                 "interval holds no change); time more calls (--ks-bench-budget) "
                                 f"to decide.{why}", undecided=True)
    return Verdict("passed", f"{text}; allowed {flag}.{why}")


def _reading(found: Change, than: str = "") -> str:
    """'10.0% slower{than}, 95% interval +4.6% to +16.4%'."""
    span = ("" if found.low is None or found.high is None
            else f", 95% interval {found.low:+.1%} to {found.high:+.1%}")
    return f"{abs(found.change):.1%} {'slower' if found.change > 0 else 'faster'}{than}{span}"


def _why(cand: CandidateResult, found: Change, path: Path) -> str:
    """What the verdict adds about the other reading, as a sentence: where the reading beside
    stands, that the reference's disagreed but had moved itself; else why the change was not
    read beside (that reading disagreed with the reference's, or the copy failed here)."""
    if found.moved is not None:
        against, ref_moved, copy_moved = found.moved
        return (f" Through the reference it read {_reading(against)}, which disagrees beyond "
                f"the intervals; but the reference's own time moved {ref_moved - 1:+.1%} "
                f"between the runs and the saved copy's {copy_moved - 1:+.1%}: the reference "
                "did not hold still while the copy moved, so the machine was not as it was "
                "then, and the reading beside stands.")
    if found.through == "beside":
        return ""
    if found.beside is not None:
        return (f" Its file as {path} ran it, timed beside it, read {_reading(found.beside)}: "
                "the two readings disagree beyond their intervals, so the saved copy does not "
                "run here as it ran then (does it read a helper module or data file that "
                "changed since?), and the reference decides.")
    failed = not_beside(cand)
    return f" Its file as {path} ran it failed here ({failed})." if failed else ""


def _other_machine(then: MachineInfo, now: MachineInfo | None) -> str:
    """The saved run's machine in words where it is not this run's, else ""."""
    if now is None:
        return ""
    kind = then.device.partition(":")[0], now.device.partition(":")[0]
    if kind[0] == kind[1] and then.device_name == now.device_name:
        return ""
    return f"{then.device} ({then.device_name}), this run on {now.device} ({now.device_name})"
