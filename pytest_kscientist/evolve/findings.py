"""The findings document of a task: what helped, what hurt, what failed and why.

Rebuilt from the population after every generation (so it is never out of step with the records
after a crash) and handed to the next designer. Speed-ups are parent time / child time, taken
from the session that timed the parent interleaved beside the child (``--ks-beside``), where a
95% interval says whether the difference is real (``links.py``: a move of knob values is taken
over the benchmarks whose knob point it changed); a child is "helped" or "hurt" only when that
interval excludes 1. A comparison across sessions (no parent beside) is listed as neutral:
session-to-session drift is not measured (issue 10: 0.57x-1.10x for identical kernels on CPU).
"""

from __future__ import annotations

import functools
import re
import textwrap
from collections import Counter
from collections.abc import Callable, Sequence

from pytest_kscientist.evolve.failure_text import trim
from pytest_kscientist.evolve.offline.links import Link, link
from pytest_kscientist.evolve.population import Member, failure_detail, status_counts

NOTES_KEPT = 5  # generations of designer notes in the document (it goes into every prompt)
SECTION_LINES = 12  # entries per section; the rest are summarised in one line
DETAIL_GENERATIONS = 2  # newest generations whose failures keep their traceback
FINDINGS_DETAIL_CHARS = 1200  # of one failure's traceback in the document
DETAILS_KEPT = 4  # failures shown with their traceback
NOTE_CHARS = 1500  # of one generation's designer notes
REJECTED_CHARS = 600  # of why one draft never ran


def lineage(member: Member, by_id: dict[str, Member]) -> list[str]:
    """Ids from the root seed down to ``member`` along first parents."""
    chain = [member.id]
    while (parents := by_id[chain[-1]].meta.parents) and parents[0] in by_id:
        if parents[0] in chain:
            break
        chain.append(parents[0])
    return chain[::-1]


def best(members: Sequence[Member], seeds_only: bool = False) -> Member | None:
    """The best member: the fastest seed, unless a descendant is confirmed faster than it.

    Seeds are ranked by geomean (timed in one session). A descendant displaces them only with
    ``confirmed`` evidence: its speedup over its root seed, multiplied along its lineage from
    ratios timed beside each parent, has a 95% interval above 1; the descendant whose root's
    time divided by that speedup is lowest is the best.
    """
    seeds = [m for m in members if m.geomean_us is not None and m.meta.origin == "seed"]
    top = min(seeds, key=lambda m: m.geomean_us or 0.0) if seeds else None
    if seeds_only:
        return top
    by_id = {m.id: m for m in members}
    # each link once: the lineages share their older links
    links = functools.cache(lambda child, parent: link(by_id[child], by_id.get(parent), parent))
    estimates = []
    for m in members:
        found = confirmed(m, by_id, links)
        if found is None or found[1] <= 1:
            continue
        root = by_id[lineage(m, by_id)[0]]
        if root.geomean_us:
            estimates.append((root.geomean_us / found[0], m))
    if estimates:
        time_us, fastest = min(estimates, key=lambda e: e[0])
        if top is None or time_us < (top.geomean_us or 0):
            return fastest
    if top is None:  # no seed passed: the fastest passing member, unconfirmed
        passed = [m for m in members if m.geomean_us is not None]
        return min(passed, key=lambda m: m.geomean_us or 0.0) if passed else None
    return top


def evidence(top: Member, members: Sequence[Member]) -> str:
    """Why ``top`` is the best, in words a reader can check."""
    if top.meta.origin == "seed":
        passed = sum(m.meta.origin != "seed" and m.geomean_us is not None for m in members)
        return (f"the fastest seed ({top.meta.seed_file}); no descendant confirmed faster "
                f"beyond the noise measured ({passed} passed)")
    by_id = {m.id: m for m in members}
    found = confirmed(top, by_id)
    if found is None:
        return "no seed passed: fastest by geomean, not confirmed beside a seed"
    speedup, low, high = found
    root = lineage(top, by_id)[0]
    # three decimals where two would hide the gain (1.003x [1.002-1.004] reads 1.00x [1.00-1.00])
    d = 3 if 1.0 in (round(low, 2), round(high, 2)) or round(low, 2) == round(high, 2) else 2
    return (f"{speedup:.{d}f}x [{low:.{d}f}-{high:.{d}f}] over seed {root} "
            f"({by_id[root].meta.seed_file}), ratios timed beside each parent along its lineage")


