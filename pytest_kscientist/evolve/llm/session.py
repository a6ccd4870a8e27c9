"""One run's LLM session, shared by the three roles: budget, audit log, replay keys, retries
for malformed answers, and the kernels already known (for the duplicate check).
"""

from __future__ import annotations

import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from pytest_kscientist.evolve.llm import prompts
from pytest_kscientist.evolve.llm.draft import KnownSources
from pytest_kscientist.evolve.llm.ledger import TOKENS_PER_CHAR, CostLedger
from pytest_kscientist.evolve.llm.llm_errors import (
    BudgetExhausted,
    LLMError,
    MalformedOutput,
    MalformedReply,
    PromptTooLong,
    ProviderError,
    ProviderOutage,
)
from pytest_kscientist.evolve.llm.provider import (
    LLMReply,
    LLMRequest,
    Provider,
    strip_thinking,
    truncated,
)
from pytest_kscientist.evolve.llm.settings import RetryPolicy, RoleLimits
from pytest_kscientist.evolve.llm.transcript import CallLog, CallRecord, Redactor, request_sha256

M = TypeVar("M", bound=BaseModel)
RAW_CHARS = 2000  # of an unusable answer kept on MalformedOutput
MIN_ANSWER_TOKENS = 1024  # the least output room worth a call under --ks-llm-context-tokens
CONTEXT_MARGIN_TOKENS = 256  # chat-template tokens a server adds around the messages
REFUSED_STATUS = frozenset({401, 403, 404})  # a bad key or model: every call will fail alike


