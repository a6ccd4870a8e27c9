"""A fake LLM service on 127.0.0.1 for tests: Gemini's ``generateContent`` and an
OpenAI-compatible ``/v1/chat/completions``, served to the real clients.

Replies come from a FIFO queue (``push``) and, when it is empty, from ``responder`` (for
instance ``ScientistResponder``, which plays all three roles for end-to-end runs). A reply can
be an HTTP error, a raw malformed body, a slow answer (to trip client timeouts) or a truncated
one. Every request is kept in ``requests``. The fixture ``ks_fake_llm`` yields a started server;
a test module (or conftest) makes it available with::

    import fake_llm_server as fake_server
    ks_fake_llm = fake_server.ks_fake_llm
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

_GEMINI_PATH = re.compile(r"^/(v1|v1beta|v1alpha)/models/([^/:]+):generateContent$")
_OPENAI_PATH = re.compile(r"^(/v1)?/chat/completions$")
_GEMINI_MODEL = re.compile(r"^/(v1|v1beta|v1alpha)/models/([^/:]+)$")  # models.get
_OPENAI_MODELS = re.compile(r"^(/v1)?/models$")
_STATUS_NAMES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


@dataclass
class FakeReply:
    """One canned answer. ``text=None`` gives a candidate without parts (an empty answer)."""

    text: str | None = None
    status: int = 200
    body: str | None = None  # raw body sent as is (malformed JSON, say)
    delay_s: float = 0.0
    finish_reason: str = "STOP"  # Gemini spelling; sent as "stop"/"length" to OpenAI clients
    input_tokens: int = 1000
    output_tokens: int = 500
    thoughts_tokens: int = 0
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def error(cls, status: int, message: str = "injected failure") -> FakeReply:
        """An HTTP error with the service's error JSON."""
        return cls(text=message, status=status)

    @classmethod
    def malformed(cls) -> FakeReply:
        """A 200 whose body is not JSON."""
        return cls(body='{"candidates": [{"content": ')

    @classmethod
    def truncated(cls, text: str) -> FakeReply:
        """An answer cut off at the output token cap (half of ``text``)."""
        return cls(text=text[: len(text) // 2], finish_reason="MAX_TOKENS")

    @classmethod
    def slow(cls, delay_s: float, text: str = "{}") -> FakeReply:
        """An answer that starts only after ``delay_s`` seconds."""
        return cls(text=text, delay_s=delay_s)


@dataclass
class FakeRequest:
    """A request as the server saw it."""

    api: str  # "gemini" | "openai"
    path: str
    headers: dict[str, str]  # names in lower case
    body: dict[str, Any]
    model: str
    system: str
    prompt: str
    json_mode: bool


def _parse_request(
    api: str, path: str, headers: dict[str, str], body: dict[str, Any], model: str
) -> FakeRequest:
    if api == "gemini":

        def text(content: dict[str, Any] | None) -> str:
            return "".join(p.get("text", "") for p in (content or {}).get("parts", []))

        contents = body.get("contents") or [{}]
        config = body.get("generationConfig") or {}
        return FakeRequest(
            api,
            path,
            headers,
            body,
            model,
            text(body.get("systemInstruction")),
            text(contents[-1]),
            config.get("responseMimeType") == "application/json",
        )
    messages = body.get("messages") or []
    by_role = {m.get("role"): m.get("content", "") for m in messages}
    return FakeRequest(
        api,
        path,
        headers,
        body,
        str(body.get("model", "")),
        by_role.get("system", ""),
        by_role.get("user", ""),
        "response_format" in body,
    )


def _body(api: str, reply: FakeReply, model: str) -> bytes:
    if reply.body is not None:
        return reply.body.encode()
    if reply.status >= 400:
        if api == "gemini":
            status = _STATUS_NAMES.get(reply.status, "UNKNOWN")
            error: dict[str, Any] = {"code": reply.status, "message": reply.text, "status": status}
        else:
            error = {"message": reply.text, "type": "fake_error", "code": reply.status}
        return json.dumps({"error": error}).encode()
    if api == "gemini":
        parts = [] if reply.text is None else [{"text": reply.text}]
        usage = {
            "promptTokenCount": reply.input_tokens,
            "candidatesTokenCount": reply.output_tokens,
            "totalTokenCount": reply.input_tokens + reply.output_tokens + reply.thoughts_tokens,
        }
        if reply.thoughts_tokens:
            usage["thoughtsTokenCount"] = reply.thoughts_tokens
        return json.dumps(
            {
                "candidates": [
                    {
                        "content": {"role": "model", "parts": parts},
                        "finishReason": reply.finish_reason,
                        "index": 0,
                    }
                ],
                "usageMetadata": usage,
                "modelVersion": model,
            }
        ).encode()
    finish = "length" if reply.finish_reason == "MAX_TOKENS" else "stop"
    return json.dumps(
        {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "finish_reason": finish,
                    "message": {"role": "assistant", "content": reply.text},
                }
            ],
            "usage": {
                "prompt_tokens": reply.input_tokens,
                "completion_tokens": reply.output_tokens + reply.thoughts_tokens,
                "total_tokens": reply.input_tokens + reply.output_tokens + reply.thoughts_tokens,
            },
        }
    ).encode()


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        gemini, openai = (
            _GEMINI_PATH.match(self.path.split("?")[0]),
            _OPENAI_PATH.match(self.path.split("?")[0]),
        )
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        if not (gemini or openai):
            self._send(404, b'{"error": {"code": 404, "message": "no such route"}}', {})
            return
        api = "gemini" if gemini else "openai"
        body = json.loads(raw or b"{}")
        model = gemini.group(2) if gemini else str(body.get("model", ""))
        request = _parse_request(
            api, self.path, {k.lower(): v for k, v in self.headers.items()}, body, model
        )
        reply = self.server.owner._next(request)
        if reply.delay_s and self.server.owner._stopping.wait(reply.delay_s):
            return  # the server is closing
        self._send(reply.status, _body(api, reply, model), reply.headers)

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        """The free lookups a client makes before generating: Gemini's ``models.get`` and the
        OpenAI ``GET /models``; answered from ``FakeLLMServer.models`` and ``lookup_reply``."""
        owner = self.server.owner
        path = self.path.split("?")[0]
        gemini, openai = _GEMINI_MODEL.match(path), _OPENAI_MODELS.match(path)
        with owner._lock:
            owner.lookups.append(path)
        if not (gemini or openai):
            self._send(404, b'{"error": {"code": 404, "message": "no such route"}}', {})
            return
        api = "gemini" if gemini else "openai"
        reply = owner.lookup_reply
        if reply is None and gemini and owner.models is not None \
                and gemini.group(2) not in owner.models:
            reply = FakeReply.error(404, f"models/{gemini.group(2)} is not found")
        if reply is not None:
            self._send(reply.status, _body(api, reply, ""), reply.headers)
            return
        if gemini:
            name = gemini.group(2)
            data = {"name": f"models/{name}", "displayName": name, "inputTokenLimit": 1048576,
                    "outputTokenLimit": 65536, "supportedGenerationMethods": ["generateContent"]}
        else:
            data = {"object": "list", "data": [{"id": m, "object": "model"}
                                                for m in owner.models or ["fake-model"]]}
        self._send(200, json.dumps(data).encode(), {})

    def _send(self, status: int, data: bytes, headers: dict[str, str]) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            # The client gave up first (its timeout is the point of a slow reply).
            self.server.owner.dropped += 1

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - base signature
        """Keep test output clean: requests are recorded in ``FakeLLMServer.requests``."""


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    owner: FakeLLMServer


