"""Verdicts in the pytest process: ask a worker to run a case, then judge what came back.

The reference is computed here, from inputs regenerated with the same seed on the same device,
so the reference output never exists in the candidate's process. Benchmarks are driven from
here one call at a time: each request carries only its own seed, the outputs to verify are
chosen here after the call, and this process's own clock is compared with the worker's. Outputs
are judged whole, whatever their size (``received.py`` takes them, through shared memory when
large).
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import os
import secrets
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_kscientist.errors import CandidateFailure, ReferenceFailed, is_out_of_memory
from pytest_kscientist.formats import forms
from pytest_kscientist.formats.task import REFERENCE_NEEDS, REPORT_MAX_SHARE, Case, Task
from pytest_kscientist.harness import attribution, received
from pytest_kscientist.harness.correctness import Mismatch, judge
from pytest_kscientist.harness.failures import def_line
from pytest_kscientist.harness.results import CaseResult
from pytest_kscientist.harness.spawn import Worker, WorkerDied
from pytest_kscientist.harness.stats import median_interval, summarize
from pytest_kscientist.protocol import perturb

# Secret choices (which timed outputs to verify, which requests are probes, which elements the
# re-run changes) are made here, in the pytest process, never in the worker.
_RNG = secrets.SystemRandom()
_clock = time.perf_counter_ns  # the round-trip clock (tests substitute a scripted one)
PROBE_SHARE = 0.25  # share of benchmark requests that time the harness's path without the kernel
MIN_PROBES = 8
CONFIRM_ROUNDS = 2  # extra rounds of probes and calls before a clock disagreement is a verdict
# Unreported time per call tolerated before the clocks are said to disagree: noise of the
# untimed path (input generation, pipe round trip) on a loaded 2-core CPU stays under this.
HIDDEN_SLACK_US = 200.0
HIDDEN_SLACK_SHARE = 0.25
# The same for the worker's CPU time, which load does not inflate but thread-pool spinning after
# a parallel kernel does (measured: under 0.5 ms per call with torch's 2 threads here).
HIDDEN_CPU_SLACK_US = 1000.0
# Device time outside the events (GPU) tolerated per call before it is counted (timing.py):
# 2 us, 2% of the median call, or 5% of the probes' own outside span (the 256 MB flush and the
# tail, ~95 us on an H100), whichever is most. An honest 2-5 us kernel's spans sat -2.5 to
# +4.1 us from the probes' over 60 rounds on an H100, and 2 us alone counted 2-4 us in 4 of
# them (notes/timing.md, section 3).
OUTSIDE_SLACK_US = 2.0
OUTSIDE_SLACK_SHARE = 0.02
OUTSIDE_SPAN_SHARE = 0.05
# A benchmark stops early once its median is known this precisely (95% interval half-width).
PRECISION = 0.01
PRECISE_AFTER = 20


def derive_seed(seed: object, salt: int, index: int | str) -> int:
    """Mix a public case seed with the session's secret salt and a call index."""
    digest = hashlib.sha256(f"{seed}/{salt}/{index}".encode()).digest()
    return int.from_bytes(digest[:7], "big")


# A GPU MODE problem takes the seed into its own generator, and some use it as a number, their
# checks' tolerances set for their own seeds: pmpp's sort draws each row around the mean seed +
# row, so at a 56-bit seed float32 held one value for the whole input (and at ~1e6 its check's
# relative tolerance, 1e-5 of the values, exceeds their spread) and a kernel that copied its
# input passed. Seeds drawn for a case stay within the public seed's bits (MIN_SEED_BITS at
# least, so that calls seldom meet the same inputs again).
MIN_SEED_BITS = 16


def seed_span(form: str, public: object) -> int | None:
    """How many seeds a case's draws take theirs from (None: all 56 bits)."""
    if form != "gpumode":
        return None
    bits = public.bit_length() if isinstance(public, int) and public > 0 else 0
    return 1 << max(MIN_SEED_BITS, bits)


def seed_for(form: str, public: object, seed: int) -> int:
    """A derived seed in the range the case's form and public seed allow (``seed_span``)."""
    span = seed_span(form, public)
    return seed if span is None else seed % span


def _rerun_hint(first: Any, second: Any) -> str:
    """What a re-run's wrong output suggests, from how it compares with the first call's (which
    passed): the same output, or the NaN the runner writes into an output once it has taken it,
    is a result kept from an earlier call; anything else is wrong for these inputs only."""
    import torch

    if second is None:
        return ""  # the call itself failed
    tensors = [t for t in forms.leaves(second) if isinstance(t, torch.Tensor)]
    if tensors and all(t.is_floating_point() and t.numel() and bool(t.isnan().all())
                       for t in tensors):
        return (" (all NaN: the runner writes NaN into an output once it has taken it, so an "
                "output returned again from an earlier call reads so; a result cached across "
                "calls?)")
    if forms.same(first, second):
        return " (the same output as for the first inputs: a result cached across calls?)"
    return " (the first inputs passed: wrong for some inputs only)"


