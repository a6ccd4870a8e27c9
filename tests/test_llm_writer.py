"""Writer drafts are checked before any GPU time: parse, ``custom_kernel``, no duplicate;
one repair round with the exact problem, then a typed ``DraftRejected``."""

from __future__ import annotations

import fake_llm_server as fake_server
import pytest
from fake_llm_server import FakeReply
from fake_scientist import (
    SEED_SOURCE,
    fake_settings,
    sample_population,
    sample_task,
)

from pytest_kscientist.evolve.llm import draft
from pytest_kscientist.evolve.llm.factory import build_roles
from pytest_kscientist.evolve.llm.llm_errors import DraftRejected
from pytest_kscientist.evolve.llm.transcript import read_calls
from pytest_kscientist.evolve.roles import ExperimentPlan

ks_fake_llm = fake_server.ks_fake_llm  # the fixture, shared with other suites


PLAN = ExperimentPlan(
    title="bigger K groups",
    changes="k_group=8",
    expected_gain_min_pct=0,
    expected_gain_max_pct=10,
    innovation=2,
)
GOOD = SEED_SOURCE.replace('"k_group": 1', '"k_group": 8')


def reply(source: str, note: str = "Group 8 K blocks.") -> str:
    return f"## Explanation\n{note}\n\n```python\n{source}```\n"


def writer(server, tmp_path):
    roles = build_roles(fake_settings(server), sample_task(), tmp_path / "log")
    assert roles is not None
    return roles


@pytest.mark.parametrize(
    ("bad", "problem"),
    [
        (
            reply(GOOD.replace("def custom_kernel(data):", "def custom_kernel(data)")),
            "SyntaxError: expected ':' at line 9",
        ),
        (
            reply(GOOD.replace("custom_kernel", "kernel")),
            "does not define custom_kernel(data) at module level",
        ),
        (
            reply(SEED_SOURCE.replace('"""Seed', '"""Reworded seed') + "# a comment\n"),
            "the same code as candidate `seed-torch` (the base)",
        ),
        (reply(GOOD + "return c\n"), "SyntaxError: 'return' outside function at line 12"),
        ("I would group K blocks by 8.", "prose without a ```python block"),
    ],
)
def test_a_rejected_draft_gets_one_repair_round_with_the_exact_problem(
    ks_fake_llm, tmp_path, bad, problem
):
    ks_fake_llm.push(bad, reply(GOOD, "Fixed."))
    roles = writer(ks_fake_llm, tmp_path)
    draft_ = roles.writer.write(sample_task(), sample_population()[0], PLAN)
    assert draft_.source == GOOD and draft_.explanation == "Fixed."
    repair = ks_fake_llm.requests[1].prompt
    assert repair.startswith("# Repair") and problem in repair
    assert "## The base kernel you started from (`seed-torch`)" in repair
    roles_logged = [r.role for r in read_calls(tmp_path / "log" / "llm-calls.jsonl")]
    assert roles_logged == ["writer", "repair"]


def test_a_truncated_reply_is_named_as_such_in_the_repair(ks_fake_llm, tmp_path):
    ks_fake_llm.push(FakeReply.truncated(reply(GOOD)), reply(GOOD))
    roles = writer(ks_fake_llm, tmp_path)
    roles.writer.write(sample_task(), sample_population()[0], PLAN)
    assert "stopped at the output token cap (finish reason MAX_TOKENS)" in (
        ks_fake_llm.requests[1].prompt
    )


def test_a_draft_that_fails_twice_is_rejected_with_both_problems(ks_fake_llm, tmp_path):
    ks_fake_llm.push(reply("def f(:\n"), reply(SEED_SOURCE))
    roles = writer(ks_fake_llm, tmp_path)
    with pytest.raises(DraftRejected) as info:
        roles.writer.write(sample_task(), sample_population()[0], PLAN)
    message = str(info.value)
    assert message.startswith("writer: draft for 'bigger K groups' rejected after one repair")
    assert "the same code as candidate `seed-torch`" in message
    assert "(first attempt: SyntaxError" in message
    assert info.value.source == SEED_SOURCE


def test_a_draft_equal_to_any_population_member_or_earlier_draft_is_a_duplicate(
    ks_fake_llm, tmp_path
):
    population = sample_population()
    roles = writer(ks_fake_llm, tmp_path)
    ks_fake_llm.push('{"base_id": "seed-torch", "reference_id": null, "reason": "r"}')
    roles.selector.select(sample_task(), population, "")  # the roles learn the population
    ks_fake_llm.push(reply(population[1].source), reply(GOOD), reply(GOOD), reply(GOOD))
    roles.writer.write(sample_task(), population[0], PLAN)
    assert "the same code as candidate `g1-kgroup4`" in ks_fake_llm.requests[2].prompt
    with pytest.raises(DraftRejected, match="an earlier draft \\(bigger K groups\\)"):
        roles.writer.write(sample_task(), population[0], PLAN)


def test_normalised_hash_ignores_comments_docstrings_and_layout_only():
    a = 'def custom_kernel(data):\n    """Doc."""\n    return data  # why\n'
    b = "def custom_kernel( data ):\n\n    return (data)\n"
    c = "def custom_kernel(data):\n    return data[0]\n"
    assert draft.normalised_sha256(a) == draft.normalised_sha256(b)
    assert draft.normalised_sha256(a) != draft.normalised_sha256(c)


@pytest.mark.parametrize(
    "source",
    [
        "custom_kernel = lambda data: data\n",
        "from impl import fast as custom_kernel\n",
        "def custom_kernel(data):\n    return data\n",
    ],
)
def test_custom_kernel_may_be_bound_any_way_at_module_level(source):
    assert draft.check(source, draft.KnownSources()) == ""


def test_the_block_with_custom_kernel_wins_over_other_blocks():
    text = "Try:\n```python\nx = 1\n```\nFile:\n```python\ndef custom_kernel(d):\n    pass\n```"
    source, explanation, problem = draft.extract(text)
    assert source == "def custom_kernel(d):\n    pass\n" and problem == ""
    assert explanation == "Try:\n\nFile:"


def test_a_bare_file_without_fences_is_accepted():
    source, _, problem = draft.extract("import torch\n\ndef custom_kernel(data):\n    pass\n")
    assert problem == "" and source is not None and "custom_kernel" in source
