"""A fake LLM service on 127.0.0.1 for tests: Gemini's ``generateContent`` and an
OpenAI-compatible ``/v1/chat/completions``, served to the real clients.

Replies come from a FIFO queue (``push``) and, when it is empty, from ``responder`` (for
instance ``ScientistResponder``, which plays all three roles for end-to-end runs). A reply can
be an HTTP error, a raw malformed body, a slow answer (to trip client timeouts) or a truncated
one. Every request is kept in ``requests``. The fixture ``ks_fake_llm`` yields a started server::

    from pytest_kscientist.evolve.llm.fake_server import ks_fake_llm  # noqa: F401
"""

from __future__ import annotations

import ast
import json
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from pytest_kscientist.evolve.llm.settings import LLMSettings, Prices, RetryPolicy
from pytest_kscientist.evolve.roles import CandidateSummary, TaskBrief

_GEMINI_PATH = re.compile(r"^/(v1|v1beta|v1alpha)/models/([^/:]+):generateContent$")
_OPENAI_PATH = re.compile(r"^(/v1)?/chat/completions$")
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


# --- A scripted scientist for end-to-end runs -------------------------------------------------

_ROW = re.compile(r"^\| `([^`]+)` \| \d+ \| (\w+) \|", re.MULTILINE)
_BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)
_TUNABLES = re.compile(r"^TUNABLES\s*=\s*(\{.*?\})\s*$", re.MULTILINE)


class ScientistResponder:
    """Plays selector, designer and writer from the prompts' headings, deterministically.

    The writer returns the base file with one entry of its ``TUNABLES`` changed to another
    value of ``TUNABLE_SPACE`` (each call the next untried change), or with a ``_VARIANT``
    constant appended when the file has no knobs.
    """

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}
        self._lock = threading.Lock()

    def __call__(self, request: FakeRequest) -> FakeReply:
        prompt = request.prompt
        for heading, role in (
            ("# Stage 1", "selector"),
            ("# Stage 2", "designer"),
            ("# Stage 3", "writer"),
            ("# Repair", "repair"),
        ):
            if heading in prompt:
                with self._lock:
                    self.calls[role] = n = self.calls.get(role, 0) + 1
                return FakeReply(text=getattr(self, f"_{role}")(prompt, n))
        return FakeReply.error(400, "fake scientist: unknown prompt")

    def _selector(self, prompt: str, n: int) -> str:
        rows = _ROW.findall(prompt)
        passed = [i for i, status in rows if status == "passed"] or [i for i, _ in rows]
        others = [i for i, _ in rows if i != passed[0]]
        return json.dumps(
            {
                "base_id": passed[0],
                "reference_id": others[0] if others else None,
                "reason": f"fastest passing candidate (fake selection {n})",
            }
        )

    def _designer(self, prompt: str, n: int) -> str:
        plans = [
            {
                "title": f"knob experiment {n}.{i}",
                "changes": f"change one tunable ({i})",
                "expected_gain_min_pct": float(i - 2),
                "expected_gain_max_pct": float(2 * i),
                "innovation": float((3 * i) % 10),
            }
            for i in range(5)
        ]
        return json.dumps(
            {
                "avenues": [f"avenue {i}" for i in range(10)],
                "plans": plans,
                "findings_update": f"- fake finding from design {n}",
            }
        )

    def _writer(self, prompt: str, n: int) -> str:
        marker = "## The base kernel to modify"
        source = _BLOCK.findall(prompt[prompt.index(marker) :])[0]
        return f"## Explanation\nFake change {n}.\n\n```python\n{mutate(source, n)}```\n"

    def _repair(self, prompt: str, n: int) -> str:
        marker = "## The base kernel you started from"
        source = _BLOCK.findall(prompt[prompt.index(marker) :])[0]
        return f"## Explanation\nFake repair {n}.\n\n```python\n{mutate(source, 1000 + n)}```\n"