def _kinds(output: Any) -> list[tuple[tuple[int, ...], Any]]:
    """(shape, dtype) of each tensor of an output."""
    import torch

    return [(tuple(t.shape), t.dtype) for t in forms.leaves(output) if isinstance(t, torch.Tensor)]


def _unlike_reference(got: Any, expected: list[tuple[tuple[int, ...], Any]]) -> str:
    """How an output its problem's own check accepted differs in kind from the reference's
    (``expected``: its ``_kinds``), or "" (GPU MODE: the check is the judge, and some ignore
    dtype)."""
    for i, (mine, theirs) in enumerate(zip(_kinds(got), expected, strict=False)):
        part = f"output {i} " if len(expected) > 1 else "output "
        if mine != theirs:
            return (f"{part}is {mine[0]} {mine[1]} where the reference's is {theirs[0]} "
                    f"{theirs[1]}; the problem's own check accepts it, as GPU MODE's would, but "
                    "its times are of other work than the reference's")
    return ""


def load_reference(task: Task) -> Any:
    if task.module is not None:
        return task.module  # loaded with the task (GPU MODE: from its snapshot of the files)
    spec = importlib.util.spec_from_file_location(f"_ks_reference_{task.name}", task.reference)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    needed = ("Model", "get_inputs", "get_init_inputs") if task.form == "kernelbench" else (
        REFERENCE_NEEDS)
    for name in needed:
        if not callable(getattr(module, name, None)):
            raise CandidateFailure(
                f"task '{task.name}': {task.reference} defines no {name}; "
                f"its reference needs {', '.join(needed)}"
            )
    return module


def check_message(found: Any) -> str:
    """A GPU MODE ``check_implementation`` answer as a failure message ("" when it passed),
    read as GPU MODE's eval reads it: a tuple is (passed, message) by the truth of its first
    item (a numpy bool too); anything else passes when it is falsy (None, "", [], an empty
    dict) and is the failure's message otherwise."""
    if isinstance(found, tuple) and len(found) == 2:
        return "" if bool(found[0]) else (str(found[1]) or "check_implementation said it failed")
    if not found:
        return ""
    return str(found)


