"""Versioned, machine-readable results of a run (``--ks-json``), shared with the population."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, Field, computed_field

from pytest_kscientist.harness.attribution import Attribution

# 2: outcome "xfailed" (a baseline with verify = "report" missing the tolerance), the
# baseline_verified / verified / mismatch / verify fields.
# 3: ci_low_us / ci_high_us / counted_outside_us on stats, speedup_low / speedup_high,
# speedup_intervals.
# 4: compiles (the compile[<arch>] items of HIP candidates, with each kernel's resources).
# 5: task_validation (the task::validate item: holes a trivial kernel passes through).
# 6: attribution on a check (--ks-attribution: the kernels a profiled call's time went to).
# 7: source on a candidate (its file's text, so --ks-compare can time the saved kernel beside),
# load_s (its import's seconds: a load_inline build is most of it).
# 8: compiles of CUDA candidates (compile[sm_XY]: KernelResources' registers, shared_bytes,
# stack_bytes, spill_store_bytes, spill_load_bytes), CompileResult.cached (kept from an earlier
# compile), item_seconds on the run.
# 9: round_speedups on a baseline's or fellow's timing (each shared round's ratio, in round
# order: whether the rounds agreed); ``speedup`` is their median, no longer their geomean.
# 10: inline_builds on a candidate (its load_inline calls the pytest process answered: built
# into the shared folder of their sources, reused from it, failed or declined).
# 11: timed_as on a benchmark (--ks-same-as: the candidate runs that kernel's code there and
# was not timed again; its stats and speedups are that kernel's from the same rounds).
# 12: interrupted on the run (Ctrl-C, a signal, -x or --maxfail stopped it: its items may be
#     missing).
# 13: bench_workers and fewer_workers_from on the run (the workers a kernel its rounds began
#     with, and the benchmark from which they went on in one after the device ran out of
#     memory).
# 14: machine_failures on the run (workers that did not start, before any candidate code ran:
#     the machine's failures, not verdicts on the kernels whose items they failed).
RESULTS_SCHEMA_VERSION = 14
# A candidate file up to this size is kept whole in the results (``CandidateResult.source``).
SOURCE_KEPT_BYTES = 1 << 20
# A candidate this many times faster than the reference needs a person's look before it is
# trusted (the harness's checks are layers, not proofs; README, "Threat model").
SUSPICIOUS_SPEEDUP = 10.0


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
    # Distribution-free 95% interval of the median (order statistics of the timed calls).
    ci_low_us: float | None = None
    ci_high_us: float | None = None
    # Device time per call that ran outside the caller's stream events (side streams, work
    # after the end event), measured against probes and added to every call (GPU only).
    counted_outside_us: float = 0.0
    # The timed calls themselves, for pooling interleaved rounds and for pytest-benchmark;
    # kept in memory only (never written: the summary fields above are the record).
    samples_us: list[float] = Field(default_factory=list, exclude=True, repr=False)


class BaselineTiming(BaseModel):
    """A baseline timed interleaved with a candidate on one benchmark case."""

    stats: TimingStats | None = None
    speedup: float | None = None  # median over rounds of baseline median / candidate median
    # 95% interval of ``speedup``: the geomean of each round's interval (the two medians'
    # intervals divided crosswise), widened to the rounds' spread, holding ``speedup``.
    speedup_low: float | None = None
    speedup_high: float | None = None
    rounds: int = 0
    # Each round's ratio (baseline median / candidate median), in round order; ``speedup`` is
    # their median (on the log scale; ``stats.rounds_centre``).
    round_speedups: list[float] = Field(default_factory=list)
    reason: str = ""  # why there is no speedup: the baseline failed, or was not run
    # False: the baseline's sampled outputs missed the tolerance in some round and it declares
    # verify = "report", so its times were kept as a yardstick; ``mismatch`` says by how much.
    verified: bool = True
    mismatch: str = ""


class CaseResult(BaseModel):
    """The verdict of one candidate on one case (a correctness test or a benchmark)."""

    kind: Literal["check", "bench"]
    # As its task's spec validated it: scalars; GPU MODE cases also lists of ints
    # (nvfp4_group_gemm), which the two specs' case types say (Any: dict is invariant).
    case: dict[str, Any]
    case_id: str
    # "xfailed": a baseline declaring verify = "report" ran (and was timed) but its output
    # missed the tolerance; ``reason`` says by how much. Candidates never get it.
    outcome: Literal["passed", "failed", "skipped", "xfailed"]
    reason: str = ""
    detail: str = ""
    stats: TimingStats | None = None
    floor_us: float | None = None
    floor_fraction: float | None = None  # floor_us / median_us: 1.0 is the physical limit
    baselines: dict[str, BaselineTiming] = Field(default_factory=dict)
    # The speedup over each other candidate (and the reference) of the session, from the
    # rounds both were timed in (harness/rounds.py): ``speedup`` is theirs over this median.
    fellows: dict[str, BaselineTiming] = Field(default_factory=dict)
    # A check's profiled call (--ks-attribution, or a task's [kernel] min_own_share): the
    # kernels the candidate's time went to (harness/attribution.py).
    attribution: Attribution | None = None
    # A remark on a passed check: a GPU MODE output whose dtype or shape differs from the
    # reference's, which the problem's own check accepted (as GPU MODE's eval would).
    note: str = ""
    # A benchmark not timed for this candidate (--ks-same-as): it runs the code of the kernel
    # named here at that kernel's knob point, so its stats, baselines and fellows are that
    # kernel's from the same rounds, and its speedup over that kernel is exactly 1.
    timed_as: str = ""


class GateResult(BaseModel):
    """The verdict of one performance gate on one candidate."""

    gate: str
    outcome: Literal["passed", "failed", "skipped"]
    message: str


class KernelResources(BaseModel):
    """What the compiler reports for one GPU kernel: clang's -Rpass-analysis=kernel-resource-usage
    for an AMD target (the first fields), ptxas -v for an NVIDIA one (the last)."""

    name: str
    vgprs: int = 0
    agprs: int = 0
    sgprs: int = 0
    lds_bytes: int = 0
    scratch_bytes_per_lane: int = 0
    occupancy_waves_per_simd: int = 0
    vgpr_spills: int = 0
    sgpr_spills: int = 0
    registers: int | None = None  # per thread
    shared_bytes: int | None = None  # static shared memory (dynamic is set at launch)
    stack_bytes: int | None = None
    spill_store_bytes: int | None = None
    spill_load_bytes: int | None = None


class InlineBuild(BaseModel):
    """One load_inline call of a candidate's import, answered by the pytest process
    (harness/shared_builds.py)."""

    module: str
    key: str = ""  # the first 16 hex digits of the build's hash ("" when declined)
    outcome: Literal["built", "reused", "failed", "declined"]
    seconds: float = 0.0  # the answer's wait: the build, or the look-up
    why: str = ""  # why it was declined (the candidate then built it in its own folder)


class CompileResult(BaseModel):
    """The verdict of one compile[<arch>] item: a HIP candidate compiled for one AMD target, or
    a CUDA candidate's load_inline source for one NVIDIA target where it cannot run."""

    arch: str
    outcome: Literal["passed", "failed", "skipped"]
    reason: str = ""  # the compiler's first errors, or why the item skipped
    detail: str = ""
    seconds: float | None = None
    compiler: str = ""  # the compiler's version line
    toolchain: str = ""  # the headers and bitcode it used (tools/install_hip_toolchain.sh)
    kernels: list[KernelResources] = Field(default_factory=list)
    ignored_flags: list[str] = Field(default_factory=list)
    sandboxed: bool = False  # the compiler ran in the workers' OS sandbox (worker.py)
    cached: bool = False  # the result of an earlier compile of the same inputs (compile_gate)