def mutate(source: str, n: int) -> str:
    """``source`` with its n-th possible single-knob change (or a ``_VARIANT = n`` line)."""
    knobs, space = _literal(source, "TUNABLES"), _literal(source, "TUNABLE_SPACE")
    changes = [
        (k, v)
        for k, values in (space or {}).items()
        for v in values
        if knobs and k in knobs and knobs[k] != v
    ]
    if not changes or not knobs:
        return source.rstrip("\n") + f"\n_VARIANT = {n}\n"
    knob, value = changes[(n - 1) % len(changes)]
    new = dict(knobs, **{knob: value})
    if n > len(changes):  # every single change used once: keep the files distinct anyway
        return (
            _TUNABLES.sub(f"TUNABLES = {new!r}", source, count=1).rstrip("\n")
            + f"\n_VARIANT = {n}\n"
        )
    return _TUNABLES.sub(f"TUNABLES = {new!r}", source, count=1)


def _literal(source: str, name: str) -> dict[str, Any] | None:
    match = re.search(rf"^{name}\s*=\s*(\{{.*?\}})\s*$", source, re.MULTILINE)
    if match is None:
        return None
    try:
        value = ast.literal_eval(match.group(1))
    except (ValueError, SyntaxError):
        return None
    return value if isinstance(value, dict) else None


# --- Builders for tests ------------------------------------------------------------------------

FAKE_KEY = "AIzaFAKE-test-key-0123456789"  # looks like a key, so a leak is easy to grep
FAST_RETRY = RetryPolicy(attempts=3, initial_delay_s=0.01, max_delay_s=0.05, timeout_s=2.0)


def fake_settings(server: FakeLLMServer, provider: str = "gemini", **changes: Any) -> LLMSettings:
    """Settings that point ``provider`` at ``server`` with millisecond retries."""
    values: dict[str, Any] = {
        "provider": provider,
        "model": "fake-model",
        "prices": Prices(1.0, 10.0),
        "retry": FAST_RETRY,
        "api_key": FAKE_KEY,
        "secrets": (FAKE_KEY,),
        "base_url": server.url if provider == "gemini" else server.openai_url,
    }
    values.update(changes)
    return LLMSettings(**values)


SEED_SOURCE = '''"""Seed: dequantise, then one matmul."""

import torch

TUNABLES = {"k_group": 1, "m_chunk": 0}
TUNABLE_SPACE = {"k_group": [0, 1, 2, 4], "m_chunk": [0, 64, 128]}


def custom_kernel(data):
    a, b, a_scale, b_scale, c = data
    return torch.zeros_like(c)  # stand-in body for prompt tests
'''


def sample_task() -> TaskBrief:
    """A small task brief for role tests."""
    return TaskBrief(
        name="fp8_gemm",
        description="C = (A * a_scale) @ (B * b_scale)^T with fp8 inputs, bf16 output.",
        reference_source="def ref_kernel(data):\n    return data[-1]\n",
        hardware="NVIDIA H200 (sm_90, 132 SMs), fp8 dtype float8_e4m3fn, wgmma, TMA",
        benchmark_ids=["m1024-n1536-k7168-s8135", "m6144-n7168-k2048-s76547"],
    )


def sample_population() -> list[CandidateSummary]:
    """A seed, a faster child and a child that failed to compile."""
    child = SEED_SOURCE.replace('"k_group": 1', '"k_group": 4')
    broken = SEED_SOURCE.replace("return torch", "return torch.(")
    return [
        CandidateSummary(
            id="seed-torch",
            generation=0,
            source=SEED_SOURCE,
            status="passed",
            geomean_us=150.0,
            bench_median_us={"m1024-n1536-k7168-s8135": 120.0, "m6144-n7168-k2048-s76547": 187.5},
        ),
        CandidateSummary(
            id="g1-kgroup4",
            generation=1,
            parents=["seed-torch"],
            source=child,
            status="passed",
            geomean_us=120.0,
            plan_title="group 4 K blocks",
            bench_median_us={"m1024-n1536-k7168-s8135": 100.0, "m6144-n7168-k2048-s76547": 144.0},
        ),
        CandidateSummary(
            id="g1-broken",
            generation=1,
            parents=["seed-torch"],
            source=broken,
            status="failed",
            plan_title="fused triton kernel",
            failure="SyntaxError: invalid syntax (candidate.py, line 11)",
        ),
    ]