class Evaluator:
    """Judges one task's cases for any worker, with the session's salt and device."""

    def __init__(self, task: Task, device: str, salt: int) -> None:
        self.task = task
        self.device = device
        self.salt = salt
        self._ref: Any = None
        self._draw: Any = None
        self._model: Any = None  # KernelBench: the problem's Model, built once
        self._issued: dict[str, int] = {}
        self._issuing = threading.Lock()  # warm-up calls draw from several threads
        # case id -> the reference output's (shape, dtype)s, for a GPU MODE check's note
        self._reference_kinds: dict[str, list[tuple[tuple[int, ...], Any]]] = {}
        # KernelBench: the seed both sides build their models' weights with (secret until the
        # worker is loaded, so no candidate ships weights tuned to it).
        self.init_seed = derive_seed(0, salt, "weights")
        # A problem whose own check judges outputs (GPU MODE's check_implementation) calls it.
        self.own_check = task.form == "gpumode"
        self._lane = os.environ.get("PYTEST_XDIST_WORKER", "")

    @property
    def reference(self) -> Any:
        if self._ref is None:
            self._ref = load_reference(self.task)
        return self._ref

    def inputs(self, case: Case, seed: int) -> Any:
        """The case's inputs for ``seed``, drawn here exactly as the worker draws them."""
        if self._draw is None:
            self._draw = forms.input_maker(self.task.describe(), self.reference)
        return self._draw(case, seed, self.device)

    def _drawable(self, case: Case, seed: int) -> None:
        """After a worker's failure: raise ReferenceFailed where the task's own
        generate_input cannot draw the case here either (the worker drew first, so its error
        read as the candidate's)."""
        try:
            self.inputs(case, seed)
        except Exception as exc:  # noqa: BLE001 - the task's code; any failure is the task's
            raise _task_raised(
                self.task, exc, "the task's generate_input",
                f" drawing case {self.task.case_id(case)}, so no kernel was judged on it; "
                "generate_input must draw every case of the task's profiles: fix the case or "
                "generate_input") from None

    def reference_output(self, data: Any) -> Any:
        """The reference's output for ``data``, on the run's device (judged there; that
        device the current one, as for its draw: on cuda:1 a reference's ``.cuda()`` went to
        cuda:0, and every kernel was judged against tensors on another device)."""
        with forms.current(self.device):
            if self.task.form != "kernelbench":
                return self.reference.ref_kernel(data)
            import torch

            if self._model is None:
                self._model = forms.build_model(self.reference.Model,
                                                self.reference.get_init_inputs, self.init_seed,
                                                self.device)
            with torch.no_grad():
                return self._model(*data)

    def expected(self, case: Case, seed: int) -> Any:
        """The reference output for ``seed``, left on the run's device (judged there)."""
        return self._expected_for(self.inputs(case, seed))

    def floor_us(self, case: Case, device_name: str) -> float | None:
        floor = self.task.floor_for(device_name)
        need = self.work(case) if floor is not None else {}
        if not need:
            return None
        return 1e6 * max(need.get("flops", 0.0) / (floor.peak_tflops * 1e12),
                         need.get("bytes", 0.0) / (floor.peak_tbps * 1e12))

    def work(self, case: Case) -> dict[str, float]:
        """The reference's ``work(**case)``, checked: a dict of non-negative finite ``flops``
        and ``bytes`` (one of them at least); else ReferenceFailed, the task's fault (a None
        was a traceback in every benchmark, a negative or NaN count a floor of nothing). {}
        when the reference has no ``work``."""
        work = getattr(self.reference, "work", None)
        if work is None:
            return {}
        shown = ", ".join(f"{k}={v!r}" for k, v in case.items())
        try:
            need = work(**case)
        except Exception as exc:  # noqa: BLE001 - the task's code
            raise _task_raised(self.task, exc, f"the task's work({shown})",
                               "; fix work() in the task's reference.py") from exc
        fine = isinstance(need, dict) and need and set(need) <= {"flops", "bytes"} and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            and v >= 0 for v in need.values())
        if not fine:
            raise ReferenceFailed(
                f"the task's work({shown}) returned {need!r:.200}, expected a dict of "
                "non-negative finite 'flops' and/or 'bytes' (the physical floor is "
                "max(flops / peak, bytes / peak)); fix work() in the task's reference.py",
                (str(self.task.reference), def_line(self.task.reference, "work")))
        return {k: float(v) for k, v in need.items()}

    def _own_check(self, data: Any, out: Any) -> None:
        """Judge with the problem's ``check_implementation(data, output)`` (GPU MODE), the
        output on the device of the inputs it is checked against: a problem drawing them on
        the CPU had every output moved to the GPU, and its check failed each candidate with
        "Expected all tensors to be on the same device"."""
        out = received.to_device(out, received.device_of(data) or self.device)
        try:
            with forms.current(self.device):
                message = check_message(self.reference.check_implementation(data, out))
        except Exception as exc:  # noqa: BLE001 - the problem's code, on the candidate's output
            if is_out_of_memory(exc):
                raise  # this process's memory, not the output's doing (``_verdict``)
            if _raised_in(self.task, exc, ("ref_kernel", "generate_input")):
                raise _reference_failed(self.task, exc) from None  # not the output's doing
            parts = out if isinstance(out, (tuple, list)) else [out]
            shapes = ", ".join(f"{tuple(t.shape)} {t.dtype}" if hasattr(t, "shape")
                               else _kind(t) for t in parts)
            message = (f"check_implementation raised {type(exc).__name__}: {exc} (on an output "
                       f"of {shapes})")
        if message:
            first = message.strip().splitlines()[0] if message.strip() else message
            if len(first) > 300:  # cut between words, marked: not in the middle of a number
                first = first[:300].rsplit(" ", 1)[0] + " ..."
            raise CandidateFailure(f"wrong result: {first}", message, wrong_result=True)

    def _compare(self, out: Any, expected: Any) -> Mismatch | None:
        """``judge`` for one tensor, or part by part for several (the first part that
        differs)."""
        import torch

        atol, rtol = self.task.spec.check.atol, self.task.spec.check.rtol
        parts = expected if isinstance(expected, (tuple, list)) else [expected]
        if not all(isinstance(e, torch.Tensor) for e in parts):
            raise ReferenceFailed(
                f"the task's reference returned {_kind(expected)}, expected a tensor or a "
                "tuple or list of tensors (what the candidates' outputs are judged against); "
                "fix ref_kernel in the task's reference.py",
                (str(self.task.reference), def_line(self.task.reference, "ref_kernel")))
        if not isinstance(expected, (tuple, list)):
            if isinstance(out, (tuple, list)):
                return Mismatch(f"output is {_kind(out)}, expected a tensor")
            return judge(out, expected, atol, rtol)
        if not isinstance(out, (tuple, list)) or len(out) != len(expected):
            return Mismatch(f"output is {_kind(out)}, expected {_kind(expected)}")
        for i, (o, e) in enumerate(zip(out, expected, strict=True)):
            found = judge(o, e, atol, rtol)
            if found is not None:
                return Mismatch(f"output {i}: {found.message}", found.structural, found.count,
                                found.numel)
        return None

    def _judge(self, expected: Any, out: Any, misses: list[Mismatch] | None = None) -> None:
        """Raise CandidateFailure unless the output matches; with ``misses``, a precision miss
        (right shape, dtype and NaN/Inf positions, few elements) is appended there instead."""
        first = expected[0] if isinstance(expected, (tuple, list)) and expected else expected
        out = received.to_device(out, getattr(first, "device", None))
        found = self._compare(out, expected)
        if found is None:
            return
        reason = f"wrong result: {found.message.split('; first:')[0]}"
        if misses is not None and not found.structural:
            if found.share <= REPORT_MAX_SHARE:
                misses.append(found)
                return
            reason += f" (over {REPORT_MAX_SHARE:.0%} of them: more than a precision miss)"
        raise CandidateFailure(reason, found.message, wrong_result=True)

    def failure(self, data: Any, expected: Any, out: Any) -> str:
        """Why ``out`` fails the task's check for ``data`` ("" when it passes), judged as a
        candidate's output is (task_validation.py asks it of trivial outputs)."""
        try:
            self._verdict(data, out, expected=expected)
        except CandidateFailure as exc:
            return exc.reason
        return ""

    def check(self, worker: Worker, case: Case, tolerate: bool = False) -> CaseResult:
        """Fresh inputs, then the same tensors again with a few elements changed.

        With ``tolerate`` (a baseline declaring verify = "report"), precision misses give an
        ``xfailed`` result saying by how much instead of raising.
        """
        # A GPU MODE case may have no seed: forms seeds its draw with the derived one.
        seed = self._seed(case, 0)
        try:
            got = self._output(worker, "check", case=case, seed=seed)
        except CandidateFailure:
            self._drawable(case, seed)
            raise
        data = self.inputs(case, seed)
        misses: list[Mismatch] | None = [] if tolerate else None
        expected = None if self.own_check else self._expected_for(data)
        self._verdict(data, got, misses, expected=expected)
        note = self._unlike(case, data, got) if self.own_check else ""
        request, data, what, expected = self._second_inputs(case, data, expected)
        first, got = got, None
        try:
            got = self._output(worker, "recheck", **request)
            self._verdict(data, got, misses, expected=expected)
        except WorkerDied:
            raise  # the worker's own verdict (hung, crashed): no context to add
        except CandidateFailure as exc:
            raise CandidateFailure(
                f"re-run in the same input tensors with {what}: "
                f"{exc.reason}{_rerun_hint(first, got)}", exc.detail,
                exc.wrong_result) from None
        result = CaseResult(kind="check", case=case, case_id=self.task.case_id(case),
                            outcome="passed", note=note)
        if misses:
            first = misses[0]
            result.outcome = "xfailed"
            result.reason = f"misses the check on {first.count} of {first.numel} elements"
            result.detail = first.message
        return result

    def attribute(self, worker: Worker, case: Case, source: str) -> attribution.Attribution:
        """One untimed call of the candidate under torch's profiler, judged against the kernels
        its file declares (harness/attribution.py)."""
        seed = self._seed(case, "attribution")
        declared = attribution.declared_kernels(source)
        header, _ = _ask(worker, "attribute", case=case, seed=seed, own=declared)
        return attribution.judge(header, declared)

    def _second_inputs(self, case: Case, data: Any,
                       expected: Any) -> tuple[dict[str, Any], Any, str, Any]:
        """The re-run's request, its inputs, their description and the reference's output for
        them (None: computed when judged). The case drawn again with another seed, written
        into the same tensors (``[check] rerun = "redraw"``, the default, and every problem
        judged by its own check): a changed element can leave the input domain, and a right
        kernel then fails (the reference's own cholesky on an SPD matrix with one element
        changed, a count over boundaries no longer sorted). With ``rerun = "changed"``
        (fp8_gemm) a few elements of ``data`` changed (perturb.py), which also exposes a cache
        keyed by a few sampled elements; a draw still where the reference raises on them,
        gives non-finite numbers it did not, or no input is floating point."""
        seed = self._seed(case, "recheck")
        output = self.task.spec.output_index
        changes = [] if self.own_check or self.task.spec.check.rerun == "redraw" else (
            perturb.choose(data, output, _RNG))
        if changes:
            perturb.apply(data, changes)
            try:
                again = self.reference_output(data)
            except Exception:  # noqa: BLE001 - the changed element left the task's domain
                again = None
            if again is not None and _finite_count(again) >= _finite_count(expected):
                return {"changes": changes}, data, f"{len(changes)} elements changed", again
        fresh = self.inputs(case, seed)
        if perturb.same_layout(data, fresh) and (
                self.own_check or perturb.changed_input(data, fresh, output) is not None):
            perturb.refill(data, fresh)
            return ({"case": case, "redraw": seed}, data,
                    "every tensor drawn again by generate_input", None)
        if not changes:  # no draw to take either (changed ones are judged as they are)
            changes = perturb.choose(data, output, _RNG)
            perturb.apply(data, changes)
        return {"changes": changes}, data, f"{len(changes)} elements changed", None

    def _output(self, worker: Worker, op: str, **fields: Any) -> Any:
        """The output a request's answer carries, taken whole into this process at once."""
        header, payload = _ask(worker, op, handover=received.spec(worker, self.device), **fields)
        return received.output(worker, header.get("output"), payload, self.device)

    def _verdict(self, data: Any, out: Any, misses: list[Mismatch] | None = None,
                 expected: Any = None) -> None:
        """Judge a checked output for ``data``: by the problem's own check where it has one,
        else against ``expected`` (the reference's output for ``data``, computed if None).
        This process's own device memory running out while it judges (the output moved here,
        compared in float64 chunks) is nobody's verdict: it raised bare, out of the item and
        the case's rounds, where the rounds retire their twins and try again for it."""
        try:
            if self.own_check:
                self._own_check(data, out)
                return
            self._judge(self._expected_for(data) if expected is None else expected, out,
                        misses)
        except Exception as exc:
            if not is_out_of_memory(exc) or isinstance(exc, (CandidateFailure, ReferenceFailed)):
                raise
            raise ReferenceFailed(
                f"the pytest process ran out of device memory judging an output ({exc!s:.160}), "
                "beside the workers (each holds its inputs, outputs and allocator cache), so "
                "the candidate was not judged; run fewer kernels a session or "
                "--ks-bench-workers 1", (str(self.task.reference), 1),
                out_of_memory=True) from None

    def _expected_for(self, data: Any) -> Any:
        """The reference's output for ``data``; its error is the task's (ReferenceFailed)."""
        try:
            return self.reference_output(data)
        except Exception as exc:  # noqa: BLE001 - the task's code: any error is its own
            raise _reference_failed(self.task, exc) from exc

    def _unlike(self, case: Case, data: Any, got: Any) -> str:
        """``_unlike_reference`` for a problem judged by its own check, where it has a
        ref_kernel to compare kinds with ("" where it has none or it fails here: the problem's
        check already passed the output). The reference runs once a case, not once a
        candidate and case."""
        key = self.task.case_id(case)
        if key not in self._reference_kinds:
            if not callable(getattr(self.reference, "ref_kernel", None)):
                return ""
            import torch

            copy = forms.rebuild(data, lambda t: t.clone() if isinstance(t, torch.Tensor) else t)
            try:  # on a copy: the re-run judges ``data`` as drawn, whatever the reference writes
                self._reference_kinds[key] = _kinds(self.reference_output(copy))
            except Exception:  # noqa: BLE001 - the problem's code; its check was the verdict
                return ""
        return _unlike_reference(got, self._reference_kinds[key])

    def fresh_seed(self, case: Case) -> int:
        """A seed that no earlier call of this session got for ``case``.

        Benchmark calls, warm-up calls and probes all draw here, across rounds and candidates,
        so a result cached under a fingerprint of every input element never meets its inputs
        again (issue 10: rounds 2-4 used to replay round 1's inputs). The pytest-xdist worker
        id keeps parallel sessions apart; the check of a case keeps its fixed index 0.
        """
        key = self.task.case_id(case)
        with self._issuing:
            count = self._issued.get(key, 0) + 1
            self._issued[key] = count
        span = seed_span(self.task.form, case.get("seed"))
        if span is not None:  # a secret start, then one apart: none drawn twice in the span
            return (self._seed(case, f"{self._lane}/start") + count) % span
        return derive_seed(case.get("seed", 0), self.salt, f"{self._lane}/{count}")

    def _seed(self, case: Case, index: int | str) -> int:
        public = case.get("seed", 0)
        return seed_for(self.task.form, public, derive_seed(public, self.salt, index))

    def untimed_call(self, worker: Worker, case: Case) -> dict[str, Any]:
        """One call of ``case`` whose output is neither fetched nor judged and whose time is
        not kept (its header): a benchmark's warm-up, and a worker's first call made before the
        rounds (starts.WarmUp). Raises CandidateFailure as a call does."""
        return _ask(worker, "call", case=case, seed=self.fresh_seed(case))[0]

    def bench(self, worker: Worker, case: Case, device_name: str, budget_s: float,
              tolerate: bool = False, samples: int | None = None,
              precise_after: int = PRECISE_AFTER, trusted: str = "",
              warmup: int | None = None, min_runs: int | None = None) -> CaseResult:
        """Warm-up, then one request per timed call; verify a secret sample of the calls' whole
        outputs; check the clocks.

        With ``tolerate``, verified outputs that miss only by precision give an ``xfailed``
        result that keeps its times (see ``check``). ``samples``: how many timed outputs to
        verify (default: the task's ``bench.verify_samples``). ``precise_after``: the fewest
        calls after which a precise enough median stops the timing (a round of several).
        ``trusted``: who the task's own code timed here is ("the task's reference", a
        baseline), for whom a time below the physical floor is the task's error, not tampering.
        ``warmup``, ``min_runs``: a round's share of the task's (rounds.spread; default the
        task's own).
        """
        spec = self.task.spec.bench
        samples = spec.verify_samples if samples is None else samples
        warmup = spec.warmup if warmup is None else warmup
        min_runs = spec.min_runs if min_runs is None else min_runs
        warm: list[float] = []
        for i in range(warmup):
            try:
                header = self.untimed_call(worker, case)
            except WorkerDied:
                raise  # the worker's own verdict (hung, crashed): no context to add
            except CandidateFailure as exc:
                self._drawable(case, self._seed(case, 0))
                raise exc.prefixed(f"warm-up call {i}: ") from None
            warm.append(float(header["raw_us"]) - float(worker.overhead_us))
        run = _TimedRun(self, worker, case, statistics.median(warm) if warm else 0.0)
        start = time.monotonic()
        while len(run.times) < spec.max_runs:
            if _RNG.random() < PROBE_SHARE:
                run.probe()
                continue
            run.call(samples)
            if len(run.times) >= min_runs and (
                time.monotonic() - start > budget_s or precise(run.times, precise_after)
            ):
                break
        while len(run.probes) < MIN_PROBES:
            run.probe()
        counted = run.outside_excess()
        hidden = run.hidden(counted)
        for _ in range(CONFIRM_ROUNDS):
            if hidden is None and not counted:
                break
            # Load on the machine can inflate a handful of round trips, and a handful of flush
            # spans: ask again before judging or counting.
            for _ in range(MIN_PROBES):
                run.probe()
                run.call(samples)
            counted = run.outside_excess()
            hidden = run.hidden(counted)
        missed = self._verify_sample(run, tolerate)
        clock = "cuda-events" if self.device.startswith("cuda") else "perf_counter_ns"
        times = [t + counted for t in run.times]
        stats = summarize(times, verified_runs=len(run.kept), clock=clock, counted_us=counted)
        floor = self.floor_us(case, device_name)
        if floor is not None and stats.min_us < floor:
            fastest = (f"fastest call {stats.min_us:.3f} us is below the physical floor "
                       f"{floor:.3f} us for {device_name}")
            if trusted:
                raise CandidateFailure(
                    f"the task's floor is wrong: {trusted} (the task's own code) ran faster "
                    f"than physics allows: {fastest}; work() counts more flops or bytes than "
                    f"the case needs, or the [[floor]] peaks for {device_name} are too low: "
                    "fix them in the task")
            raise CandidateFailure(
                f"impossible time: {fastest}; the timing was tampered with or the work was "
                "not done")
        if stats.median_us <= 0:
            # (Past the floor, which names a task's physics where it declares one.) The events
            # of a GPU timer saw no work between them: the calls ran on the host
            # (inputs drawn on the CPU), hidden under the timer's lead. Its 0.0 us crashed the
            # session's end (a geomean of zero) and lost every result (issue 31's GPU run).
            where = ("" if clock != "cuda-events" else
                     f"; its calls left no work on {self.device} for the device's events to "
                     "time: a kernel that computes on the host, or a task whose inputs are on "
                     "the CPU, is timed with --ks-device cpu")
            raise CandidateFailure(f"impossible time: median {stats.median_us:.3f} us over "
                                   f"{stats.runs} timed calls{where}")
        if hidden is not None:
            raise CandidateFailure(
                f"timing disagrees with what the pytest process measures from outside: {hidden} "
                f"than the reported median of {stats.median_us:.1f} us; work was done outside "
                "the timed region or the worker's clock was tampered with"
            )
        result = CaseResult(kind="bench", case=case, case_id=self.task.case_id(case),
                            outcome="passed", stats=stats, floor_us=floor)
        if missed:
            index, worst = max(missed, key=lambda x: x[1].count)
            upto = "up to " if len(missed) > 1 else ""
            result.outcome = "xfailed"
            result.reason = (f"misses the check on {upto}{worst.count} of {worst.numel} elements "
                             f"in {len(missed)} of {len(run.kept)} verified timed calls")
            result.detail = f"timed call {index}: {worst.message}"
        return result

    def _verify_sample(self, run: _TimedRun, tolerate: bool) -> list[tuple[int, Mismatch]]:
        """Judge the kept outputs in call order; the tolerated misses, by timed call index."""
        missed: list[tuple[int, Mismatch]] = []
        for kept in sorted(run.kept, key=lambda x: x.index):
            misses: list[Mismatch] | None = [] if tolerate else None
            try:
                if self.own_check:
                    self._own_check(self.inputs(run.case, kept.seed), kept.output)
                    continue
                self._judge(self.expected(run.case, kept.seed), kept.output, misses)
            except CandidateFailure as exc:
                raise exc.prefixed(f"timed call {kept.index}: ") from None
            missed += [(kept.index, m) for m in misses or []]
        return missed


