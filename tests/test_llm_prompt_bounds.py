"""Issue 13: prompts stay bounded over a long run. A synthetic fp8_gemm population at
generation 50 (152 candidates of the real seeds' size, a third failed with long tracebacks, the
rest timed beside their parents, designer notes and rejected drafts every generation) must give
prompts under a stated bound, and 50 more generations must not raise them."""

from __future__ import annotations

import re
from pathlib import Path

from fake_llm_server import FakeLLMServer
from fake_scientist import ScientistResponder, fake_settings

from pytest_kscientist.evolve import findings
from pytest_kscientist.evolve.llm.factory import build_roles
from pytest_kscientist.evolve.llm.ledger import TOKENS_PER_CHAR
from pytest_kscientist.evolve.offline.knobs import read_tunables, rewrite_tunables
from pytest_kscientist.evolve.population import CandidateMeta, EvaluationRecord, Member
from pytest_kscientist.evolve.roles import ExperimentPlan, TaskBrief
from pytest_kscientist.harness.results import BaselineTiming, CandidateResult, CaseResult

TASK = Path(__file__).parent.parent / "tasks" / "fp8_gemm"
BENCHES = [f"m{m}-n{n}-k{k}-s{s}" for m, n, k, s in (
    (1024, 1536, 7168, 8135), (1024, 4608, 7168, 6251), (1024, 7168, 256, 12346),
    (1024, 7168, 2048, 4711), (1024, 1536, 1536, 111), (1024, 576, 7168, 222),
    (6144, 1536, 7168, 333), (6144, 4608, 7168, 444), (6144, 7168, 256, 555),
    (6144, 7168, 2048, 666), (6144, 1536, 1536, 777), (6144, 576, 7168, 888),
    (4096, 1536, 7168, 999), (4096, 4608, 7168, 1010), (4096, 7168, 256, 1111),
    (4096, 7168, 2048, 1212), (4096, 1536, 1536, 1313), (4096, 576, 7168, 1414))]
GENERATIONS = 50
# The stated bound, in tokens at the ledger's conservative 3 characters a token (so about 25%
# over a real tokenizer's count), the system prompt included. Measured: selector 3.5k, 9.7k,
# 10.2k at generations 1, 10, 50; designer 8.5k, 13.9k, 14.4k; writer 6.3k throughout, with
# children of 8 kB; with children of 12.5 kB (triton_fused.py), designer 15.9k and writer 7.9k
# at generation 50; with children of 24 kB (cuda_wgmma.py then), designer 23.4k and writer
# 15.4k; of 34 kB (cuda_wgmma.py with stream-K and its TMA epilogue, the largest seed), designer
# 26.7k and writer 18.7k; of 38 kB (its scales copied with the tiles), designer 27.97k and
# writer 19.98k; of 37.8 kB (with C_BUFFERS, its comments shortened), designer 27,987 and writer
# 19,997. Those children all descended from a failed member, so the findings' helped / hurt /
# neutral sections stayed nearly empty. Now children of passed bases, timed beside them per
# benchmark, moving knobs of one class or of all (as the selector and the offline scientist
# make them), a third each helped, hurt and neutral, so every section fills to its cap:
# selector 11,840, designer 29,587, writer 19,997 at generation 50; 11,741, 29,487 and 19,997
# at 100. The designer and writer prompts carry two complete kernels (25k of those). With the
# seeds' shape_of (38.0 kB cuda_wgmma.py): selector 11,840, designer 29,669, writer 20,079 at
# generation 50; designer and writer get 1k more room for the seeds to grow. With 44.2 kB
# (fewer instructions a step, 2026-12-07): selector 11,840, designer 31,710, writer 22,376.
# With 44.9 kB (stream-K's CTA count fitted, 1.05x on an H100): designer 31,959, writer 22,625;
# the writer's bound moved to 23,000 for that code (the comments it would have cost say why the
# kernel is built as it is). With 45.3 kB (the fixup folded in place and tile origins by magic
# numbers, 2026-12-07; 300 bytes of comments shortened for it): designer 32,086, writer 22,752;
# the designer's bound moved to 32,500 for that code.
BOUND_TOKENS = {"selector": 12_000, "designer": 32_500, "writer": 23_000}

