"""The terminal summary section: one row per candidate, then per-benchmark times."""

from __future__ import annotations

import re
from typing import Any

from pytest_kscientist.harness.compiles import summary_lines
from pytest_kscientist.harness.gates import saved_change
from pytest_kscientist.harness.results import CandidateResult, MachineInfo, RunResults
from pytest_kscientist.harness.scores import timed_benchmarks
from pytest_kscientist.harness.stats import geomean
from pytest_kscientist.harness.task_validation import summary_line

ROLE_ORDER = {"reference": 0, "baseline": 1, "candidate": 2}


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _label(c: CandidateResult) -> str:
    if c.role == "baseline" and c.xfailed:
        return f"{c.name} (baseline, unverified)"
    return c.name if c.role == "candidate" else f"{c.name} ({c.role})"


def _vs(c: CandidateResult, name: str) -> str:
    """A speedup cell; ``*`` when the baseline missed the check beside it (a yardstick only)."""
    cell = _x(c.speedups.get(name))
    interval = c.speedup_intervals.get(name)
    if interval and c.speedups.get(name) is not None:
        cell += f"({interval[0]:.2f}-{interval[1]:.2f})"
    return cell + "*" if c.baseline_verified.get(name) is False else cell


def candidate_table(cands: list[CandidateResult], baselines: list[str] | None = None,
                    saved: tuple[RunResults, ...] = (), task: str = "",
                    machine: MachineInfo | None = None) -> list[str]:
    """Rows: candidate, passed, failed, geomean, speedups (reference, each baseline), floor.

    ``vs_<baseline>`` is timed interleaved with the candidate, with its 95% interval;
    ``floor_frac`` is the geomean of floor_us / median_us; ``vs_saved`` the geomean time
    change against ``--ks-compare``.
    """
    names = baselines or []
    head = ["candidate", "passed", "failed", "geomean_us", "speedup_vs_ref",
            *(f"vs_{n}" for n in names), "floor_frac"]
    if saved:
        head.append("vs_saved")
    reference = next((c for c in cands if c.role == "reference"), None)
    rows = [tuple(head)]
    ranked = sorted(cands, key=lambda c: (c.geomean_us is None, c.geomean_us or 0.0))
    for c in ranked:
        # compile[<arch>] items count as items (issue 29: hip_mfma read "0 0" with its
        # compile item passed)
        built = [x.outcome for x in c.compiles]
        row = [_label(c), str(c.passed + built.count("passed")),
               str(c.failed + built.count("failed")), _us(c.geomean_us),
               _x(c.speedup_over_reference), *(_vs(c, n) for n in names),
               "-" if c.floor_fraction is None else f"{c.floor_fraction:.3g}"]
        if saved:
            # The reference against itself would read +0.0%: its raw change is the drift.
            found = saved_change(c, task, saved, None if c is reference else reference,
                                 machine)
            row.append("-" if found is None else f"{found.change:+.1%}" + (
                "" if found.low is None or found.high is None
                else f"({found.low:+.1%}..{found.high:+.1%})"))
        rows.append(tuple(row))
    return _align(rows)


def pairwise_lines(cands: list[CandidateResult]) -> list[str]:
    """Each candidate against the fastest, from the rounds both were timed in (rounds.py):
    the geomean of the per-case ratios with its 95% interval, and whether it tells them apart.
    """
    ranked = sorted((c for c in cands if c.role == "candidate" and c.geomean_us is not None),
                    key=lambda c: c.geomean_us or 0.0)
    if len(ranked) < 2:
        return []
    best = ranked[0]
    lines = [f"side by side, timed in the same rounds (per benchmark the rounds' median ratio of "
             f"medians, geomean, 95% interval), against the fastest, {best.name}:"]
    for other in ranked[1:]:
        ratio = best.fellow_speedups.get(other.name)
        if ratio is None:
            lines.append(f"  {other.name}: not timed in the same rounds as {best.name} on every "
                         "benchmark (select both candidates' bench items)")
            continue
        low, high = best.fellow_intervals.get(other.name, [None, None])
        if low is None or high is None:
            verdict, span = "", ""
        else:
            span = f" ({low:.3f}-{high:.3f})"
            verdict = ("; the interval holds 1: no difference measured" if low <= 1.0 <= high
                       else f"; {best.name} is faster" if low > 1.0
                       else f"; {other.name} is faster on the paired rounds")
        lines.append(f"  {best.name} vs {other.name}: {ratio:.3f}x{span}{verdict}")
    return lines


