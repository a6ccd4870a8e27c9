"""Fakes for the ``--evolve`` tests: a tunable kernel, a synthetic evaluator, scripted roles.

Imported by ``tests/test_evolve_*.py`` and by the ``conftest.py`` files those tests write into
``pytester`` folders (the tests folder is put on ``sys.path`` there).
"""

from __future__ import annotations

import json
import math
import os
import threading
from pathlib import Path

from pytest_kscientist.evolve.offline.knobs import read_tunables, rewrite_tunables
from pytest_kscientist.evolve.roles import Design, Draft, ExperimentPlan, Selection, keep_three
from pytest_kscientist.harness.results import (
    CandidateResult,
    CaseResult,
    MachineInfo,
    RunResults,
    TimingStats,
)

BENCHES = ["n1024-s3", "n4096-s4"]

SEED = '''"""A tunable seed: the fake evaluator times it from its knobs alone."""

TUNABLES = {"tile": 16, "unroll": 1}  # rewritten by the offline writer
TUNABLE_SPACE = {"tile": [8, 16, 32, 64, 128], "unroll": [1, 2, 4, 8]}


def custom_kernel(data):
    return data
'''

PLAIN = '''"""A seed without knobs."""


def custom_kernel(data):
    return data
'''

TASK_TOML = """name = "toy"
description = "a toy task for the evolve tests"
case_keys = ["n", "seed"]

[profiles.full]
tests = [{ n = 16, seed = 1 }]
benchmarks = [{ n = 1024, seed = 3 }, { n = 4096, seed = 4 }]

[profiles.cpu]
tests = [{ n = 16, seed = 1 }]
benchmarks = [{ n = 1024, seed = 3 }, { n = 4096, seed = 4 }]
"""

REFERENCE = """def generate_input(n, seed):
    return [0.0] * n


def ref_kernel(data):
    return data
"""


def synthetic_us(knobs: dict) -> list[float]:
    """Per-benchmark times of a knob setting: best at tile=64, unroll=4 (seed: 16, 1)."""
    tile, unroll = knobs.get("tile", 16), knobs.get("unroll", 1)
    base = 100.0 * (1 + abs(math.log2(tile / 64)) * 0.6) * (1 + abs(math.log2(unroll / 4)) * 0.3)
    return [base, base * 3.0]


class FakeEvaluator:
    """Times kernels from their TUNABLES; ``fail`` names knob settings that fail a check."""

    def __init__(self, fail: set[tuple] | None = None, block_at_call: int | None = None,
                 detail: str = "", reason: str = "mismatch at [3]: 1.0 vs 2.0") -> None:
        self.calls: list[list[str]] = []
        self.fail = fail or set()
        self.block_at_call = block_at_call
        self.detail = detail  # of a failing case: a traceback, say
        self.reason = reason

    def evaluate(self, kernels: list[Path], timeout_s: float | None,
                 beside: tuple[Path, ...] = ()) -> RunResults:
        self.calls.append([p.stem for p in kernels])
        log = os.environ.get("KS_FAKE_CALL_LOG")
        if log:
            with open(log, "a", encoding="utf-8") as f:
                f.write(json.dumps([p.stem for p in kernels]) + "\n")
        if self.block_at_call is not None and len(self.calls) == self.block_at_call:
            fd = int(os.environ["KS_FAKE_READY_FD"])
            os.write(fd, b"READY\n")
            threading.Event().wait()  # until the test kills this process
        return RunResults(
            task="toy",
            task_path="toy",
            profile="cpu",
            salt=7,
            started_at="2026-01-01T00:00:00",
            machine=MachineInfo(
                hostname="h", platform="p", python="3", torch="t", device="cpu", device_name="fake"
            ),
            candidates=[self._beside(self._result(p), beside) for p in kernels],
            item_seconds={"check": 1.25, "bench": 2.5, "validate": 0.01},
        )

    def _beside(self, result: CandidateResult, beside: tuple[Path, ...]) -> CandidateResult:
        """Speedups over the kernels timed beside, as an interleaved session reports them:
        the synthetic ratio, with a 1% interval."""
        if result.geomean_us is None:
            return result
        for path in beside:
            other = self._result(path).geomean_us
            if other:
                ratio = other / result.geomean_us
                result.speedups[path.stem] = ratio
                result.speedup_intervals[path.stem] = [ratio * 0.99, ratio * 1.01]
        return result

    def _result(self, path: Path) -> CandidateResult:
        knobs = read_tunables(path.read_text(encoding="utf-8"))
        if tuple(sorted(knobs.items())) in self.fail:
            case = CaseResult(
                kind="check",
                case={"n": 16, "seed": 1},
                case_id="n16-s1",
                outcome="failed",
                reason=self.reason,
                detail=self.detail,
            )
            return CandidateResult(name=path.stem, path=str(path), sha256="x", cases=[case])
        times = synthetic_us(knobs) if knobs else [500.0, 1500.0]
        cases = [
            CaseResult(
                kind="bench",
                case={"n": 0, "seed": 0},
                case_id=bench,
                outcome="passed",
                stats=TimingStats(
                    mean_us=t, median_us=t, min_us=t, max_us=t, std_us=0, stderr_us=0, runs=5
                ),
            )
            for bench, t in zip(BENCHES, times, strict=True)
        ]
        return CandidateResult(
            name=path.stem,
            path=str(path),
            sha256="x",
            cases=cases,
            geomean_us=math.sqrt(times[0] * times[1]),
        )


class ScriptedSelector:
    """Always the best passing candidate as base, no reference; records what it was shown."""

    def __init__(self) -> None:
        self.seen: list[list[str]] = []

    def select(self, task, population, findings):
        self.seen.append([c.id for c in population])
        passed = [c for c in population if c.status == "passed"]
        best = min(passed, key=lambda c: c.geomean_us)
        return Selection(base_id=best.id, reference_id=None, reason=f"scripted: best is {best.id}")


class ScriptedDesigner:
    """Proposes tile moves up the space (then unroll), skipping settings already present."""

    def __init__(self) -> None:
        self.calls = 0

    def design(self, task, base, reference, population, findings, n_keep):
        self.calls += 1
        tried = {tuple(sorted(read_tunables(c.source).items())) for c in population}
        knobs = read_tunables(base.source)
        plans = []
        for tile in (8, 16, 32, 64, 128):
            for unroll in (1, 2, 4, 8):
                change = {"tile": tile, "unroll": unroll}
                if tuple(sorted(change.items())) not in tried and len(plans) < 5:
                    plans.append(
                        ExperimentPlan(
                            title=f"tile {knobs['tile']}->{tile}, "
                            f"unroll {knobs['unroll']}->{unroll}",
                            changes="scripted",
                            expected_gain_min_pct=0,
                            expected_gain_max_pct=10 + tile,
                            innovation=min(10, unroll),
                            knobs=change,
                        )
                    )
        return Design(avenues=["scripted"] * 10, plans=plans, kept=keep_three(plans, n_keep))


class ScriptedWriter:
    """Rewrites the knobs; ``interrupt_at`` raises KeyboardInterrupt on that call (1-based)."""

    def __init__(self, interrupt_at: int | None = None, same_source: bool = False) -> None:
        self.calls = 0
        self.interrupt_at = interrupt_at
        self.same_source = same_source

    def write(self, task, base, plan):
        self.calls += 1
        if self.calls == self.interrupt_at:
            raise KeyboardInterrupt
        knobs = {"tile": 128, "unroll": 8} if self.same_source else plan.knobs
        return Draft(source=rewrite_tunables(base.source, knobs), explanation="scripted")