@dataclass(frozen=True)
class _Kept:
    """A timed call's whole output, kept for verification (this process's own copy)."""

    index: int
    seed: int
    output: Any


class _TimedRun:
    """The timed calls of one benchmark, as the worker reports them and as seen from outside."""

    def __init__(self, evaluator: Evaluator, worker: Worker, case: Case,
                 estimate_us: float = 0.0) -> None:
        self.ev, self.worker, self.case = evaluator, worker, case
        self.overhead_us = float(worker.overhead_us)
        self.estimate_us = estimate_us  # the kernel's time before the first timed call
        self.times: list[float] = []  # worker-reported, protocol cost subtracted
        self.paths: list[float] = []  # round trip minus reported time: the untimed path
        self.outside: list[float] = []  # device time in the flush span and the tail (GPU)
        self.cpu: list[float | None] = []  # the worker's CPU time spent on each of those calls
        self.probes: list[float] = []  # the untimed path of probes (a trusted busy kernel)
        self.probe_outside: list[float] = []
        self.probe_cpu: list[float | None] = []
        self.kept: list[_Kept] = []

    def _trip(self, **fields: Any) -> tuple[dict[str, Any], float, float, float | None]:
        """(header, reported us, untimed path us, worker CPU us) of one request."""
        cpu0 = self.worker.cpu_us()
        t0 = _clock()
        header, _ = _ask(self.worker, "call", case=self.case, **fields)
        wall = (_clock() - t0) / 1000.0
        cpu1 = self.worker.cpu_us()
        reported = float(header["raw_us"]) - self.overhead_us
        cpu = None if cpu0 is None or cpu1 is None else cpu1 - cpu0
        return header, reported, wall - reported, cpu

    def probe(self) -> None:
        """The same path with a trusted busy kernel as long as the candidate's median call."""
        busy = statistics.median(self.times) if self.times else self.estimate_us
        header, _, path, cpu = self._trip(seed=self.ev.fresh_seed(self.case), probe=True,
                                          busy_us=max(busy, 0.0))
        self.probes.append(path)
        self.probe_outside.append(float(header.get("outside_us", 0.0)))
        self.probe_cpu.append(cpu)

    def call(self, sample: int) -> None:
        """One timed call; fetch its output if the reservoir (secret, kept here) takes it."""
        index = len(self.times)
        seed = self.ev.fresh_seed(self.case)
        try:
            header, reported, path, cpu = self._trip(seed=seed)
            self.times.append(reported)
            self.paths.append(path)
            self.outside.append(float(header.get("outside_us", 0.0)))
            self.cpu.append(cpu)
            slot = index if index < sample else _RNG.randrange(index + 1)
            if slot < sample:
                entry = _Kept(index, seed, self.ev._output(self.worker, "fetch"))
                if slot < len(self.kept):
                    self.kept[slot] = entry
                else:
                    self.kept.append(entry)
        except WorkerDied:
            raise  # the worker's own verdict (hung, crashed): no context to add
        except CandidateFailure as exc:
            raise exc.prefixed(f"timed call {index}: ") from None

    def hidden(self, counted: float = 0.0) -> str | None:
        """What was measured from outside but not reported, when it is too much to be noise.

        ``counted``: device time per call found outside the events (``outside_excess``), which
        the result will count, so it is not hidden.

        Per timed call, the round trip (or the worker's CPU time) minus what the reported time
        allows is the cost of the untimed path; the cheapest one is compared with the cheapest
        probe (the same path with a trusted kernel), so load on the machine, which only adds,
        does not make honest kernels look guilty. A difference counts only above the reported
        median (more than half the work hidden) and above a margin: a fixed slack for the
        untimed path plus the spread of this run's own probes.
        """
        reported = statistics.median(self.times) + counted
        fastest = min(self.probes)
        wall = min(self.paths) - counted - fastest
        slack = HIDDEN_SLACK_US + HIDDEN_SLACK_SHARE * fastest + _spread(self.probes)
        if wall > max(slack, reported):
            return f"the wall clock saw about {wall:.0f} us per call more"
        if None in self.cpu or None in self.probe_cpu or not self.cpu:
            return None
        lanes = self.worker.cpus()  # an honest kernel may keep this many CPUs busy
        spent = [c for c in self.cpu if c is not None]
        probe_cpu = [c for c in self.probe_cpu if c is not None]
        cheapest = min(probe_cpu)
        cpu = min(c - lanes * max(k + counted, 0.0)
                  for c, k in zip(spent, self.times, strict=True))
        cpu -= cheapest
        margin = HIDDEN_CPU_SLACK_US + HIDDEN_SLACK_SHARE * cheapest + _spread(probe_cpu)
        if cpu > max(margin, reported):
            return f"the worker used about {cpu:.0f} us of CPU per call more"
        return None

    def outside_excess(self) -> float:
        """Device time per call outside the caller's stream events, beyond the probes' (GPU).

        Work on a side stream that overlapped the flush or outlived the end event lengthens
        the flush span or the tail; an honest kernel's are the probes'. Above a margin (2 us,
        2% of the median, 5% of the probes' span, or twice their spread) the median excess is
        counted: added to every call, so such work is timed rather than rejected. (``bench``
        asks again before it counts.)
        """
        if not self.outside or not self.probe_outside:
            return 0.0
        span = statistics.median(self.probe_outside)
        excess = statistics.median(self.outside) - span
        margin = max(OUTSIDE_SLACK_US, OUTSIDE_SLACK_SHARE * statistics.median(self.times),
                     OUTSIDE_SPAN_SHARE * span, 2.0 * _spread(self.probe_outside))
        return excess if excess > margin else 0.0


