"""Versioned, machine-readable results of a run (``--ks-json``), shared with the population."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

RESULTS_SCHEMA_VERSION = 1


class TimingStats(BaseModel):
    """Statistics of the timed calls of one candidate on one benchmark case, in microseconds."""

    mean_us: float
    median_us: float
    min_us: float
    max_us: float
    std_us: float
    stderr_us: float
    runs: int
    verified_runs: int = 0
    clock: str = ""


class CaseResult(BaseModel):
    """The verdict of one candidate on one case (a correctness test or a benchmark)."""

    kind: Literal["check", "bench"]
    case: dict[str, int]
    case_id: str
    outcome: Literal["passed", "failed", "skipped"]
    reason: str = ""
    detail: str = ""
    stats: TimingStats | None = None
    floor_us: float | None = None


class CandidateResult(BaseModel):
    """Everything one run learned about one candidate file."""

    name: str
    path: str
    sha256: str
    cases: list[CaseResult] = Field(default_factory=list)
    geomean_us: float | None = None
    speedup_over_reference: float | None = None

    @property
    def passed(self) -> int:
        return sum(c.outcome == "passed" for c in self.cases)

    @property
    def failed(self) -> int:
        return sum(c.outcome == "failed" for c in self.cases)


class MachineInfo(BaseModel):
    """Where the run happened."""

    hostname: str
    platform: str
    python: str
    torch: str
    device: str
    device_name: str


class RunResults(BaseModel):
    """Top-level record written by ``--ks-json``."""

    schema_version: int = RESULTS_SCHEMA_VERSION
    task: str
    task_path: str
    profile: str
    salt: int
    started_at: str
    machine: MachineInfo
    candidates: list[CandidateResult] = Field(default_factory=list)
