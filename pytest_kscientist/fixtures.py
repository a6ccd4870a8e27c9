"""Public fixtures for users' own tests against a task (documented in the README).

- ``ks_load_task(path)`` -> ``Task``: load and validate a task folder (or its ``task.toml``),
  relative to the current directory.
- ``ks_evaluate(task, candidate, kind, case)`` -> ``CaseResult``: run one candidate file on one
  case in an isolated worker, judged exactly as the collected tests are (the candidate's
  failures come back as ``outcome == "failed"`` with the reason; a call that cannot mean
  anything, a kind other than "check"/"bench", a case without the task's keys or a candidate
  file that does not exist, raises ValueError or FileNotFoundError naming it).
- ``ks_device``: the device the session evaluates on ("cpu" or "cuda:N").
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Literal

import pytest

from pytest_kscientist.errors import CandidateFailure
from pytest_kscientist.formats.task import Case, Task, load_task
from pytest_kscientist.harness.results import CaseResult
from pytest_kscientist.harness.session import KS_SESSION


@pytest.fixture
def ks_device(request: pytest.FixtureRequest) -> str:
    """The device candidates run on in this session."""
    return request.config.stash[KS_SESSION].device


@pytest.fixture
def ks_load_task() -> Callable[[str | Path], Task]:
    """Load a task folder or its task.toml (TaskSpecError with the file and field on a bad
    spec)."""
    return lambda path: load_task(Path(path))


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
            return CaseResult(kind=kind, case=case, case_id=task.case_id(case), outcome="failed",
                              reason=exc.reason)
        finally:
            if worker is not None:
                worker.close()

    yield evaluate
