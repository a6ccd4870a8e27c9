"""The three LLM roles through the real google-genai client against the fake Gemini server."""

from __future__ import annotations

import json

import fake_llm_server as fake_server
import pytest
from fake_llm_server import FakeLLMServer, FakeReply
from fake_scientist import (
    FAKE_KEY,
    fake_settings,
    sample_population,
    sample_task,
)

from pytest_kscientist.evolve.llm.factory import LLMRoles, build_roles
from pytest_kscientist.evolve.llm.llm_errors import MalformedOutput, ProviderError
from pytest_kscientist.evolve.llm.settings import LLMSettings, RetryPolicy
from pytest_kscientist.evolve.llm.transcript import read_calls
from pytest_kscientist.evolve.roles import ExperimentPlan

ks_fake_llm = fake_server.ks_fake_llm  # the fixture, shared with other suites


SELECTION = {"base_id": "g1-kgroup4", "reference_id": "seed-torch", "reason": "fastest, 120 us"}


def design_answer(n_plans: int = 5) -> dict:
    plans = [
        {
            "title": f"plan {i}",
            "changes": f"do {i}",
            "expected_gain_min_pct": float(i),
            "expected_gain_max_pct": float(10 + (7 * i) % 5),
            "innovation": float((4 * i) % 10),
        }
        for i in range(n_plans)
    ]
    return {
        "avenues": [f"avenue {i}" for i in range(10)],
        "plans": plans,
        "findings_update": "- k_group 4 beats 1 by 20% (g1-kgroup4)",
    }


def roles_for(server: FakeLLMServer, tmp_path, **changes) -> LLMRoles:
    roles = build_roles(fake_settings(server, **changes), sample_task(), tmp_path / "log")
    assert roles is not None
    return roles


def test_selector_sends_a_json_mode_request_and_returns_the_selection(ks_fake_llm, tmp_path):
    ks_fake_llm.push(json.dumps(SELECTION))
    roles = roles_for(ks_fake_llm, tmp_path)
    selection = roles.selector.select(sample_task(), sample_population(), "- a finding")
    assert (selection.base_id, selection.reference_id) == ("g1-kgroup4", "seed-torch")
    [request] = ks_fake_llm.requests
    assert request.path == "/v1/models/fake-model:generateContent"
    assert request.headers["x-goog-api-key"] == FAKE_KEY
    assert request.json_mode
    schema = request.body["generationConfig"]["responseSchema"]
    assert set(schema["properties"]) == {"base_id", "reference_id", "reason"}
    # The ids are an enum the model's constrained decoding cannot leave.
    ids = sorted(c.id for c in sample_population())
    assert schema["properties"]["base_id"]["enum"] == ids
    assert "GPU Kernel Scientist" in request.system
    for expected in ("`g1-broken`", "SyntaxError", "H200", "- a finding", "120.0 us"):
        assert expected in request.prompt


def test_designer_returns_plans_and_keeps_three_by_the_papers_rule(ks_fake_llm, tmp_path):
    ks_fake_llm.push(json.dumps(design_answer()))
    roles = roles_for(ks_fake_llm, tmp_path)
    population = sample_population()
    design = roles.designer.design(
        sample_task(), population[1], population[0], population, "", n_keep=3
    )
    assert len(design.avenues) == 10 and len(design.plans) == 5
    # Most innovative: plan 2 (8); highest max gain is plan 2 again (14), so plan 4 (13);
    # highest min gain is plan 4 again (4), so plan 3 (3).
    assert [p.title for p in design.kept] == ["plan 2", "plan 4", "plan 3"]
    assert design.findings_update == "- k_group 4 beats 1 by 20% (g1-kgroup4)"
    prompt = ks_fake_llm.requests[0].prompt
    assert "m6144-n7168-k2048-s76547 | 144.0 us" in prompt  # per-shape times of the base
    assert "exactly 10 distinct avenues" in prompt and "exactly 5 concrete" in prompt


