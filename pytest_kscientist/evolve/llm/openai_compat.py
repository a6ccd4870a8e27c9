"""An OpenAI-compatible chat provider (vLLM, Ollama, llama.cpp, ...) over ``httpx``.

The HTTP client is httpx's API: the ``httpx2`` fork that google-genai 3.x installs, or ``httpx``
itself where an older google-genai brought that one. Structured output asks for
``response_format: json_schema``; the session validates the answer either way, because servers
differ in how strictly they honour it.
"""

from __future__ import annotations

import json
import random
import time
from typing import Any

from pytest_kscientist.evolve.llm.ledger import Usage
from pytest_kscientist.evolve.llm.llm_errors import MalformedReply, ProviderError
from pytest_kscientist.evolve.llm.provider import LLMReply, LLMRequest
from pytest_kscientist.evolve.llm.settings import RetryPolicy
from pytest_kscientist.evolve.llm.transcript import Redactor

RETRY_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})


def _httpx() -> Any:
    try:
        import httpx2 as httpx
    except ImportError:  # google-genai < 2 depends on httpx itself
        import httpx  # type: ignore[no-redef,import-not-found,unused-ignore]
    return httpx


class OpenAICompatProvider:
    """``POST {base_url}/chat/completions`` with backoff on 429/5xx, timeouts and resets."""

    name = "openai"

    def __init__(
        self,
        model: str,
        base_url: str,
        retry: RetryPolicy,
        redact: Redactor,
        api_key: str | None = None,
    ) -> None:
        self.model = model
        self._httpx = _httpx()
        self._retry = retry
        self._redact = redact
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = self._httpx.Client(
            base_url=base_url.rstrip("/") + "/", headers=headers, timeout=retry.timeout_s
        )

    def generate(self, request: LLMRequest) -> LLMReply:
        """One chat completion, retried on transient failures."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [
                {"role": "system", "content": request.system},
                {"role": "user", "content": request.prompt},
            ],
            "max_tokens": request.max_output_tokens,
        }
        if request.temperature is not None:
            body["temperature"] = request.temperature
        if request.schema is not None:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {
                    "name": request.schema.__name__,
                    "schema": request.schema.model_json_schema(),
                },
            }
        response = self._post(request.role, body)
        try:
            data = response.json()
            choice = data["choices"][0]
            text = choice["message"].get("content") or ""
            finish = choice.get("finish_reason") or ""
        except (json.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError) as exc:
            raise MalformedReply(
                self._redact(
                    f"the chat server sent an unexpected body ({exc!r}): {response.text[:300]!r}"
                )
            ) from None
        usage = data.get("usage") or {}
        return LLMReply(
            text=text,
            finish_reason=str(finish),
            usage=Usage(
                input_tokens=int(usage.get("prompt_tokens") or 0),
                output_tokens=int(usage.get("completion_tokens") or 0),
            ),
        )

    def _post(self, role: str, body: dict[str, Any]) -> Any:
        httpx = self._httpx
        last = ""
        for attempt in range(1, self._retry.attempts + 1):
            retry_after: float | None = None
            try:
                response = self._client.post("chat/completions", json=body)
            except (httpx.TimeoutException, httpx.TransportError) as exc:
                last = f"{type(exc).__name__}: {exc or 'no detail'}"
            else:
                if response.status_code < 400:
                    return response
                last = f"HTTP {response.status_code}: {response.text[:500]}"
                if response.status_code not in RETRY_STATUS:
                    raise ProviderError(
                        role,
                        self._redact(f"the chat server answered {last}"),
                        response.status_code,
                    )
                retry_after = _seconds(response.headers.get("retry-after"))
            if attempt < self._retry.attempts:
                time.sleep(self._delay(attempt, retry_after))
        raise ProviderError(
            role,
            self._redact(f"the chat server failed {self._retry.attempts} attempts; last: {last}"),
        )

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        backoff = self._retry.initial_delay_s * 2 ** (attempt - 1)
        backoff += random.uniform(0, self._retry.initial_delay_s)  # jitter spreads workers apart
        return min(self._retry.max_delay_s, retry_after if retry_after is not None else backoff)


def _seconds(header: str | None) -> float | None:
    try:
        return max(0.0, float(header)) if header else None
    except ValueError:  # an HTTP date: fall back to exponential backoff
        return None
