"""Prompt templates (``evolve/prompts/*.md``, ``string.Template`` syntax) and the text blocks
that fill them: population table, candidate cards with per-shape times, recent history.
"""

from __future__ import annotations

import math
from functools import cache
from importlib import resources
from string import Template

from pytest_kscientist.evolve.roles import CandidateSummary, ExperimentPlan

TEMPLATES = (
    "system", "selector", "designer", "writer", "repair", "repair_failed", "retry_note")
HISTORY_LIMIT = 16  # most recent candidates shown; older ones live on in the findings document
TABLE_ROWS = 24  # population table rows: the fastest half and the newest half
SHAPE_COLUMNS = 6  # candidates side by side in the selector's per-benchmark table
FAILURE_CHARS = 600  # of a compile/runtime error: enough for the message and the failing line


@cache
def template(name: str) -> Template:
    """The template ``prompts/<name>.md`` shipped with the package."""
    text = resources.files("pytest_kscientist.evolve").joinpath("prompts", f"{name}.md")
    return Template(text.read_text(encoding="utf-8"))


def render(name: str, **values: object) -> str:
    """Fill every placeholder of template ``name``; a missing value is a ``KeyError``."""
    return template(name).substitute({k: str(v) for k, v in values.items()}).strip() + "\n"


def _us(value: float | None) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:.1f} us"


def _ranked(population: list[CandidateSummary]) -> list[CandidateSummary]:
    def key(c: CandidateSummary) -> tuple[int, float, int, str]:
        timed = c.status == "passed" and c.geomean_us is not None
        return (0 if timed else 1, c.geomean_us if timed else 0.0, -c.generation, c.id)  # type: ignore[return-value]

    return sorted(population, key=key)


def population_table(population: list[CandidateSummary], limit: int = TABLE_ROWS) -> str:
    """One row per candidate, fastest passing first; past ``limit`` rows, the fastest and the
    newest are kept and the rest summed up in one line (issue 13: prompts bounded over a long
    run)."""
    rows = [
        "| id | gen | status | geomean | parents | plan |",
        "|----|-----|--------|---------|---------|------|",
    ]
    ranked = _ranked(population)
    shown = _shown(ranked, limit)
    for c in shown:
        parents = ", ".join(f"`{p}`" for p in c.parents) or "-"
        plan = (c.plan_title or "seed").replace("|", "/")
        rows.append(
            f"| `{c.id}` | {c.generation} | {c.status} | {_us(c.geomean_us)} | {parents} | {plan} |"
        )
    kept = {c.id for c in shown}
    left = [c for c in ranked if c.id not in kept]
    if left:
        counts = {s: sum(c.status == s for c in left) for s in ("passed", "failed", "pending")}
        gens = [c.generation for c in left]
        rows.append(
            f"\n{len(left)} older or slower candidates not shown (generations {min(gens)}-"
            f"{max(gens)}: {counts['passed']} passed, slower than those above; "
            f"{counts['failed']} failed; {counts['pending']} pending)"
        )
    return "\n".join(rows)


