"""A scripted scientist for the fake LLM service, and builders for tests of the LLM roles.

``ScientistResponder`` answers the selector, designer, writer and repair prompts deterministically,
so a whole ``pytest --evolve`` run can go through the real clients without a model.
"""

from __future__ import annotations

import ast
import json
import re
import threading
from typing import Any

from fake_llm_server import FakeLLMServer, FakeReply, FakeRequest

from pytest_kscientist.evolve.llm.settings import LLMSettings, Prices, RetryPolicy
from pytest_kscientist.evolve.roles import CandidateSummary, TaskBrief

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