def _spread(values: list[float]) -> float:
    """Upper quartile minus the minimum: how far this run's untimed path strays upwards."""
    ordered = sorted(values)
    return ordered[(3 * (len(ordered) - 1)) // 4] - ordered[0] if ordered else 0.0


def precise(times: list[float], after: int = PRECISE_AFTER) -> bool:
    """Stop once the median's 95% interval is within PRECISION of it (at least ``after``
    calls; under 6 calls the interval is their whole range)."""
    if len(times) < after:
        return False
    low, high = median_interval(times)
    middle = statistics.median(times)
    return middle > 0 and (high - low) / 2 <= PRECISION * middle


def _finite_count(output: Any) -> int:
    """How many elements of an output's tensors are finite (0 for what holds no tensor)."""
    import torch

    return sum(int(torch.isfinite(t).sum()) for t in forms.leaves(output)
               if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex()))


def _kind(value: Any) -> str:
    """What an output is, in words: ``a tensor``, ``a tuple of 2``, ``a float``."""
    import torch

    if isinstance(value, torch.Tensor):
        return "a tensor"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)}"
    return f"a {type(value).__name__}"


def _reference_frames(task: Task, exc: Exception) -> list[Any]:
    """The frames of ``exc``'s traceback in the task's reference file, outermost first."""
    import traceback

    return [f for f in traceback.extract_tb(exc.__traceback__)
            if Path(f.filename).resolve() == task.reference.resolve()]


