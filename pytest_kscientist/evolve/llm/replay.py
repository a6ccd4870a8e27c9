"""The replay provider: answers every request from an earlier run's call log, no network.

A request takes the logged answer with the same (role, request sha256, occurrence) when there is
one. Measured times differ between runs, so a re-run's prompts rarely match byte for byte: then
it takes the role's unused answer whose logged prompt is nearest this one (the most lines in
common for the lines of both together, so a later generation's longer prompt that holds this
one's lines loses; ties: log order), and the new log marks the call ``replay_match="nearest"``.
Log order alone is not enough: calls made at once (the writers of a generation) are logged as
they finish, which differs between runs. Logged failures replay as the same errors, and each
answer is charged its logged cost, so budget stops reproduce too. ``ReplayMiss`` means the role
has no logged answers left.
"""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

from pytest_kscientist.evolve.llm.llm_errors import (
    BudgetExhausted,
    MalformedReply,
    ProviderError,
    ReplayMiss,
)
from pytest_kscientist.evolve.llm.provider import LLMReply, LLMRequest
from pytest_kscientist.evolve.llm.transcript import CALLS_FILE, CallRecord, read_calls


class ReplayProvider:
    """Serves logged answers: exact match first, else the role's next one in log order."""

    name = "replay"

    def __init__(self, path: Path, model: str = "replay") -> None:
        self.path = path / CALLS_FILE if path.is_dir() else path
        self.model = model
        self.mismatches = 0  # calls answered by the nearest prompt, not an exact match
        self._records = read_calls(self.path)
        self._exact: dict[tuple[str, str, int], int] = {}
        for i, record in enumerate(self._records):
            self._exact.setdefault((record.role, record.prompt_sha256, record.occurrence), i)
        self._lines: dict[int, Counter[str]] = {}  # a record's prompt lines, once needed
        self._used: set[int] = set()
        self._lock = threading.Lock()

    def check(self) -> str:
        """Nothing to reach: the log was read when the provider was made."""
        return "" if self._records else f"the call log {self.path} holds no calls to replay"

    def __len__(self) -> int:
        return len(self._records)

    def _take(self, request: LLMRequest) -> tuple[CallRecord, str]:
        with self._lock:
            key = (request.role, request.prompt_sha256, request.occurrence)
            index = self._exact.get(key)
            match = "exact"
            if index is None or index in self._used:
                match = "nearest"
                index = self._nearest(request)
            if index is None:
                logged = sum(r.role == request.role for r in self._records)
                raise ReplayMiss(
                    request.role,
                    f"--ks-replay {self.path}: all {logged} logged {request.role} answers are "
                    "used; this run asks for more than the logged one did (another generation "
                    "count or population?)",
                )
            self._used.add(index)
            if match == "nearest":
                self.mismatches += 1
            return self._records[index], match

    def _nearest(self, request: LLMRequest) -> int | None:
        """The unused record of the request's role whose prompt is nearest it: the largest
        share of lines in common (Jaccard over the two prompts' lines, repeats counted)."""
        lines = Counter(request.prompt.splitlines())
        best: tuple[float, int] | None = None  # (share, -index)
        for i, record in enumerate(self._records):
            if i in self._used or record.role != request.role:
                continue
            logged = self._lines.get(i)
            if logged is None:
                logged = self._lines[i] = Counter(record.prompt.splitlines())
            share = sum((lines & logged).values()) / max(1, sum((lines | logged).values()))
            if best is None or (share, -i) > best:
                best = (share, -i)
        return None if best is None else -best[1]

    def generate(self, request: LLMRequest) -> LLMReply:
        """The logged answer (or failure) for this request."""
        record, match = self._take(request)
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
            replay_match=match,
        )
