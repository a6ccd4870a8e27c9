"""What a provider is: one request in, one reply out, transport retries inside.

Providers raise ``ProviderError`` when the service fails after its retries and
``MalformedReply`` when an HTTP body is not the JSON it should be; everything else (budget,
logging, schema checks, retries for malformed answers) belongs to ``session.Session``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from pydantic import BaseModel

from pytest_kscientist.evolve.llm.ledger import Usage


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
    replay_match: str = ""  # set only by replay: "exact" or "sequence"


class Provider(Protocol):
    """A chat model behind some API."""

    name: str
    model: str

    def generate(self, request: LLMRequest) -> LLMReply: ...


def truncated(finish_reason: str) -> bool:
    """Whether the reply stopped at the output token cap (Gemini and OpenAI spellings)."""
    return finish_reason.upper() in {"MAX_TOKENS", "LENGTH"}
