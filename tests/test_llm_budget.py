"""The token and cost ledger and the hard cap: no call is made that could cross it."""

from __future__ import annotations

import json

import fake_llm_server as fake_server
import pytest
from fake_llm_server import FakeReply
from fake_scientist import (
    fake_settings,
    sample_population,
    sample_task,
)

from pytest_kscientist.evolve.llm.factory import build_roles
from pytest_kscientist.evolve.llm.ledger import CostLedger, Usage, load_ledger
from pytest_kscientist.evolve.llm.llm_errors import BudgetExhausted
from pytest_kscientist.evolve.llm.settings import Prices, RoleLimits
from pytest_kscientist.evolve.llm.transcript import read_calls

ks_fake_llm = fake_server.ks_fake_llm  # the fixture, shared with other suites


SELECTION = json.dumps({"base_id": "seed-torch", "reference_id": None, "reason": "r"})


def test_usage_metadata_is_charged_at_the_configured_prices_thoughts_as_output(
    ks_fake_llm, tmp_path
):

    ks_fake_llm.push(
        FakeReply(
            text=SELECTION, input_tokens=200_000, output_tokens=10_000, thoughts_tokens=30_000
        )
    )
    roles = build_roles(
        fake_settings(ks_fake_llm, prices=Prices(2.0, 10.0)), sample_task(), tmp_path
    )
    assert roles is not None
    roles.selector.select(sample_task(), sample_population(), "")
    expected = (200_000 * 2.0 + 40_000 * 10.0) / 1e6
    assert roles.ledger.spent_usd == pytest.approx(expected)
    on_disk = load_ledger(tmp_path / "llm-ledger.json")
    assert on_disk.spent_usd == pytest.approx(expected)
    assert on_disk.roles["selector"].thoughts_tokens == 30_000
    assert on_disk.task == "fp8_gemm" and on_disk.provider == "gemini"
    [record] = read_calls(tmp_path / "llm-calls.jsonl")
    assert record.cost_usd == pytest.approx(expected) and record.usage.input_tokens == 200_000


def test_the_cap_stops_before_a_call_that_could_cross_it(ks_fake_llm, tmp_path):
    # Worst case of a selector call: 1000 output tokens at $10/M = 1 ct (input is free here);
    # the first answer costs 0.5 ct, so a second call could reach 1.5 ct > the 1.2 ct cap.
    settings = fake_settings(
        ks_fake_llm, budget_usd=0.012, prices=Prices(0.0, 10.0), limits=RoleLimits(selector=1000)
    )
    ks_fake_llm.push(FakeReply(text=SELECTION, output_tokens=500), SELECTION)
    roles = build_roles(settings, sample_task(), tmp_path)
    assert roles is not None
    roles.selector.select(sample_task(), sample_population(), "")
    with pytest.raises(BudgetExhausted, match="--ks-llm-budget-usd: the next call") as info:
        roles.selector.select(sample_task(), sample_population(), "")
    assert len(ks_fake_llm.requests) == 1  # the second call was never sent
    assert info.value.spent_usd == pytest.approx(0.005) and info.value.cap_usd == 0.012
    assert [r.outcome for r in read_calls(tmp_path / "llm-calls.jsonl")] == ["answer", "budget"]


def test_budget_exhaustion_is_not_retried_as_malformed_output(ks_fake_llm, tmp_path):
    settings = fake_settings(ks_fake_llm, budget_usd=0.001, prices=Prices(1.0, 10.0))
    roles = build_roles(settings, sample_task(), tmp_path)
    assert roles is not None
    with pytest.raises(BudgetExhausted):
        roles.selector.select(sample_task(), sample_population(), "")
    assert ks_fake_llm.requests == []


def test_the_ledger_adds_up_across_threads(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    ledger = CostLedger(Prices(1.0, 1.0), 100.0, tmp_path / "ledger.json")
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda _: ledger.charge("writer", Usage(input_tokens=1000)), range(200)))
    totals = load_ledger(tmp_path / "ledger.json")
    assert totals.roles["writer"].calls == 200
    assert totals.spent_usd == pytest.approx(200 * 1000 / 1e6)


