"""Issue 13: the LLM scientist survives a long run. The loop with the real google-genai client
against the fake service: wrong ids every time, a compile error repaired from its full text,
rate-limit storms, one ledger per population."""

from __future__ import annotations

import io
import json
from dataclasses import replace
from pathlib import Path

import pytest
from evolve_fakes import SEED, FakeEvaluator
from fake_llm_server import FakeLLMServer, FakeReply, FakeRequest
from fake_scientist import FAST_RETRY, ScientistResponder, fake_settings

from pytest_kscientist.evolve.assemble import Roles
from pytest_kscientist.evolve.llm.factory import build_roles
from pytest_kscientist.evolve.llm.settings import RetryPolicy
from pytest_kscientist.evolve.loop import Budget, Evolution
from pytest_kscientist.evolve.population import Population
from pytest_kscientist.evolve.progress import Terminal
from pytest_kscientist.evolve.roles import TaskBrief

BRIEF = TaskBrief(name="toy", description="a toy", reference_source="def ref_kernel(d):\n"
                  "    return d\n", hardware="fake", benchmark_ids=["n1024-s3", "n4096-s4"])

# What the worker reports for a Triton kernel that does not compile: the reason keeps the first
# line, the cause and the failing line are further down (issue 13).
TRITON_TRACEBACK = '''Traceback (most recent call last):
  File "/pop/toy/c0002/c0002.py", line 30, in custom_kernel
    _kernel[grid](a, out, BLOCK=3)
  File "/site-packages/triton/runtime/jit.py", line 345, in run
    kernel = self.compile(src, target=target, options=options.__dict__)
  File "/site-packages/triton/compiler/compiler.py", line 276, in compile
    module = src.make_ir(options, codegen_fns, module_map, context)
triton.compiler.errors.CompilationError: at 3:4:
def _kernel(a_ptr, out_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    ^
ValueError("arange's range must be a power of 2")
'''
TILE_8 = (("tile", 8), ("unroll", 1))  # the fake scientist's first single-knob change


class Loop:
    """An ``Evolution`` of the toy task over ``root`` with the given roles and evaluator."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "seeds").mkdir(parents=True, exist_ok=True)
        # Without the comment after TUNABLES, which the fake scientist's writer cannot parse.
        (root / "seeds" / "tunable.py").write_text(SEED.replace(
            "  # rewritten by the offline writer", ""))
        self.out = io.StringIO()

    def __call__(self, generations: int, roles: Roles, evaluator: FakeEvaluator,
                 candidates: int = 1) -> int:
        self.pop = Population(self.root / "population" / "toy", "toy")
        return Evolution(
            task="toy", seeds=[self.root / "seeds" / "tunable.py"], population=self.pop,
            evaluator=evaluator, make_roles=lambda members: (roles, BRIEF),
            budget=Budget(generations, candidates), terminal=Terminal(stream=self.out),
        ).run()

    def events(self, kind: str) -> list[dict]:
        return [e.data for e in self.pop.events() if e.kind == kind]


def llm_roles(server: FakeLLMServer, root: Path, **changes: object) -> Roles:
    made = build_roles(fake_settings(server, **changes), BRIEF, root / "population" / "toy" /
                       "llm")
    assert made is not None
    return Roles(*made)


def retry_policy(**changes: float) -> RetryPolicy:
    """The fake scientist's millisecond retries (three attempts), with ``changes``."""
    return replace(FAST_RETRY, **changes)


def prompts_of(server: FakeLLMServer, heading: str) -> list[str]:
    return [r.prompt for r in server.requests if r.prompt.startswith(heading)]


def test_a_compile_error_reaches_the_repair_prompt_and_the_findings_in_full(tmp_path):
    loop = Loop(tmp_path)
    evaluator = FakeEvaluator(fail={TILE_8}, detail=TRITON_TRACEBACK,
                              reason="load: CompilationError: at 3:4:")
    with FakeLLMServer(ScientistResponder()) as server:
        assert loop(2, llm_roles(server, tmp_path), evaluator) == 0
    [failed] = [m for m in loop.pop.members() if m.status == "failed"]
    [repair] = prompts_of(server, "# Repair: your kernel failed when it ran")
    assert "offs = tl.arange(0, BLOCK)" in repair  # the failing line, only in the traceback
    assert "ValueError(\"arange's range must be a power of 2\")" in repair
    assert "_kernel[grid](a, out, BLOCK=3)" in repair  # the candidate's own frame
    assert failed.source.strip() in repair and f"(`{failed.id}`)" in repair
    [fixed] = [m for m in loop.pop.members() if m.meta.repair_of == failed.id]
    assert fixed.meta.generation == 2 and fixed.status == "passed"
    assert fixed.meta.parents == failed.meta.parents and fixed.meta.plan == failed.meta.plan
    assert [e["failed"] for e in loop.events("repair_done")] == [failed.id]
    assert [fixed.id] in [call[-1:] for call in evaluator.calls]  # evaluated with generation 2
    # The next designer reads the same text in the findings.
    designer = prompts_of(server, "# Stage 2")[-1]
    assert "arange's range must be a power of 2" in designer
    findings = (loop.pop.root / "findings.md").read_text()
    assert "offs = tl.arange(0, BLOCK)" in findings


