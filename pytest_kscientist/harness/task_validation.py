"""Task validation (issue 30, point 5): does the task itself let a trivial kernel pass?

A task whose tolerance accepts an all-zeros or constant output, or whose reference output does
not change with the seed, passes kernels that compute nothing (KernelBench issue 165: zeros
passed 4 of 60 level-1 tasks). One item per task, ``<task file>::task::validate``, asks these
questions on the task's first check case of the run's profile:

- the case drawn twice with its own seed must give inputs whose reference outputs agree within
  the task's check (``generate_input`` follows its seed), and a declared ``output_index`` must
  name a tensor of those inputs (both task errors);
- the reference's output for the case's own seed, judged as a candidate's output would be for
  another seed's inputs, must fail (a case without a ``seed`` key, as GPU MODE allows, draws
  twice from the global generators that ``forms`` seeds, as its check items do);
- an all-zeros output and a constant one (each tensor filled with the reference output's
  mean), with the reference output's shapes and dtypes, must fail the task's own check.

Where it runs: in the pytest process, as the expected outputs of every check item are computed
today (``Evaluator.inputs`` / ``reference_output``, then the same judging a candidate's output
gets, ``Evaluator.failure``: atol/rtol, or a GPU MODE problem's ``check_implementation``). The
reference is trusted task code and never runs in a candidate's worker; only candidates do.
The seeds are public (the case's own and one derived from it without the session's salt) and
KernelBench weights use a fixed seed, so the verdict depends on the task's files alone: it is
kept in pytest's cache under ``kscientist/task-validation/<hash>`` and reused, marked
"(cached)", until a file that defines the task changes.
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

import pytest
from pydantic import BaseModel, Field, ValidationError

from pytest_kscientist.errors import ReferenceFailed, TaskSpecError
from pytest_kscientist.formats import forms
from pytest_kscientist.formats.task import Case, Task
from pytest_kscientist.harness.evaluate import Evaluator, derive_seed, seed_for
from pytest_kscientist.harness.failures import failure_repr
from pytest_kscientist.harness.results import TaskValidation, report_property
from pytest_kscientist.harness.session import KS_SESSION
from pytest_kscientist.kswarnings import KsTaskHole
from pytest_kscientist.protocol import perturb

CACHE_PREFIX = "kscientist/task-validation/"
# Bumped when what is checked changes, so older cached verdicts are not reused.
VERSION = 3


class Verdict(BaseModel):
    """What validating one task found: the holes (empty: it passed), the sub-checks that could
    not run and why, or an ``error`` when the task's own code failed. Kept in pytest's cache as
    its JSON (``cached`` left out)."""

    case_id: str
    holes: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    error: str = ""
    ran: int = 0  # sub-checks run (0 and no error: nothing could be checked)
    cached: bool = Field(default=False, exclude=True)


def task_files(task: Task) -> dict[str, bytes]:
    """The files that define ``task`` (name -> content): its spec and reference; for GPU MODE
    the files its task.yml lists, as snapshotted at load. Never its candidates or seeds."""
    files = {task.spec_path.name: task.spec_path.read_bytes()}
    if task.form == "gpumode":
        files.update({f"listed/{k}": v.encode() for k, v in task.files.items()})
    elif task.reference != task.spec_path:
        files[task.reference.name] = task.reference.read_bytes()
    return files


def cache_key(task: Task, case: Case, device: str) -> str:
    """The cache key of ``task``'s verdict on ``case``: a hash of its files, the case, the
    tolerance (KernelBench's comes from an option) and the kind of device."""
    digest = hashlib.sha256()
    head = {"version": VERSION, "form": task.form, "case": case,
            "check": task.spec.check.model_dump(), "device": device.split(":")[0]}
    digest.update(json.dumps(head, sort_keys=True, default=str).encode())
    for name, content in sorted(task_files(task).items()):
        digest.update(f"\0{name}\0{len(content)}\0".encode())
        digest.update(content)
    return CACHE_PREFIX + digest.hexdigest()


def validate(task: Task, case: Case, device: str, others: tuple[Case, ...] = ()) -> Verdict:
    """Judge ``task`` on ``case``: the holes a trivial kernel would pass through; and that
    ``generate_input`` takes the keys of every case (``others``: the profile's cases)."""
    evaluator = Evaluator(task, device, salt=0)
    verdict = Verdict(case_id=task.case_id(case))
    unfit = _unaccepted(task, evaluator, (case, *others))
    if unfit:
        verdict.error = unfit
        return verdict
    if task.form == "gpumode" and not callable(getattr(task.module, "ref_kernel", None)):
        verdict.notes.append("not checked: the problem defines no ref_kernel, so there is no "
                             "reference output to compare seeds or to shape a trivial output")
        return verdict
    seeded = "seed" in case
    first = case["seed"] if seeded and isinstance(case["seed"], int) else 0
    other = seed_for(task.form, first, derive_seed(first, 0, "validate") % (1 << 31))
    seeds = (first, other if other != first else other + 1)
    try:
        data = [evaluator.inputs(case, s) for s in seeds]
        # GPU MODE's references may write into outputs among the inputs (fp8-mm's c)
        drawn = copy.deepcopy(data[0]) if task.form != "gpumode" else None
        outputs = [evaluator.reference_output(d) for d in data]
        again = evaluator.inputs(case, seeds[0])  # the first seed drawn a second time
        again_output = evaluator.reference_output(again)
    except Exception as exc:  # noqa: BLE001 - the task's own code; any failure is its verdict
        verdict.error = (f"the reference failed on case {verdict.case_id}: "
                         f"{type(exc).__name__}: {str(exc)[:200]}")
        return verdict
    problem = (forms.output_problem(data[0], task.spec.output_index)
               or _off_device(data[0], device, verdict.case_id, task.form == "gpumode")
               or _unjudgeable(task, data[0], outputs[0], device, verdict.case_id))
    if problem:
        verdict.error = problem
        return verdict
    changed = None if drawn is None else perturb.changed_input(drawn, data[0],
                                                               task.spec.output_index)
    if changed is not None:
        verdict.error = (f"the reference changes input {changed} of case {verdict.case_id} in "
                         "place: the reference node's benchmarks fail on it (each candidate "
                         "must leave its inputs unchanged, the reference too); compute on a "
                         "copy" + (", or set output_index if that input is the output it "
                                   "writes" if task.form == "native" else ""))
        return verdict
    tolerance = _tolerance(task)
    which = "seeds" if seeded else "global generator seeds (the case has no seed key)"
    # The same seed drawn again must give inputs whose reference output passes the check
    # against the first: else every candidate is judged on inputs the pytest process cannot
    # draw again (generate_input ignoring its seed: torch.randn without a generator).
    try:
        own = (evaluator.failure(data[0], outputs[0], outputs[0]).split("\n", 1)[0][:200]
               if evaluator.own_check else "")
        differs = evaluator.failure(again, again_output, outputs[0]).split("\n", 1)[0][:200]
    except ReferenceFailed as exc:  # its output is nothing a candidate can be judged against
        verdict.error = str(exc)
        return verdict
    if own:
        verdict.error = (f"check_implementation rejects the reference's own output on case "
                         f"{verdict.case_id} ({own}), so every right kernel fails: it must "
                         "answer a pass with (True, message), or a falsy value (None, \"\"); "
                         "anything else truthy is read as the failure's message, as GPU MODE's "
                         "eval reads it")
        return verdict
    if differs:
        one = "seed" if seeded else "global generator seed"
        verdict.error = (f"case {verdict.case_id} drawn twice with {one} {seeds[0]} gives "
                         f"inputs whose reference outputs differ ({differs}): "
                         "generate_input (or the reference) does not follow the seed; draw "
                         "from a torch.Generator seeded with it")
        return verdict
    try:
        for each in (case, *others):
            evaluator.work(each)
    except ReferenceFailed as exc:
        verdict.error = str(exc)
        return verdict
    reads = _reads_output(task, evaluator, case, seeds[0], outputs[0])
    if reads:
        verdict.error = reads
        return verdict
    where = f"case {verdict.case_id}, {which} {seeds[0]} and {seeds[1]}"
    seed_hole = (f"the reference output does not change with the seed ({where})"
                 if forms.same(outputs[0], outputs[1]) else
                 f"the reference output for one seed passes the task's check for the other, so "
                 f"the check cannot tell the seeds apart ({where}; {tolerance})")
    trivial = [
        (outputs[0], seed_hole),
        (_filled(outputs[1], "zeros"), f"an all-zeros output passes the task's check on case "
                                       f"{verdict.case_id} ({tolerance})"),
        (_filled(outputs[1], "mean"), f"a constant output (the reference's mean) passes the "
                                      f"task's check on case {verdict.case_id} ({tolerance})"),
    ]
    if _one_value_each(outputs[1]):  # a loss, a sum: its own mean is the answer
        verdict.notes.append("not checked: a constant output (the reference's mean), since "
                             "each tensor of the reference output holds one value")
        trivial.pop()
    for out, hole in trivial:
        if out is None:
            verdict.notes.append(f"not checked: {hole.split(' passes')[0]} (the reference "
                                 "output holds no tensor)")
            continue
        verdict.ran += 1
        if not evaluator.failure(data[1], outputs[1], out):
            verdict.holes.append(hole)
    return verdict


def _off_device(data: Any, device: str, case_id: str, gpumode: bool = False) -> str:
    """Which of the inputs ``generate_input`` drew lies on another device than the run's
    ("" when none): a kernel handed it would be judged and timed there. A GPU MODE problem's
    generate_input takes no device and may keep some inputs on the CPU by design (the nvfp4
    problems' scale factors, ``sfa_ref_cpu``): it needs one input on the run's device."""
    import torch

    want = torch.device(device).type
    if gpumode:
        tensors = [leaf for leaf in forms.leaves(data) if isinstance(leaf, torch.Tensor)]
        if not tensors or any(t.device.type == want for t in tensors):
            return ""
        return (f"generate_input put every input of case {case_id} on {tensors[0].device}, "
                f"none on {device}, the run's device: its kernels would be timed on a device "
                f"their inputs are not on; run it with --ks-device {tensors[0].device.type}")
    for i, leaf in enumerate(forms.leaves(data)):
        if isinstance(leaf, torch.Tensor) and leaf.device.type != want:
            return (f"generate_input put input {i} of case {case_id} ({tuple(leaf.shape)}) on "
                    f"{leaf.device}, expected {device}, the device it was asked for: create "
                    "every tensor with device=device")
    return ""


def _unjudgeable(task: Task, data: Any, output: Any, device: str, case_id: str) -> str:
    """Why the reference's own output fails the worker's structural check of every kernel's
    output ("" when it passes): its benchmarks would fail on it, as the candidate's fault."""
    import torch

    from pytest_kscientist.worker.runner import part_problem

    parts = [output] if isinstance(output, torch.Tensor) else (
        list(output) if isinstance(output, (tuple, list)) else [])
    if task.form == "gpumode" and (not parts or not all(isinstance(p, torch.Tensor)
                                                        for p in parts)):
        # A native task's reference says so itself, as ReferenceFailed, on every check.
        odd = output if not parts else next(p for p in parts if not isinstance(p, torch.Tensor))
        return (f"the reference returns {type(odd).__module__}.{type(odd).__qualname__}"
                f"{'' if not parts else ' inside its output'} on case {case_id}: the harness "
                "hands over and judges outputs that are a tensor or a tuple or list of tensors, "
                "so it would refuse every kernel's output, the reference's too; this problem's "
                "output cannot be run here as it is")
    for i, part in enumerate(parts):
        if not isinstance(part, torch.Tensor):
            continue
        problem = part_problem(part, data, tensor=torch.Tensor, device=torch.device(device),
                               output_index=task.spec.output_index,
                               inputs_may_be_outputs=task.form == "gpumode")
        if problem:
            which = "" if len(parts) == 1 else f" (output {i})"
            return (f"the reference {problem.split(';')[0]}{which} on case {case_id}: every "
                    "kernel's output is checked for that, so the reference node's benchmarks "
                    "fail on it; return a tensor of its own (.clone(), .contiguous())")
    return ""


def _reads_output(task: Task, evaluator: Evaluator, case: Case, seed: int,
                  expected: Any) -> str:
    """Why the reference depends on the preallocated output's contents ("" when it does not):
    each candidate gets that tensor filled with NaN (an unwritten element shows), so a
    reference that reads it (an in-place op on its own output) or leaves some of it as drawn
    judges every candidate against numbers no candidate can compute."""
    index = task.spec.output_index
    if index is None:
        return ""
    import torch

    data = evaluator.inputs(case, seed)
    found = forms.leaves(data)
    if index >= len(found) or not isinstance(found[index], torch.Tensor) or not (
            found[index].is_floating_point()):
        return ""
    found[index].fill_(float("nan"))
    try:
        again = evaluator.reference_output(data)
    except Exception as exc:  # noqa: BLE001 - the task's own code
        again, why = None, f"it raised {type(exc).__name__}"
    if again is not None:
        why = evaluator.failure(data, expected, again).split("\n", 1)[0][:200]
    if not why:
        return ""
    return (f"the reference's output depends on what generate_input's output tensor "
            f"(output_index = {index}) holds before the call: with that tensor filled with NaN, "
            f"as each candidate gets it, {why}; compute the reference from the inputs alone "
            "(writing every element), or leave output_index unset if the kernel returns its "
            "own output")


def _unaccepted(task: Task, evaluator: Evaluator, cases: tuple[Case, ...]) -> str:
    """Why ``generate_input`` cannot take some case's keys ("" when every case fits): a typo
    in a case key (``sise``) otherwise failed every candidate with a TypeError of its own."""
    import inspect

    if task.form == "kernelbench":
        return ""
    try:
        generate = evaluator.reference.generate_input
        signature = inspect.signature(generate)
    except Exception:  # noqa: BLE001 - no signature to read: the draw itself will tell
        return ""
    extra = {"device": "cpu"} if task.form == "native" else {}
    for case in cases:
        try:
            signature.bind(**dict(case, **extra))
        except TypeError as exc:
            return (f"generate_input{signature} cannot take case {task.case_id(case)} "
                    f"({exc}); fix the case's keys or generate_input's parameters")
    return ""


def _one_value_each(output: Any) -> bool:
    """Whether the output holds tensors, each of one element at most."""
    import torch

    tensors = [t for t in forms.leaves(output) if isinstance(t, torch.Tensor)]
    return bool(tensors) and all(t.numel() <= 1 for t in tensors)


def _tolerance(task: Task) -> str:
    if task.form == "gpumode":
        return "judged by its check_implementation"
    check = task.spec.check
    return f"tolerance atol={check.atol:g}, rtol={check.rtol:g}"


def _filled(output: Any, how: str) -> Any:
    """``output`` with each tensor zeroed or filled with its own mean, shapes and dtypes kept;
    None when it holds no tensor."""
    import torch

    if not any(isinstance(t, torch.Tensor) for t in forms.leaves(output)):
        return None

    def fill(t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        if how == "zeros" or t.numel() == 0:
            return torch.zeros_like(t)
        if t.is_complex():  # both parts: the real part alone warned and judged another output
            wide = t.detach().to(torch.complex128)
            return torch.full(t.shape, wide.mean().item(), dtype=torch.complex128,
                              device=t.device).to(t.dtype)
        value = t.detach().to(torch.float64).nanmean().item() if t.is_floating_point() else (
            t.detach().to(torch.float64).mean().item())
        return torch.full(t.shape, value, dtype=torch.float64, device=t.device).to(t.dtype)

    return forms.rebuild(output, fill)


NODE_NAME = "task"  # the collector's name: ids read <task file>::task::validate


class TaskNode(pytest.Collector):
    """The task's own items, collected before its reference, baselines and candidates."""

    def __init__(self, *, task: Task, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.task = task

    def collect(self) -> list[pytest.Item]:
        return [ValidateItem.from_parent(self, name="validate")]


class ValidateItem(pytest.Item):
    """The task validated (module docstring); its verdict cached by the task's files."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_marker(pytest.mark.kscientist)

    def runtest(self) -> None:
        assert isinstance(self.parent, TaskNode)
        task = self.parent.task
        ks = self.config.stash[KS_SESSION]
        profile = task.profile(ks.profile)
        case = profile.tests[0]
        with ks.device_turn(self.nodeid):  # it runs kernels: the reference, trivial ones
            verdict = self._verdict(task, case, ks.device,
                                    (*profile.tests[1:], *profile.benchmarks))
        cached = " (cached)" if verdict.cached else ""
        lenient = ks.settings.lenient_task
        if verdict.error:
            outcome, message = "failed", f"task '{task.name}': {verdict.error}{cached}"
        elif verdict.holes:
            outcome = "warned" if lenient else "failed"
            message = (f"task '{task.name}' lets trivial kernels pass: "
                       f"{'; '.join(verdict.holes)}; tighten its check or fix its "
                       f"reference{cached}")
        elif not verdict.ran:
            outcome, message = "skipped", f"task '{task.name}': {verdict.notes[0]}"
        else:
            outcome, message = "passed", f"passed on case {verdict.case_id}{cached}"
        self.user_properties.append(("ks_task_validation", report_property({
            "task": task.name, "result": TaskValidation(
                outcome=outcome, case_id=verdict.case_id, holes=verdict.holes,
                notes=verdict.notes, error=verdict.error, cached=verdict.cached,
            ).model_dump(mode="json")})))
        if outcome == "failed":
            raise TaskSpecError(message)
        if outcome == "warned":
            self.warn(KsTaskHole(f"{message} (--ks-lenient-task: a warning, not a failure)"))
        if outcome == "skipped":
            pytest.skip(message)

    def _verdict(self, task: Task, case: Case, device: str,
                 others: tuple[Case, ...] = ()) -> Verdict:
        """The cached verdict when there is one (not with -p no:cacheprovider), else a new
        one, then cached unless the task's code failed (that may be passing trouble)."""
        cache = getattr(self.config, "cache", None)
        key = cache_key(task, case, device)
        if cache is not None:
            try:  # an entry this version cannot read is validated again
                return Verdict.model_validate({**cache.get(key, {}), "cached": True})
            except (ValidationError, TypeError):
                pass
        verdict = validate(task, case, device, others)
        if cache is not None and not verdict.error:
            cache.set(key, verdict.model_dump(mode="json"))
        return verdict

    def repr_failure(self, excinfo: Any, style: Any = None) -> Any:
        if isinstance(excinfo.value, TaskSpecError):
            return failure_repr(self, str(excinfo.value), self.path)
        return super().repr_failure(excinfo)

    def reportinfo(self) -> tuple[Any, int, str]:
        return self.path, 0, f"{NODE_NAME}::{self.name}"


def summary_line(result: TaskValidation | None) -> str:
    """The task's validation in the kscientist summary ("" when it did not run)."""
    if result is None:
        return ""
    cached = " (cached)" if result.cached else ""
    if result.outcome == "passed":
        line = f"task validation: passed on case {result.case_id}{cached}"
    elif result.outcome == "skipped":
        line = f"task validation: skipped ({result.notes[0] if result.notes else ''})"
    else:
        what = result.error or "; ".join(result.holes)
        how = "warned (--ks-lenient-task)" if result.outcome == "warned" else "FAILED"
        line = f"task validation: {how}: {what}{cached}"
    notes = [n for n in result.notes if result.outcome != "skipped"]
    return line + (f" [{'; '.join(notes)}]" if notes else "")
