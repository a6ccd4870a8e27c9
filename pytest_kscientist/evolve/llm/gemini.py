"""The Gemini provider through Google's ``google-genai`` client (imported only when used).

Retries are ours, not the client's (its ``HttpRetryOptions`` ignores the server's hint): on
408, 429 and 5xx, timeouts and refused connections, waiting what the error's ``RetryInfo`` or
``Retry-After`` header asks, else backing off exponentially. Errors become ``ProviderError``.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from typing import Any

from pytest_kscientist.evolve.llm.ledger import Usage
from pytest_kscientist.evolve.llm.llm_errors import MalformedReply, ProviderError
from pytest_kscientist.evolve.llm.provider import (
    CHECK_TIMEOUT_S,
    LLMReply,
    LLMRequest,
    retry_after_s,
    retry_delay_s,
)
from pytest_kscientist.evolve.llm.settings import RetryPolicy
from pytest_kscientist.evolve.llm.transcript import Redactor

RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
_SECONDS = re.compile(r"^\s*(\d+(?:\.\d+)?)s\s*$")


class GeminiProvider:
    """``generate_content`` on one model; JSON mode with a pydantic schema when asked."""

    name = "gemini"

    def __init__(
        self,
        model: str,
        api_key: str,
        retry: RetryPolicy,
        redact: Redactor,
        base_url: str | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        from google import genai
        from google.genai import types

        self.model = model
        self._types = types
        self._redact = redact
        self._retry = retry
        self._sleep = sleep
        options = types.HttpOptions(base_url=base_url, timeout=int(retry.timeout_s * 1000))
        # vertexai=False: GOOGLE_GENAI_USE_VERTEXAI in the environment must not reroute calls.
        self._client = genai.Client(api_key=api_key, vertexai=False, http_options=options)

    def check(self) -> str:
        """A lookup of the model (``models.get``: free, no tokens), so that a bad key or model
        name stops the run before it evaluates anything rather than after generation 0."""
        from google.genai import errors

        timeout_ms = int(min(self._retry.timeout_s, CHECK_TIMEOUT_S) * 1000)
        lookup = self._types.GetModelConfig(http_options=self._types.HttpOptions(
            timeout=timeout_ms))
        try:
            self._client.models.get(model=self.model, config=lookup)
        except errors.APIError as exc:
            raise ProviderError("start", self._redact(
                f"Gemini answered HTTP {exc.code} to a lookup of model '{self.model}': {exc}"),
                exc.code) from None
        except Exception as exc:  # noqa: BLE001 - isolation boundary: transport errors of httpx
            raise ProviderError("start", self._redact(
                f"Gemini could not be reached ({type(exc).__name__}: {exc or 'no detail'})")
            ) from None
        return ""

    def generate(self, request: LLMRequest) -> LLMReply:
        """One ``generate_content`` call, retried on transient failures."""
        from google.genai import errors

        config = self._types.GenerateContentConfig(
            system_instruction=request.system,
            max_output_tokens=request.max_output_tokens,
            temperature=request.temperature,
            response_mime_type="application/json" if request.schema else None,
            response_schema=request.schema,
        )
        attempts = self._retry.attempts
        for attempt in range(1, attempts + 1):
            try:
                response = self._client.models.generate_content(
                    model=self.model, contents=request.prompt, config=config
                )
            except errors.APIError as exc:
                if exc.code not in RETRY_STATUS or attempt == attempts:
                    tries = f" (attempt {attempt} of {attempts})" if attempt > 1 else ""
                    raise ProviderError(request.role, self._redact(
                        f"Gemini answered HTTP {exc.code}{tries}: {exc}"), exc.code) from None
                hint = _hint(exc)
            except (json.JSONDecodeError, errors.UnknownApiResponseError) as exc:
                raise MalformedReply(
                    self._redact(f"Gemini sent a body that is not JSON: {exc}")
                ) from None
            except Exception as exc:  # noqa: BLE001 - isolation boundary: transport errors of httpx
                if attempt == attempts:
                    raise ProviderError(request.role, self._redact(
                        f"Gemini call failed after {attempts} attempts "
                        f"({type(exc).__name__}: {exc or 'no detail'})")) from None
                hint = None
            else:
                return _reply(response)
            self._sleep(retry_delay_s(attempt, self._retry, hint))
        raise AssertionError("unreachable: the last attempt returns or raises")


def _hint(exc: Any) -> float | None:
    """Seconds the error asks to wait: its ``RetryInfo.retryDelay`` ("37s"), else the
    ``Retry-After`` header."""
    body = exc.details if isinstance(exc.details, dict) else {}
    error = body.get("error", body) if isinstance(body.get("error", body), dict) else {}
    for detail in error.get("details") or []:
        if isinstance(detail, dict) and str(detail.get("@type", "")).endswith("RetryInfo"):
            found = _SECONDS.match(str(detail.get("retryDelay", "")))
            if found:
                return float(found.group(1))
    headers = getattr(getattr(exc, "response", None), "headers", None)
    return retry_after_s(headers.get("retry-after")) if headers is not None else None


def _reply(response: Any) -> LLMReply:
    candidates = response.candidates or []
    finish = candidates[0].finish_reason if candidates else None
    finish_reason = getattr(finish, "name", str(finish or ""))
    if not candidates and response.prompt_feedback is not None:
        finish_reason = f"BLOCKED:{response.prompt_feedback.block_reason}"
    meta = response.usage_metadata
    usage = Usage(
        input_tokens=(meta.prompt_token_count or 0) if meta else 0,
        output_tokens=(meta.candidates_token_count or 0) if meta else 0,
        thoughts_tokens=(meta.thoughts_token_count or 0) if meta else 0,
    )
    return LLMReply(text=response.text or "", finish_reason=finish_reason, usage=usage)