def _shown(ranked: list[CandidateSummary], limit: int) -> list[CandidateSummary]:
    """The rows a table of ``limit`` keeps: the fastest half, then the newest, in rank order."""
    if len(ranked) <= limit:
        return ranked
    fastest = ranked[: limit // 2]
    newest = sorted((c for c in ranked if c not in fastest),
                    key=lambda c: (-c.generation, c.id))[: limit - len(fastest)]
    keep = {c.id for c in fastest + newest}
    return [c for c in ranked if c.id in keep]


def shape_table(population: list[CandidateSummary], limit: int = SHAPE_COLUMNS) -> str:
    """Per-benchmark medians side by side for the fastest passing candidates and the fastest on
    each benchmark (the selector's reference can be the one that wins some shapes)."""
    timed = [c for c in _ranked(population) if c.status == "passed" and c.bench_median_us]
    if not timed:
        return "(no benchmark times yet)"
    benches = list(dict.fromkeys(b for c in timed for b in c.bench_median_us))
    by_id = {c.id: c for c in timed}
    # the fastest on a benchmark, credited to the kernel whose code ran there (timed_as)
    fastest = [min(timed, key=lambda c, b=b: c.bench_median_us.get(b, math.inf))
               for b in benches]
    winners = [by_id.get(c.timed_as.get(b, c.id), c) for c, b in zip(fastest, benches,
                                                                     strict=True)]
    ids = dict.fromkeys(c.id for c in [*timed[: max(1, limit // 2)], *winners])
    columns = [by_id[i] for i in ids][:limit]
    lines = ["| benchmark | " + " | ".join(f"`{c.id}`" for c in columns) + " |",
             "|---" * (len(columns) + 1) + "|"]
    for b in benches:
        times = [c.bench_median_us.get(b) for c in columns]
        best = min((t for t in times if t is not None), default=None)
        cells = [("-" if t is None else ("**" + _us(t) + "**" if t == best else _us(t))
                  + (f" (={c.timed_as[b]}'s code)" if b in c.timed_as else ""))
                 for c, t in zip(columns, times, strict=True)]
        lines.append(f"| {b} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def shape_times(candidate: CandidateSummary) -> str:
    """Per-benchmark medians of one candidate as a small table."""
    if not candidate.bench_median_us:
        return "(no benchmark times)"
    lines = ["| benchmark | median |", "|-----------|--------|"]
    lines += [f"| {case} | {_us(t)} |" for case, t in candidate.bench_median_us.items()]
    return "\n".join(lines)


def _first(text: str, limit: int) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[:limit] + " [...]"


def candidate_card(candidate: CandidateSummary | None, title: str) -> str:
    """A candidate with its status, times, plan and complete source."""
    if candidate is None:
        return f"### {title}\n(none chosen)"
    parts = [
        f"### {title}: `{candidate.id}` (generation {candidate.generation}, "
        f"{candidate.status}, geomean {_us(candidate.geomean_us)})",
    ]
    if candidate.plan_title:
        parts.append(f"Plan it implemented: {candidate.plan_title}")
    if candidate.explanation:
        parts.append(f"Author's explanation: {_first(candidate.explanation, 1500)}")
    if candidate.failure:
        parts.append(failure_text(candidate))
    parts.append(shape_times(candidate))
    parts.append(f"```python\n{candidate.source.rstrip()}\n```")
    return "\n\n".join(parts)


def failure_text(candidate: CandidateSummary) -> str:
    """The failure line and, when there is one, its trimmed traceback or mismatch detail."""
    text = f"Failure: {_first(candidate.failure, FAILURE_CHARS)}"
    if candidate.failure_detail:
        text += f"\n\n```text\n{candidate.failure_detail.rstrip()}\n```"
    return text


def history(population: list[CandidateSummary], limit: int = HISTORY_LIMIT) -> str:
    """The most recent experiments: what was tried, the outcome, errors, change vs parent."""
    by_id = {c.id: c for c in population}
    recent = sorted(population, key=lambda c: (-c.generation, c.id))[:limit]
    if not recent:
        return "(nothing tried yet)"
    lines = []
    for c in recent:
        what = c.plan_title or "seed"
        outcome = c.status
        if c.status == "passed" and c.geomean_us is not None:
            outcome = f"passed, geomean {_us(c.geomean_us)}"
            parent = by_id.get(c.parents[0]) if c.parents else None
            if parent and parent.geomean_us and c.geomean_us > 0:
                speedup = parent.geomean_us / c.geomean_us
                outcome += f", {speedup:.2f}x the speed of `{parent.id}`"
        elif c.failure:
            outcome = f"{c.status}: {_first(c.failure, FAILURE_CHARS)}"
        lines.append(f"- gen {c.generation} `{c.id}`: {what} -> {outcome}")
    return "\n".join(lines)


def plan_text(plan: ExperimentPlan) -> str:
    """An experiment plan as the writer reads it."""
    text = (
        f"**{plan.title}**\n\n{plan.changes.strip()}\n\n"
        f"Expected gain: {plan.expected_gain_min_pct:g}% to {plan.expected_gain_max_pct:g}%; "
        f"innovation {plan.innovation:g}/10."
    )
    if plan.knobs:
        text += "\nKnob settings: " + ", ".join(f"{k}={v!r}" for k, v in plan.knobs.items())
    if plan.by_shape:
        text += "\nTUNABLES_BY_SHAPE rules (first that holds wins; [low, high) per key): " + (
            "; ".join(f"when {r.when} knobs {r.knobs}" for r in plan.by_shape))
    return text


def findings_text(findings: str) -> str:
    """The discovery document, or a note that it is still empty."""
    return findings.strip() or "(empty: nothing learned yet)"
