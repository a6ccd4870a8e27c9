"""Every failure kind of a candidate becomes its own one-line verdict; honest code passes.

One pytest session evaluates the whole corpus in ``tests/data/candidates`` against the tiny
axpy task, so the worker replacement after each failure is exercised too.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import AXPY, CANDIDATES, case_reasons, run_pytest

from pytest_kscientist.harness.results import RESULTS_SCHEMA_VERSION, RunResults
from pytest_kscientist.harness.stats import rounds_centre

EXPECTED = {
    "wrong": "wrong result: 33 of 33 elements outside",
    "raises": "RuntimeError: boom from the kernel",
    # A message of several lines keeps its first and its last (the cause, for Triton).
    "multiline": "RuntimeError: at 3:4: ... ValueError: unsupported tensor layout",
    "exits": "worker exited with code 0 before answering 'check'",
    "sysexit": "SystemExit: 0",
    "hangs": "no answer to 'check' within 4 s (hang?); worker killed",
    "syntax": "failed to load: SyntaxError",
    "noentry": "failed to load: defines no callable custom_kernel(data)",
    "badsig": "failed to load: custom_kernel() cannot be called as custom_kernel(data)",
    "mutates": "modified input 1 in place",
    "aliases": "returned a tensor sharing memory with input 1",
    "untouched": "NaN where the reference is not: unwritten output?",
    "forges": "failed authentication (forged or out of order)",
    "subclass": "returned _ks_candidate.AlwaysClose, expected a plain torch.Tensor",
    "expanded": "returned an expanded tensor (stride 0",
    "skips": "Skipped: nothing to see here",
    # The re-run's hint follows what its output was (it said "cached" whatever it was).
    "later_wrong": "drawn again by generate_input: wrong result: 33 of 33 elements outside "
                   "|out-ref| <= 1e-06 + 1e-06*|ref| (the first inputs passed: wrong for some "
                   "inputs only)",
    "kept": "(the same output as for the first inputs: a result cached across calls?)",
    "sibling": "good_helper(.py) beside the candidate is not importable in its worker; a "
               "candidate is one file",
}


@pytest.fixture(scope="module")
def corpus_run(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("corpus")
    kernels = [f"--kernel={p}" for p in sorted(CANDIDATES.glob("*.py"))]
    kernels.append(f"--kernel={AXPY / 'seeds' / 'good.py'}")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MY_SERVICE_API_KEY", "must-not-reach-candidates")
        return run_pytest([str(AXPY), "-k", "n33 or bench", "--ks-timeout", "4", "--ks-device",
                           "cpu", *kernels], tmp)  # the CPU's verdicts, on any machine


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_failure_kind_has_its_reason(corpus_run, name: str) -> None:
    _, _, data = corpus_run
    outcome, reason = case_reasons(data)[(name, "n33-s2")]
    assert outcome == "failed"
    assert EXPECTED[name] in reason


def test_a_load_failure_shows_the_candidates_traceback_once(corpus_run) -> None:
    _, output, data = corpus_run
    (syntax,) = [c for c in data["candidates"] if c["name"] == "syntax"]
    first, *rest = syntax["cases"]
    assert 'syntax.py", line 1' in first["detail"] and "SyntaxError" in first["detail"]
    assert "pytest_kscientist" not in first["detail"]  # the harness's frames are left out
    assert rest and all(c["detail"] == "(details under the first failed item of syntax)"
                        for c in rest)


def test_hang_fails_the_rest_of_the_candidate_at_once(corpus_run) -> None:
    _, _, data = corpus_run
    outcome, reason = case_reasons(data)[("hangs", "n4096-s3")]
    assert outcome == "failed"
    assert reason == "not run: the candidate hung on check n33-s2 and was killed"


def test_honest_controls_pass_after_failing_workers(corpus_run) -> None:
    code, output, data = corpus_run
    reasons = case_reasons(data)
    for name in ("good", "secrets_probe"):  # secrets_probe raises if any *KEY* variable leaks
        assert reasons[(name, "n33-s2")] == ("passed", "")
        assert reasons[(name, "n4096-s3")] == ("passed", "")
    assert code == 1
    assert "reproduce with --ks-salt" in output


def test_a_candidate_failing_a_check_is_not_timed(corpus_run) -> None:
    # (Benchmarks that run, -k bench, name the timed call that was wrong: test_corpus.py and
    # test_timing_fidelity.py.)
    _, _, data = corpus_run
    reasons = case_reasons(data)
    assert reasons[("wrong", "n4096-s3")] == (
        "failed", "not timed: check n33-s2 failed earlier in this run")
    assert reasons[("hangs", "n4096-s3")][1].startswith("not run: the candidate hung")


def test_json_follows_the_schema(corpus_run) -> None:
    _, _, data = corpus_run
    run = RunResults.model_validate(data)
    assert run.schema_version == RESULTS_SCHEMA_VERSION == 14
    assert run.task == "axpy" and run.profile == "cpu"
    assert run.machine_failures == []  # every worker started: the failures are verdicts
    good = next(c for c in run.candidates if c.name == "good")
    assert good.sha256 and Path(good.path).name == "good.py"
    assert good.source == Path(good.path).read_text() and good.load_s is not None
    bench = next(c for c in good.cases if c.kind == "bench")
    assert bench.stats is not None and bench.stats.runs >= 5
    assert bench.stats.clock == "perf_counter_ns"
    assert bench.stats.min_us <= bench.stats.median_us <= bench.stats.max_us
    # verify_samples (2) in each of the 4 rounds it shared with the other candidates
    assert bench.stats.verified_runs == 2 * 4
    assert good.geomean_us == pytest.approx(bench.stats.median_us)
    assert good.speedup_over_reference is not None
    # every shared round's ratio is kept, and the speedup is their median
    over_ref = bench.fellows["reference"]
    assert len(over_ref.round_speedups) == over_ref.rounds == 4
    assert over_ref.speedup == pytest.approx(rounds_centre(over_ref.round_speedups))
    assert over_ref.speedup_low <= over_ref.speedup <= over_ref.speedup_high
    assert {c.name for c in run.candidates if c.geomean_us is None} >= set(EXPECTED)
