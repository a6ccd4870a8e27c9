"""bench/summarize.py: the notes' tables from a --ks-json run and a population (no GPU needed)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import REPO, load_file

from pytest_kscientist.evolve.population import EvaluationRecord, Population
from pytest_kscientist.harness.results import (
    BaselineInfo,
    CandidateResult,
    CaseResult,
    MachineInfo,
    RunResults,
    TimingStats,
)
from pytest_kscientist.harness.stats import geomean, summarize

CASES = {"m1024-n1536-k7168-s8135": 11.39, "m6144-n4096-k512-s45245": 13.02}
MACHINE = MachineInfo(hostname="h", platform="p", python="3.12", torch="2.11",
                      device="cuda:0", device_name="NVIDIA H200")


def _module():
    return load_file(REPO / "bench" / "summarize.py", "summarize")


def _stats(median: float) -> TimingStats:
    return summarize([median] * 5, verified_runs=3)


def _cand(name: str, role: str, medians: list[float], outcome: str = "passed",
          **fields: object) -> CandidateResult:
    cases = [CaseResult(kind="bench", case={}, case_id=cid, outcome=outcome,  # type: ignore[arg-type]
                        stats=_stats(m), floor_us=floor)
             for (cid, floor), m in zip(CASES.items(), medians, strict=True)]
    return CandidateResult(name=name, path=f"{name}.py", sha256="0", role=role,  # type: ignore[arg-type]
                           cases=cases, geomean_us=geomean(medians), **fields)


@pytest.fixture
def inputs(tmp_path: Path) -> tuple[Path, Path]:
    run = RunResults(
        task="fp8_gemm", task_path="tasks/fp8_gemm", profile="full", salt=7, started_at="t",
        machine=MACHINE,
        baselines=[BaselineInfo(name="cublas_task_layout", path="b.py", verify="report",
                                verified=False)],
        candidates=[
            _cand("reference", "reference", [800.0, 780.0]),
            _cand("cublas_task_layout", "baseline", [150.0, 40.0], outcome="xfailed"),
            _cand("triton_blockscaled", "candidate", [100.0, 50.0],
                  speedups={"cublas_task_layout": 1.1},
                  baseline_verified={"cublas_task_layout": False}),
        ],
    )
    table = tmp_path / "table.json"
    table.write_text(run.model_dump_json())
    _population(tmp_path / "pop", seed=[100.0, 50.0], evolved=[50.0, 25.0])
    return table, tmp_path / "pop"


def _population(root: Path, seed: list[float], evolved: list[float],
                beside: tuple[float, float, float] | None = (2.0, 1.9, 2.1)) -> None:
    """A seed (source "A = 1", c0001) and one written child of it ("A = 2", c0002), with these
    medians; ``beside``: the child's speedup over its parent timed beside it, and its interval
    (None: not timed beside it)."""
    pop = Population(root / "fp8_gemm", "fp8_gemm")
    for source, origin, gen, medians in (("A = 1", "seed", 0, seed),
                                         ("A = 2", "writer", 1, evolved)):
        added = pop.add(source, generation=gen, origin=origin,  # type: ignore[arg-type]
                        seed_file="triton_blockscaled.py" if origin == "seed" else "",
                        parents=["c0001"] if origin == "writer" else None)
        speedups = {"c0001": beside[0]} if origin == "writer" and beside else {}
        intervals = {"c0001": list(beside[1:])} if origin == "writer" and beside else {}
        pop.record(EvaluationRecord(
            id=added.id, evaluated_at="t", status="passed", geomean_us=geomean(medians),
            profile="full", machine=MACHINE, speedups=speedups, speedup_intervals=intervals,
            bench_median_us=dict(zip(CASES, medians, strict=True))))


def test_full_tables_put_seeds_baselines_and_best_evolved_side_by_side(inputs, capsys) -> None:
    table, pop = inputs
    assert _module().main(["--table", str(table), "--population", str(pop)]) == 0
    out = capsys.readouterr().out
    assert ("| benchmark | floor_us | reference | cublas_task_layout | triton_blockscaled | "
            "best evolved c0002 |") in out
    assert "| m1024-n1536-k7168 | 11.39 | 800.00 | 150.00* | 100.00 | 50.00 |" in out
    ref = geomean([800, 780])
    assert f"| **geomean** | {geomean(list(CASES.values())):.2f} | **{ref:.2f}**" in out
    assert "| triton_blockscaled | candidate | 70.71 | " in out and "| 1.10x* |" in out
    frac = geomean([11.39 / 50, 13.02 / 25])
    assert f"| best evolved c0002 | evolve session | 35.36 | {ref / 35.36:.2f}x" in out
    assert f"| {frac:.3g} |" in out
    assert "`*`: a baseline that missed the task's check" in out


def test_short_table_is_seed_against_best(inputs, capsys) -> None:
    _, pop = inputs
    assert _module().main(["--population", str(pop / "fp8_gemm"), "--short"]) == 0
    out = capsys.readouterr().out
    assert "best evolved c0002 (generation 1); NVIDIA H200, profile full" in out
    assert "| m6144-n4096-k512 | 50.00 | 25.00 | 2.00x |" in out
    assert "| geomean | 70.71 | 35.36 | 2.00x |" in out


def test_best_source_copies_the_best_written_kernel(inputs, tmp_path, capsys) -> None:
    _, pop = inputs
    out_dir = tmp_path / "best"
    assert _module().main(["--population", str(pop), "--best-source", str(out_dir)]) == 0
    printed = capsys.readouterr().out.strip()
    assert printed == str(out_dir / "c0002.py")
    assert (out_dir / "c0002.py").read_text() == "A = 2"


def test_best_source_prints_nothing_when_a_seed_is_best(tmp_path, capsys) -> None:
    _population(tmp_path / "pop", seed=[10.0, 5.0], evolved=[50.0, 25.0],
                beside=(0.2, 0.19, 0.21))
    out_dir = tmp_path / "best"
    assert _module().main(["--population", str(tmp_path / "pop"),
                           "--best-source", str(out_dir)]) == 0
    assert capsys.readouterr().out == "" and not out_dir.exists()


def test_a_faster_median_not_confirmed_beside_its_parent_is_labelled_so(tmp_path, capsys) -> None:
    """The evolve's own verdict: a child whose ratio beside its parent spans 1 is not its best,
    however its median compares (the H200 run's "best evolved" was its seed re-timed)."""
    _population(tmp_path / "pop", seed=[100.0, 50.0], evolved=[99.0, 49.5],
                beside=(1.01, 0.99, 1.03))
    module = _module()
    assert module.main(["--population", str(tmp_path / "pop"), "--short"]) == 0
    out = capsys.readouterr().out
    assert "fastest evolved c0002 (not confirmed) (generation 1)" in out
    assert "best evolved" not in out
    out_dir = tmp_path / "best"
    assert module.main(["--population", str(tmp_path / "pop"), "--best-source",
                        str(out_dir)]) == 0
    assert capsys.readouterr().out == "" and not out_dir.exists()
