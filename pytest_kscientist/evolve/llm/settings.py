"""The LLM options resolved once into a frozen ``LLMSettings`` (pure: no pytest, no network).

``resolve_settings`` takes the raw flag/ini strings and the environment, so the pytest plugin
(``llm_options.py``) and a command line outside pytest share one set of rules and messages.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from pytest_kscientist.errors import KsError

Provider = Literal["gemini", "openai", "replay", "offline"]
PROVIDERS: tuple[str, ...] = ("auto", "gemini", "openai", "replay", "offline")

# Google's client reads the same two variables and prefers GOOGLE_API_KEY when both are set.
GEMINI_KEY_VARS = ("GOOGLE_API_KEY", "GEMINI_API_KEY")
OPENAI_KEY_VAR = "OPENAI_API_KEY"
OPENAI_BASE_URL_VAR = "OPENAI_BASE_URL"

DEFAULT_GEMINI_MODEL = "gemini-2.5-pro"
DEFAULT_BUDGET_USD = 5.0
# Gemini 2.5 Pro list price per 1M tokens (prompts up to 200k tokens; thinking billed as
# output), 2025. Local OpenAI-compatible servers cost nothing unless ks_llm_prices says so.
DEFAULT_PRICES = {"gemini": (1.25, 10.0), "openai": (0.0, 0.0), "replay": (0.0, 0.0)}

# The option names as the user sees them, for messages: (flag, ini).
OPTION_NAMES = {
    "llm": ("--ks-llm", "ks_llm"),
    "model": ("--ks-model", "ks_model"),
    "base_url": ("--ks-llm-base-url", "ks_llm_base_url"),
    "replay": ("--ks-replay", "ks_replay"),
    "budget_usd": ("--ks-llm-budget-usd", "ks_llm_budget_usd"),
    "prices": ("--ks-llm-prices", "ks_llm_prices"),
    "outage_s": ("--ks-llm-outage-s", "ks_llm_outage_s"),
    "timeout_s": ("--ks-llm-timeout-s", "ks_llm_timeout_s"),
    "output_tokens": ("--ks-llm-output-tokens", "ks_llm_output_tokens"),
    "context_tokens": ("--ks-llm-context-tokens", "ks_llm_context_tokens"),
}
DEFAULT_OUTAGE_S = 600.0


class SettingsError(KsError):
    """An LLM option has a value that cannot work; the message names the option and the fix."""


@dataclass(frozen=True)
class Prices:
    """US dollars per one million input and output tokens."""

    input_per_mtok: float
    output_per_mtok: float

    def cost_usd(self, input_tokens: int, output_tokens: int) -> float:
        """What a call with these token counts costs."""
        return (input_tokens * self.input_per_mtok + output_tokens * self.output_per_mtok) / 1e6


@dataclass(frozen=True)
class RetryPolicy:
    """Transport retries (429/5xx/timeouts) and attempts at a well-formed answer."""

    attempts: int = 4  # HTTP attempts per call, the first included
    initial_delay_s: float = 2.0
    max_delay_s: float = 60.0
    timeout_s: float = 600.0  # per HTTP request; long writer answers take minutes
    format_attempts: int = 3  # calls per role step before MalformedOutput
    # How long every call may fail (after its retries) before the run stops as an outage;
    # shorter failures are stood in for (offline roles, skipped plans).
    outage_s: float = DEFAULT_OUTAGE_S


@dataclass(frozen=True)
class RoleLimits:
    """Output token caps per role. Thinking models spend part of the cap on thoughts."""

    selector: int = 8192
    designer: int = 16384
    writer: int = 32768
    temperature: float | None = None  # None: the provider's default
    # The model's context window (prompt + answer), when the server has a small one: the
    # output cap shrinks to what the prompt leaves (a 32k vLLM model refused the 32k writer
    # cap with HTTP 400; Ollama cut prompts to its num_ctx: issue 13).
    context_tokens: int | None = None

    def max_output_tokens(self, role: str) -> int:
        """The cap for ``role`` (a repair round is a writer call)."""
        return int(getattr(self, "writer" if role == "repair" else role))


@dataclass(frozen=True)
class LLMSettings:
    """Everything the LLM scientist needs to know, resolved and checked."""

    provider: Provider
    model: str = ""
    base_url: str | None = None
    replay_path: Path | None = None
    budget_usd: float = DEFAULT_BUDGET_USD
    prices: Prices = Prices(0.0, 0.0)
    retry: RetryPolicy = RetryPolicy()
    limits: RoleLimits = RoleLimits()
    notice: str = ""  # one line for the terminal when auto mode fell back to offline
    api_key: str | None = field(default=None, repr=False)
    secrets: tuple[str, ...] = field(default=(), repr=False)  # redacted from logs and errors


def _name(key: str) -> str:
    flag, ini = OPTION_NAMES[key]
    return f"{flag} (ini {ini})"


def _parse_budget(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise SettingsError(
            f"{_name('budget_usd')} expects a positive number of US dollars, got {raw!r}; "
            "pass e.g. --ks-llm-budget-usd 5"
        )
    return value


def _parse_prices(raw: str) -> Prices:
    parts = raw.replace(",", "/").split("/")
    try:
        values = [float(p) for p in parts]
    except ValueError:
        values = []
    if len(values) != 2 or not all(math.isfinite(v) and v >= 0 for v in values):
        raise SettingsError(
            f"{_name('prices')} expects 'INPUT/OUTPUT' US dollars per 1M tokens, got {raw!r}; "
            "pass e.g. --ks-llm-prices 1.25/10"
        )
    return Prices(values[0], values[1])


def _positive(key: str, raw: str, example: str, integer: bool = False) -> float:
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0 or (integer and value != int(value)):
        what = "a positive whole number" if integer else "a positive number"
        unit = " of tokens" if integer else " of seconds"
        raise SettingsError(
            f"{_name(key)} expects {what}{unit}, got {raw!r}; pass e.g. "
            f"{OPTION_NAMES[key][0]} {example}"
        )
    return value


def _parse_output_tokens(raw: str) -> RoleLimits:
    parts = [p.strip() for p in raw.replace(",", "/").split("/")]
    if len(parts) not in (1, 3):
        raise SettingsError(
            f"{_name('output_tokens')} expects one cap for every role or "
            f"'SELECTOR/DESIGNER/WRITER' tokens, got {raw!r}; pass e.g. "
            "--ks-llm-output-tokens 4096/8192/16384"
        )
    caps = [int(_positive("output_tokens", p, "8192", integer=True)) for p in parts]
    caps = caps * 3 if len(caps) == 1 else caps
    return RoleLimits(selector=caps[0], designer=caps[1], writer=caps[2])


def _transport(raw: Mapping[str, str | None]) -> tuple[RetryPolicy, RoleLimits]:
    """The retry policy and the role limits from the outage, timeout, output and context
    options (defaults where unset)."""
    retry, limits = RetryPolicy(), RoleLimits()
    if raw.get("outage_s"):
        retry = replace(retry, outage_s=_positive("outage_s", raw["outage_s"] or "", "600"))
    if raw.get("timeout_s"):
        retry = replace(retry, timeout_s=_positive("timeout_s", raw["timeout_s"] or "", "300"))
    if raw.get("output_tokens"):
        limits = _parse_output_tokens(raw["output_tokens"] or "")
    if raw.get("context_tokens"):
        context = int(_positive("context_tokens", raw["context_tokens"] or "", "32768",
                                integer=True))
        limits = replace(limits, context_tokens=context)
    return retry, limits


def _check_url(raw: str) -> str:
    if not raw.startswith(("http://", "https://")):
        raise SettingsError(
            f"{_name('base_url')} expects an http(s) URL, got {raw!r}; "
            "pass e.g. --ks-llm-base-url http://127.0.0.1:8000/v1"
        )
    return raw.rstrip("/")


def _replay_file(raw: str) -> Path:
    path = Path(raw).expanduser()
    if path.is_dir():
        path = path / "llm-calls.jsonl"
    if not path.is_file():
        raise SettingsError(
            f"{_name('replay')} expects a call log (llm-calls.jsonl or the folder holding it), "
            f"found nothing at {raw!r}; point it at the log folder of an earlier run"
        )
    return path


def _secrets(env: Mapping[str, str]) -> tuple[str, ...]:
    names = (*GEMINI_KEY_VARS, OPENAI_KEY_VAR)
    return tuple(sorted({env[n] for n in names if env.get(n)}, key=len, reverse=True))


def resolve_settings(raw: Mapping[str, str | None], env: Mapping[str, str]) -> LLMSettings:
    """Turn raw option strings (keys of ``OPTION_NAMES``, None = unset) into settings."""
    choice = (raw.get("llm") or "auto").strip().lower()
    if choice not in PROVIDERS:
        raise SettingsError(
            f"{_name('llm')} expects one of {', '.join(PROVIDERS)}, got {raw.get('llm')!r}; "
            "pass e.g. --ks-llm gemini"
        )
    if raw.get("replay") and choice not in ("auto", "replay"):
        raise SettingsError(
            f"{_name('replay')} only applies with --ks-llm replay or auto, got --ks-llm {choice}; "
            "drop --ks-replay or pass --ks-llm replay"
        )
    gemini_key = next((env[n] for n in GEMINI_KEY_VARS if env.get(n)), None)
    notice = ""
    if choice == "auto":
        if raw.get("replay"):
            choice = "replay"
        elif gemini_key:
            choice = "gemini"
        else:
            choice = "offline"
            notice = (
                "kscientist: no GEMINI_API_KEY or GOOGLE_API_KEY set, evolving with the offline "
                "scientist; export a key for Gemini or pass --ks-llm openai --ks-model M "
                "--ks-llm-base-url URL for a local server"
            )
    budget_raw, url_raw, prices_raw = raw.get("budget_usd"), raw.get("base_url"), raw.get("prices")
    budget = _parse_budget(budget_raw) if budget_raw else DEFAULT_BUDGET_USD
    base_url = _check_url(url_raw) if url_raw else None
    model = (raw.get("model") or "").strip()
    retry, limits = _transport(raw)
    common = {"budget_usd": budget, "notice": notice, "secrets": _secrets(env), "retry": retry,
              "limits": limits}
    if choice == "offline":
        return LLMSettings(provider="offline", **common)  # type: ignore[arg-type]
    prices = _parse_prices(prices_raw) if prices_raw else Prices(*DEFAULT_PRICES[choice])
    if choice == "gemini":
        if not gemini_key:
            raise SettingsError(
                f"{_name('llm')} gemini needs an API key in GEMINI_API_KEY or GOOGLE_API_KEY, "
                "found neither; export one, or pass --ks-llm offline"
            )
        return LLMSettings(
            provider="gemini",
            model=model or DEFAULT_GEMINI_MODEL,
            base_url=base_url,
            prices=prices,
            api_key=gemini_key,
            **common,  # type: ignore[arg-type]
        )
    if choice == "openai":
        base_url = base_url or (
            _check_url(env[OPENAI_BASE_URL_VAR]) if env.get(OPENAI_BASE_URL_VAR) else None
        )
        if not base_url or not model:
            missing = " and ".join(
                n for n, v in ((_name("base_url"), base_url), (_name("model"), model)) if not v
            )
            raise SettingsError(
                f"{_name('llm')} openai needs {missing}, found none; pass e.g. "
                "--ks-llm-base-url http://127.0.0.1:8000/v1 --ks-model Qwen/Qwen3-32B"
            )
        return LLMSettings(
            provider="openai",
            model=model,
            base_url=base_url,
            prices=prices,
            api_key=env.get(OPENAI_KEY_VAR) or None,
            **common,  # type: ignore[arg-type]
        )
    if not raw.get("replay"):
        raise SettingsError(
            f"{_name('llm')} replay needs {_name('replay')}, found none; pass "
            "--ks-replay PATH/TO/llm-calls.jsonl from an earlier run"
        )
    return LLMSettings(
        provider="replay",
        model=model or "replay",
        replay_path=_replay_file(raw["replay"] or ""),
        prices=prices,
        **common,  # type: ignore[arg-type]
    )
