"""Markdown tables for notes/fp8_gemm_h200.md from a ``--ks-json`` run and an evolve population.

    python bench/summarize.py --table table.json --population /tmp/pop [--short]

Full output: per benchmark, the medians (us) of the reference, the baselines, each seed and the
evolve's best written candidate beside the physical floor, with a geomean row; then one row per
column: geomean, speedup over the reference, speedups over each baseline (interleaved, same
session), floor fraction. ``*`` marks times of a baseline that missed the check (verify =
"report"). The evolved column is the evolve's own best ("best evolved": confirmed faster than
its seed by ratios timed beside each parent), else its fastest written candidate by geomean
("fastest evolved ... (not confirmed)"); either was timed by the evolve run's own sessions, not
beside the others.
``--short``: the population's seed(s) against that candidate per shape (both from the
population's records, so measured alike).
``--best-source DIR``: copy the best evolved candidate's kernel file into DIR (for a table run
with ``--kernel``) and print its path; prints nothing when none was confirmed faster.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from pytest_kscientist.api import (
    CandidateResult,
    Member,
    Population,
    RunResults,
    best_member,
    confirmed_speedup,
    geomean,
)

TASK = "fp8_gemm"
ORDER = {"reference": 0, "baseline": 1, "candidate": 2}


def shape(case_id: str) -> str:
    """``m1024-n1536-k7168-s8135`` -> ``m1024-n1536-k7168``."""
    return re.sub(r"-s\d+$", "", case_id)


def read_run(path: Path, task: str) -> RunResults:
    """The task's run in a ``--ks-json`` file (a list when a session ran several tasks)."""
    text = path.read_text(encoding="utf-8")
    try:
        return RunResults.model_validate_json(text)
    except ValueError:
        import json

        runs = [RunResults.model_validate(r) for r in json.loads(text)]
        return next(r for r in runs if r.task == task)


def read_population(path: Path, task: str) -> list[Member]:
    """Members of ``path`` (a population folder, or the --ks-population root holding it)."""
    folder = path / task if (path / task).is_dir() else path
    if not folder.is_dir():
        return []
    return Population(folder, task).members()


def best(members: list[Member]) -> tuple[Member | None, str]:
    """The evolve's best written candidate and its column label: the descendant confirmed
    faster than its seed (``best_member``), else the fastest written one by geomean, labelled
    as not confirmed (beside its parent it was within the noise, or slower)."""
    top = best_member(members)
    if top is not None and top.meta.origin != "seed" and confirmed_speedup(
            top, {m.id: m for m in members}) is not None:
        return top, f"best evolved {top.id}"
    written = [m for m in members if m.geomean_us is not None and m.meta.origin != "seed"]
    if not written:
        return None, ""
    fastest = min(written, key=lambda m: m.geomean_us or 0.0)
    return fastest, f"fastest evolved {fastest.id} (not confirmed)"


def _cell(value: float | None, mark: str = "") -> str:
    return "-" if value is None else f"{value:.2f}{mark}"


def _x(value: float | None, mark: str = "") -> str:
    return "-" if value is None else f"{value:.2f}x{mark}"


