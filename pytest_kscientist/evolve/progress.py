"""What an evolution run shows: progress lines, generation table, summary, plot and lineage.

Terminal output goes through pytest's terminal reporter; matplotlib is imported only to draw.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from pytest_kscientist.evolve.findings import best, confirmed, evidence, label, lineage
from pytest_kscientist.evolve.offline.links import link
from pytest_kscientist.evolve.population import Member, status_counts
from pytest_kscientist.harness.files import atomic_target

PLOT = "progress.png"
LINEAGE = "lineage.md"


class Terminal:
    """Writes lines through pytest's terminal reporter (or a plain stream outside pytest)."""

    def __init__(self, reporter: Any = None, stream: Any = None) -> None:
        self._reporter = reporter
        self._stream = stream

    @classmethod
    def for_config(cls, config: Any) -> Terminal:
        """The terminal of a pytest run."""
        return cls(config.pluginmanager.get_plugin("terminalreporter"), sys.stdout)

    def line(self, text: str, **markup: bool) -> None:
        if self._reporter is not None:
            self._reporter.write_line(text, **markup)
        elif self._stream is not None:
            self._stream.write(text + "\n")
            self._stream.flush()

    def count(self, what: str, n: int) -> None:
        """Make pytest's last line count ``n`` of ``what`` ("3 generations in 104.2s")."""
        if self._reporter is not None and n > 0:
            # Entries other plugins may walk as reports (hypothesis reads their __dict__).
            mark = SimpleNamespace(nodeid="", when="call", outcome=what, longrepr=None,
                                   count_towards_summary=True)
            self._reporter.stats.setdefault(what, []).extend([mark] * n)

    def sep(self, title: str) -> None:
        if self._reporter is not None:
            self._reporter.write_sep("-", title)
        else:
            self.line(f"---- {title} ----")


def _fmt_us(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*header).rstrip()] + [fmt.format(*r).rstrip() for r in rows]


def generation_table(members: Sequence[Member], generation: int) -> list[str]:
    """One row per candidate of ``generation`` plus the best-so-far line."""
    by_id = {m.id: m for m in members}
    rows = []
    for m in members:
        if m.meta.generation != generation:
            continue
        parent = by_id.get(m.meta.parents[0]) if m.meta.parents else None
        vs = "-"
        if parent is not None and parent.geomean_us and m.geomean_us:
            found = link(m, parent, parent.id)
            if found is not None:
                vs = found.short()
            else:  # across sessions: drift not measured
                vs = f"~{parent.geomean_us / m.geomean_us:.2f}x"
        verdict = m.status if m.status != "failed" else f"failed: {m.evaluation.failure[:60]}"  # type: ignore[union-attr]
        rows.append(
            [m.id, parent.id if parent else "-", label(m)[:48], verdict, _fmt_us(m.geomean_us), vs]
        )
    lines = _table(["id", "parent", "change", "verdict", "geomean_us", "vs parent"], rows)
    if not rows:
        lines = ["(no new candidates)"]
    return lines + [best_line(members)]


def best_line(members: Sequence[Member]) -> str:
    """Best so far and how we know: a seed, or a descendant confirmed faster than its seed."""
    top = best(members)
    if top is None:
        return "best so far: none passed"
    line = f"best so far: {top.id} (gen {top.meta.generation}) {top.geomean_us:.1f} us"
    return line + ", " + evidence(top, members)


def best_per_generation(members: Sequence[Member]) -> list[tuple[int, float | None]]:
    """(generation, best geomean among candidates up to that generation) for every generation."""
    if not members:
        return []
    out = []
    running: float | None = None
    for g in range(max(m.meta.generation for m in members) + 1):
        for m in members:
            if m.meta.generation == g and m.geomean_us is not None:
                running = m.geomean_us if running is None else min(running, m.geomean_us)
        out.append((g, running))
    return out


