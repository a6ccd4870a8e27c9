"""The terminal summary section: one row per candidate, then per-benchmark times."""

from __future__ import annotations

from typing import Any

from pytest_kscientist.results import CandidateResult


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def candidate_table(cands: list[CandidateResult]) -> list[str]:
    """Rows: candidate, passed, failed, geomean, speedup over the reference."""
    rows = [("candidate", "passed", "failed", "geomean_us", "speedup_vs_ref")]
    ranked = sorted(cands, key=lambda c: (c.geomean_us is None, c.geomean_us or 0.0))
    for c in ranked:
        speed = "-" if c.speedup_over_reference is None else f"{c.speedup_over_reference:.2f}x"
        rows.append((c.name, str(c.passed), str(c.failed), _us(c.geomean_us), speed))
    return _align(rows)


def bench_table(cands: list[CandidateResult]) -> list[str]:
    """Rows: benchmark case, then each candidate's median (us) or its failure."""
    names = [c.name for c in cands]
    cases: list[str] = []
    cells: dict[tuple[str, str], str] = {}
    floors: dict[str, str] = {}
    for c in cands:
        for case in c.cases:
            if case.kind != "bench":
                continue
            if case.case_id not in cases:
                cases.append(case.case_id)
            if case.floor_us is not None or case.case_id not in floors:
                floors[case.case_id] = _us(case.floor_us)
            cells[(case.case_id, c.name)] = (
                _us(case.stats.median_us) if case.stats and case.outcome == "passed" else "FAIL"
            )
    if not cases:
        return []
    rows = [("benchmark (median us)", *names, "floor_us")]
    for case_id in cases:
        rows.append((case_id, *(cells.get((case_id, n), "-") for n in names), floors[case_id]))
    return _align(rows)


def _align(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]


def write_summary(tr: Any, session: Any) -> None:
    """Write the kscientist section of the terminal summary."""
    if not session.results:
        return
    tr.write_sep("=", "kscientist summary")
    for task_name, per_task in session.results.items():
        cands = list(per_task.values())
        tr.write_line(f"task {task_name} | profile {session.profile} | device "
                      f"{session.device} ({session.device_name})")
        for line in candidate_table(cands):
            tr.write_line("  " + line)
        lines = bench_table(cands)
        if lines:
            tr.write_line("")
            for line in lines:
                tr.write_line("  " + line)
    how = "given with --ks-salt" if session.settings.salt_given else "secret, drawn for this run"
    tr.write_line(f"seed salt {session.salt} ({how}); reproduce with --ks-salt {session.salt}")