def confirmed(
    member: Member, by_id: dict[str, Member],
    links: Callable[[str, str], Link | None] | None = None,
) -> tuple[float, float, float] | None:
    """(speedup, low, high) of ``member`` over the seed at the root of its lineage: the product
    of the links timed beside each parent (``links.link``: a knob move over the benchmarks whose
    knob point it changed; intervals multiplied, conservatively); None for a seed, or where a
    link was not timed beside its parent. ``links``: (child id, parent id) -> its link, where a
    caller asking for many members keeps them."""
    chain = lineage(member, by_id)
    if len(chain) < 2 or by_id[chain[0]].meta.origin != "seed":
        return None
    speedup = low = high = 1.0
    for parent_id, child_id in zip(chain, chain[1:], strict=False):
        found = (links(child_id, parent_id) if links is not None
                 else link(by_id[child_id], by_id.get(parent_id), parent_id))
        if found is None:
            return None
        speedup *= found.speedup
        low *= found.low
        high *= found.high
    return speedup, low, high


def label(member: Member) -> str:
    """A short description of what a candidate is: its seed file or its plan title."""
    if member.meta.origin == "seed":
        return f"seed {member.meta.seed_file}"
    title = member.meta.plan.title if member.meta.plan else "(no plan)"
    return f"{title} (repair of {member.meta.repair_of})" if member.meta.repair_of else title


def render(
    task: str, members: Sequence[Member],
    designer_notes: Sequence[tuple[int, str]] = (), generation: int = 0,
    rejected: Sequence[tuple[int, str, str]] = (),
) -> str:
    """The markdown findings document for ``members``; ``designer_notes``: (generation, notes)
    pairs, newest first, of which the first NOTES_KEPT are shown; ``rejected``: (generation,
    plan title, why) of drafts rejected before the GPU, newest first.

    Every section keeps its SECTION_LINES most telling entries and summarises the rest in one
    line, so the document (in every prompt) stays bounded over a long run (issue 13).
    """
    by_id = {m.id: m for m in members}
    out = [
        f"# Findings: {task}",
        "",
        f"After generation {generation}: {len(members)} candidates "
        f"({status_counts(list(members))}). Speed-up = parent time / child time (geomean of "
        "the benchmark medians).",
        "",
        "## Best so far",
        "",
    ]
    top, seed = best(members), best(members, seeds_only=True)
    if top is None:
        out.append("No candidate has passed its checks yet.")
    else:
        out.append(f"- {top.id} (gen {top.meta.generation}): {top.geomean_us:.1f} us, {label(top)}")
        out.append(f"- {evidence(top, members)}")
        if seed is not None and seed.geomean_us and top is not seed:
            out.append(f"- the best seed {seed.id} ({seed.meta.seed_file}): "
                       f"{seed.geomean_us:.1f} us")
        out.append(f"- lineage: {' -> '.join(lineage(top, by_id))}")
    helped, hurt, neutral, failed = [], [], [], []
    for m in sorted(members, key=lambda m: -m.meta.generation):
        if m.status == "failed":
            failed.append(m)
            continue
        if m.meta.origin == "seed" or m.evaluation is None:
            continue
        parent = by_id.get(m.meta.parents[0]) if m.meta.parents else None
        what = f"{m.id} (gen {m.meta.generation}) `{label(m)}` on {parent.id if parent else '?'}"
        if parent is None or parent.geomean_us is None or m.geomean_us is None:
            neutral.append((f"- {what}: {m.geomean_us:.1f} us (parent not timed)", 1.0))
            continue
        verdict, text, speedup = versus_parent(m, parent)
        line = (f"- {what}: {text}", speedup)
        {"helped": helped, "hurt": hurt, "neutral": neutral}[verdict].append(line)
    sections = [
        (
            "What helped (faster than the parent beyond this run's 95% interval)",
            _bounded([t for t, _ in sorted(helped, key=lambda x: -x[1])], "helped, smaller gains"),
        ),
        (
            "What hurt (slower than the parent beyond this run's 95% interval)",
            _bounded([t for t, _ in sorted(hurt, key=lambda x: x[1])], "hurt, smaller losses"),
        ),
        ("Neutral (within the noise measured, or compared across sessions)",
         _bounded([t for t, _ in neutral], "neutral, older")),
        ("What failed and why", _failures(failed, generation)),
        ("Drafts that never ran (rejected before the GPU, or the writer failed)",
         _bounded([f"- gen {g} `{title}`: {why[:REJECTED_CHARS]}" for g, title, why in rejected],
                  "older")),
    ]
    for title, lines in sections:
        out += ["", f"## {title}", ""] + (lines or ["- none yet"])
    out += ["", "## Fastest per benchmark", ""] + _winners(members)
    history = [(g, text.strip()) for g, text in designer_notes if text.strip()]
    if history:
        out += ["", "## Designer notes (newest first)"]
        for g, text in history[:NOTES_KEPT]:
            note = text if len(text) <= NOTE_CHARS else text[:NOTE_CHARS].rstrip() + " [...]"
            out += ["", f"### After generation {g}", "", note]
        if len(history) > NOTES_KEPT:
            older = [g for g, _ in history[NOTES_KEPT:]]
            out += ["", f"(notes of generations {min(older)}-{max(older)} left out: what they "
                        "taught is in the sections above)"]
    return "\n".join(out) + "\n"


