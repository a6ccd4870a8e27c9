"""The population of one task on disk: candidates, their results, the event log, derived notes.

Layout of ``<root>/<task>/``::

    c0001/c0001.py      the candidate (file stem = id, so the harness names it by id)
    c0001/meta.json     CandidateMeta: lineage, role outputs, content hash
    c0001/results.json  EvaluationRecord: verdict and per-benchmark medians (absent = pending)
    events.jsonl        append-only log of Event records
    findings.md, lineage.md, progress.png   derived, rewritten whole

Every write happens under one ``filelock`` and is atomic (temp file, then ``os.replace``; a new
candidate folder is built under a temp name and renamed), so concurrent runs and ``kill -9`` leave
either the old or the new record. Unreadable records are reported with a warning and skipped.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import shutil
import socket
import uuid
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

import filelock
from pydantic import BaseModel, Field, ValidationError

from pytest_kscientist.errors import KsError
from pytest_kscientist.evolve.roles import CandidateSummary, ExperimentPlan, Selection
from pytest_kscientist.formats.source_ast import parse
from pytest_kscientist.harness.files import atomic_write
from pytest_kscientist.harness.results import CandidateResult, MachineInfo
from pytest_kscientist.kswarnings import KsWarning

SCHEMA_VERSION = 1
EVENTS = "events.jsonl"
LOCK_TIMEOUT_S = 120.0
HOST = socket.gethostname()
_ID = re.compile(r"^c(\d{4,})$")


class PopulationWarning(KsWarning):
    """A stored record could not be read and was skipped."""


class PopulationError(KsError):
    """The population folder cannot be used (lock timeout, not a directory...)."""


class CandidateMeta(BaseModel):
    """Who a candidate is: lineage, the role outputs that produced it, its content hash."""

    schema_version: int = SCHEMA_VERSION
    id: str
    task: str
    generation: int = Field(ge=0)
    parents: list[str] = Field(default_factory=list)
    sha256: str
    origin: Literal["seed", "writer"]
    seed_file: str = ""
    created_at: str
    run_id: str = ""
    selection: Selection | None = None
    plan: ExperimentPlan | None = None
    plan_index: int | None = None
    repair_of: str = ""  # the failed candidate this one repairs (its plan and parents)
    explanation: str = ""
    roles: dict[str, str] = Field(default_factory=dict)


class EvaluationRecord(BaseModel):
    """What one child pytest session found about one candidate."""

    schema_version: int = SCHEMA_VERSION
    id: str
    evaluated_at: str
    run_id: str = ""
    profile: str = ""
    salt: int = 0
    # "skipped": every item skipped (a kernel for another device, e.g. a HIP seed off ROCm).
    status: Literal["passed", "failed", "skipped"]
    geomean_us: float | None = None
    bench_median_us: dict[str, float] = Field(default_factory=dict)
    speedups: dict[str, float] = Field(default_factory=dict)  # interleaved, over each baseline
    # Per key of ``speedups``: its conservative 95% interval [low, high]. Parents timed beside
    # the candidate (--ks-beside) appear here under their ids.
    speedup_intervals: dict[str, list[float]] = Field(default_factory=dict)
    failure: str = ""
    machine: MachineInfo | None = None
    result: CandidateResult | None = None

    def timed_as(self) -> dict[str, str]:
        """Benchmark -> the kernel whose rounds its median is, where the candidate was not timed
        itself (--ks-same-as: it runs that kernel's code there)."""
        return self.result.timed_as() if self.result is not None else {}


class Event(BaseModel):
    """One line of ``events.jsonl``."""

    schema_version: int = SCHEMA_VERSION
    at: str
    run_id: str = ""
    pid: int = 0
    host: str = ""
    kind: str
    generation: int | None = None
    data: dict[str, Any] = Field(default_factory=dict)


@dataclass(frozen=True)
class Member:
    """A readable candidate: its meta, its source and, once evaluated, its record."""

    meta: CandidateMeta
    source: str
    evaluation: EvaluationRecord | None

    @property
    def id(self) -> str:
        return self.meta.id

    @property
    def status(self) -> str:
        return "pending" if self.evaluation is None else self.evaluation.status

    @property
    def geomean_us(self) -> float | None:
        ev = self.evaluation
        return ev.geomean_us if ev is not None and ev.status == "passed" else None

    def summary(self) -> CandidateSummary:
        """The candidate as the roles see it."""
        ev = self.evaluation
        return CandidateSummary(
            id=self.id,
            generation=self.meta.generation,
            parents=list(self.meta.parents),
            source=self.source,
            status=self.status,
            geomean_us=self.geomean_us,
            bench_median_us=dict(ev.bench_median_us) if ev else {},
            timed_as=ev.timed_as() if ev else {},
            failure=ev.failure if ev else "",
            failure_detail=failure_detail(ev),
            plan_title=self.meta.plan.title if self.meta.plan else "",
            explanation=self.meta.explanation,
        )


def failure_detail(ev: EvaluationRecord | None) -> str:
    """The trimmed detail (traceback, mismatch) of the first failed case that has one."""
    from pytest_kscientist.evolve.failure_text import trim

    if ev is None or ev.status != "failed" or ev.result is None:
        return ""
    return next((trim(c.detail) for c in ev.result.cases if c.outcome == "failed" and c.detail),
                "")


@dataclass(frozen=True)
class Added:
    """Outcome of adding a source: its id, and whether identical code was already there."""

    id: str
    duplicate: bool


def now() -> str:
    """The current UTC time as an ISO-8601 string."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def source_sha(source: str) -> str:
    """sha256 of the normalised source: formatting and comments do not make code new."""
    try:
        text = ast.unparse(parse(source))
    except (SyntaxError, ValueError):
        lines = source.replace("\r\n", "\n").replace("\r", "\n").split("\n")
        text = "\n".join(line.rstrip() for line in lines).strip()
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class Population:
    """One task's population folder; safe to share between processes."""

    def __init__(self, root: Path, task: str, run_id: str = "") -> None:
        if root.exists() and not root.is_dir():
            raise PopulationError(
                f"population folder {root} is a file; point --ks-population at a directory"
            )
        try:
            root.mkdir(parents=True, exist_ok=True)
            probe = root / f".write-probe-{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise PopulationError(
                f"population folder {root}: cannot write there ({exc.strerror or exc}); point "
                "--ks-population at a writable folder") from None
        self.root = root
        self.task = task
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self._lock = filelock.FileLock(str(root / ".lock"), timeout=LOCK_TIMEOUT_S)
        self._skipped: dict[str, str] = {}
        self._same_task()

    def _same_task(self) -> None:
        """Refuse a folder whose candidates are another task's: their kernels were taken as
        this task's seeds and parents, every child failed, and the best "kernel" of the task
        was another task's file."""
        for cid in self.ids():
            try:
                raw = json.loads((self.root / cid / "meta.json").read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue  # unreadable: warned about where it is read
            found = raw.get("task") if isinstance(raw, dict) else None
            if isinstance(found, str) and found != self.task:
                raise PopulationError(
                    f"population folder {self.root} holds candidates of task '{found}' ({cid}), "
                    f"not of '{self.task}'; point --ks-population at another folder (each "
                    "task's population is its own subfolder, named after the task)")
            return

    @property
    def skipped(self) -> list[str]:
        """Messages about the unreadable records met so far (each warned about once)."""
        return list(self._skipped.values())

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the population's inter-process lock."""
        try:
            with self._lock:
                yield
        except filelock.Timeout:
            raise PopulationError(
                f"population {self.root}: lock held by another process for over "
                f"{LOCK_TIMEOUT_S:.0f} s; if no run is active, delete {self.root / '.lock'}"
            ) from None

    # -- reading ------------------------------------------------------------------------------
    def _skip(self, path: Path, why: str) -> None:
        message = f"population record {path} skipped: {why}; delete or repair it"
        if self._skipped.get(str(path)) != message:
            self._skipped[str(path)] = message
            warnings.warn(PopulationWarning(message), stacklevel=3)

    def _read_model(self, path: Path, model: type[BaseModel]) -> Any:
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            version = raw.get("schema_version", SCHEMA_VERSION) if isinstance(raw, dict) else 0
            if isinstance(version, int) and version > SCHEMA_VERSION:
                self._skip(path, f"schema version {version} is newer than {SCHEMA_VERSION}")
                return None
            return model.model_validate(raw)
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError, ValueError, ValidationError) as exc:
            self._skip(path, f"{type(exc).__name__}: {str(exc).splitlines()[0]}")
            return None

    def ids(self) -> list[str]:
        """Ids of the candidate folders, in creation order."""
        found = [(int(m.group(1)), p.name) for p in self.root.iterdir() if (m := _ID.match(p.name))]
        return [name for _, name in sorted(found)]

    def _meta(self, cid: str) -> CandidateMeta | None:
        path = self.root / cid / "meta.json"
        meta = self._read_model(path, CandidateMeta)
        if meta is None and not path.exists():
            self._skip(path, "missing")
        return meta

    def members(self) -> list[Member]:
        """Every readable candidate, in creation order; unreadable ones warn and are skipped."""
        out = []
        for cid in self.ids():
            folder = self.root / cid
            meta = self._meta(cid)
            if meta is None:
                continue
            try:
                source = (folder / f"{cid}.py").read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                self._skip(folder / f"{cid}.py", f"{type(exc).__name__}: {exc}")
                continue
            evaluation = self._read_model(folder / "results.json", EvaluationRecord)
            out.append(Member(meta, source, evaluation))
        return out

    def source_path(self, cid: str) -> Path:
        """Where candidate ``cid``'s kernel file lives."""
        return self.root / cid / f"{cid}.py"

    def events(self) -> list[Event]:
        """The event log; a torn or unreadable line warns and is skipped."""
        path = self.root / EVENTS
        try:
            with self.locked():  # an append in progress is not a torn line
                lines = path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return []
        out = []
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                out.append(Event.model_validate_json(line))
            except ValidationError as exc:
                self._skip(path, f"line {n}: {str(exc).splitlines()[0]}")
        return out

    def read_text(self, name: str) -> str:
        """A derived document (``findings.md``...), or '' when it does not exist yet."""
        try:
            return (self.root / name).read_text(encoding="utf-8")
        except FileNotFoundError:
            return ""

    # -- writing ------------------------------------------------------------------------------
    def add(
        self,
        source: str,
        *,
        generation: int,
        origin: Literal["seed", "writer"],
        parents: list[str] | None = None,
        **fields: Any,
    ) -> Added:
        """Store a new candidate under a fresh id, unless identical code is already stored."""
        sha = source_sha(source)
        with self.locked():
            self._sweep_temp()
            ids = self.ids()
            for known in ids:
                old = self._meta(known)
                if old is not None and old.sha256 == sha:
                    return Added(known, duplicate=True)
            number = int(_ID.match(ids[-1]).group(1)) + 1 if ids else 1  # type: ignore[union-attr]
            cid = f"c{number:04d}"
            record = CandidateMeta(
                id=cid,
                task=self.task,
                generation=generation,
                parents=parents or [],
                sha256=sha,
                origin=origin,
                created_at=now(),
                run_id=self.run_id,
                **fields,
            )
            tmp = self.root / f".new-{cid}-{uuid.uuid4().hex[:8]}"
            tmp.mkdir()
            (tmp / f"{cid}.py").write_text(source, encoding="utf-8")
            (tmp / "meta.json").write_text(record.model_dump_json(indent=2), encoding="utf-8")
            os.replace(tmp, self.root / cid)
        return Added(cid, duplicate=False)

    def _sweep_temp(self) -> None:
        # Only called under the lock: a temp folder seen here belongs to a killed writer.
        for p in self.root.glob(".new-*"):
            shutil.rmtree(p, ignore_errors=True)

    def record(self, evaluation: EvaluationRecord) -> None:
        """Store (or replace) a candidate's evaluation."""
        folder = self.root / evaluation.id
        with self.locked():
            if not folder.is_dir():
                raise PopulationError(f"candidate {evaluation.id} is not in {self.root}")
            atomic_write(folder / "results.json", evaluation.model_dump_json(indent=2))
        # A record that was unreadable and is now written again is repaired: not a warning.
        self._skipped.pop(str(folder / "results.json"), None)

    def log(self, kind: str, generation: int | None = None, **data: Any) -> Event:
        """Append one event to ``events.jsonl``."""
        event = Event(
            at=now(),
            run_id=self.run_id,
            pid=os.getpid(),
            host=HOST,
            kind=kind,
            generation=generation,
            data=data,
        )
        line = (event.model_dump_json() + "\n").encode("utf-8")
        path = self.root / EVENTS
        with self.locked():
            with open(path, "ab+") as f:
                f.seek(0, os.SEEK_END)
                if f.tell():
                    f.seek(-1, os.SEEK_END)
                    if f.read(1) != b"\n":  # a writer was killed mid-line: end that line first
                        f.write(b"\n")
                f.write(line)
        return event

    def live_runs(self) -> dict[str, int]:
        """Other runs of this population that started, have not ended, and whose process is
        alive on this host, by run id, with their pid. Runs on other hosts are not counted:
        their liveness cannot be checked from here, and waiting on a killed one would never end.
        """
        started: dict[str, Event] = {}
        ended: set[str] = set()
        for event in self.events():
            if event.kind == "run_start":
                started[event.run_id] = event
            elif event.kind == "run_end":
                ended.add(event.run_id)
        return {
            rid: start.pid
            for rid, start in started.items()
            if rid != self.run_id and rid not in ended and _alive(start)
        }

    def write_text(self, name: str, text: str) -> Path:
        """Atomically replace a derived document."""
        path = self.root / name
        with self.locked():
            atomic_write(path, text)
        return path


def _alive(start: Event) -> bool:
    """Whether the process that logged ``start`` still runs on this host."""
    if start.host != HOST or start.pid <= 0 or start.pid == os.getpid():
        return False  # another host, an old record without a host, or our pid reused
    try:
        os.kill(start.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def status_counts(members: list[Member]) -> str:
    """'9 passed, 1 failed, 0 pending' (and 'N not run here' when some were skipped)."""
    counts = {s: sum(m.status == s for m in members)
              for s in ("passed", "failed", "pending", "skipped")}
    text = f"{counts['passed']} passed, {counts['failed']} failed, {counts['pending']} pending"
    return text + (f", {counts['skipped']} not run here" if counts["skipped"] else "")
