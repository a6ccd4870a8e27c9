"""The OpenAI-compatible provider (vLLM, Ollama) against the fake ``/v1/chat/completions``."""

from __future__ import annotations

import json

import fake_llm_server as fake_server
import pytest
from fake_llm_server import FakeReply
from fake_scientist import (
    FAKE_KEY,
    SEED_SOURCE,
    ScientistResponder,
    fake_settings,
    sample_population,
    sample_task,
)

from pytest_kscientist.evolve.llm.factory import build_roles
from pytest_kscientist.evolve.llm.llm_errors import MalformedOutput, ProviderError
from pytest_kscientist.evolve.llm.settings import RetryPolicy
from pytest_kscientist.evolve.llm.transcript import read_calls

ks_fake_llm = fake_server.ks_fake_llm  # the fixture, shared with other suites


SELECTION = json.dumps({"base_id": "g1-kgroup4", "reference_id": None, "reason": "fastest"})


def roles_for(server, tmp_path, **changes):
    roles = build_roles(fake_settings(server, "openai", **changes), sample_task(), tmp_path)
    assert roles is not None
    return roles


def test_the_selector_posts_a_chat_completion_with_a_json_schema(ks_fake_llm, tmp_path):
    ks_fake_llm.push(FakeReply(text=SELECTION, input_tokens=300, output_tokens=40))
    roles = roles_for(ks_fake_llm, tmp_path)
    assert roles.selector.select(sample_task(), sample_population(), "").base_id == "g1-kgroup4"
    [request] = ks_fake_llm.requests
    assert request.path == "/v1/chat/completions" and request.model == "fake-model"
    assert request.headers["authorization"] == f"Bearer {FAKE_KEY}"
    assert [m["role"] for m in request.body["messages"]] == ["system", "user"]
    fmt = request.body["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["name"] == "SelectionAnswer"
    assert "base_id" in fmt["json_schema"]["schema"]["properties"]
    assert request.body["max_tokens"] == 8192
    totals = roles.ledger.totals().roles["selector"]
    assert (totals.input_tokens, totals.output_tokens) == (300, 40)


def test_a_server_without_a_key_gets_no_authorization_header(ks_fake_llm, tmp_path):
    ks_fake_llm.push(SELECTION)
    roles = roles_for(ks_fake_llm, tmp_path, api_key=None)
    roles.selector.select(sample_task(), sample_population(), "")
    assert "authorization" not in ks_fake_llm.requests[0].headers


def test_fenced_json_from_a_lenient_server_is_accepted(ks_fake_llm, tmp_path):
    ks_fake_llm.push(f"```json\n{SELECTION}\n```")
    roles = roles_for(ks_fake_llm, tmp_path)
    assert roles.selector.select(sample_task(), sample_population(), "").base_id == "g1-kgroup4"


@pytest.mark.parametrize("status", [429, 502, 503])
def test_transient_errors_are_retried_with_backoff(ks_fake_llm, tmp_path, status):
    ks_fake_llm.push(FakeReply.error(status), FakeReply.error(status), SELECTION)
    roles = roles_for(ks_fake_llm, tmp_path)
    assert roles.selector.select(sample_task(), sample_population(), "").base_id == "g1-kgroup4"
    assert len(ks_fake_llm.requests) == 3


def test_retry_after_is_honoured_within_the_maximum_delay(ks_fake_llm, tmp_path):
    limited = FakeReply.error(429)
    limited.headers = {"Retry-After": "0.01"}
    ks_fake_llm.push(limited, SELECTION)
    roles = roles_for(ks_fake_llm, tmp_path)
    roles.selector.select(sample_task(), sample_population(), "")
    assert len(ks_fake_llm.requests) == 2


def test_a_timeout_is_retried_and_exhaustion_is_a_provider_error(ks_fake_llm, tmp_path):
    fast = RetryPolicy(attempts=2, initial_delay_s=0.01, max_delay_s=0.01, timeout_s=0.2)
    ks_fake_llm.push(FakeReply.slow(5.0, SELECTION), FakeReply.slow(5.0, SELECTION))
    roles = roles_for(ks_fake_llm, tmp_path, retry=fast)
    with pytest.raises(ProviderError, match="failed 2 attempts; last: ReadTimeout"):
        roles.selector.select(sample_task(), sample_population(), "")


def test_client_errors_fail_at_once(ks_fake_llm, tmp_path):
    ks_fake_llm.push(FakeReply.error(404, "model not found"))
    roles = roles_for(ks_fake_llm, tmp_path)
    with pytest.raises(ProviderError, match="answered HTTP 404.*model not found") as info:
        roles.selector.select(sample_task(), sample_population(), "")
    assert info.value.status == 404 and len(ks_fake_llm.requests) == 1


def test_a_refused_connection_is_a_provider_error(tmp_path, ks_fake_llm):
    settings = fake_settings(ks_fake_llm, "openai", base_url="http://127.0.0.1:9/v1")
    roles = build_roles(settings, sample_task(), tmp_path)
    assert roles is not None
    with pytest.raises(ProviderError, match="ConnectError"):
        roles.selector.select(sample_task(), sample_population(), "")


def test_malformed_bodies_and_empty_answers_end_in_malformed_output(ks_fake_llm, tmp_path):
    ks_fake_llm.push(
        FakeReply(body="<html>bad gateway</html>"),
        FakeReply(body='{"choices": []}'),
        FakeReply(text=None),
    )
    roles = roles_for(ks_fake_llm, tmp_path)
    with pytest.raises(MalformedOutput, match="the answer was empty"):
        roles.selector.select(sample_task(), sample_population(), "")
    outcomes = [r.outcome for r in read_calls(tmp_path / "llm-calls.jsonl")]
    assert outcomes == ["malformed", "malformed", "answer"]


def test_all_three_roles_run_against_the_scripted_scientist(ks_fake_llm, tmp_path):
    ks_fake_llm.responder = ScientistResponder()
    roles = roles_for(ks_fake_llm, tmp_path)
    population = sample_population()
    selection = roles.selector.select(sample_task(), population, "")
    base = next(c for c in population if c.id == selection.base_id)
    design = roles.designer.design(sample_task(), base, None, population, "", 3)
    drafts = [roles.writer.write(sample_task(), base, plan) for plan in design.kept]
    assert len({d.source for d in drafts}) == 3
    assert all("TUNABLES = {" in d.source and d.source != SEED_SOURCE for d in drafts)


def test_think_blocks_are_stripped_before_the_answer_is_parsed(ks_fake_llm, tmp_path):
    thinking = '<think>\nThe table says {"base_id": "seed-torch"} but\n</think>\n\n'
    ks_fake_llm.push(thinking + SELECTION, "<think>never closed, the cap came first")
    roles = roles_for(ks_fake_llm, tmp_path)
    assert roles.selector.select(sample_task(), sample_population(), "").base_id == "g1-kgroup4"
    assert read_calls(tmp_path / "llm-calls.jsonl")[0].response_text.startswith("<think>")
    reply = roles.session.call("selector", "p")
    assert reply.text == ""  # all thinking: an empty answer, asked again by ask()


def test_the_output_cap_shrinks_to_the_context_and_a_prompt_too_long_is_not_sent(
        ks_fake_llm, tmp_path):
    from pytest_kscientist.evolve.llm.llm_errors import PromptTooLong
    from pytest_kscientist.evolve.llm.settings import RoleLimits

    roles = roles_for(ks_fake_llm, tmp_path, limits=RoleLimits(context_tokens=8192))
    ks_fake_llm.push("## Explanation\nx\n\n```python\ndef custom_kernel(data):\n    return 1\n```")
    prompt = "p" * 6000  # with the system prompt about 2,330 tokens at 3 characters a token
    roles.session.call("writer", prompt)
    sent = ks_fake_llm.requests[0].body["max_tokens"]
    expected = 8192 - int((len(roles.session.system) + 6000) / 3) - 1 - 256
    assert sent == expected and sent < 32768
    with pytest.raises(PromptTooLong, match=r"leaves under 1024 of the model's 8192 context "
                       r"tokens \(--ks-llm-context-tokens\)"):
        roles.session.call("writer", "p" * 24000)
    assert len(ks_fake_llm.requests) == 1