def counted(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless one: "1 candidate", "3 candidates"."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def summary(members: Sequence[Member], stop_reason: str, elapsed_s: float) -> list[str]:
    """The closing lines of a run."""
    gens = best_per_generation(members)
    lines = [
        f"stopped: {stop_reason} ({elapsed_s:.0f} s this run)",
        f"population: {counted(len(members), 'candidate')} in "
        f"{counted(len({m.meta.generation for m in members}), 'generation')} "
        f"({status_counts(list(members))})",
        best_line(members),
    ]
    top = best(members)
    if top is not None:
        lines.append(
            f"lineage of the best: {' -> '.join(lineage(top, {m.id: m for m in members}))}"
        )
    trail = ", ".join(f"g{g}: {_fmt_us(t)}" for g, t in gens)
    if trail:
        lines.append(f"best geomean_us per generation: {trail}")
    return lines


def not_the_best(members: Sequence[Member], top: Member, path_of: Any, where: Any,
                 go_on: int, population: Any = None) -> list[str]:
    """Why the member with the lowest geomean is not ``top`` (geomeans of different sessions
    differ by the machine's noise; only ratios timed side by side confirm a gain), and the run
    that would settle it: none when ``top`` has the lowest geomean. ``go_on``: the ``--evolve``
    count of the command that goes on; ``population``: the folder the run's
    ``--ks-population`` named, repeated in that command."""
    passed = [m for m in members if m.geomean_us is not None]
    low = min(passed, key=lambda m: m.geomean_us or 0.0, default=None)
    if low is None or low.id == top.id or (low.geomean_us or 0) >= (top.geomean_us or 0):
        return []
    by_id = {m.id: m for m in members}
    found = confirmed(low, by_id)
    root = lineage(low, by_id)[0]
    if found is None:
        measured = ("no ratio beside its parent was timed, so nothing confirms it")
    else:
        speedup, lo, hi = found
        verdict = ("holds 1: not confirmed faster" if lo <= 1 <= hi else
                   "lies below 1: slower, side by side" if hi < 1 else
                   "excludes 1, but its seed's time over it is still above the best's")
        measured = (f"its ratios timed beside each parent make it {speedup:.3f}x "
                    f"({lo:.3f}-{hi:.3f}) over seed {root}, an interval that {verdict}")
    return [
        f"why {low.id} is not the best: its {low.geomean_us:.1f} us (gen {low.meta.generation}) "
        f"against {top.id}'s {top.geomean_us:.1f} us compares geomeans of different sessions; "
        f"{measured}",
        f"to settle it, time both in one run: pytest {where} -k bench --kernel "
        f"{path_of(low.id)} --kernel {path_of(top.id)}; or go on: pytest --evolve "
        f"{go_on} {where}"
        + ("" if population is None else f" --ks-population {population}"),
    ]


def write_plot(members: Sequence[Member], path: Path, task: str) -> str:
    """Draw best geomean per generation into ``path``; return a one-line note of what happened."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        return "plot skipped: matplotlib is not installed (pip install matplotlib)"
    points = [(m.meta.generation, m.geomean_us) for m in members if m.geomean_us is not None]
    curve = [(g, t) for g, t in best_per_generation(members) if t is not None]
    if not curve:
        return "plot skipped: no candidate has passed yet"
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    try:
        ax.scatter(
            [g for g, _ in points], [t for _, t in points], s=14, alpha=0.5, label="candidates"
        )
        ax.step(
            [g for g, _ in curve],
            [t for _, t in curve],
            where="post",
            color="C3",
            label="lowest geomean so far (across sessions)",
        )
        for g in sorted({m.meta.generation for m in members}):
            timed = [m for m in members if m.meta.generation == g and m.geomean_us is not None]
            if timed:  # each generation's fastest, by id
                fastest = min(timed, key=lambda m: m.geomean_us or 0.0)
                ax.annotate(fastest.id, (g, fastest.geomean_us), textcoords="offset points",
                            xytext=(4, 4), fontsize=7)
        top = best(members)
        if top is not None and top.geomean_us is not None:
            ax.scatter([top.meta.generation], [top.geomean_us], marker="*", s=120, color="C2",
                       zorder=3, label=f"best: {top.id} (confirmed, or the fastest seed)")
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        ax.set_yscale("log")
        ax.set_xlabel("generation")
        ax.set_ylabel("geomean of benchmark medians (us)")
        ax.set_title(f"{task}: best geomean per generation")
        ax.legend()
        fig.tight_layout()
        with atomic_target(path, suffix=".tmp.png") as tmp:
            fig.savefig(tmp)
    finally:
        plt.close(fig)
    return f"plot: {path}"


def lineage_markdown(task: str, members: Sequence[Member]) -> str:
    """The population as a markdown tree (children indented under their first parent)."""
    ids = {m.id for m in members}
    children: dict[str | None, list[Member]] = {}
    for m in members:
        parent = m.meta.parents[0] if m.meta.parents and m.meta.parents[0] in ids else None
        children.setdefault(parent, []).append(m)
    top = best(members)
    out = [
        f"# Lineage: {task}",
        "",
        "`id` gen, verdict, geomean_us, change (best marked **best**)",
        "",
    ]

    stack: list[tuple[Member, int]] = [(m, 0) for m in reversed(children.get(None, []))]
    while stack:  # depth-first, iterative: lineages can be deeper than the recursion limit
        m, depth = stack.pop()
        star = " **best**" if top is not None and m.id == top.id else ""
        failure = m.evaluation.failure[:80] if m.evaluation else ""
        verdict = m.status if m.status != "failed" else f"failed ({failure})"
        out.append(
            f"{'  ' * depth}- `{m.id}` g{m.meta.generation}, {verdict}, "
            f"{_fmt_us(m.geomean_us)} us, {label(m)}{star}"
        )
        stack += [(c, depth + 1) for c in reversed(children.get(m.id, []))]
    return "\n".join(out) + "\n"
