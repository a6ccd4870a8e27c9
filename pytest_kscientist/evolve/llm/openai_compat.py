"""An OpenAI-compatible chat provider (vLLM, Ollama, llama.cpp, ...) over ``httpx2``.

httpx2 is the HTTP client google-genai 3.x is built on, declared by the project too (a
dependency of its own, rather than the ``openai`` package: one request shape is all this needs).
Structured output asks for ``response_format: json_schema``; the session validates the answer
either way, because servers differ in how strictly they honour it. Output caps, the timeout and
the context size come from the ``--ks-llm-*`` options (``RoleLimits``, ``RetryPolicy``).
"""

from __future__ import annotations

import json
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

RETRY_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})


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
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        import httpx2

        self.model = model
        self._httpx = httpx2
        self._sleep = sleep
        self._retry = retry
        self._redact = redact
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = self._httpx.Client(
            base_url=base_url.rstrip("/") + "/", headers=headers, timeout=retry.timeout_s
        )

    def check(self) -> str:
        """``GET {base_url}/models`` (free): the server answers and takes the key. A server
        without the route (404) is not refused for it; one that lists models without
        ``--ks-model`` gets a warning, not a stop (llama.cpp serves whatever it loaded under any
        name)."""
        httpx = self._httpx
        timeout = min(self._retry.timeout_s, CHECK_TIMEOUT_S)
        try:
            response = self._client.get("models", timeout=timeout)
        except (httpx.TimeoutException, httpx.TransportError) as exc:
            raise ProviderError("start", self._redact(
                f"the chat server at {self._client.base_url} could not be reached "
                f"({type(exc).__name__}: {exc or 'no detail'})")) from None
        if response.status_code == 404:
            return ""
        if response.status_code >= 400:
            raise ProviderError("start", self._redact(
                f"the chat server answered HTTP {response.status_code} to GET models: "
                f"{response.text[:300]}"), response.status_code)
        try:
            listed = [str(m["id"]) for m in response.json()["data"]]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            return self._redact(f"the chat server's model list is not the OpenAI shape ({exc!r})")
        if listed and self.model not in listed:
            shown = ", ".join(listed[:8]) + (", ..." if len(listed) > 8 else "")
            return (f"the chat server lists the models {shown}, not '{self.model}' "
                    "(--ks-model); a server that refuses unknown names will stop the run at "
                    "its first call")
        return ""

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
        last, status = "", None
        for attempt in range(1, self._retry.attempts + 1):
            retry_after: float | None = None
            try:
                response = self._client.post("chat/completions", json=body)
            except (httpx.TimeoutException, httpx.TransportError) as exc:
                last = f"{type(exc).__name__}: {exc or 'no detail'}"
            else:
                if response.status_code < 400:
                    return response
                last, status = f"HTTP {response.status_code}: {response.text[:500]}", (
                    response.status_code)
                if response.status_code not in RETRY_STATUS:
                    raise ProviderError(
                        role,
                        self._redact(f"the chat server answered {last}"),
                        response.status_code,
                    )
                retry_after = retry_after_s(response.headers.get("retry-after"))
            if attempt < self._retry.attempts:
                self._sleep(retry_delay_s(attempt, self._retry, retry_after))
        raise ProviderError(
            role,
            self._redact(f"the chat server failed {self._retry.attempts} attempts; last: {last}"),
            status,
        )