TRACEBACK = "Traceback (most recent call last):\n" + "".join(
    f'  File "/pop/fp8_gemm/c0{i:03d}/kernel.py", line {i}, in f{i}\n    call_{i}(a, b)\n'
    for i in range(60)) + (
    "triton.compiler.errors.CompilationError: at 12:8:\n" + "    acc = tl.dot(a, b)\n" * 40
    + "        ^\nValueError('Cannot make_shape_compatible: incompatible dimensions')\n")


def brief() -> TaskBrief:
    from pytest_kscientist.formats.task import load_task

    return TaskBrief(name="fp8_gemm", description=load_task(TASK).spec.description,
                     reference_source=(TASK / "reference.py").read_text(),
                     hardware="NVIDIA H200 (sm_90, 132 SMs, 50 MB L2); torch 2.11, Linux",
                     benchmark_ids=BENCHES)


def member(cid: str, g: int, source: str, parents: list[str], failed: bool,
           time_us: float) -> Member:
    plan = None if g == 0 else ExperimentPlan(
        title=f"experiment {cid}: retile and reorder the K loop of generation {g}",
        changes="...", expected_gain_min_pct=1, expected_gain_max_pct=9, innovation=5)
    meta = CandidateMeta(id=cid, task="fp8_gemm", generation=g, parents=parents, sha256=cid,
                         origin="seed" if g == 0 else "writer", seed_file=f"{cid}.py",
                         created_at="2026-01-01T00:00:00", plan=plan,
                         explanation="A change explained at length. " * 40)
    if failed:
        case = CaseResult(kind="check", case={"m": 1}, case_id=BENCHES[0], outcome="failed",
                          reason="CompilationError: at 12:8: ... ValueError(...)",
                          detail=TRACEBACK)
        result = CandidateResult(name=cid, path=cid, sha256=cid, cases=[case])
        ev = EvaluationRecord(id=cid, evaluated_at="t", status="failed", result=result,
                              failure=f"check {BENCHES[0]}: {case.reason}")
    else:
        medians = {b: time_us * (1 + i / 20) for i, b in enumerate(BENCHES)}
        ratio = [0.97, 1.0, 1.03][int(cid[1:]) // 3 % 3]  # hurt, neutral, helped: all fill
        # timed beside its parent per benchmark, so a knob move's findings line is the longer
        # one over the benchmarks it moved (links.py)
        timed = {parents[0]: BaselineTiming(speedup=ratio, speedup_low=ratio - 0.02,
                                            speedup_high=ratio + 0.02)} if parents else {}
        cases = [CaseResult(kind="bench", case=dict(zip("mnks", map(int, re.findall(r"\d+", b)),
                                                        strict=True)),
                            case_id=b, outcome="passed", baselines=timed) for b in BENCHES]
        ev = EvaluationRecord(id=cid, evaluated_at="t", status="passed", geomean_us=time_us,
                              bench_median_us=medians,
                              speedups={parents[0]: ratio} if parents else {},
                              speedup_intervals={parents[0]: [ratio - 0.02, ratio + 0.02]}
                              if parents else {},
                              result=CandidateResult(name=cid, path=cid, sha256=cid,
                                                     cases=cases))
    if parents and "GROUP_M" in read_tunables(source):
        # knob moves, each unlike its parent's: odd ids move one class (their links are taken
        # over the 6 benchmarks it holds), even ids every benchmark (whole-run links)
        group_m = [1, 4, 8, 16][int(cid[1:]) % 4]
        rule = {"when": {"k": [None, 1792]},
                "knobs": {"STREAM_K": 0, "GROUP_M": group_m}}
        source = (rewrite_tunables(source, {}, [rule], ["k < 1792"]) if int(cid[1:]) % 2
                  else rewrite_tunables(source, {"GROUP_M": group_m}))
    return Member(meta, source + f"\n# variant {cid}\n", ev)


def population_at(generations: int) -> tuple[list[Member], str]:
    """The members and the findings document after ``generations`` generations."""
    seeds = sorted((TASK / "seeds").glob("*.py"))
    members = [member(f"c{i + 1:04d}", 0, p.read_text(), [], False, 180.0 - i)
               for i, p in enumerate(seeds)]
    # every child the size of the largest seed (38 kB: cuda_wgmma.py)
    big = max(seeds, key=lambda p: p.stat().st_size).read_text()
    for g in range(1, generations + 1):
        bases = [m for m in members if m.status == "passed"]  # the selector picks passed bases
        for k in range(3):
            cid = f"c{len(members) + 1:04d}"
            members.append(member(cid, g, big, [bases[-1 - k].id], k == 2, 170.0 - g / 10))
    notes = [(g, "- a finding that cites c0042 and its 123.4 us at length\n" * 30)
             for g in range(generations, 0, -1)]
    rejected = [(g, f"plan of generation {g}", "SyntaxError: invalid syntax at line 88: " +
                 "x" * 400) for g in range(generations, 0, -1)]
    return members, findings.render("fp8_gemm", members, notes, generations, rejected)


def prompt_tokens(tmp_path: Path, generations: int) -> dict[str, int]:
    """Tokens (3 characters each) of the selector, designer and writer prompts."""
    members, doc = population_at(generations)
    summaries = [m.summary() for m in members]
    base, reference = summaries[-2], summaries[1]
    with FakeLLMServer(ScientistResponder()) as server:
        roles = build_roles(fake_settings(server), brief(), tmp_path / str(generations))
        assert roles is not None
        roles.selector.select(brief(), summaries, doc)
        design = roles.designer.design(brief(), base, reference, summaries, doc, 3)
        roles.writer.write(brief(), base, design.kept[0], reference=reference)
    by_role = {r.prompt.split(":")[0]: r for r in server.requests}
    names = {"# Stage 1": "selector", "# Stage 2": "design experiments", "# Stage 3": "writer"}
    sizes = {}
    for heading, role in zip(names, BOUND_TOKENS, strict=True):
        request = by_role[heading]
        sizes[role] = int((len(request.system) + len(request.prompt)) * TOKENS_PER_CHAR)
    return sizes


def test_prompts_at_generation_50_stay_under_the_stated_bound(tmp_path):
    at_50 = prompt_tokens(tmp_path, GENERATIONS)
    for role, bound in BOUND_TOKENS.items():
        assert at_50[role] <= bound, (role, at_50)
    at_100 = prompt_tokens(tmp_path, 100)
    for role in BOUND_TOKENS:  # bounded, not merely slow-growing: 50 more generations add ~0
        assert at_100[role] <= at_50[role] * 1.02, (role, at_50, at_100)


def test_the_bounded_prompts_still_carry_the_latest_and_the_best(tmp_path):
    members, doc = population_at(GENERATIONS)
    assert f"After generation {GENERATIONS}: {len(members)} candidates" in doc
    assert "- and " in doc and "older failures (generations 1-" in doc  # summarised, counted
    assert "ValueError('Cannot make_shape_compatible" in doc  # the newest failure in full
    assert "(notes of generations 1-45 left out" in doc
    # the longest findings lines, links over the benchmarks a class move changed, are there
    assert "on the 6 of 18 benchmarks it moved) over the parent timed beside it" in doc
    from pytest_kscientist.evolve.llm import prompts

    table = prompts.population_table([m.summary() for m in members])
    fastest = min((m for m in members if m.geomean_us), key=lambda m: m.geomean_us or 0)
    assert f"`{members[-1].id}`" in table and f"`{fastest.id}`" in table
    assert "`c0001`" not in table  # an old, slow seed
    seeds = sum(m.meta.generation == 0 for m in members)  # 4 (tasks/fp8_gemm/seeds)
    assert (f"{126 + seeds} older or slower candidates not shown (generations 0-42: "
            f"{84 + seeds} passed") in table
    shapes = prompts.shape_table([m.summary() for m in members])
    assert shapes.count("\n") == len(BENCHES) + 1 and "**" in shapes


def test_a_small_population_is_shown_whole():
    from pytest_kscientist.evolve.llm import prompts

    members, doc = population_at(1)
    table = prompts.population_table([m.summary() for m in members])
    assert "not shown" not in table and all(f"`{m.id}`" in table for m in members)
    assert "- and " not in doc