def test_wrong_ids_every_time_still_complete_two_generations_with_recorded_fallbacks(tmp_path):
    scientist = ScientistResponder()

    def lost(request: FakeRequest) -> FakeReply:
        if request.prompt.startswith("# Stage 1"):  # the selector, answering a number
            return FakeReply(text=json.dumps({"base_id": "4050", "reference_id": "4050",
                                              "reason": "it is the fastest"}))
        return scientist(request)

    loop = Loop(tmp_path)
    with FakeLLMServer(lost) as server:
        assert loop(3, llm_roles(server, tmp_path), FakeEvaluator()) == 0
    assert sorted(e.generation for e in loop.pop.events() if e.kind == "generation_done") == [
        0, 1, 2, 3]
    fallbacks = loop.events("role_fallback")
    assert [f["role"] for f in fallbacks] == ["selector", "selector"]  # gen 1 had one candidate
    assert "base_id" in fallbacks[0]["error"] and "4050" in fallbacks[0]["error"]
    assert len(prompts_of(server, "# Stage 1")) == 2 * 3  # three attempts per generation
    assert "the offline selector stands in for this generation" in loop.out.getvalue()


def test_drafts_rejected_before_the_gpu_appear_in_the_next_prompts(tmp_path):
    scientist = ScientistResponder()
    prose = iter(range(2))  # generation 1's writer call and its repair round answer in prose

    def prose_writer(request: FakeRequest) -> FakeReply:
        if request.prompt.startswith(("# Stage 3", "# Repair")) and next(prose, None) is not None:
            return FakeReply(text="I would rather describe the kernel than write it.")
        return scientist(request)

    loop = Loop(tmp_path)
    with FakeLLMServer(prose_writer) as server:
        assert loop(2, llm_roles(server, tmp_path), FakeEvaluator()) == 0
    [rejected] = [e for e in loop.events("plan_done") if e["outcome"] == "write_failed"]
    assert "prose without a ```python block" in rejected["error"]
    designer = prompts_of(server, "# Stage 2")[-1]
    assert "## Drafts that never ran" in designer
    assert f"`{rejected['plan_title']}`: " in designer and "prose without a" in designer


def test_the_ledger_survives_a_resume_with_its_spent_total(tmp_path):
    from pytest_kscientist.evolve.llm.ledger import load_ledger
    from pytest_kscientist.evolve.llm.transcript import read_calls

    loop = Loop(tmp_path)
    with FakeLLMServer(ScientistResponder()) as server:
        assert loop(1, llm_roles(server, tmp_path), FakeEvaluator()) == 0
        log = loop.pop.root / "llm"
        after_one = load_ledger(log / "llm-ledger.json").spent_usd
        assert after_one > 0
        resumed = build_roles(fake_settings(server), BRIEF, log)  # a new run, a new ledger
        assert resumed is not None
        assert f"(${after_one:.2f} spent so far)" in resumed.describe()
        assert loop(2, Roles(*resumed), FakeEvaluator()) == 0
    ledger = load_ledger(log / "llm-ledger.json")
    calls = read_calls(log / "llm-calls.jsonl")
    assert ledger.runs == 2 and ledger.spent_usd > after_one
    assert ledger.spent_usd == pytest.approx(sum(c.cost_usd for c in calls))
    assert sum(t.calls for t in ledger.roles.values()) == len(calls) == len(server.requests)


