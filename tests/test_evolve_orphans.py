"""Issue 31: nothing a killed run started outlives it, and its resumed run never times beside
what it left; a finished child session's results are adopted, not evaluated again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from evolve_fakes import FakeEvaluator
from helpers import AXPY, CANDIDATES, PYTEST, REPO
from test_evolve_loop import Run

from pytest_kscientist.evolve import child_exit
from pytest_kscientist.evolve.child_exit import exit_path
from pytest_kscientist.evolve.orphans import SessionStarted, record
from pytest_kscientist.evolve.population import Population
from pytest_kscientist.harness.lifeline import Lifeline
from pytest_kscientist.harness.mounts import protected_paths, sandbox_available

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(),
                                reason="reads the process table from /proc")
DEADLINE_S = 10.0  # a SIGKILL takes milliseconds; a process left running stays for minutes
START_S = 180.0  # for a run to start its child session and a worker on a loaded 2-core machine


# -- the process table, read here independently of the package's own reading -----------------
def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None


def _identity(pid: int) -> tuple[int, str] | None:
    """(pid, start time) of a running process, None if it is gone or a zombie."""
    fields = _stat(pid)
    return None if fields is None or fields[0] == "Z" else (pid, fields[19])


def _still_running(procs: list[tuple[int, str]]) -> list[tuple[int, str]]:
    return [p for p in procs if _identity(p[0]) == p]


def _argv(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _descendants(root: int) -> list[int]:
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        fields = _stat(int(entry)) if entry.isdigit() else None
        if fields is not None and fields[0] != "Z":
            parents[int(entry)] = int(fields[1])
    found, frontier = [], [root]
    while frontier:
        frontier = [p for p, parent in parents.items() if parent in frontier]
        found += frontier
    return found


def _wait_gone(procs: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """Poll until none of ``procs`` runs or DEADLINE_S passed; return those still running."""
    deadline = time.monotonic() + DEADLINE_S
    while (left := _still_running(procs)) and time.monotonic() < deadline:
        time.sleep(0.02)
    return left


def _is_runner(pid: int) -> bool:
    """A worker's runner: exec'd (its command line) or forked from a zygote (its name)."""
    try:
        forked = Path(f"/proc/{pid}/comm").read_text().strip() == "ks-runner"
    except OSError:
        forked = False
    return forked or _argv(pid)[1:3] == ["-m", "pytest_kscientist.worker.runner"]


def _sandbox_modes() -> list[object]:
    why = sandbox_available(tuple(protected_paths(AXPY / "reference.py")))
    return [False, pytest.param(True, marks=pytest.mark.skipif(
        why is not None, reason=f"no sandbox here: {why}"))]


# -- the lifeline itself ----------------------------------------------------------------------
GROUP = "import subprocess, time; subprocess.Popen(['sleep', '600']); time.sleep(600)"


@pytest.mark.parametrize("how", ["auto", "fork"])
def test_cutting_the_lifeline_kills_the_process_group_it_started(how: str) -> None:
    lifeline = Lifeline(how)
    proc = subprocess.Popen(lifeline.command([sys.executable, "-c", GROUP], group=True),
                            pass_fds=(lifeline.read_fd,), start_new_session=True)
    lifeline.started()
    try:
        deadline = time.monotonic() + START_S
        while len(members := [p for p in _descendants(proc.pid) if _argv(p)[:1] == ["sleep"]]) < 1:
            assert time.monotonic() < deadline, "the started process never started its child"
            time.sleep(0.02)
        group = [p for p in (_identity(proc.pid), _identity(members[0])) if p]
        assert len(group) == 2
        lifeline.cut()  # what the kernel does with this process's files when it is killed
        assert proc.wait(timeout=DEADLINE_S) == -signal.SIGKILL
        assert not _wait_gone(group), "the group's other member outlived the lifeline"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.parametrize("how", ["auto", "fork"])
def test_a_process_whose_starter_died_before_it_ran_dies_at_once(how: str) -> None:
    lifeline = Lifeline(how)
    lifeline.cut()  # gone before the started process could arm anything
    proc = subprocess.Popen(lifeline.command([sys.executable, "-c", "import time; "
                                              "time.sleep(600)"], group=False),
                            pass_fds=(lifeline.read_fd,))
    lifeline.started()
    try:
        assert proc.wait(timeout=DEADLINE_S) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# A compile (a compile item's, a shared load_inline build's) whose pytest process is killed.
COMPILING = """
import sys
from pathlib import Path
from pytest_kscientist.harness.compiles import run
run([sys.executable, "-c", "import os, time; MARK; time.sleep(600)"], Path("."), 600.0)
"""


def test_a_compiler_dies_with_the_pytest_process_that_started_it(tmp_path: Path) -> None:
    marker = tmp_path / "pid"
    code = COMPILING.replace("MARK", f"open({str(marker)!r}, 'w').write(str(os.getpid()))")
    starter = subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path)
    try:
        deadline = time.monotonic() + START_S
        while not marker.exists() or not marker.read_text():
            assert time.monotonic() < deadline and starter.poll() is None
            time.sleep(0.05)
        compiler = _identity(int(marker.read_text()))
        assert compiler is not None
        os.kill(starter.pid, signal.SIGKILL)
        starter.wait()
        assert not _wait_gone([compiler])
    finally:
        if starter.poll() is None:
            starter.kill()
            starter.wait()


# -- a worker whose pytest process is killed mid-call -----------------------------------------
PYTEST_SIDE = """
import sys, threading
from pathlib import Path
from pytest_kscientist.formats.task import load_task
from pytest_kscientist.harness.spawn import Worker
task = load_task(Path({axpy!r}))
worker = Worker(task.describe(), "cpu", task.spec.output_index, 600.0, sandbox={sandbox})
header, _ = worker.request("load", path={hangs!r}, entry="custom_kernel")
assert header["ok"], header
worker._send({{"op": "call", "case": {{"n": 33, "seed": 2}}, "seed": 5}})  # it never answers
print(worker.proc.pid, flush=True)
threading.Event().wait()
"""


@pytest.mark.parametrize("sandbox", _sandbox_modes())
def test_a_worker_hung_in_a_call_dies_with_its_pytest_process(sandbox: bool) -> None:
    script = PYTEST_SIDE.format(axpy=str(AXPY), hangs=str(CANDIDATES / "hangs.py"),
                                sandbox=sandbox)
    side = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            cwd=REPO)
    group: list[tuple[int, str]] = []
    try:
        assert side.stdout is not None
        line = side.stdout.readline()
        assert line.strip().isdigit(), "the pytest side never got its worker into a call"
        leader = int(line)
        group = [p for p in (_identity(leader), *map(_identity, _descendants(leader))) if p]
        assert any(_is_runner(p) for p, _ in group), group
        side.send_signal(signal.SIGKILL)
        side.wait()
        left = _wait_gone(group)
        assert not left, f"worker processes {left} outlived their pytest process"
    finally:
        if side.poll() is None:
            side.kill()
            side.wait()
        for pid, _ in _still_running(group):
            os.kill(pid, signal.SIGKILL)  # what a failure left, not to burden later tests


# -- kill -9 of a real --evolve run -----------------------------------------------------------
HANGING_SEED = '''"""Says it was called, then takes as long as a hung kernel would."""

import threading

TUNABLES = {{"chunk": 64}}
TUNABLE_SPACE = {{"chunk": [16, 64]}}


def custom_kernel(data):
    open({marker!r}, "w").close()
    threading.Event().wait(600)
    return data[2]
'''


@pytest.mark.parametrize("device", [
    "cpu",
    # on a GPU a spare runner waits beside the worker (harness/runners.py, Spares)
    pytest.param("cuda:0", marks=[pytest.mark.gpu, pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs a CUDA or ROCm device")]),
])
def test_kill_9_of_an_evolve_run_takes_its_child_session_and_workers_along(
    pytester: pytest.Pytester, tmp_path_factory: pytest.TempPathFactory, device: str
) -> None:
    marker = tmp_path_factory.mktemp("called") / "called"
    task = pytester.mkdir("axpy")
    for name in ("task.toml", "reference.py"):
        (task / name).write_text((AXPY / name).read_text())
    (task / "seeds").mkdir()
    (task / "seeds" / "hangs.py").write_text(HANGING_SEED.format(marker=str(marker)))
    cmd = [*PYTEST, "--evolve", "1", "axpy",
           "--ks-llm", "offline", "--ks-profile", "cpu", "--ks-timeout", "600",
           "--ks-device", device]
    run = subprocess.Popen(cmd, cwd=pytester.path, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    tree: list[tuple[int, str]] = []
    try:
        deadline = time.monotonic() + START_S
        while not marker.exists():  # the worker is inside the seed's call
            assert run.poll() is None, "the run ended before its worker called the seed"
            assert time.monotonic() < deadline, "the run's worker never called the seed"
            time.sleep(0.05)
        tree = [p for p in map(_identity, _descendants(run.pid)) if p]
        sessions = [p for p in tree if _argv(p[0])[1:3] == ["-m", "pytest"]]
        assert len(sessions) == 1 and any(_is_runner(p) for p, _ in tree), tree
        run.send_signal(signal.SIGKILL)
        run.wait()
        left = [(p, _argv(p)[:3]) for p, _ in _wait_gone(tree)]
        assert not left, f"the killed run's processes still run: {left}"
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        for pid, _ in _still_running(tree):
            os.kill(pid, signal.SIGKILL)  # what a failure left, not to burden later tests
    starts = [json.loads(line) for line in (pytester.path / "population" / "axpy" /
                                             "events.jsonl").read_text().splitlines()]
    logged = [e["data"] for e in starts if e["kind"] == "session_start"]
    assert [(d["child_pid"], d["child_started"], d["candidates"]) for d in logged] == [
        (sessions[0][0], sessions[0][1], ["c0001"])]


# -- the resumed run: stop what is left, adopt what finished ----------------------------------
ORPHAN = textwrap.dedent("""
    import subprocess, sys, time
    worker = subprocess.Popen(["sleep", "600"], start_new_session=True)
    print(worker.pid, flush=True)
    time.sleep(600)
