"""Evaluating candidates for ``--evolve``: a child pytest session of the task, one per generation.

The child is ``python -m pytest <task> --kernel c0004.py ... --ks-json <file>``: the same harness,
isolation and verdicts as a hand-run session. Its output goes to a log file next to its JSON.
It dies with its parent (a lifeline, ``harness/lifeline.py``; its workers die with it in turn), and
its start is reported to ``on_session_start``'s callback (``orphans.py``: what a resumed run
checks).
With ``--ks-devices``, ``ParallelSessions`` splits a generation over one child session per device,
run at once with one salt. Tests inject another ``GenerationEvaluator`` through
``config.stash[EVALUATOR_KEY]``.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

import pytest
from pydantic import ValidationError

from pytest_kscientist.evolve.orphans import SessionStarted
from pytest_kscientist.evolve.population import EvaluationRecord, now
from pytest_kscientist.harness.lifeline import Lifeline
from pytest_kscientist.harness.results import CandidateResult, RunResults
from pytest_kscientist.options import resolve

# Flags of the parent run that state facts about how to evaluate, passed on to each child.
PASS_THROUGH = {
    "ks_profile": "--ks-profile",
    "ks_salt": "--ks-salt",
    "ks_device": "--ks-device",
    "ks_timeout": "--ks-timeout",
    "ks_bench_budget": "--ks-bench-budget",
    "ks_bench_workers": "--ks-bench-workers",
    "ks_baselines": "--ks-baselines",
    "ks_drawn": "--ks-drawn",
    "ks_kernelbench_tol": "--ks-kernelbench-tol",
}
GRACE_S = 10.0
# A child session whose log has not grown for this long is stopped as hung: its workers each
# answer within --ks-timeout (a load within five of it, a build included), so a child that
# says nothing for six of them and five minutes more is stuck in its own process (a wedged
# device under the reference, say); without --ks-time-limit the run waited for it forever.
QUIET_TIMEOUTS, QUIET_MARGIN_S = 6, 300.0
POLL_S = 2.0
CHILD_EXIT = "pytest_kscientist.evolve.child_exit"  # records how a child session ended
NO_HYPOTHESIS_PLUGIN = ("-p", "no:hypothesispytest")


class EvaluationError(Exception):
    """A child session ended without results (usage error, crash, timeout)."""

    def __init__(self, message: str, code: int = int(pytest.ExitCode.INTERNAL_ERROR)) -> None:
        super().__init__(message)
        self.code = code


class GenerationEvaluator(Protocol):
    def evaluate(self, kernels: list[Path], timeout_s: float | None,
                 beside: tuple[Path, ...] = ()) -> RunResults:
        """Evaluate the kernel files (named by file stem), each timed interleaved with the
        ``beside`` files (earlier members, speedups keyed by their stems); raise
        EvaluationError if impossible."""
        ...


EVALUATOR_KEY = pytest.StashKey[GenerationEvaluator]()


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
    skipped = [c for c in result.cases if c.outcome == "skipped"]
    not_run = getattr(result, "not_run", "") or (
        skipped[0].reason if result.cases and len(skipped) == len(result.cases) else "")
    if not_run and not failed:
        # Not run on this device (its KS_REQUIRES): not a failure of the kernel.
        return record.model_copy(update={"status": "skipped", "result": result,
                                         "failure": f"not run here: {not_run}"})
    if failed:
        first = failed[0]
        failure = f"{first.kind} {first.case_id}: {first.reason}"
        if len(failed) > 1:
            failure += f" (and {len(failed) - 1} more failed case(s))"
    elif result.geomean_us is None:
        why = f"; skipped: {skipped[0].reason}" if skipped else ""
        failure = f"no geomean: not every benchmark was timed{why}"
    return record.model_copy(
        update={
            "status": "failed" if failure else "passed",
            "geomean_us": None if failure else result.geomean_us,
            "bench_median_us": bench,
            "speedups": dict(getattr(result, "speedups", {}) or {}),
            "speedup_intervals": dict(getattr(result, "speedup_intervals", {}) or {}),
            "failure": failure,
            "result": result,
        }
    )


def machine_stop(failures: list[str], log_path: Path) -> str:
    """Why a generation is not recorded: its session's workers did not start (the machine's
    failure, spawn.MachineFailed), so its kernels were not judged; a resumed run evaluates
    them again."""
    more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
    return (f"the machine failed in the child session, so its kernels were not recorded: a "
            f"worker did not start, before any candidate code ran: {failures[0]}{more}; free "
            f"the device or fix the machine, then run the same command again to evaluate them "
            f"(log {log_path})")


class ChildSession:
    """Runs the task's test suite on the candidates in a fresh ``python -m pytest`` process.

    ``task_dir`` is what the child collects: a native task's folder, or the problem's own file
    (a GPU MODE ``task.yml``, a KernelBench problem ``.py``)."""

    def __init__(
        self, task_dir: Path, log_dir: Path, args: list[str], cwd: Path | None = None,
        tag: str = "", benchmarks: Sequence[tuple[str, Mapping[str, Any]]] = (),
    ) -> None:
        self.task_dir = task_dir
        self.log_dir = log_dir
        self.args = args
        self.cwd = cwd
        self.tag = tag  # in the log's name, to tell parallel sessions apart
        # (case id, case) of every benchmark of the task's profiles: where a knob move runs
        # its parent's code (same_as_entries)
        self.benchmarks = tuple(benchmarks)
        self.proc: subprocess.Popen[bytes] | None = None
        self.on_start: Callable[[SessionStarted], None] | None = None
        self.quiet_s: float | None = None  # stopped as hung after this long without output

    def on_session_start(self, callback: Callable[[SessionStarted], None]) -> None:
        """Call ``callback`` with each child session's process once it has started."""
        self.on_start = callback

    def label(self, count: int) -> str:
        return "a child pytest session"

    @classmethod
    def for_config(cls, config: pytest.Config, task_dir: Path, log_dir: Path,
                   benchmarks: Sequence[tuple[str, Mapping[str, Any]]] = ()) -> ChildSession:
        """A child session that sees the same ini file, rootdir, plugins and harness flags."""
        args = ["-q", "-p", "no:cacheprovider", "-p", CHILD_EXIT, "--rootdir",
                str(config.rootpath)]
        if config.inipath is not None:
            args += ["-c", str(config.inipath)]
        args += _plugin_args(config.invocation_params.args)
        for dest, flag in PASS_THROUGH.items():
            value = config.getoption(dest, default=None)
            if value is not None:
                args += [flag, str(value)]
        if config.getoption("ks_bench_workers", default=None) is None and str(
                config.getini("ks_bench_workers") or "").strip() in ("", "auto"):
            # auto would time a generation's children and their parent in a worker a round
            # (4 on a GPU), doubling its bench time (issue 32); the loop confirms a child's
            # move beside its parent over generations instead (links.py). Asked for: as given.
            args += ["--ks-bench-workers", "1"]
        # The loop ranks candidates among themselves: timing the reference again in every
        # generation would only cost time (18 benchmarks of the slowest kernel on a GPU).
        args.append("--ks-skip-reference")
        if config.getoption("ks_baselines", default=None) is None:
            # Interleaved baselines triple a generation's bench time on a GPU (each side gets
            # the budget) and the loop ranks on geomean: time them only when asked for.
            args += ["--ks-baselines", "none"]
        child = cls(task_dir, log_dir, args, cwd=config.invocation_params.dir,
                    benchmarks=benchmarks)
        child.quiet_s = QUIET_TIMEOUTS * resolve(config).timeout_s + QUIET_MARGIN_S
        return child

    def evaluate(self, kernels: list[Path], timeout_s: float | None,
                 beside: tuple[Path, ...] = (), extra: tuple[str, ...] = ()) -> RunResults:
        """Run the child session; return its results or raise EvaluationError."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%f")
        tag = f"-{self.tag.replace(':', '')}" if self.tag else ""
        json_path = self.log_dir / f"{stamp}-{os.getpid()}{tag}.json"
        log_path = json_path.with_suffix(".log")
        # Hypothesis's pytest plugin imports all of hypothesis at every session's end (0.5-0.9 s
        # on a 2-core CPU, 6.155); a child session collects a task folder, never a @given test.
        cmd = [sys.executable, "-m", "pytest", *NO_HYPOTHESIS_PLUGIN, str(self.task_dir),
               *self.args, *extra]
        for kernel in kernels:
            cmd += ["--kernel", str(kernel)]
        for kernel in beside:
            cmd += ["--ks-beside", str(kernel)]
        same = same_as_entries(kernels, beside, self.benchmarks)
        if same:
            same_path = json_path.with_suffix(".same.json")
            same_path.write_text(json.dumps(same, indent=1), encoding="utf-8")
            cmd += ["--ks-same-as", str(same_path)]
        cmd += ["--ks-json", str(json_path)]
        lifeline = Lifeline()
        with open(log_path, "w", encoding="utf-8") as log:
            log.write(" ".join(cmd) + "\n\n")
            log.flush()
            # Only the child itself dies with this process: it shares this process's group,
            # whose other members (a calling script, say) are none of this run's business.
            try:
                proc = self.proc = subprocess.Popen(
                    lifeline.command(cmd, group=False), stdout=log, stderr=subprocess.STDOUT,
                    cwd=self.cwd, pass_fds=(lifeline.read_fd,),
                    env={**os.environ, "PYTHONUNBUFFERED": "1"},  # its log shows it is alive
                )
            except BaseException:
                lifeline.cut()
                raise
            finally:
                lifeline.started()
            try:
                if self.on_start is not None:
                    self.on_start(SessionStarted(proc.pid, json_path,
                                                 tuple(k.stem for k in kernels)))
                code = wait_speaking(proc, log_path, timeout_s, self.quiet_s)
            except subprocess.TimeoutExpired:
                _stop(proc)
                raise EvaluationError(
                    f"time limit reached while evaluating (child session stopped; log {log_path})",
                    code=0,
                ) from None
            except Silent as silent:
                _stop(proc)
                raise EvaluationError(
                    f"child pytest session{' ' + self.tag if self.tag else ''} printed nothing for "
                    f"{silent.quiet_s:.0f} s and was stopped as hung (its workers answer within "
                    f"--ks-timeout; a "
                    f"longer --ks-timeout allows longer silences); last lines of {log_path}:\n  "
                    + "\n  ".join(_tail(log_path))) from None
            except BaseException:
                _stop(proc)
                raise
            finally:
                lifeline.cut()
        if code not in (0, 1) or not json_path.exists():
            raise EvaluationError(
                f"child pytest session exited with code {code} without results; last lines of "
                f"{log_path}:\n  " + "\n  ".join(_tail(log_path))
            )
        try:
            run = RunResults.model_validate_json(json_path.read_text(encoding="utf-8"))
        except (OSError, ValidationError) as exc:
            raise EvaluationError(f"{json_path}: unreadable session results ({exc})") from None
        if run.machine_failures:
            raise EvaluationError(machine_stop(run.machine_failures, log_path))
        return run


class ParallelSessions:
    """One child session per device, run at once; a generation's kernels dealt out among them.

    All of them get the same salt (drawn here unless ``--ks-salt`` was given), so the merged
    results read as one session's. If any session fails, the first error is raised once all
    have ended (the loop re-evaluates the generation on resume).
    """

    def __init__(self, sessions: list[ChildSession], salt_given: bool) -> None:
        if not sessions:
            raise ValueError("ParallelSessions needs at least one session")
        self.sessions = sessions
        self.salt_given = salt_given

    @classmethod
    def for_config(cls, config: pytest.Config, task_dir: Path, log_dir: Path,
                   devices: tuple[str, ...],
                   benchmarks: Sequence[tuple[str, Mapping[str, Any]]] = ()) -> ParallelSessions:
        base = ChildSession.for_config(config, task_dir, log_dir)
        sessions = [
            ChildSession(task_dir, log_dir, [*base.args, "--ks-device", device], cwd=base.cwd,
                         tag=f"{device}-{i}" if device == "cpu" else device,
                         benchmarks=benchmarks)
            for i, device in enumerate(devices)
        ]
        for session in sessions:
            session.quiet_s = base.quiet_s
        return cls(sessions, salt_given=config.getoption("ks_salt", default=None) is not None)

    def on_session_start(self, callback: Callable[[SessionStarted], None]) -> None:
        """Call ``callback`` with each child session's process once it has started (from the
        thread that runs that session)."""
        for session in self.sessions:
            session.on_session_start(callback)

    def _used(self, count: int) -> list[ChildSession]:
        return self.sessions[: max(1, min(count, len(self.sessions)))]

    def label(self, count: int) -> str:
        used = self._used(count)
        if len(used) == 1:
            return f"a child pytest session ({used[0].tag})"
        return f"{len(used)} child pytest sessions at once ({', '.join(s.tag for s in used)})"

    def evaluate(self, kernels: list[Path], timeout_s: float | None,
                 beside: tuple[Path, ...] = ()) -> RunResults:
        used = self._used(len(kernels))
        groups = [kernels[i :: len(used)] for i in range(len(used))]
        extra = () if self.salt_given else ("--ks-salt", str(secrets.randbits(32)))
        outcomes: list[RunResults | BaseException | None] = [None] * len(used)

        def run(i: int) -> None:
            try:
                outcomes[i] = used[i].evaluate(groups[i], timeout_s, beside, extra)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller below
                outcomes[i] = exc

        threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(used))]
        for thread in threads:
            thread.start()
        try:
            for thread in threads:
                thread.join()
        except BaseException:
            # Ctrl-C lands in this thread only: stop every child like the terminal would.
            for session in used:
                if session.proc is not None:
                    _stop(session.proc)
            for thread in threads:
                thread.join(timeout=GRACE_S)
            raise
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        runs = [o for o in outcomes if isinstance(o, RunResults)]
        merged = [c for r in runs for c in r.candidates]
        # The sessions ran at once: the generation's time is the slowest one's, so its items'
        # seconds are the ones that say where that time went.
        slowest = max(runs, key=lambda r: sum(r.item_seconds.values()))
        return runs[0].model_copy(update={"candidates": merged,
                                          "item_seconds": slowest.item_seconds})


def same_as_entries(kernels: Sequence[Path], beside: Sequence[Path],
                    benchmarks: Sequence[tuple[str, Mapping[str, Any]]]) -> dict[str, Any]:
    """``--ks-same-as``'s entries: for each kernel that runs the code of a kernel timed beside
    it (its parent, for a knob move or a graft: ``links.same_code``) on some benchmarks, the
    one it shares the most with and those benchmarks' case ids. Timing a child there again
    measures its parent's code twice (a generation of three knob moves: about half its bench
    items' time, notes/timing.md)."""
    if not benchmarks or not beside:
        return {}
    from pytest_kscientist.evolve.offline.links import same_code

    sources = {p: p.read_text(encoding="utf-8", errors="replace") for p in (*kernels, *beside)}
    shapes = [case for _, case in benchmarks]
    out: dict[str, Any] = {}
    for kernel in kernels:
        best: list[str] = []
        for other in beside:
            same = same_code(sources[kernel], sources[other], shapes) or []
            ids = [case_id for (case_id, _), kept in zip(benchmarks, same, strict=False) if kept]
            if len(ids) > len(best) and other.stem != kernel.stem:
                best, out[kernel.stem] = ids, {"as": other.stem, "cases": ids}
    return out