class FakeLLMServer:
    """A threaded HTTP server on 127.0.0.1:<free port>; use as a context manager."""

    def __init__(self, responder: Callable[[FakeRequest], FakeReply] | None = None) -> None:
        self.responder = responder
        self.requests: list[FakeRequest] = []
        # The start check's lookups (GET paths), apart from ``requests``; ``models``: the model
        # names the service has (None: any); ``lookup_reply``: an error to answer them with.
        self.lookups: list[str] = []
        self.models: list[str] | None = None
        self.lookup_reply: FakeReply | None = None
        self.dropped = 0
        self._queue: list[FakeReply] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.owner = self
        self._thread = threading.Thread(
            # serve_forever polls for shutdown every poll_interval: 0.5 s by default per test.
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.02},
            daemon=True,
        )

    @property
    def url(self) -> str:
        """Base URL for Gemini clients (``HttpOptions(base_url=...)``)."""
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    @property
    def openai_url(self) -> str:
        """Base URL for OpenAI-compatible clients."""
        return self.url + "/v1"

    def push(self, *replies: FakeReply | str) -> None:
        """Queue replies (a str is a plain 200 answer), served in order."""
        with self._lock:
            self._queue.extend(FakeReply(text=r) if isinstance(r, str) else r for r in replies)

    @property
    def pending(self) -> int:
        """Queued replies not served yet."""
        with self._lock:
            return len(self._queue)

    def _next(self, request: FakeRequest) -> FakeReply:
        with self._lock:
            self.requests.append(request)
            if self._queue:
                return self._queue.pop(0)
        if self.responder is not None:
            return self.responder(request)
        # 400 is not retried: an unexpected call fails the test at once.
        return FakeReply.error(400, "fake server: no reply queued for this request")

    def start(self) -> FakeLLMServer:
        self._thread.start()
        return self

    def close(self) -> None:
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def __enter__(self) -> FakeLLMServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


@pytest.fixture
def ks_fake_llm() -> Iterator[FakeLLMServer]:
    """A started ``FakeLLMServer`` with an empty queue and no responder."""
    with FakeLLMServer() as server:
        yield server
