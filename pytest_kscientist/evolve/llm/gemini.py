"""The Gemini provider through Google's ``google-genai`` client (imported only when used).

Transport retries are the client's own ``HttpRetryOptions`` (exponential backoff on 408, 429
and 5xx, and on httpx timeouts and refused connections); its errors become ``ProviderError``.
"""

from __future__ import annotations

import json
from typing import Any

from pytest_kscientist.evolve.llm.ledger import Usage
from pytest_kscientist.evolve.llm.llm_errors import MalformedReply, ProviderError
from pytest_kscientist.evolve.llm.provider import LLMReply, LLMRequest
from pytest_kscientist.evolve.llm.settings import RetryPolicy
from pytest_kscientist.evolve.llm.transcript import Redactor

RETRY_STATUS = [408, 429, 500, 502, 503, 504]


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
    ) -> None:
        from google import genai
        from google.genai import types

        self.model = model
        self._types = types
        self._redact = redact
        self._retry = retry
        options = types.HttpOptions(
            base_url=base_url,
            timeout=int(retry.timeout_s * 1000),
            retry_options=types.HttpRetryOptions(
                attempts=retry.attempts,
                initial_delay=retry.initial_delay_s,
                max_delay=retry.max_delay_s,
                jitter=retry.initial_delay_s,  # the client's default adds up to 1 s per retry
                http_status_codes=RETRY_STATUS,
            ),
        )
        # vertexai=False: GOOGLE_GENAI_USE_VERTEXAI in the environment must not reroute calls.
        self._client = genai.Client(api_key=api_key, vertexai=False, http_options=options)

    def generate(self, request: LLMRequest) -> LLMReply:
        """One ``generate_content`` call (with the client's retries)."""
        from google.genai import errors

        config = self._types.GenerateContentConfig(
            system_instruction=request.system,
            max_output_tokens=request.max_output_tokens,
            temperature=request.temperature,
            response_mime_type="application/json" if request.schema else None,
            response_schema=request.schema,
        )
        try:
            response = self._client.models.generate_content(
                model=self.model, contents=request.prompt, config=config
            )
        except errors.APIError as exc:
            raise ProviderError(
                request.role, self._redact(f"Gemini answered HTTP {exc.code}: {exc}"), exc.code
            ) from None
        except (json.JSONDecodeError, errors.UnknownApiResponseError) as exc:
            raise MalformedReply(
                self._redact(f"Gemini sent a body that is not JSON: {exc}")
            ) from None
        except Exception as exc:  # noqa: BLE001 - isolation boundary: transport errors of httpx
            raise ProviderError(
                request.role,
                self._redact(
                    f"Gemini call failed after {self._retry.attempts} attempts "
                    f"({type(exc).__name__}: {exc or 'no detail'})"
                ),
            ) from None
        return _reply(response)


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
