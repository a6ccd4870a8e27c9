"""The ``--ks-llm*`` options and their ini twins: resolution, precedence, every usage error."""

from __future__ import annotations

import sys

import pytest

from pytest_kscientist.evolve.llm.settings import (
    DEFAULT_BUDGET_USD,
    DEFAULT_GEMINI_MODEL,
    Prices,
    SettingsError,
    resolve_settings,
)

KEY = "AIzaFAKE-settings-key"


def resolve(env: dict[str, str] | None = None, **raw: str):
    return resolve_settings(raw, env or {})


def test_auto_without_a_key_is_offline_with_a_one_line_notice():
    settings = resolve()
    assert settings.provider == "offline"
    assert "\n" not in settings.notice
    assert settings.notice.startswith("kscientist: no GEMINI_API_KEY or GOOGLE_API_KEY set")
    assert "--ks-llm openai" in settings.notice


def test_auto_with_a_key_is_gemini_and_google_api_key_wins():
    settings = resolve({"GEMINI_API_KEY": "g", "GOOGLE_API_KEY": KEY})
    assert (settings.provider, settings.model, settings.api_key) == (
        "gemini",
        DEFAULT_GEMINI_MODEL,
        KEY,
    )
    assert settings.notice == "" and settings.prices == Prices(1.25, 10.0)
    assert settings.budget_usd == DEFAULT_BUDGET_USD
    assert KEY not in repr(settings)


def test_auto_with_a_replay_log_is_replay(tmp_path):
    (tmp_path / "llm-calls.jsonl").write_text("")
    settings = resolve({"GEMINI_API_KEY": KEY}, replay=str(tmp_path))
    assert settings.provider == "replay" and settings.replay_path == tmp_path / "llm-calls.jsonl"


def test_openai_takes_model_url_and_optional_key():
    settings = resolve(
        {"OPENAI_API_KEY": "sk-x"},
        llm="openai",
        model="qwen",
        base_url="http://127.0.0.1:8000/v1/",
        prices="0.1,0.4",
    )
    assert (settings.base_url, settings.api_key) == ("http://127.0.0.1:8000/v1", "sk-x")
    assert settings.prices == Prices(0.1, 0.4) and "sk-x" in settings.secrets


@pytest.mark.parametrize(
    ("raw", "env", "message"),
    [
        (
            {"llm": "claude"},
            {},
            "--ks-llm (ini ks_llm) expects one of auto, gemini, openai, "
            "replay, offline, got 'claude'",
        ),
        (
            {"llm": "gemini"},
            {},
            "--ks-llm (ini ks_llm) gemini needs an API key in "
            "GEMINI_API_KEY or GOOGLE_API_KEY, found neither; export one, or pass --ks-llm offline",
        ),
        (
            {"llm": "openai", "model": "m"},
            {},
            "openai needs --ks-llm-base-url (ini ks_llm_base_url), found none",
        ),
        ({"llm": "openai", "base_url": "http://h/v1"}, {}, "openai needs --ks-model"),
        ({"llm": "replay"}, {}, "replay needs --ks-replay (ini ks_replay), found none"),
        ({"replay": "/nonexistent/log"}, {}, "--ks-replay (ini ks_replay) expects a call log"),
        (
            {"llm": "gemini", "replay": "x"},
            {"GEMINI_API_KEY": KEY},
            "--ks-replay (ini ks_replay) "
            "only applies with --ks-llm replay or auto, got --ks-llm gemini",
        ),
        (
            {"budget_usd": "0"},
            {},
            "--ks-llm-budget-usd (ini ks_llm_budget_usd) expects a "
            "positive number of US dollars, got '0'",
        ),
        ({"budget_usd": "five"}, {}, "expects a positive number of US dollars, got 'five'"),
        ({"budget_usd": "nan"}, {}, "got 'nan'"),
        (
            {"prices": "1.25"},
            {"GEMINI_API_KEY": KEY},
            "--ks-llm-prices (ini ks_llm_prices) expects "
            "'INPUT/OUTPUT' US dollars per 1M tokens, got '1.25'; "
            "pass e.g. --ks-llm-prices 1.25/10",
        ),
        (
            {"base_url": "localhost:8000"},
            {},
            "--ks-llm-base-url (ini ks_llm_base_url) expects an http(s) URL, got 'localhost:8000'",
        ),
    ],
)
def test_every_bad_value_names_the_option_the_expectation_and_the_fix(raw, env, message):
    with pytest.raises(SettingsError) as info:
        resolve(env, **raw)
    assert message in str(info.value)
    assert KEY not in str(info.value)


