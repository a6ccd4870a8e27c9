"""Public fixtures for users' own tests against a task (documented in the README).

- ``ks_load_task(path)`` -> ``Task``: load and validate a task as collection does: a folder
  holding ``task.toml`` or a GPU MODE ``task.yml``, either file, or a KernelBench problem file
  (a relative path from the current directory).
- ``ks_evaluate(task, candidate, kind, case)`` -> ``CaseResult``: run one candidate file on one
  case in an isolated worker, judged exactly as the collected tests are (the candidate's
  failures come back as ``outcome == "failed"`` with the reason, a candidate this device
  cannot run (its ``KS_REQUIRES``) as ``"skipped"`` with why; a call that cannot mean
  anything, a kind other than "check"/"bench", a case without the task's keys or a candidate
  file that does not exist, raises ValueError or FileNotFoundError naming it).
- ``ks_device``: the device the session evaluates on ("cpu" or "cuda:N").
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Literal

import pytest

from pytest_kscientist.errors import CandidateFailure, TaskSpecError
from pytest_kscientist.formats.task import SPEC_NAME, Case, Task, load_task
from pytest_kscientist.harness.results import CaseResult
from pytest_kscientist.harness.session import KS_SESSION


@pytest.fixture
def ks_device(request: pytest.FixtureRequest) -> str:
    """The device candidates run on in this session."""
    return request.config.stash[KS_SESSION].device


@pytest.fixture
def ks_load_task(request: pytest.FixtureRequest) -> Callable[[str | Path], Task]:
    """Load a task folder (task.toml, GPU MODE task.yml), either file, or a KernelBench problem
    file (TaskSpecError with the file and field on a bad spec)."""
    tolerance = request.config.stash[KS_SESSION].settings.kernelbench_tol
    return lambda path: _load(Path(os.path.abspath(path)), tolerance)


def _load(path: Path, kernelbench_tol: float) -> Task:
    """The task at ``path``, of whichever format collection would claim it as."""
    from pytest_kscientist.formats import gpumode
    from pytest_kscientist.harness.collect import load_any
    from pytest_kscientist.plugin import claims

    if path.is_dir() and not (path / SPEC_NAME).exists():
        path = path / gpumode.YML_NAME  # a GPU MODE folder, else load_task names what lacks
    if path.is_file() and path.name != SPEC_NAME:  # task.toml: load_task reads it, or says why
        if claims(path):
            return load_any(path, kernelbench_tol)
        raise TaskSpecError(
            f"ks_load_task: {path} is none of the tasks collection claims: a folder holding "
            f"{SPEC_NAME} or a GPU MODE {gpumode.YML_NAME}, either file, or a KernelBench "
            "problem file (Model, get_inputs and get_init_inputs at top level); pass one")
    return load_task(path.parent if path.name == gpumode.YML_NAME else path)


@pytest.fixture
def ks_evaluate(request: pytest.FixtureRequest) -> Iterator[Callable[..., CaseResult]]:
    """Evaluate a candidate file on one case, in a fresh isolated worker per call."""
    ks = request.config.stash[KS_SESSION]

    def evaluate(
        task: Task, candidate: str | Path, kind: Literal["check", "bench"], case: Case
    ) -> CaseResult:
        from pytest_kscientist.harness.baselines import start_worker

        if kind not in ("check", "bench"):
            raise ValueError(f"ks_evaluate: kind must be 'check' or 'bench', got {kind!r}")
        missing = [key for key in task.spec.case_keys if key not in case]
        if missing:
            raise ValueError(f"ks_evaluate: the case {case!r} lacks {', '.join(missing)}; task "
                             f"'{task.name}' cases have the keys {task.spec.case_keys}")
        if not Path(candidate).is_file():
            raise FileNotFoundError(f"ks_evaluate: no candidate file at {candidate}; pass the "
                                    "path of a .py file exposing custom_kernel(data)")
        from pytest_kscientist.harness.collect import candidate_unmet

        case_id = task.case_id(case)
        # As its collected items: skipped where this device cannot run it (its KS_REQUIRES),
        # failed when that declaration is itself wrong; a GPU-only kernel ran on the CPU.
        unmet, declared = candidate_unmet(Path(candidate), ks.device)
        if unmet or declared:
            return CaseResult(kind=kind, case=case, case_id=case_id,
                              outcome="skipped" if unmet else "failed", reason=unmet or declared)
        evaluator = ks.evaluator(task)
        worker = None
        try:
            worker = start_worker(task, Path(candidate).resolve(), task.entry, None,
                                  ks.device, ks.settings.timeout_s, evaluator.init_seed)
            if kind == "check":
                return evaluator.check(worker, case)
            ks.wait_for_starts()  # no collected candidate's build beside a timed call
            return evaluator.bench(worker, case, ks.device_name, ks.bench_budget(task))
        except CandidateFailure as exc:
            return CaseResult(kind=kind, case=case, case_id=case_id, outcome="failed",
                              reason=exc.reason)
        finally:
            if worker is not None:
                worker.close()

    yield evaluate