class Silent(Exception):
    """A child session's log did not grow for ``quiet_s`` seconds."""

    def __init__(self, quiet_s: float) -> None:
        super().__init__(f"silent for {quiet_s:.0f} s")
        self.quiet_s = quiet_s


def wait_speaking(proc: subprocess.Popen[bytes], log_path: Path, timeout_s: float | None,
                  quiet_s: float | None) -> int:
    """``proc``'s exit code once it ends: TimeoutExpired past ``timeout_s``, Silent once its log
    at ``log_path`` has not grown for ``quiet_s`` (None: no such limit)."""
    end = None if timeout_s is None else time.monotonic() + timeout_s
    size, heard = -1, time.monotonic()
    while True:
        step = POLL_S if end is None else max(0.0, min(POLL_S, end - time.monotonic()))
        try:
            return proc.wait(timeout=step)
        except subprocess.TimeoutExpired:
            if end is not None and time.monotonic() >= end:
                raise
        try:
            grown = log_path.stat().st_size
        except OSError:
            grown = size
        if grown != size:
            size, heard = grown, time.monotonic()
        elif quiet_s is not None and time.monotonic() - heard > quiet_s:
            raise Silent(quiet_s)


def _tail(log_path: Path, lines: int = 8) -> list[str]:
    return log_path.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-lines:]


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
