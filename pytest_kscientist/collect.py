"""Task folders -> pytest nodes: TaskFile (task.toml) -> CandidateNode -> CaseItem.

Test ids read ``tasks/fp8_gemm/task.toml::<candidate>::check[m64-n64-k128-s6635]`` (or
``bench[...]``), so ``-k`` selects by candidate, kind or case.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pytest_kscientist.errors import CandidateFailure, TaskSpecError
from pytest_kscientist.evaluate import file_sha256
from pytest_kscientist.session import KS_SESSION, REFERENCE_NAME, KsSession
from pytest_kscientist.task import Case, Task, load_task
from pytest_kscientist.worker import Worker, WorkerDied


class TaskFile(pytest.File):
    """A task's spec file; collects one node per candidate."""

    def collect(self) -> Any:
        ks = self.config.stash[KS_SESSION]
        try:
            task = load_task(self.path.parent)
            profile = task.profile(ks.profile)
        except TaskSpecError as exc:
            raise self.CollectError(str(exc)) from None
        ks.tasks[task.name] = task
        candidates = list(ks.settings.kernels) or task.seeds()
        if not candidates:
            raise self.CollectError(
                f"task '{task.name}': no candidates: {task.seeds_dir} holds no seed kernels and "
                "no --kernel was given; add a seed or pass --kernel PATH"
            )
        if profile.benchmarks:
            yield CandidateNode.from_parent(
                self, name=REFERENCE_NAME, task=task, source=task.reference, entry="ref_kernel",
                tests=[], benchmarks=profile.benchmarks,
            )
        for path in candidates:
            yield CandidateNode.from_parent(
                self, name=path.stem, task=task, source=path, entry="custom_kernel",
                tests=profile.tests, benchmarks=profile.benchmarks,
            )

    def repr_failure(self, excinfo: Any, style: Any = None) -> Any:
        if isinstance(excinfo.value, self.CollectError):
            return str(excinfo.value)
        return super().repr_failure(excinfo)


class CandidateNode(pytest.Collector):
    """One candidate file of one task; owns the candidate's worker process."""

    def __init__(self, *, task: Task, source: Path, entry: str, tests: list[Case],
                 benchmarks: list[Case], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.task = task
        self.source = source
        self.entry = entry
        self.tests = tests
        self.benchmarks = benchmarks
        self.sha256 = file_sha256(source)
        self.worker: Worker | None = None
        self.load_failure: CandidateFailure | None = None

    def collect(self) -> Any:
        for case in self.tests:
            yield CaseItem.from_parent(self, name=f"check[{self.task.case_id(case)}]",
                                       kind="check", case=case)
        for case in self.benchmarks:
            yield CaseItem.from_parent(self, name=f"bench[{self.task.case_id(case)}]",
                                       kind="bench", case=case)

    @property
    def ks(self) -> KsSession:
        return self.config.stash[KS_SESSION]

    def live_worker(self) -> Worker:
        """The candidate's worker, spawned and loaded on first use or after a failure."""
        if self.load_failure is not None:
            raise self.load_failure
        if self.worker is not None and self.worker.alive():
            return self.worker
        try:
            self.worker = Worker(self.task.reference, self.ks.device,
                                 self.task.spec.output_index, self.ks.settings.timeout_s)
            header, _ = self.worker.request("load", timeout=self.ks.settings.timeout_s * 5,
                                            path=str(self.source), entry=self.entry)
        except WorkerDied as exc:
            self.load_failure = CandidateFailure(f"failed to load: {exc.reason}", exc.log_tail)
            raise self.load_failure from None
        if not header.get("ok"):
            self.load_failure = CandidateFailure(
                f"failed to load: {header.get('reason')}", str(header.get("detail", ""))
            )
            self.drop_worker()
            raise self.load_failure
        return self.worker

    def drop_worker(self) -> None:
        if self.worker is not None:
            self.worker.close()
            self.worker = None

    def teardown(self) -> None:
        self.drop_worker()


class CaseItem(pytest.Item):
    """A correctness check or a benchmark of one candidate on one case."""

    def __init__(self, *, kind: str, case: Case, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.kind = kind
        self.case = case
        self.add_marker(pytest.mark.kscientist)

    @property
    def candidate(self) -> CandidateNode:
        assert isinstance(self.parent, CandidateNode)
        return self.parent

    def runtest(self) -> None:
        cand = self.candidate
        ks = cand.ks
        evaluator = ks.evaluator(cand.task)
        case_id = cand.task.case_id(self.case)
        try:
            worker = cand.live_worker()
            if self.kind == "check":
                result = evaluator.check(worker, self.case)
            else:
                result = evaluator.bench(worker, self.case, ks.device_name,
                                         ks.bench_budget(cand.task))
        except (CandidateFailure, WorkerDied) as exc:
            # A worker that failed once may hold a sticky device error: start afresh next time.
            cand.drop_worker()
            failure = exc if isinstance(exc, CandidateFailure) else CandidateFailure(
                exc.reason, exc.log_tail)
            if isinstance(exc, WorkerDied) and exc.hung:
                # Each further case would wait out the whole timeout again: fail them at once.
                cand.load_failure = CandidateFailure(
                    f"not run: the candidate hung on {self.kind} {case_id} and was killed")
            self._publish(kind=self.kind, case=self.case, case_id=case_id, outcome="failed",
                          reason=failure.reason, detail=failure.detail[-4000:])
            raise failure from None
        self._publish(**result.model_dump())

    def _publish(self, **fields: Any) -> None:
        cand = self.candidate
        self.user_properties.append(("ks_case", {
            "task": cand.task.name, "candidate": cand.name, "path": str(cand.source),
            "sha256": cand.sha256, "result": fields,
        }))

    def repr_failure(self, excinfo: Any, style: Any = None) -> Any:
        exc = excinfo.value
        if isinstance(exc, CandidateFailure):
            head = f"{self.candidate.name} {self.kind} {self.candidate.task.case_id(self.case)}: "
            text = head + exc.reason
            if exc.detail and exc.detail != exc.reason:
                text += "\n\n" + exc.detail.rstrip()
            return text
        return super().repr_failure(excinfo)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, f"{self.candidate.name}::{self.name}"