def bench_table(cands: list[CandidateResult]) -> list[str]:
    """Rows: each benchmark case's median (us) per column (reference, baselines, candidates),
    the physical floor, then a geomean row."""
    cands = sorted(cands, key=lambda c: ROLE_ORDER.get(c.role, 2))
    names = [c.name for c in cands]
    cases: list[str] = []
    cells: dict[tuple[str, str], str] = {}
    floors: dict[str, float | None] = {}
    for c in cands:
        for case in c.cases:
            if case.kind != "bench":
                continue
            if case.case_id not in cases:
                cases.append(case.case_id)
            if case.floor_us is not None or case.case_id not in floors:
                floors[case.case_id] = case.floor_us
            timed = case.stats is not None and case.outcome in ("passed", "xfailed")
            cells[(case.case_id, c.name)] = (
                _median(case.stats) + ("*" if case.outcome == "xfailed" else "")
                + (f" ={case.timed_as}" if case.timed_as else "")
                if timed and case.stats else "FAIL"
            )
    if not cases:
        return []
    rows = [("benchmark (median us)", *names, "floor_us")]
    for case_id in cases:
        rows.append((case_id, *(cells.get((case_id, n), "-") for n in names),
                     _us(floors[case_id])))
    known = [f for f in floors.values() if f is not None and f > 0]
    geo = [_us(geomean([x.stats.median_us for x in b if x.stats]))
           if (b := timed_benchmarks(c)) and len(b) == len(cases) else "-" for c in cands]
    rows.append(("geomean", *geo, _us(geomean(known)) if len(known) == len(cases) else "-"))
    return _align(rows)


def _median(stats: Any) -> str:
    """A median with the half-width of its 95% interval, in percent of it."""
    cell = _us(stats.median_us)
    if stats.ci_low_us is not None and stats.ci_high_us is not None and stats.median_us > 0:
        cell += f"±{50 * (stats.ci_high_us - stats.ci_low_us) / stats.median_us:.1f}%"
    return cell


def _align(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]


def run_notes(session: Any, task_name: str, cands: list[CandidateResult]) -> list[str]:
    """What has no numbers and why: the reference left untimed, a declared baseline skipped in
    this run or failed beside someone, a candidate whose KS_REQUIRES this device lacks."""
    lines = [f"baseline {b.name} not timed: {b.reason}"
             for b in session.baselines.get(task_name, []) if b.status == "skipped"]
    if session.settings.skip_reference:
        lines.insert(0, "reference not timed (--ks-skip-reference): no speedup_vs_ref")
    lines += [f"not run: {r.not_run}" for r in session.unmet.get(task_name, {}).values()]
    failures = session.machine_failures.get(task_name, [])
    if failures:
        more = f" ({len(failures)} workers in all)" if len(failures) > 1 else ""
        lines.insert(0, f"the machine failed: a worker did not start: {failures[0]}{more}; "
                        "the items that needed it were not judged")
    seen = set()
    for c in cands:
        for case in c.cases:
            for name, timing in case.baselines.items():
                if timing.reason and (name, timing.reason) not in seen:
                    seen.add((name, timing.reason))
                    lines.append(f"no speedup of {c.name} over {name}: {timing.reason}")
    return lines + same_as_notes(cands) + yardstick_notes(cands)


def same_as_notes(cands: list[CandidateResult]) -> list[str]:
    """One line per candidate with benchmarks it was not timed on (--ks-same-as)."""
    lines = []
    for c in cands:
        borrowed = c.timed_as()
        if borrowed:
            total = sum(1 for case in c.cases if case.kind == "bench")
            names = ", ".join(sorted(set(borrowed.values())))
            lines.append(f"{c.name}: {len(borrowed)} of {total} benchmarks not timed (marked "
                         f"={names} in the table): it runs {names}'s code there "
                         f"(--ks-same-as); its times there are {names}'s, from the same rounds")
    return lines


