"""``--ks-replay``: a logged run replays to the same role outputs with no service at all."""

from __future__ import annotations

import json

import pytest
from fake_llm_server import FakeLLMServer, FakeReply
from fake_scientist import (
    ScientistResponder,
    fake_settings,
    sample_population,
    sample_task,
)

from pytest_kscientist.evolve.llm.factory import build_roles
from pytest_kscientist.evolve.llm.llm_errors import BudgetExhausted, ProviderError, ReplayMiss
from pytest_kscientist.evolve.llm.provider import LLMRequest
from pytest_kscientist.evolve.llm.replay import ReplayProvider
from pytest_kscientist.evolve.llm.settings import LLMSettings, Prices, RoleLimits
from pytest_kscientist.evolve.llm.transcript import CallRecord, read_calls
from pytest_kscientist.evolve.roles import CandidateSummary


def one_generation(roles, population: list[CandidateSummary]) -> list[str]:
    """Select, design, write every kept plan; the outputs (or failures) as JSON lines."""
    task, out = sample_task(), []
    try:
        selection = roles.selector.select(task, population, "")
        out.append(selection.model_dump_json())
        by_id = {c.id: c for c in population}
        base, ref = by_id[selection.base_id], by_id.get(selection.reference_id or "")
        design = roles.designer.design(task, base, ref, population, "", 3)
        out.append(design.model_dump_json())
        for plan in design.kept:
            try:
                out.append(roles.writer.write(task, base, plan).model_dump_json())
            except ProviderError as exc:
                out.append(f"failed: {exc}")
    except BudgetExhausted as exc:
        out.append(f"stopped: {exc.role}")
    return out


def replay_settings(path) -> LLMSettings:
    return LLMSettings(provider="replay", model="replay", replay_path=path)


def test_a_replayed_run_reproduces_every_output_without_a_server(tmp_path):
    population = sample_population()
    with FakeLLMServer(ScientistResponder()) as server:
        server.push(FakeReply.error(429), "not json")  # a client retry and a format retry
        live = build_roles(fake_settings(server), sample_task(), tmp_path / "live")
        first = one_generation(live, population)
    assert len(first) == 5 and not any(line.startswith("failed") for line in first)
    replay = build_roles(replay_settings(tmp_path / "live"), sample_task(), tmp_path / "again")
    assert replay is not None
    assert one_generation(replay, population) == first
    records = read_calls(tmp_path / "again" / "llm-calls.jsonl")
    assert {r.replay_match for r in records} == {"exact"}
    assert replay.ledger.spent_usd == pytest.approx(live.ledger.spent_usd)
    twice = build_roles(replay_settings(tmp_path / "again"), sample_task(), tmp_path / "third")
    assert one_generation(twice, population) == first  # a replay log replays too


def test_logged_failures_and_budget_stops_replay_as_the_same_errors(tmp_path):
    population = sample_population()
    with FakeLLMServer(ScientistResponder()) as server:
        server.push(
            '{"base_id": "seed-torch", "reason": "r"}',
            json.dumps(json.loads(ScientistResponder()._designer("", 1))),
            FakeReply.error(500),
            FakeReply.error(500),
            FakeReply.error(500),
        )
        # Output-only prices: every answer costs 0.5 ct, a writer call's worst case is 2 ct. After
        # selector, designer, a failed writer (free) and a writer (1.5 ct spent) the next
        # writer call could reach 3.5 ct > the 3.2 ct cap.
        settings = fake_settings(
            server,
            budget_usd=0.032,
            prices=Prices(0.0, 10.0),
            limits=RoleLimits(selector=500, designer=500, writer=2000),
        )
        live = build_roles(settings, sample_task(), tmp_path / "live")
        first = one_generation(live, population)
    assert first[2].startswith("failed: writer: Gemini answered HTTP 500")
    assert first[-1] == "stopped: writer"
    outcomes = [r.outcome for r in read_calls(tmp_path / "live" / "llm-calls.jsonl")]
    assert outcomes == ["answer", "answer", "error", "answer", "budget"]
    replay = build_roles(replay_settings(tmp_path / "live"), sample_task(), tmp_path / "again")
    again = one_generation(replay, population)
    assert again[:2] == first[:2] and again[-1] == "stopped: writer"
    assert again[2] == first[2].replace("writer: ", "writer: (replayed) ", 1)


