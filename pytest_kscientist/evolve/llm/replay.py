"""The replay provider: answers every request from an earlier run's call log, no network.

A request is matched by (role, request sha256, occurrence). Logged failures replay as the same
``ProviderError``, and each answer is charged its logged cost, so budget stops reproduce too.
"""

from __future__ import annotations

from pathlib import Path

from pytest_kscientist.evolve.llm.errors import (
    BudgetExhausted,
    MalformedReply,
    ProviderError,
    ReplayMiss,
)
from pytest_kscientist.evolve.llm.provider import LLMReply, LLMRequest
from pytest_kscientist.evolve.llm.transcript import CALLS_FILE, CallRecord, read_calls


class ReplayProvider:
    """Serves logged answers keyed by role, prompt hash and occurrence."""

    name = "replay"

    def __init__(self, path: Path, model: str = "replay") -> None:
        self.path = path / CALLS_FILE if path.is_dir() else path
        self.model = model
        self._calls: dict[tuple[str, str, int], CallRecord] = {}
        for record in read_calls(self.path):
            self._calls.setdefault((record.role, record.prompt_sha256, record.occurrence), record)

    def __len__(self) -> int:
        return len(self._calls)

    def generate(self, request: LLMRequest) -> LLMReply:
        """The logged answer to this request, or ``ReplayMiss`` if the run has diverged."""
        key = (request.role, request.prompt_sha256, request.occurrence)
        record = self._calls.get(key)
        if record is None:
            raise ReplayMiss(
                request.role,
                f"--ks-replay {self.path}: no logged answer to this prompt (sha256 "
                f"{request.prompt_sha256[:12]}, occurrence {request.occurrence}); the run "
                "diverged from the log: replay needs the same task, population, seeds and options",
            )
        if record.outcome == "budget":
            raise BudgetExhausted(request.role, f"(replayed) {record.error}", 0.0, 0.0)
        if record.outcome == "malformed":
            raise MalformedReply(f"(replayed) {record.error}")
        if record.response_text is None:
            raise ProviderError(request.role, f"(replayed) {record.error}", record.status)
        return LLMReply(
            text=record.response_text,
            finish_reason=record.finish_reason,
            usage=record.usage,
            cost_usd=record.cost_usd,
        )