def test_writer_returns_the_file_and_the_explanation(ks_fake_llm, tmp_path):
    population = sample_population()
    new = population[0].source.replace('"m_chunk": 0', '"m_chunk": 64')
    ks_fake_llm.push(f"## Explanation\nChunk rows by 64.\n\n```python\n{new}```\n")
    roles = roles_for(ks_fake_llm, tmp_path)
    plan = ExperimentPlan(
        title="chunk rows",
        changes="m_chunk=64",
        expected_gain_min_pct=1,
        expected_gain_max_pct=5,
        innovation=1,
    )
    draft = roles.writer.write(sample_task(), population[0], plan)
    assert draft.source == new
    assert draft.explanation == "Chunk rows by 64."
    assert not ks_fake_llm.requests[0].json_mode
    assert "**chunk rows**" in ks_fake_llm.requests[0].prompt


@pytest.mark.parametrize("status", [429, 500, 503])
def test_transient_http_errors_are_retried_by_the_client(ks_fake_llm, tmp_path, status):
    ks_fake_llm.push(FakeReply.error(status), FakeReply.error(status), json.dumps(SELECTION))
    roles = roles_for(ks_fake_llm, tmp_path)
    assert roles.selector.select(sample_task(), sample_population(), "").base_id == "g1-kgroup4"
    assert len(ks_fake_llm.requests) == 3
    assert roles.ledger.totals().roles["selector"].calls == 1


def test_a_slow_answer_times_out_and_the_retry_succeeds(ks_fake_llm, tmp_path):
    ks_fake_llm.push(FakeReply.slow(5.0, json.dumps(SELECTION)), json.dumps(SELECTION))
    fast = RetryPolicy(attempts=2, initial_delay_s=0.01, max_delay_s=0.01, timeout_s=0.3)
    roles = roles_for(ks_fake_llm, tmp_path, retry=fast)
    assert roles.selector.select(sample_task(), sample_population(), "").base_id == "g1-kgroup4"
    assert len(ks_fake_llm.requests) == 2


def test_retries_exhausted_raise_a_recorded_provider_error(ks_fake_llm, tmp_path):
    ks_fake_llm.push(*[FakeReply.error(503, "overloaded")] * 3)
    roles = roles_for(ks_fake_llm, tmp_path)
    with pytest.raises(ProviderError, match="HTTP 503") as info:
        roles.selector.select(sample_task(), sample_population(), "")
    assert info.value.status == 503 and info.value.role == "selector"
    [record] = read_calls(tmp_path / "log" / "llm-calls.jsonl")
    assert record.outcome == "error" and "503" in record.error


def test_client_errors_are_not_retried(ks_fake_llm, tmp_path):
    ks_fake_llm.push(FakeReply.error(403, "permission denied"))
    roles = roles_for(ks_fake_llm, tmp_path)
    with pytest.raises(ProviderError, match="403"):
        roles.selector.select(sample_task(), sample_population(), "")
    assert len(ks_fake_llm.requests) == 1


def test_a_body_that_is_not_json_is_asked_again(ks_fake_llm, tmp_path):
    ks_fake_llm.push(FakeReply.malformed(), json.dumps(SELECTION))
    roles = roles_for(ks_fake_llm, tmp_path)
    assert roles.selector.select(sample_task(), sample_population(), "").base_id == "g1-kgroup4"
    records = read_calls(tmp_path / "log" / "llm-calls.jsonl")
    assert [r.outcome for r in records] == ["malformed", "answer"]


