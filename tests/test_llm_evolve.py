"""End to end: ``pytest --evolve`` with the Gemini scientist against the fake server, then the
same evolution replayed from its call log with no server at all."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from evolve_fakes import REFERENCE, SEED, TASK_TOML
from fake_llm_server import FakeLLMServer
from fake_scientist import ScientistResponder
from helpers import quick_bench

from pytest_kscientist.evolve.llm.ledger import CostLedger, Usage, load_ledger
from pytest_kscientist.evolve.llm.settings import Prices
from pytest_kscientist.evolve.llm.transcript import read_calls

REPO = Path(__file__).parent.parent
AXPY = REPO / "tests" / "data" / "axpy"
KEY = "AIzaFAKE-evolve-key-55555"


@pytest.fixture
def scientist(monkeypatch):
    """The fake Gemini service playing all roles, with a key only the fake accepts."""
    monkeypatch.delenv("GOOGLE_API_KEY", raising=False)
    monkeypatch.setenv("GEMINI_API_KEY", KEY)
    with FakeLLMServer(ScientistResponder()) as server:
        yield server


TOY_CONFTEST = f"""
import os, sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
from evolve_fakes import FakeEvaluator
from pytest_kscientist.evolve.sessions import EVALUATOR_KEY

FAIL = {{(("tile", 16), ("unroll", 1))}}  # the seed's knobs


def pytest_configure(config):
    fail = FAIL if os.environ.get("KS_TOY_SEED_FAILS") else set()
    config.stash[EVALUATOR_KEY] = FakeEvaluator(fail=fail)
