"""API keys never reach logs, ledgers, prompts or error messages, even when a server echoes them."""

from __future__ import annotations

import json

import fake_llm_server as fake_server
import pytest
from fake_llm_server import FakeReply
from fake_scientist import (
    FAKE_KEY,
    fake_settings,
    sample_population,
    sample_task,
)

from pytest_kscientist.evolve.llm.factory import build_roles
from pytest_kscientist.evolve.llm.llm_errors import DraftRejected, MalformedOutput, ProviderError
from pytest_kscientist.evolve.llm.transcript import REDACTED
from pytest_kscientist.evolve.roles import ExperimentPlan

ks_fake_llm = fake_server.ks_fake_llm  # the fixture, shared with other suites


PLAN = ExperimentPlan(
    title="p", changes="c", expected_gain_min_pct=0, expected_gain_max_pct=1, innovation=1
)


@pytest.mark.parametrize("provider", ["gemini", "openai"])
def test_a_key_echoed_by_the_server_is_redacted_everywhere(ks_fake_llm, tmp_path, provider):
    echo = f"API key {FAKE_KEY} not valid"
    ks_fake_llm.push(
        FakeReply.error(400, echo),  # selector: provider error quoting the key
        FakeReply(text=f"base {FAKE_KEY}"),
        FakeReply(text=echo),
        FakeReply(text="{}"),
        FakeReply(text=echo),
        FakeReply(text=echo),  # writer + repair: prose quoting the key
    )
    roles = build_roles(fake_settings(ks_fake_llm, provider), sample_task(), tmp_path)
    assert roles is not None
    population = sample_population()
    errors: list[Exception] = []
    for call in (
        lambda: roles.selector.select(sample_task(), population, ""),
        lambda: roles.selector.select(sample_task(), population, ""),
        lambda: roles.writer.write(sample_task(), population[0], PLAN),
    ):
        with pytest.raises((ProviderError, MalformedOutput, DraftRejected)) as info:
            call()
        errors.append(info.value)
    sent_key = [
        r.headers.get("x-goog-api-key") or r.headers.get("authorization", "")
        for r in ks_fake_llm.requests
    ]
    assert all(FAKE_KEY in h for h in sent_key)  # the key did travel, in a header only
    assert not any(FAKE_KEY in r.prompt or FAKE_KEY in r.system for r in ks_fake_llm.requests)
    for exc in errors:
        assert FAKE_KEY not in str(exc) and FAKE_KEY not in repr(exc.__dict__)
    assert REDACTED in str(errors[0])
    logs = "".join(p.read_text() for p in tmp_path.iterdir() if p.is_file())
    assert FAKE_KEY not in logs and REDACTED in logs
    assert "AIzaFAKE" not in repr(fake_settings(ks_fake_llm, provider))


def test_every_environment_key_is_redacted_not_only_the_one_in_use(ks_fake_llm, tmp_path):
    other = "sk-other-provider-key-987654321"
    settings = fake_settings(ks_fake_llm, secrets=(FAKE_KEY, other))
    ks_fake_llm.push(FakeReply.error(400, f"bad {other}"))
    roles = build_roles(settings, sample_task(), tmp_path)
    assert roles is not None
    with pytest.raises(ProviderError) as info:
        roles.selector.select(sample_task(), sample_population(), "")
    assert other not in str(info.value)
    assert other not in (tmp_path / "llm-calls.jsonl").read_text()
    assert json.loads((tmp_path / "llm-calls.jsonl").read_text())["error"].count(REDACTED) == 1


def test_a_placeholder_key_is_not_redacted_and_field_names_stay_whole(tmp_path) -> None:
    from pytest_kscientist.evolve.llm.ledger import Usage
    from pytest_kscientist.evolve.llm.transcript import CallLog, CallRecord, Redactor, read_calls

    # OPENAI_API_KEY=none is a common placeholder for local servers; "ken" is inside
    # "input_tokens". Neither may be replaced; the real key still is.
    log = CallLog(tmp_path / "calls.jsonl", Redactor(["none", "ken", FAKE_KEY]))
    log.append(CallRecord(
        index=0, role="writer", prompt_sha256="x", occurrence=0, provider="openai", model="m",
        system="s", prompt=f"if x is none: token = '{FAKE_KEY}'",
        usage=Usage(input_tokens=11, output_tokens=7)))
    (record,) = read_calls(tmp_path / "calls.jsonl")
    assert record.prompt == f"if x is none: token = '{REDACTED}'"
    assert (record.usage.input_tokens, record.usage.output_tokens) == (11, 7)
    assert FAKE_KEY not in (tmp_path / "calls.jsonl").read_text()