@pytest.mark.parametrize(
    ("bad", "problem"),
    [
        ("I think the base should be g1-kgroup4.", "does not match the schema"),
        (json.dumps({**SELECTION, "base_id": "nonexistent"}), "'nonexistent' is not an id"),
        (json.dumps({**SELECTION, "reference_id": "ghost"}), "'ghost' is not an id"),
        (None, "the answer was empty"),
    ],
)
def test_an_unusable_answer_is_asked_again_with_the_problem(ks_fake_llm, tmp_path, bad, problem):
    ks_fake_llm.push(FakeReply(text=bad), json.dumps(SELECTION))
    roles = roles_for(ks_fake_llm, tmp_path)
    assert roles.selector.select(sample_task(), sample_population(), "").base_id == "g1-kgroup4"
    first, second = ks_fake_llm.requests
    assert problem not in first.prompt
    assert "## Your previous answer could not be used" in second.prompt
    assert problem in second.prompt


def test_a_truncated_design_is_reported_as_cut_off(ks_fake_llm, tmp_path):
    ks_fake_llm.push(FakeReply.truncated(json.dumps(design_answer())), json.dumps(design_answer()))
    roles = roles_for(ks_fake_llm, tmp_path)
    population = sample_population()
    design = roles.designer.design(sample_task(), population[0], None, population, "", 3)
    assert len(design.kept) == 3
    assert "cut off at the output token cap" in ks_fake_llm.requests[1].prompt


def test_design_with_too_few_plans_or_inverted_gains_is_asked_again(ks_fake_llm, tmp_path):
    inverted = design_answer()
    inverted["plans"][0]["expected_gain_min_pct"] = 50.0
    ks_fake_llm.push(
        json.dumps(design_answer(n_plans=2)), json.dumps(inverted), json.dumps(design_answer())
    )
    roles = roles_for(ks_fake_llm, tmp_path)
    population = sample_population()
    roles.designer.design(sample_task(), population[0], None, population, "", 3)
    assert "plans holds 2 experiments, 5 were asked for" in ks_fake_llm.requests[1].prompt
    assert "expected_gain_min_pct 50 exceeds" in ks_fake_llm.requests[2].prompt


def test_malformed_output_after_every_attempt_is_a_typed_failure(ks_fake_llm, tmp_path):
    ks_fake_llm.push("no", "still no", "never")
    roles = roles_for(ks_fake_llm, tmp_path)
    with pytest.raises(MalformedOutput, match="no usable answer in 3 attempts") as info:
        roles.selector.select(sample_task(), sample_population(), "")
    assert info.value.raw == "never"
    assert ks_fake_llm.pending == 0


def test_a_single_candidate_population_needs_no_call(ks_fake_llm, tmp_path):
    roles = roles_for(ks_fake_llm, tmp_path)
    selection = roles.selector.select(sample_task(), sample_population()[:1], "")
    assert selection.base_id == "seed-torch" and ks_fake_llm.requests == []


def test_the_environment_base_url_is_honoured(ks_fake_llm, tmp_path, monkeypatch):
    monkeypatch.setenv("GOOGLE_GEMINI_BASE_URL", ks_fake_llm.url)
    ks_fake_llm.push(json.dumps(SELECTION))
    roles = roles_for(ks_fake_llm, tmp_path, base_url=None)
    assert roles.selector.select(sample_task(), sample_population(), "").base_id == "g1-kgroup4"


def test_an_unexpected_provider_exception_is_a_recorded_provider_error(tmp_path):
    (tmp_path / "llm-calls.jsonl").write_text("")

    class Broken:
        name, model = "broken", "m"

        def generate(self, request):
            raise RuntimeError("a bug in the provider")

    roles = build_roles(
        LLMSettings(provider="replay", replay_path=tmp_path), sample_task(), tmp_path / "log"
    )
    assert roles is not None
    roles.session.provider = Broken()
    with pytest.raises(ProviderError, match="broken provider raised RuntimeError: a bug") as info:
        roles.selector.select(sample_task(), sample_population(), "")
    assert "Traceback" in info.value.detail
    [record] = read_calls(tmp_path / "log" / "llm-calls.jsonl")
    assert record.outcome == "error" and "RuntimeError: a bug in the provider" in record.error
