"""Child sessions a killed run left behind (issue 31): stopped before a resumed run times
anything beside them, and adopted when they finished.

Each child session's start is logged (``session_start``: its pid and start time, its results
file, its candidates) under the population's lock before it runs anything. A run that resumes
looks at the sessions of runs that are over (not live, not its own) whose candidates are still
pending: one still running is killed with its workers (the lifeline, ``harness/lifeline.py``,
normally does that first, within milliseconds of its parent's death); one that finished, whose
results file exists and whose recorded exit status says it ran to its end (``child_exit.py``),
has its results stored instead of evaluating those candidates again.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from pytest_kscientist.evolve.child_exit import FINISHED, exit_status
from pytest_kscientist.evolve.population import HOST, Event, Population
from pytest_kscientist.harness.results import RunResults

SESSION_START = "session_start"
STOP_WAIT_S = 10.0  # a SIGKILLed process is gone in milliseconds; this is a bound, not a wait
_POLL_S = 0.02


@dataclass(frozen=True)
class SessionStarted:
    """A child session just started: its process, its results file, its candidates."""

    pid: int
    results: Path
    candidates: tuple[str, ...]


def record(pop: Population, generation: int, started: SessionStarted) -> Event:
    """Log a child session's start, with what tells its process from a later one of its pid."""
    return pop.log(SESSION_START, generation, child_pid=started.pid,
                   child_started=process_start(started.pid), results=str(started.results),
                   candidates=list(started.candidates))


def _stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (state first), or None."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rpartition(")")[2].split()
    except OSError:
        return None


def process_start(pid: int) -> str:
    """When ``pid`` started, in clock ticks since boot (Linux); '' where that cannot be read."""
    fields = _stat(pid)
    return fields[19] if fields is not None and len(fields) > 19 else ""


def running(pid: int, started: str) -> bool:
    """Whether the process ``pid`` that started at ``started`` still runs (a zombie does not).
    Without a start time it cannot be told from a later process of the same pid: False."""
    fields = _stat(pid)
    return bool(started) and fields is not None and fields[0] != "Z" and (
        len(fields) > 19 and fields[19] == started)


def _children(pid: int) -> list[tuple[int, str]]:
    """``pid``'s child processes with their start times (Linux)."""
    found = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", encoding="ascii") as f:
                found += [int(c) for c in f.read().split()]
        except (OSError, ValueError):
            continue
    return [(c, process_start(c)) for c in found]


def stop(pid: int, started: str) -> bool:
    """Kill the child session ``pid`` and its workers' process groups, if it still runs, and
    wait until none of them does; return whether it was running."""
    if not running(pid, started):
        return False
    workers = [(c, s) for c, s in _children(pid) if (_stat(c) or ["", "", ""])[2] == str(c)]
    for target, group in [(pid, False), *((c, True) for c, _ in workers)]:
        try:
            os.killpg(target, signal.SIGKILL) if group else os.kill(target, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + STOP_WAIT_S
    while any(running(p, s) for p, s in [(pid, started), *workers]):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the child session (pid {pid}) a killed run left running, or one "
                               f"of its workers, still runs {STOP_WAIT_S:g} s after SIGKILL")
        time.sleep(_POLL_S)
    return True


def left_behind(pop: Population, pending: set[str]) -> list[Event]:
    """The logged starts of child sessions on this host, of runs that are over, that were
    evaluating candidates still pending."""
    live = pop.live_runs()
    return [
        e for e in pop.events()
        if e.kind == SESSION_START and e.host == HOST and e.run_id != pop.run_id
        and e.run_id not in live and pending & set(e.data.get("candidates", []))
    ]


def finished(data: dict[str, Any], pending: set[str]) -> RunResults | None:
    """The results of a logged session that ran to its end with every one of its candidates
    still pending, else None (killed, interrupted, unreadable, some already recorded, or a
    worker of it did not start on the machine)."""
    results = Path(str(data.get("results", "")))
    candidates = set(data.get("candidates", []))
    if not candidates or not candidates <= pending or exit_status(results) not in FINISHED:
        return None
    try:
        run = RunResults.model_validate_json(results.read_text(encoding="utf-8"))
    except (OSError, ValueError, ValidationError):
        return None
    if run.machine_failures:  # its kernels were not judged (sessions.machine_stop)
        return None
    return run if candidates <= {c.name for c in run.candidates} else None
