"""The LLM options of pytest-kscientist: flags with ini twins, validated once at configure time.

``plugin.py`` calls ``add_options(parser)`` from ``pytest_addoption`` and
``validate(config)`` from ``pytest_configure``; ``settings(config)`` gives the resolved
``LLMSettings`` afterwards. Nothing here imports an LLM client.
"""

from __future__ import annotations

import os

import pytest

from pytest_kscientist.evolve.llm.settings import (
    DEFAULT_BUDGET_USD,
    DEFAULT_OUTAGE_S,
    OPTION_NAMES,
    LLMSettings,
    SettingsError,
    resolve_settings,
)
from pytest_kscientist.options import Option, raw_value, register

_HELP = {
    "llm": "LLM provider of the --evolve scientist: auto (gemini when GEMINI_API_KEY or "
    "GOOGLE_API_KEY is set, else offline), gemini, openai (any OpenAI-compatible chat server: "
    "vLLM, Ollama), replay (re-run from a call log), offline.",
    "model": "model name, e.g. gemini-2.5-pro (gemini's default) or the model a local server "
    "serves (required with openai).",
    "base_url": "endpoint of the provider: the OpenAI-compatible base URL (e.g. "
    "http://127.0.0.1:8000/v1), or a Gemini API proxy.",
    "replay": "call log of an earlier run (llm-calls.jsonl or its folder) to replay.",
    "budget_usd": "hard cap in US dollars on the LLM spending of the task's population, all its "
    f"runs together (its ledger; default {DEFAULT_BUDGET_USD:g}); no call is made that could "
    "exceed it, and the run stops cleanly before one would.",
    "prices": "prices as 'INPUT/OUTPUT' US dollars per 1M tokens (default: Gemini 2.5 Pro list "
    "price for gemini, 0/0 for openai).",
    "outage_s": "stop the run (exit code 3, resumable) once no LLM call has succeeded for this "
    f"many seconds and every call since failed (default {DEFAULT_OUTAGE_S:g}); shorter "
    "failures are stood in for by the offline roles or skip a plan.",
    "timeout_s": "timeout of one HTTP request to the LLM in seconds (default 600).",
    "output_tokens": "output token caps: one for every role, or SELECTOR/DESIGNER/WRITER "
    "(default 8192/16384/32768; thinking counts against them).",
    "context_tokens": "the model's context window in tokens (prompt + answer): each call's "
    "output cap shrinks to what its prompt leaves (for local servers with small contexts).",
}


_METAVAR = {
    "llm": "PROVIDER",
    "model": "NAME",
    "base_url": "URL",
    "replay": "PATH",
    "budget_usd": "USD",
    "prices": "IN/OUT",
    "outage_s": "SECONDS",
    "timeout_s": "SECONDS",
    "output_tokens": "N[/N/N]",
    "context_tokens": "N",
}


LLM_OPTIONS = tuple(
    Option(flag, _HELP[key], _METAVAR[key], ini=ini, ini_default=None, group="llm")
    for key, (flag, ini) in OPTION_NAMES.items()
)


def add_options(parser: pytest.Parser) -> None:
    """Register the ``--ks-llm*`` table: the flags in the help's LLM section, their ini twins
    on ``parser``."""
    register(parser, LLM_OPTIONS)


def _raw(config: pytest.Config) -> dict[str, str | None]:
    raw: dict[str, str | None] = {}
    for key, option in zip(OPTION_NAMES, LLM_OPTIONS, strict=True):
        value, _ = raw_value(config, option)
        raw[key] = None if value in (None, "") else str(value)
    return raw


def settings(config: pytest.Config) -> LLMSettings:
    """The resolved LLM settings of this run (the flag wins over its ini twin): those resolved
    at configure time when ``--evolve`` runs, else resolved now."""
    from pytest_kscientist.harness.session import KS_SESSION

    ks = config.stash.get(KS_SESSION, None)
    if ks is not None and ks.settings.llm is not None:
        return ks.settings.llm  # type: ignore[no-any-return]
    try:
        return resolve_settings(_raw(config), os.environ)
    except SettingsError as exc:
        raise pytest.UsageError(str(exc)) from None


def validate(config: pytest.Config) -> None:
    """Check every LLM option once; raise ``pytest.UsageError`` naming the option and the fix."""
    settings(config)