class CandidateResult(BaseModel):
    """Everything one run learned about one candidate file."""

    name: str
    path: str
    sha256: str
    cases: list[CaseResult] = Field(default_factory=list)
    role: Literal["candidate", "reference", "baseline"] = "candidate"
    geomean_us: float | None = None
    speedup_over_reference: float | None = None
    # Over this candidate's benchmarks: geomean of the interleaved per-case speedups over each
    # baseline, and geomean of floor_us / median_us.
    speedups: dict[str, float] = Field(default_factory=dict)
    # Per baseline of ``speedups``: [low, high], the geomeans of the per-case intervals.
    speedup_intervals: dict[str, list[float]] = Field(default_factory=dict)
    # Per baseline of ``speedups``: False when its outputs missed the tolerance beside this
    # candidate (verify = "report"): that speedup is over a yardstick, not a verified result.
    baseline_verified: dict[str, bool] = Field(default_factory=dict)
    # Over this candidate's benchmarks, the same for each other candidate (and the reference)
    # timed in the same rounds: the pairwise comparison, fair against the machine's drift.
    fellow_speedups: dict[str, float] = Field(default_factory=dict)
    fellow_intervals: dict[str, list[float]] = Field(default_factory=dict)
    floor_fraction: float | None = None
    gates: list[GateResult] = Field(default_factory=list)
    # Constructs cheating kernels rely on, found in the source (pytest_kscientist/harness/scan.py).
    suspicious: list[str] = Field(default_factory=list)
    compiles: list[CompileResult] = Field(default_factory=list)
    # Why its items were not run on this device (its KS_REQUIRES), "" when they were.
    not_run: str = ""
    # A candidate's file as it was run (up to SOURCE_KEPT_BYTES; None above it, for the
    # reference and baselines, and in files of schema 6 and older): a later run given this file
    # by --ks-compare times it beside the candidate (gates.change_beside).
    source: str | None = None
    # Seconds its first worker's import took (a load_inline build or a Triton compile at
    # import is most of it); None when it never loaded.
    load_s: float | None = None
    inline_builds: list[InlineBuild] = Field(default_factory=list)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def review(self) -> str:
        """Why a person should read this candidate before trusting its speed ("" if no reason)."""
        speedup = self.speedup_over_reference
        if self.role == "candidate" and speedup is not None and speedup > SUSPICIOUS_SPEEDUP:
            return (f"{speedup:.1f}x faster than the reference (over {SUSPICIOUS_SPEEDUP:g}x): "
                    "read the source before trusting the speed")
        return ""

    @property
    def passed(self) -> int:
        return sum(c.outcome == "passed" for c in self.cases)

    @property
    def failed(self) -> int:
        return sum(c.outcome == "failed" for c in self.cases)

    @property
    def xfailed(self) -> int:
        return sum(c.outcome == "xfailed" for c in self.cases)

    def timed_as(self) -> dict[str, str]:
        """Benchmark id -> the kernel whose rounds its result is, where this candidate was not
        timed itself (--ks-same-as: it runs that kernel's code there)."""
        return {c.case_id: c.timed_as for c in self.cases if c.kind == "bench" and c.timed_as}