def test_a_resume_keeps_the_populations_spent_total_and_its_cap(ks_fake_llm, tmp_path):
    # Each selector answer costs 0.5 ct and its worst case is 1 ct: the 1.6 ct cap lets a first
    # run make one call and a resumed run a second, but no third across both (issue 13: each
    # process had a fresh cap).
    settings = fake_settings(
        ks_fake_llm, budget_usd=0.016, prices=Prices(0.0, 10.0), limits=RoleLimits(selector=1000)
    )
    ks_fake_llm.push(FakeReply(text=SELECTION, output_tokens=500),
                     FakeReply(text=SELECTION, output_tokens=500))
    first = build_roles(settings, sample_task(), tmp_path)
    assert first is not None
    first.selector.select(sample_task(), sample_population(), "")
    resumed = build_roles(settings, sample_task(), tmp_path)
    assert resumed is not None and resumed.ledger.spent_before_usd == pytest.approx(0.005)
    resumed.selector.select(sample_task(), sample_population(), "")
    with pytest.raises(BudgetExhausted, match=r"\$0\.0100 of the population's \$0\.02 cap"):
        resumed.selector.select(sample_task(), sample_population(), "")
    on_disk = load_ledger(tmp_path / "llm-ledger.json")
    assert on_disk.spent_usd == pytest.approx(0.01) and on_disk.runs == 2
    assert on_disk.roles["selector"].calls == 2 and on_disk.reserved == {}
    assert "$0.01 spent so far" in resumed.describe()


def test_concurrent_runs_draw_on_one_cap_through_reservations(tmp_path):
    path = tmp_path / "llm-ledger.json"
    one = CostLedger(Prices(1.0, 1.0), 1.0, path)
    other = CostLedger(Prices(1.0, 1.0), 1.0, path)  # a second run of the same population
    held = one.reserve("writer", 0.6)
    with pytest.raises(BudgetExhausted, match=r"and \$0\.6000 held by calls in flight"):
        other.reserve("writer", 0.6)
    one.charge("writer", Usage(input_tokens=500_000), reservation=held)  # $0.50 spent
    other.release(other.reserve("writer", 0.5))
    with pytest.raises(BudgetExhausted):
        other.reserve("writer", 0.51)
    assert load_ledger(path).spent_usd == pytest.approx(0.5)


def test_a_reservation_left_by_a_killed_process_is_dropped(tmp_path):
    import subprocess
    import sys

    from pytest_kscientist.evolve.llm.ledger import HOST

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    path = tmp_path / "llm-ledger.json"
    CostLedger(Prices(1.0, 1.0), 5.0, path).reserve("designer", 1.0)  # this process: kept
    record = load_ledger(path)
    record.reserved[f"{HOST}:{dead}:gone"] = 4.0  # a killed run's call in flight
    path.write_text(record.model_dump_json())
    ledger = CostLedger(Prices(1.0, 1.0), 5.0, path)
    ledger.release(ledger.reserve("writer", 3.9))
    assert list(load_ledger(path).reserved.values()) == [1.0]


def test_the_projection_says_what_the_generations_cost_and_where_the_cap_stops(tmp_path):
    from pytest_kscientist.evolve.llm.cost import generation_usd, project
    from pytest_kscientist.evolve.llm.settings import DEFAULT_BUDGET_USD, DEFAULT_PRICES

    ledger = CostLedger(Prices(*DEFAULT_PRICES["gemini"]), DEFAULT_BUDGET_USD, tmp_path / "l.json")
    each = generation_usd(ledger, 3)
    assert 0.4 < each < 0.8  # README: about $11.50 for 20 generations at the default prices
    line = project(ledger, 20, 3)
    assert f"20 more generation(s) of 3 candidate(s) would cost about ${20 * each:.2f}" in line
    assert f"covers about {int(5 // each)}: the run stops cleanly" in line
    assert "an estimate" in line
    # Once the population has calls, their measured average replaces the typical sizes.
    for _ in range(2):
        ledger.charge("writer", Usage(input_tokens=1000, output_tokens=1000))
    assert "this population's average cost per call" in project(ledger, 1, 3)
    assert generation_usd(ledger, 3) < each
    assert project(ledger, 0, 3) == ""


def test_a_peek_at_the_ledger_counts_no_run_and_moves_nothing(tmp_path):
    from pytest_kscientist.evolve.llm.cost import project
    from pytest_kscientist.evolve.llm.ledger import peek_ledger

    path = tmp_path / "llm" / "llm-ledger.json"
    assert peek_ledger(Prices(1.0, 1.0), 5.0, path).spent_usd == 0.0  # no file: $0
    assert not path.parent.exists()  # and none created
    ledger = CostLedger(Prices(1.25, 10.0), 5.0, path)
    ledger.charge("writer", Usage(input_tokens=1000, output_tokens=1000))
    files = {p.name: p.read_bytes() for p in path.parent.iterdir()}
    view = peek_ledger(Prices(1.25, 10.0), 5.0, path)
    assert view is not None
    assert project(view, 4, 3) == project(ledger, 4, 3)  # the same line as the ledger's
    assert "this population's average cost per call" in project(view, 4, 3)
    assert {p.name: p.read_bytes() for p in path.parent.iterdir()} == files
    assert load_ledger(path).runs == 1
    path.write_text("{not json")  # unreadable: spent unknown, and the file stays put
    assert peek_ledger(Prices(1.25, 10.0), 5.0, path) is None
    assert path.read_text() == "{not json"