def _md(rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
    return out + ["| " + " | ".join(r) + " |" for r in rows[1:]]


def _medians(c: CandidateResult) -> dict[str, tuple[float | None, str]]:
    """case id -> (median us, mark): '*' unverified, 'FAIL', 'skip'; only benchmarks."""
    out: dict[str, tuple[float | None, str]] = {}
    for case in c.cases:
        if case.kind != "bench":
            continue
        if case.outcome in ("passed", "xfailed") and case.stats is not None:
            out[case.case_id] = (case.stats.median_us, "*" if case.outcome == "xfailed" else "")
        else:
            out[case.case_id] = (None, "FAIL" if case.outcome == "failed" else "skip")
    return out


def _geo(values: list[float | None]) -> float | None:
    return geomean([v for v in values if v is not None]) if values and None not in values else None


def full(run: RunResults | None, members: list[Member]) -> list[str]:
    """The per-benchmark table and the per-column summary."""
    lines: list[str] = []
    cands = sorted(run.candidates, key=lambda c: ORDER[c.role]) if run else []
    top, evolved = best(members)
    columns = {c.name: _medians(c) for c in cands}
    floors: dict[str, float | None] = {}
    for c in cands:
        for case in c.cases:
            if case.kind == "bench" and case.floor_us is not None:
                floors[case.case_id] = case.floor_us
    cases = list(dict.fromkeys(cid for col in columns.values() for cid in col))
    if top and top.evaluation:
        by_shape = {shape(k): v for k, v in top.evaluation.bench_median_us.items()}
        columns[evolved] = {cid: (by_shape.get(shape(cid)), "") for cid in cases}
        if not cases:
            cases = list(top.evaluation.bench_median_us)
            columns[evolved] = {cid: (v, "") for cid, v in top.evaluation.bench_median_us.items()}
    if not cases:
        return ["(no benchmark in the table or the population)"]
    names = list(columns)
    rows = [["benchmark", "floor_us", *names]]
    for cid in cases:
        cells = [_cell(v, m) if v is not None else m
                 for v, m in (columns[n].get(cid, (None, "-")) for n in names)]
        rows.append([shape(cid), _cell(floors.get(cid)), *cells])
    geos = {n: _geo([columns[n].get(cid, (None, ""))[0] for cid in cases]) for n in names}
    floor_geo = _geo([floors.get(cid) for cid in cases])
    rows.append(["**geomean**", _cell(floor_geo), *(f"**{_cell(geos[n])}**" for n in names)])
    lines += _md(rows)
    lines += ["", *_score_table(run, cands, names, columns, geos, floors, cases, evolved)]
    return lines


def _score_table(run: RunResults | None, cands: list[CandidateResult], names: list[str],
                 columns: dict[str, dict[str, tuple[float | None, str]]],
                 geos: dict[str, float | None], floors: dict[str, float | None],
                 cases: list[str], evolved: str) -> list[str]:
    baselines = [b.name for b in run.baselines] if run else []
    ref = geos.get("reference")
    rows = [["candidate", "role", "geomean_us", "speedup_vs_ref",
             *(f"vs_{b}" for b in baselines), "floor_frac"]]
    by_name = {c.name: c for c in cands}
    for n in names:
        c = by_name.get(n)
        geo = geos[n]
        fracs = [(floors.get(cid) or 0) / v for cid in cases
                 if (v := columns[n].get(cid, (None, ""))[0])]
        frac = geomean(fracs) if len(fracs) == len(cases) and all(fracs) else None
        vs = [_x(c.speedups.get(b), "*" if c.baseline_verified.get(b) is False else "")
              if c else "-" for b in baselines]
        rows.append([n, c.role if c else "evolve session", _cell(geo),
                     _x(ref / geo if ref and geo else None), *vs,
                     "-" if frac is None else f"{frac:.3g}"])
    notes = [""]
    if any("*" in cell for row in rows for cell in row) or any(
            v[1] == "*" for col in columns.values() for v in col.values()):
        notes.append("`*`: a baseline that missed the task's check (verify = \"report\"): timed "
                     "as a yardstick, not a verified result.")
    if run:
        notes.append(f"Table: {run.machine.device_name}, profile {run.profile}, salt {run.salt}, "
                     f"{run.started_at}.")
    if evolved:
        notes.append(f"`{evolved}`: medians from the evolve run's own child session (no "
                     "baselines beside it); its speedup_vs_ref compares with this table's "
                     "reference, so it carries the drift between sessions.")
    return _md(rows) + notes


def short(members: list[Member]) -> list[str]:
    """Seed(s) against the best written member, per shape, from the population's records."""
    top, label = best(members)
    seeds = [m for m in members if m.meta.origin == "seed" and m.evaluation is not None]
    if top is None or top.evaluation is None or not seeds:
        return ["(no evaluated seed and passing candidate in the population)"]
    gens = max(m.meta.generation for m in members)
    where = top.evaluation.machine.device_name if top.evaluation.machine else "?"
    head = [f"{len(members)} candidates over {gens} generation(s) after the seeds; {label} "
            f"(generation {top.meta.generation}); {where}, profile "
            f"{top.evaluation.profile}", ""]
    cols = [*seeds, top]  # top is a written candidate (best() returns no seed)
    names = [f"{m.meta.seed_file or m.id} ({m.id})" if m.meta.origin == "seed" else label
             for m in cols]
    rows = [["shape", *names, f"{top.id} vs {names[0]}"]]
    ids = list(top.evaluation.bench_median_us)
    first = seeds[0].evaluation
    assert first is not None
    for cid in ids:
        vals = [m.evaluation.bench_median_us.get(cid) if m.evaluation else None for m in cols]
        ratio = (first.bench_median_us.get(cid) or 0) / top.evaluation.bench_median_us[cid]
        rows.append([shape(cid), *(_cell(v) for v in vals), _x(ratio or None)])
    geos = [m.geomean_us for m in cols]
    rows.append(["geomean", *(_cell(g) for g in geos),
                 _x(first.geomean_us / top.geomean_us if first.geomean_us and top.geomean_us
                    else None)])
    return head + _md(rows)


def copy_best(population: Path | None, task: str, out: Path) -> int:
    """Copy the evolve's best into ``out`` when it is a written candidate (confirmed faster than
    its seed, or the fastest where no seed passed); print where it went."""
    if population is None:
        sys.stderr.write("--best-source needs --population\n")
        return 2
    members = read_population(population, task)
    top = best_member(members)
    if top is None or top.meta.origin == "seed":
        return 0  # nothing evolved was confirmed faster: the table's seeds already cover it
    folder = population / task if (population / task).is_dir() else population
    source = Population(folder, task).source_path(top.id)
    out.mkdir(parents=True, exist_ok=True)
    target = out / source.name
    target.write_text(source.read_text(encoding="utf-8"), encoding="utf-8")
    sys.stdout.write(f"{target}\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", type=Path, help="a --ks-json file of the table run")
    parser.add_argument("--population", type=Path, help="the --ks-population folder")
    parser.add_argument("--task", default=TASK)
    parser.add_argument("--short", action="store_true", help="only seed vs best per shape")
    parser.add_argument("--best-source", type=Path, metavar="DIR",
                        help="copy the best evolved kernel file into DIR and print its path")
    args = parser.parse_args(argv)
    if args.best_source is not None:
        return copy_best(args.population, args.task, args.best_source)
    run = None
    if args.table is not None:
        try:
            run = read_run(args.table, args.task)
        except (OSError, ValueError, StopIteration) as exc:
            sys.stderr.write(f"--table {args.table}: not readable ({exc}); left out\n")
    members = read_population(args.population, args.task) if args.population else []
    lines = short(members) if args.short else full(run, members)
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