SHOW = """
def test_show(pytestconfig):
    from pytest_kscientist.evolve.llm import llm_options
    s = llm_options.settings(pytestconfig)
    print("SETTINGS", s.provider, s.model, s.budget_usd, s.prices.input_per_mtok)
"""


def test_the_flag_wins_over_its_ini_twin(pytester, monkeypatch):
    monkeypatch.setenv("GEMINI_API_KEY", KEY)
    pytester.makeini(
        "[pytest]\nks_llm = gemini\nks_model = from-ini\nks_llm_budget_usd = 2\n"
        "ks_llm_prices = 3/30\n"
    )
    pytester.makepyfile(SHOW)
    result = pytester.runpytest("-s", "--ks-model", "from-flag")
    result.stdout.fnmatch_lines(["*SETTINGS gemini from-flag 2.0 3.0*"])


def test_a_bad_ini_value_is_a_usage_error_at_configure_time(pytester, monkeypatch):
    monkeypatch.delenv("GEMINI_API_KEY", raising=False)
    monkeypatch.delenv("GOOGLE_API_KEY", raising=False)
    pytester.makeini("[pytest]\nks_llm_budget_usd = -1\n")
    pytester.mkdir("task")
    result = pytester.runpytest("--evolve", "1", "task")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "ERROR: --ks-llm-budget-usd (ini ks_llm_budget_usd) expects a positive number of US "
            "dollars, got '-1'; pass e.g. --ks-llm-budget-usd 5",
        ]
    )


def test_help_lists_the_llm_flags_and_imports_no_client(pytester):
    result = pytester.runpytest_subprocess(
        "-p",
        "no:cacheprovider",
        "--help",
    )
    result.stdout.fnmatch_lines(
        ["*--ks-llm=PROVIDER*", "*--ks-llm-budget-usd=USD*", "*ks_llm_prices (string)*"]
    )
    pytester.makepyfile(
        check="""
import sys, subprocess
import pytest_kscientist.evolve.llm.llm_options, pytest_kscientist.evolve.llm.factory
heavy = [m for m in sys.modules if m.startswith(("google.genai", "httpx", "torch"))]
print("HEAVY", heavy)
"""
    )
    run = pytester.run(sys.executable, "check.py")
    run.stdout.fnmatch_lines(["HEAVY []"])


def test_outage_timeout_output_caps_and_context_resolve_into_the_policy_and_limits():
    settings = resolve({"GEMINI_API_KEY": KEY}, outage_s="90", timeout_s="120.5",
                       output_tokens="4096/8192/16384", context_tokens="32768")
    assert (settings.retry.outage_s, settings.retry.timeout_s) == (90.0, 120.5)
    limits = settings.limits
    assert (limits.selector, limits.designer, limits.writer) == (4096, 8192, 16384)
    assert limits.context_tokens == 32768 and limits.max_output_tokens("repair") == 16384
    one = resolve({"GEMINI_API_KEY": KEY}, output_tokens="2048").limits
    assert (one.selector, one.designer, one.writer, one.context_tokens) == (2048,) * 3 + (None,)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"outage_s": "soon"}, "--ks-llm-outage-s (ini ks_llm_outage_s) expects a positive "
         "number of seconds, got 'soon'; pass e.g. --ks-llm-outage-s 600"),
        ({"timeout_s": "0"}, "--ks-llm-timeout-s (ini ks_llm_timeout_s) expects a positive "
         "number of seconds, got '0'"),
        ({"output_tokens": "4096/8192"}, "--ks-llm-output-tokens (ini ks_llm_output_tokens) "
         "expects one cap for every role or 'SELECTOR/DESIGNER/WRITER' tokens, got '4096/8192'"),
        ({"output_tokens": "1.5k"}, "--ks-llm-output-tokens (ini ks_llm_output_tokens) "
         "expects a positive whole number of tokens, got '1.5k'"),
        ({"context_tokens": "32768.5"}, "--ks-llm-context-tokens (ini ks_llm_context_tokens) "
         "expects a positive whole number of tokens, got '32768.5'"),
    ],
)
def test_bad_transport_options_name_the_option_and_the_fix(raw, message):
    with pytest.raises(SettingsError) as info:
        resolve({"GEMINI_API_KEY": KEY}, **raw)
    assert message in str(info.value)
