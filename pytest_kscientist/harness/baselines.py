"""Baselines: trusted implementations a task declares, timed interleaved with each candidate.

A baseline runs in its own worker, never in a candidate's process, and is verified like a
candidate (its sampled outputs are judged against the reference). A case's benchmark
alternates rounds between the candidates' workers and each baseline's worker, in an order
that changes every round (C B1 B2, then B2 B1 C, then B1 B2 C, ...: ``rounds.round_order``),
and the speedup is the median over rounds (on the log scale) of the baseline's median over
the candidate's median in the same round: clock drift (boost, thermal) shifts both sides of each
ratio alike.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_kscientist.errors import CandidateFailure
from pytest_kscientist.formats.task import REQUIREMENT, BaselineSpec, Task
from pytest_kscientist.harness.mounts import build_folder
from pytest_kscientist.harness.results import BaselineTiming, CaseResult, InlineBuild
from pytest_kscientist.harness.runners import Spares
from pytest_kscientist.harness.spawn import MachineFailed, Worker, WorkerDied
from pytest_kscientist.harness.stats import (
    geomean,
    ratio_interval,
    rounds_centre,
    spread_interval,
    summarize,
)


def describe(need: str) -> str:
    """A requirement in words: ``sm_90`` -> an NVIDIA GPU of compute capability 9.0 or newer."""
    match = REQUIREMENT.match(need)
    if match and match.group(2):
        return f"an NVIDIA GPU of compute capability {match.group(2)}.{match.group(3)} or newer"
    return {"cuda": "a CUDA or ROCm GPU", "nvidia": "an NVIDIA GPU", "rocm": "a ROCm GPU"}[need]


def unmet_requirement(spec: BaselineSpec, device: str) -> str:
    """Why ``device`` cannot run the baseline ("" when it can)."""
    missing = first_unmet(spec.requires, device)
    if missing is None:
        return ""
    need, found = missing
    return (f"baseline '{spec.name}' requires {need} ({describe(need)}), this run's device is "
            f"{found}; run it on such a device, or leave it out with --ks-baselines")


def first_unmet(needs: list[str], device: str) -> tuple[str, str] | None:
    """The first of ``needs`` the device lacks and what the device is, or None."""
    for need in needs:
        found = _lacks(need, device)
        if found:
            return need, found
    return None


def _lacks(need: str, device: str) -> str:
    """What the device is, when it lacks ``need``; "" when it has it."""
    if not device.startswith("cuda"):
        return device
    import torch

    hip = torch.version.hip is not None
    name = torch.cuda.get_device_name(device)
    if need == "cuda" or (need == "rocm" and hip) or (need == "nvidia" and not hip):
        return ""
    if need in ("rocm", "nvidia"):
        return name
    match = REQUIREMENT.match(need)
    assert match is not None  # validated by BaselineSpec
    major, minor = torch.cuda.get_device_capability(device)
    wanted = (int(match.group(2)), int(match.group(3)))
    if hip or (major, minor) < wanted:
        return f"{name} (ROCm)" if hip else f"{name} (sm_{major}{minor})"
    return ""


def start_worker(task: Task, source: Path, entry: str, prepare: str | None, device: str,
                 timeout_s: float, init_seed: int = 0, spares: Spares | None = None,
                 builds: Callable[[], Any] | None = None, answered: list[Any] | None = None
                 ) -> Worker:
    """A fresh worker with ``source`` loaded; raises CandidateFailure if it does not load.
    ``init_seed``: the seed a KernelBench model's weights are built with (Evaluator's);
    ``spares``: runner processes started ahead of need (the session's); ``builds``: the
    session's shared load_inline builds (``shared_builds.SharedBuilds``, made on first use),
    which answer its load_inline calls where its sandbox allows; ``answered``: where those
    answers are noted (results.InlineBuild), whether or not it loads, while it holds none (a
    kernel's later workers, twins and restarts, answer the same calls again)."""
    try:
        worker = Worker(task.describe(), device, task.spec.output_index, timeout_s,
                        protect=task.spec_path, spares=spares, builds=build_folder(source))
        shared = builds() if builds is not None and worker.shares_builds else None
        noted = answered if answered is not None and not answered else None

        def build(request: dict[str, Any], deadline: float) -> dict[str, Any]:
            try:
                reply, record = shared.answer(request, deadline)
            except Exception as exc:  # noqa: BLE001 - the request is the worker's: untrusted
                # declined, so the worker builds it in its own folder as torch would
                reply = {"declined": True}
                record = InlineBuild(module="?", outcome="declined",
                                     why=f"the request could not be read ({type(exc).__name__}: "
                                         f"{str(exc)[:200]})")
            if noted is not None:
                noted.append(record)
            return reply

        worker.keep_caches_of(source)
        began = time.monotonic()
        header, _ = worker.request("load", timeout=timeout_s * 5, path=str(source), entry=entry,
                                   prepare=prepare, init_seed=init_seed,
                                   interim=build if shared is not None else None,
                                   shared=shared is not None)
        worker.load_s = time.monotonic() - began
    except MachineFailed:
        raise  # not the kernel's load: it never began
    except WorkerDied as exc:
        raise CandidateFailure(f"failed to load: {exc.reason}", exc.log_tail) from None
    if not header.get("ok"):
        worker.close()
        raise CandidateFailure(f"failed to load: {header.get('reason')}",
                               str(header.get("detail", "")))
    return worker


@dataclass
class Turns:
    """The workers a kernel's timing rounds go to in turn (--ks-bench-workers): round ``r``
    takes turn ``r % count``; turn 0 is the kernel's own worker (its owner keeps it), the
    others its twins, each started on first use and again after it died.

    Twins start in the background (``start_ahead``, starts.start_workers) while a failed check
    may close them all (``close``): a close under way saw the dict grow (on an H100, "dictionary
    changed size during iteration" as the item's verdict), and a twin whose start straddled a
    close was kept past it. So the dict is read and changed under a lock, and a twin begun
    before the last close is closed instead of kept."""

    count: int = 1
    twins: dict[int, Worker] = field(default_factory=dict)
    # turn -> how its worker hung on its first call, made before the rounds (starts.WarmUp):
    # raised by that turn's round (``hung_first``), not started again to hang once more.
    hung: dict[int, CandidateFailure] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    _closes: int = field(default=0, repr=False, compare=False)  # how many closes so far

    def hung_first(self, turn: int) -> None:
        """Raise, once, the hang of round ``turn``'s worker on its first call."""
        failure = self.hung.pop(turn % self.count, None)
        if failure is not None:
            raise failure

    def worker(self, turn: int, own: Worker, start: Callable[[], Worker]) -> Worker:
        which = turn % self.count
        if not which:
            return own
        with self._lock:
            twin, closes = self.twins.get(which), self._closes
        if twin is not None and twin.alive():
            return twin
        fresh = start()
        with self._lock:
            kept = self.twins.get(which)
            if closes == self._closes and (kept is None or kept is twin or not kept.alive()):
                self.twins[which] = fresh
                return fresh
        fresh.close()  # closed while it started, or another start of this turn came first
        if closes != self._closes:
            raise CandidateFailure(f"twin {which}'s start ended after its kernel's workers "
                                   "were closed: not kept")
        return kept  # type: ignore[return-value]  # alive, stored by the other start

    def start_ahead(self, turn: int, start: Callable[[], Worker]) -> None:
        """Start twin ``turn`` now (starts.start_workers, in the background); a failure is left
        for the round that needs the twin, which starts it again and fails as its kernel."""
        try:
            self.worker(turn, None, start)  # type: ignore[arg-type]  # turn >= 1: no own
        except Exception:  # noqa: BLE001 - nothing was kept: the round starts it, and says why
            pass

    def twin(self, turn: int) -> Worker | None:
        """Round ``turn``'s twin as started so far (None: not started)."""
        with self._lock:
            return self.twins.get(turn)

    def live(self, own: Worker | None) -> list[Worker]:
        """The kernel's workers now: ``own`` (turn 0's, kept by its owner) and its twins."""
        with self._lock:
            twins = list(self.twins.values())
        return [w for w in (own, *twins) if w is not None]

    def close(self) -> None:
        with self._lock:
            twins = list(self.twins.values())
            self.twins.clear()
            self._closes += 1
        for twin in twins:
            twin.close()


@dataclass
class Partner:
    """A baseline's worker, kept by the session and shared by every candidate's benchmarks."""

    task: Task
    spec: BaselineSpec
    device: str
    timeout_s: float
    worker: Worker | None = None
    broken: str = ""  # sticky: it failed to load or hung, so it is not tried again
    errors: dict[str, str] = field(default_factory=dict)  # case id -> why it failed there
    init_seed: int = 0  # KernelBench: the weight seed, the Evaluator's (Evaluator.init_seed)
    spares: Spares | None = None  # the session's runners started ahead of need
    # True for kernels timed beside as yardsticks of their own kind (--ks-beside, a saved
    # copy of --ks-compare): verified like a candidate, so the two sides of the comparison
    # do the same untimed work between calls; a trusted baseline verifies one output a round.
    full_sample: bool = False
    turns: Turns = field(default_factory=Turns)  # --ks-bench-workers
    # The session's shared load_inline builds and where its answers are noted (start_worker):
    # a parent re-timed beside its children (--ks-beside) loads the build it shared.
    builds: Callable[[], Any] | None = None
    answered: list[Any] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def tolerate(self) -> bool:
        """Whether a precision miss keeps its times as a yardstick (verify = "report")."""
        return self.spec.verify == "report"

    def live(self, turn: int = 0) -> Worker:
        """The worker of round ``turn`` (``turns``), started on first use."""
        self.turns.hung_first(turn)
        if self.worker is None or not self.worker.alive():
            self.worker = self._start()
        return self.turns.worker(turn, self.worker, self._start_twin)

    def _start(self) -> Worker:
        """Its own worker: a failure to load marks it ``broken`` for the session."""
        if self.broken:
            raise CandidateFailure(self.broken)
        try:
            return self._spawn(self.answered)
        except CandidateFailure as exc:
            self.broken = exc.reason
            raise

    def _start_twin(self) -> Worker:
        """A timing twin (Turns): a failure is its round's, never ``broken`` (a twin that ran
        out of device memory at load would have retired the baseline for the session)."""
        if self.broken:
            raise CandidateFailure(self.broken)
        return self._spawn(None)  # its load_inline answers are its own worker's to note

    def _spawn(self, answered: list[Any] | None) -> Worker:
        entry, prepare = ("run", "prepare") if self.spec.prepare else (self.task.entry, None)
        return start_worker(self.task, self.task.baseline_path(self.spec), entry, prepare,
                            self.device, self.timeout_s, self.init_seed, self.spares,
                            self.builds, answered)

    def timeable(self) -> bool:
        """Whether its rounds can be timed: not ``broken``."""
        return not self.broken

    def start_early(self) -> None:
        """Start the worker now (starts.start_workers); a failure is kept in ``broken``, an
        unexpected error too (raised in the background, it was another item's verdict)."""
        try:
            self.live()
        except CandidateFailure:
            pass
        except Exception as exc:  # noqa: BLE001 - the baseline's, said where it is skipped
            self.broken = f"failed to start its worker: {type(exc).__name__}: {exc}"

    def failed(self, case_id: str, exc: CandidateFailure) -> None:
        self.errors[case_id] = exc.reason
        if isinstance(exc, WorkerDied) and exc.hung:
            self.broken = f"hung on {case_id} and was killed"
        self.close()

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()
            self.worker = None
        self.turns.close()


def pool(rounds: list[CaseResult]) -> CaseResult:
    """One result whose stats cover every timed call of the rounds. The median's interval is
    the pooled calls' distribution-free one, widened to the spread of the rounds' own medians
    (``spread_interval``) where that is wider: the pooled calls alone take every call as
    independent, so a machine that ran a kernel slower for a round or two (seen on the 2-core
    CPU) gave two copies of one kernel disjoint intervals."""
    first = rounds[0]
    assert first.stats is not None
    timed = [r.stats for r in rounds if r.stats]
    samples = [t for s in timed for t in s.samples_us]
    verified = sum(s.verified_runs for s in timed)
    counted = max((s.counted_outside_us for s in timed), default=0.0)
    stats = summarize(samples, verified_runs=verified, clock=first.stats.clock,
                      counted_us=counted)
    spread = spread_interval([s.median_us for s in timed])
    if spread is not None and stats.ci_low_us is not None and stats.ci_high_us is not None:
        stats = stats.model_copy(update={"ci_low_us": min(stats.ci_low_us, spread[0]),
                                         "ci_high_us": max(stats.ci_high_us, spread[1])})
    return first.model_copy(update={"stats": stats})


def paired(mine: list[CaseResult], theirs: list[CaseResult]) -> BaselineTiming:
    """The baseline's pooled stats and its speedup: the rounds' median ratio
    (``rounds_centre``), with an interval: the geometric means of each round's ratio interval
    (``ratio_interval``), widened to the rounds' own spread where that is wider
    (``spread_interval``: with the rounds in several workers, a worker's lasting bias shows
    there), and always holding the speedup."""
    pairs = [
        (b.stats, c.stats)
        for c, b in zip(mine, theirs, strict=False)
        if b.stats and c.stats and min(b.stats.median_us, c.stats.median_us) > 0
    ]
    if not pairs:
        return BaselineTiming(reason="no round timed both the candidate and the baseline")
    ratios = [b.median_us / c.median_us for b, c in pairs]
    intervals = [ratio_interval(b, c) for b, c in pairs]
    low = high = None
    if all(i is not None for i in intervals):
        low = geomean([i[0] for i in intervals if i is not None])
        high = geomean([i[1] for i in intervals if i is not None])
        spread = spread_interval(ratios)
        if spread is not None:
            low, high = min(low, spread[0]), max(high, spread[1])
    speedup = rounds_centre(ratios)
    if low is not None and high is not None:
        low, high = min(low, speedup), max(high, speedup)
    missed = [r.reason for r in theirs if r.outcome == "xfailed"]
    return BaselineTiming(stats=pool(theirs).stats, speedup=speedup, rounds=len(ratios),
                          round_speedups=ratios, speedup_low=low, speedup_high=high,
                          verified=not missed, mismatch=missed[0] if missed else "")


def yardstick_only(name: str, result: CaseResult) -> CaseResult:
    """A baseline's tolerated miss, worded for the summary: who missed, by how much, so what."""
    if result.outcome != "xfailed":
        return result
    return result.model_copy(update={"reason": f"baseline {name} {result.reason} (yardstick only)"})
