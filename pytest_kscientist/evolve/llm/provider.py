"""What a provider is: one request in, one reply out, transport retries inside.

Providers raise ``ProviderError`` when the service fails after its retries and
``MalformedReply`` when an HTTP body is not the JSON it should be; everything else (budget,
logging, schema checks, retries for malformed answers) belongs to ``session.Session``.
"""

from __future__ import annotations

import random
import re
import time
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import Protocol

from pydantic import BaseModel

from pytest_kscientist.evolve.llm.ledger import Usage
from pytest_kscientist.evolve.llm.settings import RetryPolicy


@dataclass(frozen=True)
class LLMRequest:
    """One call: a system instruction, a user prompt, an optional structured-output model."""

    role: str
    system: str
    prompt: str
    max_output_tokens: int
    schema: type[BaseModel] | None = None
    temperature: float | None = None
    prompt_sha256: str = ""  # replay key, set by the session
    occurrence: int = 0


@dataclass(frozen=True)
class LLMReply:
    """The text of the first candidate (may be empty), why it ended, and the tokens used."""

    text: str
    finish_reason: str = ""
    usage: Usage = field(default_factory=Usage)
    cost_usd: float | None = None  # set only by replay: the logged cost
    replay_match: str = ""  # set only by replay: "exact" or "nearest"


class Provider(Protocol):
    """A chat model behind some API."""

    name: str
    model: str

    def generate(self, request: LLMRequest) -> LLMReply: ...

    def check(self) -> str:
        """One free request before the run spends anything (no tokens): raise
        ``ProviderError`` when the service cannot be reached or refuses the key or the model;
        return a warning to show ("" when none)."""
        ...


# A refusal of the start check: a bad key (Gemini answers 400 API_KEY_INVALID), no permission,
# or a model the service does not have. Every generation call would fail alike.
CHECK_REFUSED = frozenset({400, 401, 403, 404})
CHECK_TIMEOUT_S = 30.0  # the start check's lookup: a small answer, no generation


def truncated(finish_reason: str) -> bool:
    """Whether the reply stopped at the output token cap (Gemini and OpenAI spellings)."""
    return finish_reason.upper() in {"MAX_TOKENS", "LENGTH"}


_THINK = re.compile(r"<think>.*?</think>\s*", re.DOTALL | re.IGNORECASE)


def strip_thinking(text: str) -> str:
    """``text`` without ``<think>...</think>`` blocks (Qwen3-style reasoning inline in the
    answer broke the JSON parse: issue 13); an unclosed block is all thinking."""
    text = _THINK.sub("", text)
    opened = text.lower().find("<think>")
    return text[:opened] if opened >= 0 else text


def retry_after_s(header: str | None) -> float | None:
    """Seconds an HTTP ``Retry-After`` header asks to wait (seconds or an HTTP date)."""
    if not header:
        return None
    try:
        return max(0.0, float(header))
    except ValueError:
        pass
    try:
        return max(0.0, parsedate_to_datetime(header).timestamp() - time.time())
    except (TypeError, ValueError, IndexError):
        return None


def retry_delay_s(attempt: int, retry: RetryPolicy, hint: float | None) -> float:
    """Seconds before attempt ``attempt + 1``: the server's hint when it gave one (up to the
    outage limit: waiting less only earns another 429), else exponential backoff with jitter
    (which spreads concurrent callers apart) up to ``max_delay_s``."""
    if hint is not None:
        return min(hint, retry.outage_s)
    backoff = retry.initial_delay_s * 2 ** (attempt - 1)
    return min(retry.max_delay_s, backoff + random.uniform(0, retry.initial_delay_s))
