"""Typed failures of the LLM scientist: each one is recorded by the loop, never a crash.

``BudgetExhausted`` means "stop cleanly" and ``ProviderOutage`` "stop, the provider cannot go
on"; the others fail one role call (one generation step or one candidate) and carry their
reason as text the loop can store.
"""

from __future__ import annotations

from pytest_kscientist.errors import KsError


class LLMError(KsError):
    """Base class: a role call of the LLM scientist did not produce a usable answer."""

    def __init__(self, role: str, reason: str) -> None:
        super().__init__(f"{role}: {reason}")
        self.role = role
        self.reason = reason


class BudgetExhausted(LLMError):
    """The next call could exceed ``--ks-llm-budget-usd``: the loop should stop cleanly."""

    def __init__(self, role: str, reason: str, spent_usd: float, cap_usd: float) -> None:
        super().__init__(role, reason)
        self.spent_usd = spent_usd
        self.cap_usd = cap_usd


class ProviderError(LLMError):
    """The provider failed after its retries (HTTP error, timeout, refused connection)."""

    def __init__(self, role: str, reason: str, status: int | None = None) -> None:
        super().__init__(role, reason)
        self.status = status
        self.detail = ""  # the traceback, when the provider itself raised something unexpected


class ProviderOutage(ProviderError):
    """Every call has failed for longer than ``--ks-llm-outage-s``, or the provider refuses
    them outright (a bad key, an unknown model): the run stops, resumable, with code 3."""


class PromptTooLong(LLMError):
    """The prompt leaves no room for an answer in ``--ks-llm-context-tokens``."""


class MalformedOutput(LLMError):
    """The reply stayed empty, truncated or off-schema after every allowed attempt."""

    def __init__(self, role: str, reason: str, raw: str = "") -> None:
        super().__init__(role, reason)
        self.raw = raw


class DraftRejected(LLMError):
    """The writer's file failed the pre-GPU checks, also after one repair round."""

    def __init__(self, reason: str, source: str = "", explanation: str = "") -> None:
        super().__init__("writer", reason)
        self.source = source
        self.explanation = explanation


class ReplayMiss(LLMError):
    """``--ks-replay`` holds no logged answer for this prompt: the run diverged from the log."""


class MalformedReply(Exception):
    """Internal: a provider's HTTP body was not the JSON it promised (retried by the session)."""