def test_a_429_storm_longer_than_the_outage_limit_stops_cleanly_and_a_rerun_resumes(tmp_path):
    loop = Loop(tmp_path)
    storm = retry_policy(outage_s=0.001)  # every failed call is already "too long"
    with FakeLLMServer(lambda r: FakeReply.error(429, "Resource has been exhausted")) as server:
        assert loop(2, llm_roles(server, tmp_path, retry=storm), FakeEvaluator()) == 3
    out = loop.out.getvalue()
    assert "no LLM call has succeeded for 0 s (1 failed in a row, retries included), longer " \
        "than --ks-llm-outage-s 0.001" in out
    assert "HTTP 429" in out and "rerun the same command to resume" in out
    assert len(server.requests) == storm.attempts  # one call and its retries: no stand-in
    assert loop.events("role_fallback") == [] and loop.events("run_end")[-1]["code"] == 3
    assert [e.generation for e in loop.pop.events() if e.kind == "generation_done"] == [0]
    with FakeLLMServer(ScientistResponder()) as server:
        assert loop(2, llm_roles(server, tmp_path), FakeEvaluator()) == 0
    assert sorted(e.generation for e in loop.pop.events() if e.kind == "generation_done") == [
        0, 1, 2]


def test_a_storm_shorter_than_the_outage_limit_is_stood_in_for(tmp_path):
    loop = Loop(tmp_path)
    with FakeLLMServer(ScientistResponder()) as server:
        server.push(*[FakeReply.error(429)] * retry_policy().attempts)  # the designer's call
        assert loop(1, llm_roles(server, tmp_path), FakeEvaluator()) == 0
    [fallback] = loop.events("role_fallback")
    assert fallback["role"] == "designer" and "HTTP 429" in fallback["error"]
    assert any(m.meta.generation == 1 for m in loop.pop.members())  # the LLM writer wrote it


def test_a_refused_key_stops_at_once_with_the_fix(tmp_path):
    loop = Loop(tmp_path)
    with FakeLLMServer(lambda r: FakeReply.error(401, "API key not valid")) as server:
        assert loop(1, llm_roles(server, tmp_path), FakeEvaluator()) == 3
    assert len(server.requests) == 1
    assert "the provider refuses calls (HTTP 401): check the API key" in loop.out.getvalue()


@pytest.mark.parametrize("provider", ["gemini", "openai"])
def test_the_servers_retry_hint_is_honoured_beyond_the_backoff_cap(tmp_path, provider):
    from pytest_kscientist.evolve.llm.gemini import GeminiProvider
    from pytest_kscientist.evolve.llm.openai_compat import OpenAICompatProvider
    from pytest_kscientist.evolve.llm.provider import LLMRequest
    from pytest_kscientist.evolve.llm.transcript import Redactor

    slept: list[float] = []
    policy = retry_policy()  # backoff capped at 0.05 s
    with FakeLLMServer() as server:
        header = FakeReply.error(429)
        header.headers = {"Retry-After": "42"}
        server.push(header)
        if provider == "gemini":  # Gemini's own hint: RetryInfo in the error body
            server.push(FakeReply(status=429, body=json.dumps({"error": {
                "code": 429, "message": "quota", "status": "RESOURCE_EXHAUSTED", "details": [
                    {"@type": "type.googleapis.com/google.rpc.RetryInfo",
                     "retryDelay": "17s"}]}})))
        server.push("fine")
        if provider == "gemini":
            made = GeminiProvider("m", "AIzaFAKE-hint-key-000000", policy, Redactor([]),
                                  base_url=server.url, sleep=slept.append)
        else:
            made = OpenAICompatProvider("m", server.openai_url, policy, Redactor([]),
                                        sleep=slept.append)
        reply = made.generate(LLMRequest(role="writer", system="s", prompt="p",
                                         max_output_tokens=100))
    assert reply.text == "fine"
    assert slept == ([42.0, 17.0] if provider == "gemini" else [42.0])


def test_the_writer_calls_of_a_generation_are_in_flight_at_once(tmp_path):
    import threading

    scientist = ScientistResponder()
    together = threading.Barrier(3, timeout=10)  # passes only when three calls wait at once

    def writer_waits(request: FakeRequest) -> FakeReply:
        if request.prompt.startswith("# Stage 3"):
            try:
                together.wait()
            except threading.BrokenBarrierError:
                return FakeReply.error(400, "the writer calls came one at a time")
        return scientist(request)

    loop = Loop(tmp_path)
    with FakeLLMServer(writer_waits) as server:
        assert loop(1, llm_roles(server, tmp_path), FakeEvaluator(), candidates=3) == 0
    assert "| write    | 3 writer calls at once" in loop.out.getvalue()
    written = [m for m in loop.pop.members() if m.meta.generation == 1]
    assert [m.meta.plan_index for m in written] == [0, 1, 2]  # stored in plan order