"""


@pytest.fixture
def toy(pytester):
    """The toy task with a fake evaluator (the seed fails its check when KS_TOY_SEED_FAILS is
    set)."""
    task = pytester.mkdir("toy")
    (task / "task.toml").write_text(TASK_TOML)
    (task / "reference.py").write_text(REFERENCE)
    (task / "seeds").mkdir()
    (task / "seeds" / "tunable.py").write_text(SEED)
    pytester.makeconftest(TOY_CONFTEST)
    pytester.makeini("[pytest]\n")
    return pytester


def sources(population: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(population.rglob("c*.py"))}


def all_text(folder: Path) -> str:
    return "".join(
        p.read_text(errors="replace")
        for p in folder.rglob("*")
        if p.is_file() and p.suffix in {".py", ".json", ".jsonl", ".md", ".txt", ".log"}
    )


@pytest.mark.slow  # four child pytest sessions: about 50 s on 2 CPU cores
def test_evolve_with_gemini_then_replay_without_it(pytester, scientist):
    shutil.copytree(AXPY, pytester.path / "axpy")
    live = pytester.runpytest_subprocess(
        "-p",
        "no:cacheprovider",
        "--evolve",
        "1",
        "axpy",
        "--ks-llm",
        "gemini",
        "--ks-llm-base-url",
        scientist.url,
        "--ks-candidates",
        "2",
        "--ks-population",
        "live",
    )
    assert live.ret == 0, live.stdout.str()
    live.stdout.fnmatch_lines(
        [  # the projection before the seeds are evaluated, and only there
            "*axpy | gen 0/1 | cost     | kscientist: 1 more generation(s) of 2 candidate(s) "
            "would cost about $0.4* (*from typical prompt sizes and a thinking model's output; "
            "an estimate); the cap of $5.00 ($0.00 spent) covers them",
            "*axpy | gen 0/1 | seed*",
            "*LLM scientist gemini:gemini-2.5-pro, budget $5.00 for this population ($0.00 "
            "spent so far), calls logged in *llm-calls.jsonl",
            "*generation 1*",
        ]
    )
    assert live.stdout.str().count("would cost") == 1
    roles = [r.prompt.splitlines()[0] for r in scientist.requests]
    assert roles == ["# Stage 2: design experiments"] + ["# Stage 3: write the kernel"] * 2
    assert all(r.headers["x-goog-api-key"] == KEY for r in scientist.requests)
    log = pytester.path / "live" / "axpy" / "llm"
    assert [r.role for r in read_calls(log / "llm-calls.jsonl")] == ["designer", "writer", "writer"]
    assert json.loads((log / "llm-ledger.json").read_text())["spent_usd"] > 0
    assert KEY not in all_text(pytester.path / "live") + live.stdout.str() + live.stderr.str()

    replay = pytester.runpytest_subprocess(
        "-p",
        "no:cacheprovider",
        "--evolve",
        "1",
        "axpy",
        "--ks-llm",
        "replay",
        "--ks-replay",
        str(log),
        "--ks-candidates",
        "2",
        "--ks-population",
        "again",
    )
    assert replay.ret == 0, replay.stdout.str()
    assert len(scientist.requests) == 3  # nothing new reached the service
    assert sources(pytester.path / "again") == sources(pytester.path / "live")
    assert len(sources(pytester.path / "live")) == 3  # the seed and two written candidates


@pytest.mark.slow  # about 75 s on 2 CPU cores
def test_evolve_two_generations_of_fp8_gemm_with_gemini(pytester, scientist):
    """The CI run: ``pytest --evolve 2 tasks/fp8_gemm --ks-llm gemini`` on the fake service."""
    # The rounds' length is not what this proves (two generations through the LLM roles).
    quick_bench(shutil.copytree(REPO / "tasks" / "fp8_gemm", pytester.path / "fp8_gemm"))
    result = pytester.runpytest_subprocess(
        "-p",
        "no:cacheprovider",
        "--evolve",
        "2",
        "fp8_gemm",
        "--ks-llm",
        "gemini",
        "--ks-llm-base-url",
        scientist.url,
        "--ks-candidates",
        "1",
        timeout=600,
    )
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(["*generation 2*", "*stopped: 2 generation(s) done*"])
    log = pytester.path / "population" / "fp8_gemm" / "llm" / "llm-calls.jsonl"
    assert {r.role for r in read_calls(log)} >= {"selector", "designer", "writer"}
    assert KEY not in all_text(pytester.path / "population")


def test_the_projection_comes_first_and_leaves_the_ledger_as_it_was(toy, scientist,
                                                                     monkeypatch):
    """Shown before the seeds are evaluated, from the population's ledger, without counting a
    run in it or writing anything: the seed fails, so no role ever starts."""
    monkeypatch.setenv("KS_TOY_SEED_FAILS", "1")
    llm = toy.path / "population" / "toy" / "llm"
    llm.mkdir(parents=True)
    ledger = CostLedger(Prices(1.25, 10.0), 5.0, llm / "llm-ledger.json")
    ledger.charge("writer", Usage(input_tokens=200_000, output_tokens=100_000))
    before = {p.name: p.read_bytes() for p in llm.iterdir()}
    result = toy.runpytest_subprocess("-p", "no:cacheprovider", "--evolve", "3", "toy",
                                      "--ks-llm", "gemini", "--ks-llm-base-url", scientist.url,
                                      "--ks-candidates", "3")
    assert result.ret == 1, result.stdout.str()  # no candidate passes its checks
    result.stdout.fnmatch_lines([
        "*toy | gen 0/3 | cost     | kscientist: 3 more generation(s) of 3 candidate(s) would "
        "cost about $11.65 (*from this population's average cost per call); the cap of "
        "$5.00 ($1.25 spent) covers about 0: *",
        "*toy | gen 0/3 | seed     | 1 new of 1 seed(s): c0001",
        "*no candidate passes its checks*",
    ])
    assert {p.name: p.read_bytes() for p in llm.iterdir()} == before
    assert load_ledger(llm / "llm-ledger.json").runs == 1
    assert scientist.requests == []


def test_a_conftest_role_hook_defers_the_projection_to_the_roles(toy, scientist,
                                                                 monkeypatch):
    """A conftest implementing a role hook may replace the LLM roles, so the projection waits
    for them; here the hook returns None, the LLM roles play, and the line comes once."""
    monkeypatch.delenv("KS_TOY_SEED_FAILS", raising=False)
    toy.makeconftest(TOY_CONFTEST + "\n\ndef pytest_kscientist_make_selector(config, task):\n"
                     "    return None\n")
    result = toy.runpytest_subprocess("-p", "no:cacheprovider", "--evolve", "1", "toy",
                                      "--ks-llm", "gemini", "--ks-llm-base-url", scientist.url,
                                      "--ks-candidates", "1")
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines([
        "*toy | gen 0/1 | seed     | 1 new of 1 seed(s): c0001",
        "*toy | gen 1/1 | roles    | kscientist: 1 more generation(s) of 1 candidate(s) would "
        "cost about $* the cap of $5.00 ($0.00 spent) covers them",
        "*generation 1*",
    ])
    assert result.stdout.str().count("would cost") == 1
    result.stdout.no_fnmatch_line("*| cost     |*")