def test_a_changed_prompt_takes_the_roles_nearest_logged_answer_and_is_marked(tmp_path):
    population = sample_population()
    with FakeLLMServer(ScientistResponder()) as server:
        live = build_roles(fake_settings(server), sample_task(), tmp_path / "live")
        first = one_generation(live, population)
    # Re-measured times change every prompt, as they do when a run is replayed for real.
    remeasured = [
        c.model_copy(update={"geomean_us": (c.geomean_us or 0) * 1.01 or None}) for c in population
    ]
    replay = build_roles(replay_settings(tmp_path / "live"), sample_task(), tmp_path / "again")
    assert one_generation(replay, remeasured) == first
    records = read_calls(tmp_path / "again" / "llm-calls.jsonl")
    matches = [r.replay_match for r in records]
    assert matches[:3] == ["nearest"] * 3  # selector, designer, writer prompts carry times
    assert replay.session.provider.mismatches == matches.count("nearest")


def test_writers_logged_out_of_order_replay_to_their_own_plans(tmp_path):
    """Writers called at once are logged as they finish; a re-run (its times changed) must still
    give each plan the answer written for it, not the one that happened to finish first."""

    def prompt(plan: str, time_us: float) -> str:
        return f"# Stage 3: write the kernel\nbase geomean {time_us} us\n## Plan\n{plan}\n"

    log = tmp_path / "llm-calls.jsonl"
    records = [  # plan B finished first in the live run
        CallRecord(index=i, role="writer", prompt_sha256=f"{i}", occurrence=0, provider="gemini",
                   model="m", system="s", prompt=prompt(plan, 5.9), response_text=f"for {plan}")
        for i, plan in enumerate(["knob experiment 1.4", "knob experiment 1.3"])
    ]
    log.write_text("".join(r.model_dump_json() + "\n" for r in records))
    replay = ReplayProvider(log)
    answers = [
        replay.generate(LLMRequest(role="writer", system="s", prompt=prompt(plan, 6.1),
                                   max_output_tokens=100, prompt_sha256="changed"))
        for plan in ["knob experiment 1.3", "knob experiment 1.4"]
    ]
    assert [a.text for a in answers] == ["for knob experiment 1.3", "for knob experiment 1.4"]
    assert [a.replay_match for a in answers] == ["nearest", "nearest"]


def test_a_later_generations_longer_prompt_does_not_take_an_earlier_ones_place(tmp_path):
    """Generation 2's designer prompt holds generation 1's rows and more; replaying generation 1
    with new times must still take generation 1's answer."""
    rows = [f"c000{i} passed {i}.0 us" for i in range(1, 6)]
    first, second = ["# Stage 2", *rows[:2], "best 5.9 us"], ["# Stage 2", *rows, "best 5.0 us"]
    log = tmp_path / "llm-calls.jsonl"
    log.write_text("".join(
        CallRecord(index=i, role="designer", prompt_sha256=f"{i}", occurrence=0,
                   provider="gemini", model="m", system="s", prompt="\n".join(lines),
                   response_text=f"design {i + 1}").model_dump_json() + "\n"
        for i, lines in enumerate([first, second])))
    replay = ReplayProvider(log)
    again = "\n".join(["# Stage 2", *rows[:2], "best 5.0 us"])  # re-measured: 5.0, as gen 2's
    answer = replay.generate(LLMRequest(role="designer", system="s", prompt=again,
                                        max_output_tokens=100, prompt_sha256="new"))
    assert answer.text == "design 1"


def test_asking_for_more_than_the_log_holds_is_a_replay_miss_naming_the_log(tmp_path):
    with FakeLLMServer(ScientistResponder()) as server:
        live = build_roles(fake_settings(server), sample_task(), tmp_path / "live")
        live.selector.select(sample_task(), sample_population(), "")
    replay = build_roles(replay_settings(tmp_path / "live"), sample_task(), tmp_path / "again")
    replay.selector.select(sample_task(), sample_population(), "")
    with pytest.raises(ReplayMiss, match="all 1 logged selector answers are used") as info:
        replay.selector.select(sample_task(), sample_population(), "")
    assert str(tmp_path / "live") in str(info.value)
    with pytest.raises(ReplayMiss, match="all 0 logged designer answers"):
        population = sample_population()
        replay.designer.design(sample_task(), population[0], None, population, "", 3)


def test_replaying_into_the_same_folder_does_not_append_to_the_log_read(tmp_path):
    with FakeLLMServer(ScientistResponder()) as server:
        live = build_roles(fake_settings(server), sample_task(), tmp_path)
        live.selector.select(sample_task(), sample_population(), "")
    before = (tmp_path / "llm-calls.jsonl").read_text()
    replay = build_roles(replay_settings(tmp_path), sample_task(), tmp_path)
    replay.selector.select(sample_task(), sample_population(), "")
    assert (tmp_path / "llm-calls.jsonl").read_text() == before
    assert len(read_calls(tmp_path / "llm-calls.replay.jsonl")) == 1