def _bounded(lines: list[str], what: str) -> list[str]:
    """The first SECTION_LINES of ``lines`` and one line counting the rest."""
    if len(lines) <= SECTION_LINES:
        return lines
    return lines[:SECTION_LINES] + [f"- and {len(lines) - SECTION_LINES} more ({what})"]


_ERROR_NAME = re.compile(r"\b([A-Z]\w*(?:Error|Exception|Failure))\b")


def _failures(failed: Sequence[Member], generation: int) -> list[str]:
    """Failures newest first: the last DETAIL_GENERATIONS generations' with their trimmed
    tracebacks or mismatch details, older ones as lines, the oldest counted by kind."""
    lines, details = [], 0
    for m in failed[:SECTION_LINES]:
        ev = m.evaluation
        assert ev is not None
        parent = m.meta.parents[0] if m.meta.parents else None
        on = f" on {parent}" if parent else ""
        lines.append(f"- {m.id} (gen {m.meta.generation}) `{label(m)}`{on}: {ev.failure}")
        detail = failure_detail(ev)
        if detail and m.meta.generation > generation - DETAIL_GENERATIONS and (
                details < DETAILS_KEPT):
            details += 1
            body = trim(detail, FINDINGS_DETAIL_CHARS)
            lines.append("  ```text\n" + textwrap.indent(body, "  ") + "\n  ```")
    older = failed[SECTION_LINES:]
    if older:
        kinds = Counter(_kind(m.evaluation.failure if m.evaluation else "") for m in older)
        gens = [m.meta.generation for m in older]
        lines.append(f"- and {len(older)} older failures (generations {min(gens)}-{max(gens)}): "
                     + ", ".join(f"{k} {n}" for k, n in kinds.most_common(6)))
    return lines


def _kind(failure: str) -> str:
    """What kind of failure a line is: its error's name, else its first word (check, bench)."""
    found = _ERROR_NAME.search(failure)
    return found.group(1) if found else (failure.split() or ["unknown"])[0]


def versus_parent(child: Member, parent: Member) -> tuple[str, str, float]:
    """(helped/hurt/neutral, a line's text, speedup) of ``child`` over ``parent``."""
    found = link(child, parent, parent.id)
    if found is not None:
        text = f"{found.text()} over the parent timed beside it ({child.geomean_us:.1f} us)"
        verdict = "helped" if found.low > 1 else "hurt" if found.high < 1 else "neutral"
        return verdict, text, found.speedup
    assert parent.geomean_us is not None and child.geomean_us is not None
    speedup = parent.geomean_us / child.geomean_us
    return "neutral", (f"{speedup:.2f}x across sessions ({parent.geomean_us:.1f} -> "
                       f"{child.geomean_us:.1f} us; drift not measured)"), speedup


def _winners(members: Sequence[Member]) -> list[str]:
    bests: dict[str, tuple[float, str]] = {}
    for m in members:
        if m.geomean_us is None or m.evaluation is None:
            continue
        borrowed = m.evaluation.timed_as()  # another kernel's rounds: credit that one
        for bench, median in m.evaluation.bench_median_us.items():
            if bench not in bests or median < bests[bench][0]:
                bests[bench] = (median, borrowed.get(bench, m.id))
    return [f"- {b}: {mid} ({t:.1f} us)" for b, (t, mid) in sorted(bests.items())] or ["- none yet"]