class Session:
    """Calls the provider for the roles; every call is budgeted, logged and replay-keyed."""

    def __init__(
        self,
        provider: Provider,
        ledger: CostLedger,
        log: CallLog,
        retry: RetryPolicy | None = None,
        limits: RoleLimits | None = None,
    ) -> None:
        self.provider = provider
        self.ledger = ledger
        self.log = log
        self.retry = retry or RetryPolicy()
        self.limits = limits or RoleLimits()
        self.redact: Redactor = log.redact
        self.known = KnownSources()
        self.system = prompts.render("system")
        self._occurrences: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()
        self._failing_since: float | None = None  # start of the current run of failed calls
        self._failed_calls = 0

    def call(self, role: str, prompt: str, schema: type[BaseModel] | None = None) -> LLMReply:
        """One budgeted, logged provider call; raises the typed errors of ``llm_errors.py``."""
        prompt = self.redact(prompt)  # a key echoed into an earlier answer goes no further
        schema_name = schema.__name__ if schema else ""
        digest = request_sha256(role, self.system, prompt, schema_name)
        with self._lock:
            occurrence = self._occurrences[(role, digest)]
            self._occurrences[(role, digest)] += 1
        request = LLMRequest(
            role=role,
            system=self.system,
            prompt=prompt,
            schema=schema,
            max_output_tokens=self._output_cap(role, prompt),
            temperature=self.limits.temperature,
            prompt_sha256=digest,
            occurrence=occurrence,
        )
        base = CallRecord(
            index=0,
            role=role,
            prompt_sha256=digest,
            occurrence=occurrence,
            provider=self.provider.name,
            model=self.provider.model,
            schema_name=schema_name,
            system=self.system,
            prompt=prompt,
        )
        started = time.monotonic()
        held = ""
        try:
            if request.max_output_tokens < min(MIN_ANSWER_TOKENS,
                                               self.limits.max_output_tokens(role)):
                raise self._too_long(role, prompt)
            worst = self.ledger.worst_case_usd(
                len(self.system) + len(prompt), request.max_output_tokens
            )
            held = self.ledger.reserve(role, worst)
            try:
                reply = self.provider.generate(request)
            except ProviderError as failed:
                raise self._outage(failed, started) from None
        except (LLMError, MalformedReply) as exc:
            self._release(held)
            outcome = {BudgetExhausted: "budget", MalformedReply: "malformed"}.get(
                type(exc), "error"
            )
            reason = exc.reason if isinstance(exc, LLMError) else str(exc)
            self._log_failure(base, outcome, reason, getattr(exc, "status", None), started)
            raise
        except Exception as exc:  # noqa: BLE001 - isolation boundary: the provider's own bugs
            self._release(held)
            where = traceback.extract_tb(exc.__traceback__)[-1]
            failure = ProviderError(
                role,
                self.redact(
                    f"{self.provider.name} provider raised {type(exc).__name__}: {exc} "
                    f"({where.filename}:{where.lineno})"
                ),
            )
            failure.detail = self.redact(traceback.format_exc())
            self._log_failure(base, "error", failure.detail, None, started)
            raise failure from None
        except BaseException:  # Ctrl-C: no answer came back, so no usage to charge
            self._release(held)
            raise
        with self._lock:
            self._failing_since = None
        cost = self.ledger.charge(role, reply.usage, reply.cost_usd, reservation=held)
        self.log.append(
            base.model_copy(
                update={
                    "response_text": reply.text,
                    "finish_reason": reply.finish_reason,
                    "usage": reply.usage,
                    "cost_usd": cost,
                    "replay_match": reply.replay_match,
                    "elapsed_s": time.monotonic() - started,
                }
            )
        )
        return replace(reply, text=strip_thinking(reply.text))  # the log keeps them

    def _output_cap(self, role: str, prompt: str) -> int:
        """The role's cap, shrunk to what the prompt leaves of ``--ks-llm-context-tokens``."""
        cap = self.limits.max_output_tokens(role)
        context = self.limits.context_tokens
        if context is None:
            return cap
        prompt_tokens = int((len(self.system) + len(prompt)) * TOKENS_PER_CHAR) + 1
        return min(cap, context - prompt_tokens - CONTEXT_MARGIN_TOKENS)

    def _too_long(self, role: str, prompt: str) -> PromptTooLong:
        chars = len(self.system) + len(prompt)
        return PromptTooLong(
            role,
            f"the {role} prompt (~{int(chars * TOKENS_PER_CHAR)} tokens, counting 3 characters "
            f"a token) leaves under {MIN_ANSWER_TOKENS} of the model's "
            f"{self.limits.context_tokens} context tokens (--ks-llm-context-tokens) for the "
            "answer; serve the model with a larger context and raise --ks-llm-context-tokens",
        )

    def _outage(self, failed: ProviderError, started: float) -> ProviderError:
        """``failed``, or a ``ProviderOutage`` when the provider refuses calls outright or every
        call has failed for longer than ``retry.outage_s``."""
        with self._lock:
            if self._failing_since is None:
                self._failing_since, self._failed_calls = started, 0
            self._failed_calls += 1
            failing_s, calls = time.monotonic() - self._failing_since, self._failed_calls
        resume = "the run stops here; rerun the same command to resume"
        if failed.status in REFUSED_STATUS:
            return ProviderOutage(failed.role, (
                f"{failed.reason}; the provider refuses calls (HTTP {failed.status}): check the "
                f"API key, --ks-model and --ks-llm-base-url; {resume}"), failed.status)
        if failing_s >= self.retry.outage_s:
            return ProviderOutage(failed.role, (
                f"no LLM call has succeeded for {failing_s:.0f} s ({calls} failed in a row, "
                f"retries included), longer than "
                f"--ks-llm-outage-s {self.retry.outage_s:g} (last: {failed.reason}); {resume} "
                "once the provider answers"), failed.status)
        return failed

    def ask(
        self,
        role: str,
        prompt: str,
        schema: type[M],
        check: Callable[[M], None] = lambda _value: None,
    ) -> M:
        """A structured answer validated by ``schema`` and ``check`` (which raises ValueError).

        An empty, truncated, non-JSON or off-schema answer is asked again with the problem
        appended to the prompt, up to ``retry.format_attempts`` calls, then ``MalformedOutput``.
        """
        problem, raw, asked = "", "", prompt
        for _attempt in range(self.retry.format_attempts):
            try:
                reply = self.call(role, asked, schema)
            except MalformedReply as exc:
                problem, raw = str(exc), ""
            else:
                raw = reply.text
                value, problem = _parse(reply, schema, check)
                if value is not None:
                    return value
            asked = prompt + "\n" + prompts.render("retry_note", problem=problem)
        raise MalformedOutput(
            role,
            f"no usable answer in {self.retry.format_attempts} attempts; last problem: {problem}",
            self.redact(raw[:RAW_CHARS]),
        )

    def _release(self, held: str) -> None:
        if held:
            self.ledger.release(held)

    def _log_failure(
        self, base: CallRecord, outcome: str, error: str, status: int | None, started: float
    ) -> None:
        self.log.append(
            base.model_copy(
                update={
                    "outcome": outcome,
                    "error": self.redact(error),
                    "status": status,
                    "elapsed_s": time.monotonic() - started,
                }
            )
        )


def _strip_fences(text: str) -> str:
    text = text.strip()
    if text.startswith("```"):
        text = text.split("\n", 1)[1] if "\n" in text else ""
        text = text.rsplit("```", 1)[0]
    return text.strip()


def _parse(reply: LLMReply, schema: type[M], check: Callable[[M], None]) -> tuple[M | None, str]:
    finish = reply.finish_reason or "unknown"
    if not reply.text.strip():
        return None, f"the answer was empty (finish reason {finish})"
    try:
        value = schema.model_validate_json(_strip_fences(reply.text))
    except ValidationError as exc:
        if truncated(reply.finish_reason):
            return None, (
                "the answer was cut off at the output token cap; answer more briefly "
                f"({exc.error_count()} validation errors)"
            )
        details = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'answer'}: {e['msg']}"
            for e in exc.errors()[:5]
        )
        return None, f"the answer does not match the schema: {details}"
    try:
        check(value)
    except ValueError as exc:
        return None, str(exc)
    return value, ""
