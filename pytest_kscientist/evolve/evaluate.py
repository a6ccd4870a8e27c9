"""Evaluating candidates for ``--evolve``: a child pytest session of the task, one per generation.

The child is ``python -m pytest <task> --kernel c0004.py ... --ks-json <file>``: the same harness,
isolation and verdicts as a hand-run session. Its output goes to a log file next to its JSON.
Tests inject another ``Evaluator`` through ``config.stash[EVALUATOR_KEY]``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Protocol

import pytest
from pydantic import ValidationError

from pytest_kscientist.evolve.population import EvaluationRecord, now
from pytest_kscientist.results import CandidateResult, RunResults

# Flags of the parent run that state facts about how to evaluate, passed on to each child.
PASS_THROUGH = {
    "ks_profile": "--ks-profile",
    "ks_salt": "--ks-salt",
    "ks_device": "--ks-device",
    "ks_timeout": "--ks-timeout",
    "ks_bench_budget": "--ks-bench-budget",
    "ks_baselines": "--ks-baselines",
}
GRACE_S = 10.0


class EvaluationError(Exception):
    """A child session ended without results (usage error, crash, timeout)."""

    def __init__(self, message: str, code: int = int(pytest.ExitCode.INTERNAL_ERROR)) -> None:
        super().__init__(message)
        self.code = code


class Evaluator(Protocol):
    def evaluate(self, kernels: list[Path], timeout_s: float | None) -> RunResults:
        """Evaluate the kernel files (named by file stem); raise EvaluationError if impossible."""
        ...


EVALUATOR_KEY = pytest.StashKey[Evaluator]()


def to_record(
    cid: str, result: CandidateResult | None, run: RunResults, run_id: str
) -> EvaluationRecord:
    """The population's record of one candidate's result in a session."""
    record = EvaluationRecord(
        id=cid,
        evaluated_at=now(),
        run_id=run_id,
        profile=run.profile,
        salt=run.salt,
        machine=run.machine,
        status="failed",
        failure="the child session reported no result for it",
    )
    if result is None:
        return record
    failed = [c for c in result.cases if c.outcome == "failed"]
    bench = {
        c.case_id: c.stats.median_us
        for c in result.cases
        if c.kind == "bench" and c.outcome == "passed" and c.stats is not None
    }
    failure = ""
    if failed:
        first = failed[0]
        failure = f"{first.kind} {first.case_id}: {first.reason}"
        if len(failed) > 1:
            failure += f" (and {len(failed) - 1} more failed case(s))"
    elif result.geomean_us is None:
        skipped = [c for c in result.cases if c.outcome == "skipped"]
        why = f"; skipped: {skipped[0].reason}" if skipped else ""
        failure = f"no geomean: not every benchmark was timed{why}"
    return record.model_copy(
        update={
            "status": "failed" if failure else "passed",
            "geomean_us": None if failure else result.geomean_us,
            "bench_median_us": bench,
            "speedups": dict(getattr(result, "speedups", {}) or {}),
            "failure": failure,
            "result": result,
        }
    )


class ChildSession:
    """Runs the task's test suite on the candidates in a fresh ``python -m pytest`` process."""

    def __init__(
        self, task_dir: Path, log_dir: Path, args: list[str], cwd: Path | None = None
    ) -> None:
        self.task_dir = task_dir
        self.log_dir = log_dir
        self.args = args
        self.cwd = cwd

    @classmethod
    def for_config(cls, config: pytest.Config, task_dir: Path, log_dir: Path) -> ChildSession:
        """A child session that sees the same ini file, rootdir, plugins and harness flags."""
        args = ["-q", "-p", "no:cacheprovider", "--rootdir", str(config.rootpath)]
        if config.inipath is not None:
            args += ["-c", str(config.inipath)]
        args += _plugin_args(config.invocation_params.args)
        for dest, flag in PASS_THROUGH.items():
            value = config.getoption(dest, default=None)
            if value is not None:
                args += [flag, str(value)]
        # The loop ranks candidates among themselves: timing the reference again in every
        # generation would only cost time (18 benchmarks of the slowest kernel on a GPU).
        args.append("--ks-skip-reference")
        if config.getoption("ks_baselines", default=None) is None:
            # Interleaved baselines triple a generation's bench time on a GPU (each side gets
            # the budget) and the loop ranks on geomean: time them only when asked for.
            args += ["--ks-baselines", "none"]
        return cls(task_dir, log_dir, args, cwd=config.invocation_params.dir)

    def evaluate(self, kernels: list[Path], timeout_s: float | None) -> RunResults:
        """Run the child session; return its results or raise EvaluationError."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%f")
        json_path = self.log_dir / f"{stamp}-{os.getpid()}.json"
        log_path = json_path.with_suffix(".log")
        cmd = [sys.executable, "-m", "pytest", str(self.task_dir), *self.args]
        for kernel in kernels:
            cmd += ["--kernel", str(kernel)]
        cmd += ["--ks-json", str(json_path)]
        with open(log_path, "w", encoding="utf-8") as log:
            log.write(" ".join(cmd) + "\n\n")
            log.flush()
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=self.cwd)
            try:
                code = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                _stop(proc)
                raise EvaluationError(
                    f"time limit reached while evaluating (child session stopped; log {log_path})",
                    code=0,
                ) from None
            except BaseException:
                _stop(proc)
                raise
        if code not in (0, 1) or not json_path.exists():
            tail = log_path.read_text(encoding="utf-8", errors="replace").strip().splitlines()
            raise EvaluationError(
                f"child pytest session exited with code {code} without results; last lines of "
                f"{log_path}:\n  " + "\n  ".join(tail[-8:])
            )
        try:
            return RunResults.model_validate_json(json_path.read_text(encoding="utf-8"))
        except (OSError, ValidationError) as exc:
            raise EvaluationError(f"{json_path}: unreadable session results ({exc})") from None


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Interrupt the child like Ctrl-C would, then kill it if it lingers."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _plugin_args(args: tuple[str, ...] | list[str]) -> list[str]:
    """The ``-p NAME`` options of the parent's command line (how the plugins got loaded)."""
    out, it = [], iter(args)
    for arg in it:
        if arg == "-p":
            name = next(it, None)
            if name is not None and name != "no:cacheprovider":
                out += ["-p", name]
        elif arg.startswith("-p") and len(arg) > 2 and arg[2:] != "no:cacheprovider":
            out += ["-p", arg[2:]]
    return out