class MachineInfo(BaseModel):
    """Where the run happened."""

    hostname: str
    platform: str
    python: str
    torch: str
    device: str
    device_name: str


class BaselineInfo(BaseModel):
    """A baseline the task declares, and whether this run timed it."""

    name: str
    path: str
    prepare: bool = False
    requires: list[str] = Field(default_factory=list)
    status: Literal["active", "skipped"] = "active"
    reason: str = ""
    verify: Literal["strict", "report"] = "strict"
    # After the run: True if every item and interleaved round of it passed the check, False if
    # one missed it (xfailed, with verify = "report") or failed, None if none ran.
    verified: bool | None = None


class TaskValidation(BaseModel):
    """The verdict of a task's ``task::validate`` item (harness/task_validation.py)."""

    # "warned": holes found, reported as a warning (--ks-lenient-task).
    outcome: Literal["passed", "failed", "warned", "skipped"]
    case_id: str
    holes: list[str] = Field(default_factory=list)  # one sentence per hole, naming it
    notes: list[str] = Field(default_factory=list)  # sub-checks not run, and why
    error: str = ""  # the task's reference failed: why
    cached: bool = False  # reused from pytest's cache (the task's files unchanged)


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
    baselines: list[BaselineInfo] = Field(default_factory=list)
    task_validation: TaskValidation | None = None
    # pytest's seconds in this task's items by kind (check, bench, compile, gate, validate),
    # setup, call and teardown together: where a session's time went (a check that waits for
    # its candidate's build counts the wait; the rest of a session is start-up and collection).
    item_seconds: dict[str, float] = Field(default_factory=dict)
    # The session was stopped (Ctrl-C, a signal) before its items ran: a result absent from
    # this file may never have run, so a gate reading it cannot take the absence as news.
    interrupted: bool = False
    # Worker processes each kernel's rounds began in (--ks-bench-workers), and the benchmark
    # from which they went on in one because the device ran out of memory ("" where none).
    bench_workers: int = 1
    fewer_workers_from: str = ""
    # Workers that did not start, before any candidate code ran (the device's context or
    # memory, the sandbox), in order: the items they failed say "not judged", and --evolve
    # does not record this session's kernels as failed on them.
    machine_failures: list[str] = Field(default_factory=list)


def report_property(value: dict[str, Any]) -> str:
    """A report's ``user_properties`` value as JSON: JUnit XML (``--junitxml``) writes each as
    ``str(value)``, which made a dict a Python repr that CI tools cannot read; read back with
    ``json.loads``."""
    return json.dumps(value, default=_plain)


def _plain(value: Any) -> Any:
    """A value json cannot write as it is: a model as its JSON form, anything else as text."""
    return value.model_dump(mode="json") if isinstance(value, BaseModel) else str(value)
