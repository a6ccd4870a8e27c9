"""The audit log of every LLM call (``llm-calls.jsonl``), with keys redacted, and its reader.

One JSON line per call, success or failure. ``--ks-replay`` reads the same file back: a call is
keyed by role, the sha256 of its request and its occurrence number, so identical prompts replay
their answers in order.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
import warnings
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ValidationError

from pytest_kscientist.evolve.llm.ledger import Usage

CALLS_SCHEMA_VERSION = 1
CALLS_FILE = "llm-calls.jsonl"
LEDGER_FILE = "llm-ledger.json"
REDACTED = "[REDACTED]"


class CallRecord(BaseModel):
    """One LLM call as logged: what was asked, what came back, what it cost."""

    schema_version: int = CALLS_SCHEMA_VERSION
    index: int  # position in this run's log
    role: str
    prompt_sha256: str
    occurrence: int  # how many earlier calls had the same role and prompt_sha256
    provider: str
    model: str
    schema_name: str = ""  # the structured-output model, "" for free text
    system: str
    prompt: str
    response_text: str | None = None
    finish_reason: str = ""
    usage: Usage = Usage()
    cost_usd: float = 0.0
    outcome: Literal["answer", "error", "malformed", "budget"] = "answer"
    error: str = ""  # why there is no answer (outcome other than "answer")
    status: int | None = None
    elapsed_s: float = 0.0
    replay_match: str = ""  # a replayed answer: "exact" prompt match or the "nearest" one
    time: float = 0.0  # Unix seconds at the end of the call


def request_sha256(role: str, system: str, prompt: str, schema_name: str) -> str:
    """The replay key of a request: everything that decides the answer but the model."""
    blob = json.dumps([role, system, prompt, schema_name], ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


# Values shorter than this are placeholders, not keys ("none", "EMPTY", "sk-" for local servers,
# issue 13): replacing them everywhere mangled code in prompts and the log's own field names.
MIN_SECRET_CHARS = 12


class Redactor:
    """Replaces every known secret (API keys) in text that leaves the process."""

    def __init__(self, secrets: tuple[str, ...] | list[str]) -> None:
        # Longest first, so a key that contains another is removed whole.
        self._secrets = sorted({s for s in secrets if len(s) >= MIN_SECRET_CHARS}, key=len,
                               reverse=True)

    def __call__(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, REDACTED)
        return text


class CallLog:
    """Appends ``CallRecord`` lines to ``path``; thread-safe, redacting as it writes."""

    def __init__(self, path: Path, redact: Redactor) -> None:
        self.path = path
        self.redact = redact
        self._lock = threading.Lock()
        self._index = 0

    def append(self, record: CallRecord) -> CallRecord:
        """Give ``record`` the next index, redact it, write it, return what was written."""
        with self._lock:
            text_fields = {name: self.redact(value) for name, value in record
                           if isinstance(value, str)}  # values only: field names stay intact
            record = record.model_copy(
                update={**text_fields, "index": self._index, "time": time.time()})
            self._index += 1
            line = record.model_dump_json()
            with self.path.open("a", encoding="utf-8") as fh:
                fh.write(line + "\n")
        return CallRecord.model_validate_json(line)


def read_calls(path: Path) -> list[CallRecord]:
    """Every well-formed record of a call log; a corrupt line is a warning and a skip."""
    records: list[CallRecord] = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append(CallRecord.model_validate_json(line))
        except ValidationError as exc:
            first = str(exc).splitlines()[0]
            warnings.warn(f"{path}:{number}: skipped a corrupt call record ({first})", stacklevel=2)
    return records