""")


def _killed_run(run: Run) -> Population:
    """A run that stored the seed as c0001 and was killed (it never logged its end)."""
    killed = Population(run.root, "toy", run_id="killed")
    killed.log("run_start")  # by this process's pid: not a live run (population._alive)
    killed.add((run.seeds / "tunable.py").read_text(), generation=0, origin="seed",
               seed_file="tunable.py")
    return killed


class Watching(FakeEvaluator):
    """Notes which of ``procs`` still run when it is asked to evaluate."""

    def __init__(self, procs: list[tuple[int, str]]) -> None:
        super().__init__()
        self.procs = procs
        self.running_then: list[list[tuple[int, str]]] = []

    def evaluate(self, kernels, timeout_s, beside=()):  # type: ignore[no-untyped-def]
        self.running_then.append(_still_running(self.procs))
        return super().evaluate(kernels, timeout_s, beside)


def test_a_resumed_run_stops_a_live_orphan_and_its_workers_before_evaluating(
    tmp_path: Path,
) -> None:
    run = Run(tmp_path)
    killed = _killed_run(run)
    orphan = subprocess.Popen([sys.executable, "-c", ORPHAN], stdout=subprocess.PIPE, text=True)
    try:
        assert orphan.stdout is not None
        worker = _identity(int(orphan.stdout.readline()))
        session = _identity(orphan.pid)
        assert session is not None and worker is not None
        record(killed, 0, SessionStarted(orphan.pid, tmp_path / "none.json", ("c0001",)))
        evaluator = Watching([session, worker])
        assert run(0, evaluator=evaluator) == 0, run.out.getvalue()
    finally:
        orphan.kill()
        orphan.wait()
    assert evaluator.running_then == [[]], "the resumed run evaluated beside the orphan"
    assert evaluator.calls == [["c0001"]]
    assert (f"gen 0/0 | resume   | stopped the child session (pid {orphan.pid}) of a killed "
            "run, still evaluating c0001, and its workers") in run.out.getvalue()
    assert [e.data["child_pid"] for e in run.pop.events() if e.kind == "orphan_stopped"] == [
        orphan.pid]
    assert _wait_gone([worker]) == []


def test_a_dead_sessions_pid_taken_by_another_process_is_left_alone(tmp_path: Path) -> None:
    run = Run(tmp_path)
    killed = _killed_run(run)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        killed.log("session_start", 0, child_pid=other.pid, child_started="1",
                   results=str(tmp_path / "none.json"), candidates=["c0001"])
        assert run(0) == 0, run.out.getvalue()
        assert other.poll() is None  # a start time that is not its own: not the session
    finally:
        other.kill()
        other.wait()
    assert run.evaluator.calls == [["c0001"]]


def _finished_session(run: Run, killed: Population, tmp_path: Path, status: str | None,
                      names: tuple[str, ...] = ("c0001",)) -> Path:
    """A session of the killed run that wrote its results (for ``names``) and, unless
    ``status`` is None, its exit status, then exited."""
    results = tmp_path / "sessions" / "s.json"
    results.parent.mkdir(exist_ok=True)
    body = FakeEvaluator().evaluate([killed.source_path(n) for n in names], None)
    body = body.model_copy(update={"salt": 99})
    results.write_text(body.model_dump_json())
    if status is not None:
        exit_path(results).write_text(status + "\n")
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)
    record(killed, 0, SessionStarted(int(ended.stdout), results, ("c0001",)))
    return results


def test_a_resumed_run_adopts_a_finished_child_sessions_results(tmp_path: Path) -> None:
    run = Run(tmp_path)
    killed = _killed_run(run)
    results = _finished_session(run, killed, tmp_path, "1")
    assert run(0) == 0, run.out.getvalue()
    assert run.evaluator.calls == []  # nothing timed again
    stored = run.pop.members()[0].evaluation
    assert stored is not None and stored.salt == 99 and stored.run_id == "killed"
    assert stored.status == "passed" and stored.geomean_us is not None
    adopted = [e.data for e in run.pop.events() if e.kind == "evaluated"]
    assert adopted == [{"candidates": ["c0001"], "profile": "cpu", "salt": 99,
                        "adopted_from": "killed", "results": str(results)}]
    assert ("gen 0/0 | resume   | results of a finished child session of a killed run adopted, "
            "not evaluated again: c0001 passed") in run.out.getvalue()


@pytest.mark.parametrize(
    ("status", "names"),
    [("2", ("c0001",)),  # interrupted: its results are partial
     (None, ("c0001",)),  # killed before it recorded how it ended
     ("0", ())],  # its results do not cover its candidate
)
def test_a_session_that_did_not_finish_is_evaluated_again(
    tmp_path: Path, status: str | None, names: tuple[str, ...]
) -> None:
    run = Run(tmp_path)
    killed = _killed_run(run)
    _finished_session(run, killed, tmp_path, status, names)
    assert run(0) == 0, run.out.getvalue()
    assert run.evaluator.calls == [["c0001"]]
    stored = run.pop.members()[0].evaluation
    assert stored is not None and stored.salt == 7  # the fake evaluator's, not the session's


def test_a_second_ctrl_c_inside_pytests_interrupt_handling_still_reads_interrupted(
        pytester: pytest.Pytester, tmp_path: Path) -> None:
    """pytest's interrupt handling, hit by a second Ctrl-C (a terminal's and the parent's),
    leaves the session's exit status at 0; the child's exit record must still say interrupted,
    or a resumed run adopts the half-run session's results as finished."""
    pytester.makeconftest('''
def pytest_keyboard_interrupt(excinfo):
    raise KeyboardInterrupt  # the second Ctrl-C, while pytest reports the first
''')
    pytester.makepyfile(test_it='''
def test_interrupted():
    raise KeyboardInterrupt
''')
    results = tmp_path / "run.json"
    pytester.runpytest_subprocess("-p", "pytest_kscientist.evolve.child_exit",
                                  f"--ks-json={results}")
    assert child_exit.exit_status(results) == pytest.ExitCode.INTERRUPTED


def test_a_child_session_that_says_nothing_for_too_long_is_stopped(tmp_path: Path) -> None:
    """Without --ks-time-limit the loop waited for a child session forever, one wedged in its
    own process (a stuck device under the reference) too; one whose log keeps growing runs
    on, whatever it takes."""
    from pytest_kscientist.evolve.sessions import Silent, wait_speaking

    def child(code: str, log: Path) -> subprocess.Popen[bytes]:
        with open(log, "w") as out:
            return subprocess.Popen([sys.executable, "-u", "-c", code], stdout=out)

    talking = tmp_path / "talking.log"
    proc = child("import time\nfor _ in range(8):\n    print('.')\n    time.sleep(0.5)\n",
                 talking)
    assert wait_speaking(proc, talking, None, quiet_s=2.5) == 0  # 4 s, never 2.5 s quiet
    stuck = tmp_path / "stuck.log"
    proc = child("import time\nprint('collected 3 items')\ntime.sleep(60)\n", stuck)
    began = time.monotonic()
    try:
        with pytest.raises(Silent):
            wait_speaking(proc, stuck, None, quiet_s=1.0)
        assert time.monotonic() - began < 15
    finally:
        proc.kill()
        proc.wait()