def yardstick_notes(cands: list[CandidateResult]) -> list[str]:
    """One line per baseline that missed the check but is kept as a yardstick (verify =
    "report"): the first miss, and how many of its items and interleaved benchmarks missed."""
    by_name = {c.name: c for c in cands}
    names = {n for c in cands for case in c.cases for n, t in case.baselines.items()
             if not t.verified} | {c.name for c in cands if c.role == "baseline" and c.xfailed}
    lines = []
    for name in sorted(names):
        own = by_name[name].cases if name in by_name else []
        # One timing per case: the candidates of a session share the rounds it was timed in.
        beside = list({case.case_id: t for c in cands for case in c.cases
                       for n, t in case.baselines.items()
                       if n == name and t.stats is not None}.values())
        first = next((c.reason for c in own if c.outcome == "xfailed"), "") or next(
            t.mismatch for t in beside if not t.verified)
        judged = [c for c in own if c.outcome in ("passed", "xfailed")]
        lines.append(
            f"{first}: {sum(c.outcome == 'xfailed' for c in judged)} of {len(judged)} of its "
            f"items and {sum(not t.verified for t in beside)} of {len(beside)} benchmarks "
            "beside candidates missed; its times and speedups over it are kept, marked *"
        )
    return lines


def attribution_lines(cands: list[CandidateResult]) -> list[str]:
    """Where each profiled candidate's time went (--ks-attribution), one line each."""
    lines = []
    for c in cands:
        found = next((r.attribution for r in c.cases if r.attribution is not None), None)
        if found is not None:
            lines.append(f"kernels of {c.name}: {found.line()}")
    return lines


# A candidate whose import took this long gets a line saying so, and why (issue 32).
SLOW_LOAD_S = 5.0


def build_hint(source: str) -> str:
    """What a slow import most likely spent its time on, read from the candidate's source,
    and how the CUDA seed's build avoids it."""
    if "load_inline" not in source and "cpp_extension" not in source:
        if "triton" in source:
            return "Triton kernels compiled at import (cached after the first run)"
        return "its module-level code"
    split = re.search(r"no_implicit_headers\s*=\s*True", source)
    pch = re.search(r"use_pch\s*=\s*True", source)
    # a wrapper of torch tensors (load_inline's functions= are bound through torch's pybind11)
    torch_wrapper = re.search(r"torch/extension\.h|torch::|\bfunctions\s*=", source)
    seed = ("tasks/fp8_gemm/seeds/cuda_wgmma.py: the kernels and a raw-pointer launcher in "
            "cuda_sources with no_implicit_headers=True, a wrapper on Python's C API in "
            "cpp_sources, the tensors checked and allocated in Python; its kernels alone take "
            "about 4 s of nvcc")
    if "cuda_sources" in source and not split:
        return ("its load_inline build, which puts torch's headers in every CUDA source (the "
                f"CUDA seed built in 56.5 s so on an H200); see {seed}")
    if torch_wrapper and not pch:
        return ("its load_inline build, whose C++ wrapper parses torch's headers (14-42 s of "
                "the host compiler): use_pch=True reuses torch's precompiled header, or see "
                f"{seed}")
    return "its load_inline build"


def load_lines(cands: list[CandidateResult]) -> list[str]:
    """One line per candidate whose import took SLOW_LOAD_S or more: how long, and why."""
    lines = []
    for c in cands:
        if c.role == "candidate" and c.load_s is not None and c.load_s >= SLOW_LOAD_S:
            lines.append(f"load of {c.name}: {c.load_s:.1f} s before its first call, most "
                         f"likely {build_hint(c.source or '')}{shared_note(c)}")
    return lines


def shared_note(c: CandidateResult) -> str:
    """Where the slow load's load_inline builds are kept (harness/shared_builds.py)."""
    if "load_inline" not in (c.source or "") and not c.inline_builds:
        return ""
    built = [b for b in c.inline_builds if b.outcome == "built"]
    declined = [b for b in c.inline_builds if b.outcome == "declined"]
    note = ""
    if built:
        note += (f" ({len(built)} kept by the hash of their sources and flags: any file with "
                 "the same ones loads them without building)")
    if declined:
        note += (f" ({declined[0].module} built in its own folder, kept for this file only: "
                 f"not shared because {declined[0].why})")
    if not c.inline_builds:
        note += " (kept for this file: an unchanged file loads it without building)"
    return note


