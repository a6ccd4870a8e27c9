"""The findings document of a task: what helped, what hurt, what failed and why.

Rebuilt from the population after every generation (so it is never out of step with the records
after a crash) and handed to the next designer. Speed-ups are parent time / child time.
"""

from __future__ import annotations

from collections.abc import Sequence

from pytest_kscientist.evolve.population import Member

NEUTRAL_BAND = 0.03  # within 3% of the parent: CPU session-to-session noise on 2 shared cores


def lineage(member: Member, by_id: dict[str, Member]) -> list[str]:
    """Ids from the root seed down to ``member`` along first parents."""
    chain = [member.id]
    while (parents := by_id[chain[-1]].meta.parents) and parents[0] in by_id:
        if parents[0] in chain:
            break
        chain.append(parents[0])
    return chain[::-1]


def best(members: Sequence[Member], seeds_only: bool = False) -> Member | None:
    """The passing member with the lowest geomean (among seeds only if asked)."""
    passed = [
        m
        for m in members
        if m.geomean_us is not None and (not seeds_only or m.meta.origin == "seed")
    ]
    return min(passed, key=lambda m: m.geomean_us or 0.0) if passed else None


def label(member: Member) -> str:
    """A short description of what a candidate is: its seed file or its plan title."""
    if member.meta.origin == "seed":
        return f"seed {member.meta.seed_file}"
    return member.meta.plan.title if member.meta.plan else "(no plan)"


def render(
    task: str, members: Sequence[Member], designer_notes: str = "", generation: int = 0
) -> str:
    """The markdown findings document for ``members``."""
    by_id = {m.id: m for m in members}
    counts = {s: sum(m.status == s for m in members) for s in ("passed", "failed", "pending")}
    out = [
        f"# Findings: {task}",
        "",
        f"After generation {generation}: {len(members)} candidates ({counts['passed']} passed, "
        f"{counts['failed']} failed, {counts['pending']} pending). Speed-up = parent time / "
        "child time (geomean of the benchmark medians).",
        "",
        "## Best so far",
        "",
    ]
    top, seed = best(members), best(members, seeds_only=True)
    if top is None:
        out.append("No candidate has passed its checks yet.")
    else:
        out.append(f"- {top.id} (gen {top.meta.generation}): {top.geomean_us:.1f} us, {label(top)}")
        if seed is not None and seed.geomean_us and top.geomean_us:
            out.append(
                f"- {seed.geomean_us / top.geomean_us:.2f}x over the best seed {seed.id} "
                f"({seed.meta.seed_file}, {seed.geomean_us:.1f} us)"
            )
        out.append(f"- lineage: {' -> '.join(lineage(top, by_id))}")
    helped, hurt, neutral, failed = [], [], [], []
    for m in members:
        if m.meta.origin == "seed" or m.evaluation is None:
            if m.status == "failed":
                failed.append(f"- {m.id} ({label(m)}): {m.evaluation.failure}")  # type: ignore[union-attr]
            continue
        parent = by_id.get(m.meta.parents[0]) if m.meta.parents else None
        what = f"{m.id} (gen {m.meta.generation}) `{label(m)}` on {parent.id if parent else '?'}"
        if m.status == "failed":
            failed.append(f"- {what}: {m.evaluation.failure}")
            continue
        if parent is None or parent.geomean_us is None or m.geomean_us is None:
            neutral.append(f"- {what}: {m.geomean_us:.1f} us (parent not timed)")
            continue
        speedup = parent.geomean_us / m.geomean_us
        line = (
            f"- {what}: {speedup:.2f}x ({parent.geomean_us:.1f} -> {m.geomean_us:.1f} us)",
            speedup,
        )
        if speedup > 1 + NEUTRAL_BAND:
            helped.append(line)
        elif speedup < 1 - NEUTRAL_BAND:
            hurt.append(line)
        else:
            neutral.append(line[0])
    sections = [
        (
            f"What helped (over {NEUTRAL_BAND:.0%} faster than the parent)",
            [t for t, _ in sorted(helped, key=lambda x: -x[1])],
        ),
        (
            f"What hurt (over {NEUTRAL_BAND:.0%} slower than the parent)",
            [t for t, _ in sorted(hurt, key=lambda x: x[1])],
        ),
        ("Neutral (within the noise band)", neutral),
        ("What failed and why", failed),
    ]
    for title, lines in sections:
        out += ["", f"## {title}", ""] + (lines or ["- none yet"])
    out += ["", "## Fastest per benchmark", ""] + _winners(members)
    if designer_notes.strip():
        out += ["", "## Designer notes (latest)", "", designer_notes.strip()]
    return "\n".join(out) + "\n"


def _winners(members: Sequence[Member]) -> list[str]:
    bests: dict[str, tuple[float, str]] = {}
    for m in members:
        if m.geomean_us is None or m.evaluation is None:
            continue
        for bench, median in m.evaluation.bench_median_us.items():
            if bench not in bests or median < bests[bench][0]:
                bests[bench] = (median, m.id)
    return [f"- {b}: {mid} ({t:.1f} us)" for b, (t, mid) in sorted(bests.items())] or ["- none yet"]