def _raised_at(task: Task, exc: Exception) -> tuple[str, int]:
    """The task reference's file and the line of it where ``exc`` was raised (1: not in it)."""
    frames = _reference_frames(task, exc)
    return str(task.reference), (frames[-1].lineno or 1) if frames else 1


def _raised_in(task: Task, exc: Exception, functions: tuple[str, ...]) -> bool:
    """Whether ``exc`` came from one of the task reference's ``functions`` (its innermost
    frame in the reference file is one of them)."""
    frames = _reference_frames(task, exc)
    return bool(frames) and frames[-1].name in functions


def _task_raised(task: Task, exc: Exception, who: str, then: str) -> ReferenceFailed:
    """``who`` (the task's code) raised ``exc``, named with the line of its file it came from,
    then what follows and the fix (``then``)."""
    where = _raised_at(task, exc)
    return ReferenceFailed(f"{who} raised {type(exc).__name__}: {str(exc).strip()[:300]} (at "
                           f"{where[0]}:{where[1]}){then}", where)


def _reference_failed(task: Task, exc: Exception) -> ReferenceFailed:
    """The reference's error on a check's inputs: the candidate was not judged on them."""
    if is_out_of_memory(exc):
        failed = _task_raised(
            task, exc, "the task's reference",
            " in the pytest process, where it judges outputs: the device's memory ran out "
            "beside the workers (each holds its inputs, outputs and allocator cache), so the "
            "candidate was not judged; run fewer kernels a session or --ks-bench-workers 1")
        failed.out_of_memory = True
        return failed
    return _task_raised(
        task, exc, "the task's reference",
        " on this check's inputs, so the candidate was not judged; the reference must handle "
        "every input generate_input draws for the case (with any seed): fix the task's "
        "reference.py or its generate_input")


def _ask(worker: Worker, op: str, timeout: float | None = None,
         **fields: Any) -> tuple[dict[str, Any], bytes]:
    header, payload = worker.request(op, timeout=timeout, **fields)
    if not header.get("ok"):
        raise CandidateFailure(str(header.get("reason", "failed")), str(header.get("detail", "")),
                               out_of_memory=header.get("out_of_memory") is True)
    return header, payload


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


__all__ = ["Evaluator", "WorkerDied", "derive_seed", "file_sha256"]
