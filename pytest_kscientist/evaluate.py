"""Verdicts in the pytest process: ask a worker to run a case, then judge what came back.

The reference is computed here, from inputs regenerated with the same seed on the same device,
so the reference output never exists in the candidate's process.
"""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path
from typing import Any

from pytest_kscientist.correctness import compare
from pytest_kscientist.errors import CandidateFailure
from pytest_kscientist.results import CaseResult
from pytest_kscientist.stats import summarize
from pytest_kscientist.task import Case, Task
from pytest_kscientist.worker import Worker, WorkerDied


def derive_seed(seed: int, salt: int, index: int) -> int:
    """Mix a public case seed with the session's secret salt and a call index."""
    digest = hashlib.sha256(f"{seed}/{salt}/{index}".encode()).digest()
    return int.from_bytes(digest[:7], "big")


def load_reference(task: Task) -> Any:
    spec = importlib.util.spec_from_file_location(f"_ks_reference_{task.name}", task.reference)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name in ("generate_input", "ref_kernel"):
        if not callable(getattr(module, name, None)):
            raise CandidateFailure(
                f"task '{task.name}': {task.reference} defines no {name}(); "
                "a reference needs generate_input(**case) and ref_kernel(data)"
            )
    return module


def _tensor_from(meta: dict[str, Any], payload: bytes) -> Any:
    import torch

    dtype = getattr(torch, str(meta.get("dtype")), None)
    if not isinstance(dtype, torch.dtype):
        raise CandidateFailure(f"output has unknown dtype {meta.get('dtype')!r}")
    shape = [int(s) for s in meta["shape"]]
    if not payload:
        return torch.empty(shape, dtype=dtype)
    flat = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    if flat.numel() % dtype.itemsize:
        raise CandidateFailure(f"output payload of {flat.numel()} bytes does not fit {dtype}")
    return flat.view(dtype).reshape(shape)


class Evaluator:
    """Judges one task's cases for any worker, with the session's salt and device."""

    def __init__(self, task: Task, device: str, salt: int) -> None:
        self.task = task
        self.device = device
        self.salt = salt
        self._ref: Any = None

    @property
    def reference(self) -> Any:
        if self._ref is None:
            self._ref = load_reference(self.task)
        return self._ref

    def expected(self, case: Case, seed: int) -> Any:
        data = self.reference.generate_input(**dict(case, seed=seed), device=self.device)
        return self.reference.ref_kernel(data).cpu()

    def floor_us(self, case: Case, device_name: str) -> float | None:
        work = getattr(self.reference, "work", None)
        floor = self.task.floor_for(device_name)
        if work is None or floor is None:
            return None
        need = work(**case)
        return 1e6 * max(
            need.get("flops", 0.0) / (floor.peak_tflops * 1e12),
            need.get("bytes", 0.0) / (floor.peak_tbps * 1e12),
        )

    def _judge(self, case: Case, seed: int, meta: dict[str, Any], payload: bytes) -> None:
        if len(payload) != int(meta.get("nbytes", -1)):
            raise CandidateFailure(
                f"output payload is {len(payload)} bytes, header says {meta.get('nbytes')}"
            )
        out = _tensor_from(meta, payload)
        problem = compare(out, self.expected(case, seed), self.task.spec.check.atol,
                          self.task.spec.check.rtol)
        if problem:
            raise CandidateFailure(f"wrong result: {problem.split('; first:')[0]}", problem)

    def check(self, worker: Worker, case: Case) -> CaseResult:
        seed = derive_seed(case["seed"], self.salt, 0)
        header, payload = _ask(worker, "check", case=case, seed=seed)
        self._judge(case, seed, header["output"], payload)
        return CaseResult(kind="check", case=case, case_id=self.task.case_id(case),
                          outcome="passed")

    def bench(self, worker: Worker, case: Case, device_name: str, budget_s: float) -> CaseResult:
        spec = self.task.spec.bench
        seeds = [derive_seed(case["seed"], self.salt, i + 1) for i in range(spec.max_runs)]
        warmup = [derive_seed(case["seed"], self.salt, -1 - i) for i in range(spec.warmup)]
        header, payload = _ask(
            worker, "bench", timeout=worker.timeout + 2 * budget_s, case=case, seeds=seeds,
            warmup_seeds=warmup, min_runs=spec.min_runs, budget_s=budget_s,
            sample=spec.verify_samples,
        )
        times = [float(t) for t in header["times_us"]]
        samples = header["samples"]
        if not times or not samples:
            raise CandidateFailure("benchmark came back with no timed or sampled calls")
        offset = 0
        for meta in samples:
            index = int(meta["index"])
            if seeds[index] != meta.get("seed"):
                raise CandidateFailure(f"sampled call {index} came back with a foreign seed")
            chunk = payload[offset : offset + int(meta["nbytes"])]
            offset += int(meta["nbytes"])
            try:
                self._judge(case, seeds[index], meta, chunk)
            except CandidateFailure as exc:
                raise CandidateFailure(f"timed call {index}: {exc.reason}", exc.detail) from None
        clock = "cuda-events" if self.device.startswith("cuda") else "perf_counter_ns"
        stats = summarize(times, verified_runs=len(samples), clock=clock)
        floor = self.floor_us(case, device_name)
        result = CaseResult(kind="bench", case=case, case_id=self.task.case_id(case),
                            outcome="passed", stats=stats, floor_us=floor)
        if floor is not None and stats.min_us < floor:
            raise CandidateFailure(
                f"impossible time: fastest call {stats.min_us:.3f} us is below the physical "
                f"floor {floor:.3f} us for {device_name}; the timing was tampered with or the "
                "work was not done"
            )
        return result


def _ask(worker: Worker, op: str, timeout: float | None = None, **fields: Any) -> tuple[dict[str, Any], bytes]:
    header, payload = worker.request(op, timeout=timeout, **fields)
    if not header.get("ok"):
        raise CandidateFailure(str(header.get("reason", "failed")), str(header.get("detail", "")))
    return header, payload


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


__all__ = ["Evaluator", "WorkerDied", "derive_seed", "file_sha256"]