def write_summary(tr: Any, session: Any) -> None:
    """Write the kscientist section of the terminal summary; under ``-qq`` (pytest's quieter
    still) each task's line, its candidate table, what was not run and the salt alone."""
    if not session.results and not session.validations:
        return
    brief = tr.config.get_verbosity() <= -2
    tr.write_sep("=", "kscientist summary")
    saved = session.settings.compare_runs
    for task_name in session.task_names():
        per_task = session.results.get(task_name, {})
        # a candidate not run here has no row: run_notes says why
        cands = [c for c in per_task.values() if c.cases or c.compiles or not c.not_run]
        active = [b.name for b in session.baselines.get(task_name, []) if b.status == "active"]
        workers, fewer_from = session.rounds_workers(task_name)
        how = f" | {workers} workers a kernel" if workers > 1 else ""
        if fewer_from:
            how += (f", 1 from {fewer_from} on (the device's memory ran out; "
                    "--ks-bench-workers 1 times all in one)")
        elif how and session.settings.bench_workers is None:
            how += " (--ks-bench-workers auto: kernels compared)"
        tr.write_line(f"task {task_name} | profile {session.profile} | device "
                      f"{session.device} ({session.device_name}){how}")
        if cands or task_name in session.results:
            for line in candidate_table(cands, active, saved, task_name, session.machine()):
                tr.write_line("  " + line)
        if brief:
            for line in run_notes(session, task_name, cands):
                tr.write_line("  " + line)
            continue
        lines = bench_table(cands)
        if lines:
            tr.write_line("")
            for line in lines:
                tr.write_line("  " + line)
            tr.write_line("  ±: half-width of each median's 95% interval, in percent; (low-high) "
                          "after a speedup: its 95% interval")
        for line in pairwise_lines(cands):
            tr.write_line("  " + line)
        for line in run_notes(session, task_name, cands) + summary_lines(cands):
            tr.write_line("  " + line)
        for line in attribution_lines(cands) + load_lines(cands):
            tr.write_line("  " + line)
        for c in cands:
            if c.review:
                tr.write_line(f"  review {c.name}: {c.review}")
        validated = summary_line(session.validations.get(task_name))
        if validated:
            tr.write_line("  " + validated)
    if session.settings.compare_path is not None and not brief:
        compare = session.settings.quoted("ks_compare")
        gate = ("" if session.settings.max_regression is not None else
                "; a report, no gate: add --ks-max-regression PERCENT to fail a regression")
        tr.write_line(f"vs_saved: geomean time change against {session.settings.compare_path} "
                      f"({compare}): against the saved file timed beside it in this run "
                      "(<name>_saved), else through the reference timed in both runs; with its "
                      f"95% interval; + is slower{gate}")
    how = "given with --ks-salt" if session.settings.salt_given else "secret, drawn for this run"
    tr.write_line(f"seed salt {session.salt} ({how}); reproduce with --ks-salt {session.salt}")


def selection_hints(session: Any, keyword: str) -> list[str]:
    """Why ``-k KEYWORD`` selected nothing, when the words it names are case ids of another
    profile of a task ("m6144" is in fp8_gemm's full profile, not the CPU one)."""
    words = [w for w in re.findall(r"[\w\-]+", keyword) if w not in ("and", "or", "not")]
    lines = []
    for task in session.tasks.values():
        here = session.profile
        ids_here = {task.case_id(c) for p in [task.spec.profiles.get(here)] if p
                    for c in [*p.tests, *p.benchmarks]}
        for name, profile in task.spec.profiles.items():
            if name == here:
                continue
            ids = {task.case_id(c) for c in [*profile.tests, *profile.benchmarks]}
            hits = sorted(i for i in ids - ids_here if any(w in i for w in words))
            if hits and not any(w in i for w in words for i in ids_here):
                lines.append(
                    f"hint: -k '{keyword}' names cases of task '{task.name}' in its profile "
                    f"'{name}' ({len(hits)}, e.g. {hits[0]}), not in this run's profile '{here}'; "
                    f"add --ks-profile {name}" + (" (on a GPU it is picked by default)"
                                                  if name == "full" else ""))
    return lines
