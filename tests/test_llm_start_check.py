"""The LLM provider's start check: a bad key or model stops ``--evolve`` before generation 0.

Before, a wrong ``GEMINI_API_KEY`` or ``--ks-model`` showed only when the designer first called
the provider, after generation 0 had been evaluated (a minute on the H200, longer on a CPU).
The check is a free lookup through the real clients (google-genai's ``models.get``, the OpenAI
``GET /models``), served here by the fake server on 127.0.0.1.
"""

from __future__ import annotations

import fake_llm_server as fake_server
import pytest
from fake_llm_server import FakeReply
from fake_scientist import FAKE_KEY, fake_settings

from pytest_kscientist.evolve.llm.factory import check_provider
from pytest_kscientist.evolve.llm.llm_errors import ProviderOutage

ks_fake_llm = fake_server.ks_fake_llm


@pytest.mark.parametrize("provider", ["gemini", "openai"])
def test_a_provider_that_answers_passes_without_a_generation_call(ks_fake_llm, provider):
    assert check_provider(fake_settings(ks_fake_llm, provider)) == ""
    assert ks_fake_llm.requests == []  # nothing generated, nothing charged
    assert ks_fake_llm.lookups == (["/v1/models/fake-model"] if provider == "gemini"
                                   else ["/v1/models"])


@pytest.mark.parametrize("provider", ["gemini", "openai"])
@pytest.mark.parametrize("status", [400, 401, 403])
def test_a_refused_key_stops_with_the_services_answer_and_no_key(ks_fake_llm, provider, status):
    ks_fake_llm.lookup_reply = FakeReply.error(status, f"API key not valid: {FAKE_KEY}")
    with pytest.raises(ProviderOutage) as info:
        check_provider(fake_settings(ks_fake_llm, provider))
    message = str(info.value)
    assert f"HTTP {status}" in message and "API key not valid" in message, message
    assert "check the API key, --ks-model and --ks-llm-base-url" in message
    assert "nothing was evaluated or spent" in message
    assert FAKE_KEY not in message  # redacted like every logged error
    assert ks_fake_llm.requests == []


def test_an_unknown_gemini_model_stops(ks_fake_llm):
    ks_fake_llm.models = ["gemini-2.5-pro"]
    with pytest.raises(ProviderOutage, match=r"HTTP 404 to a lookup of model 'fake-model'"):
        check_provider(fake_settings(ks_fake_llm, "gemini"))
    assert check_provider(fake_settings(ks_fake_llm, "gemini", model="gemini-2.5-pro")) == ""


def test_a_chat_server_without_the_model_warns_and_one_without_the_route_passes(ks_fake_llm):
    ks_fake_llm.models = ["qwen3-32b", "llama-3.3-70b"]
    warning = check_provider(fake_settings(ks_fake_llm, "openai"))
    assert "lists the models qwen3-32b, llama-3.3-70b, not 'fake-model' (--ks-model)" in warning
    # A server with no /models route (404) is not refused for it.
    ks_fake_llm.lookup_reply = FakeReply.error(404, "no such route")
    assert check_provider(fake_settings(ks_fake_llm, "openai")) == ""


@pytest.mark.parametrize("provider", ["gemini", "openai"])
def test_an_unreachable_provider_warns_and_the_run_goes_on(ks_fake_llm, provider):
    url = "http://127.0.0.1:9" + ("/v1" if provider == "openai" else "")
    warning = check_provider(fake_settings(ks_fake_llm, provider, base_url=url))
    assert "could not be reached" in warning, warning
    assert "run stops once no LLM call has succeeded for --ks-llm-outage-s" in warning


def test_a_server_error_warns_rather_than_stops(ks_fake_llm):
    ks_fake_llm.lookup_reply = FakeReply.error(503, "overloaded")
    warning = check_provider(fake_settings(ks_fake_llm, "gemini"))
    assert "HTTP 503" in warning and "generation 0 is evaluated all the same" in warning

