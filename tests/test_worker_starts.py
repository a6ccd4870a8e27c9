"""Workers started once per candidate and several at once (issue 32: evaluation time).

A candidate's worker serves its checks and its benchmarks (the shared rounds put them far apart
in the run's order, which used to tear the worker down in between), and every worker of a
session is started and loaded in the background from the first item on, as many at once as the
machine has cores, so their torch imports and candidate builds overlap each other and the
untimed items instead of adding up; timing waits for every load.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import CANDIDATES, run_pytest

from pytest_kscientist.harness.runners import Spares

AXPY = Path(__file__).parent / "data" / "axpy"

# Logs its import's start and end (wall clock) and its process's token to LOAD_LOG; its import
# takes a second, as a build would.
LOGGED = '''
import json
import os
import time
import uuid

TOKEN = uuid.uuid4().hex
_began = time.time()
time.sleep(1.0)
with open(os.environ["LOAD_LOG"], "a") as log:
    log.write(json.dumps({"file": __file__, "token": TOKEN, "began": _began,
                          "ended": time.time(),
                          "extensions": os.environ.get("TORCH_EXTENSIONS_DIR")}) + "\\n")


def custom_kernel(data):
    x, y, out = data
    out.copy_(2 * x + y)
    return out
'''


def _loads(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_each_worker_is_loaded_once_the_loads_overlap_and_each_source_builds_in_its_own_folder(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """One session of three candidates, checks and benchmarks (one session, not two: 17.7 s
    as two tests on the 2-core CPU):
    - each worker is loaded once: a candidate's checks and its benchmark share the worker;
    - the loads overlap: workers start together, in the background;
    - workers load together, so two variants of one seed that name their load_inline module
      alike must not build into one folder at once (on the H200 three knob variants of the
      CUDA seed failed to import each other's half-written .so), while an unchanged file keeps
      its folder (and its build) across workers and sessions."""
    log = tmp_path / "loads.log"  # outside the run's folder, which the sandbox keeps read-only
    monkeypatch.setenv("LOAD_LOG", str(log))
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    (pytester.path / "one.py").write_text(LOGGED)
    (pytester.path / "two.py").write_text(LOGGED)
    (pytester.path / "variant.py").write_text(LOGGED + "# a knob moved\n")
    result = pytester.runpytest_subprocess(str(AXPY), "-p", "no:cacheprovider", "--kernel",
                                           "one.py", "--kernel", "two.py",
                                           "--kernel", "variant.py",
                                           "--ks-bench-workers", "1")  # a GPU's auto is 4
    result.assert_outcomes(passed=1 + 1 + 3 * 3)  # validation, reference bench, 3 x 3 items
    loads = _loads(log)
    # one load per candidate: its checks and its benchmark shared the worker
    assert sorted(Path(r["file"]).stem for r in loads) == ["one", "two", "variant"], loads
    first, second, _ = sorted(loads, key=lambda r: r["began"])
    # started together: the second began before the first had loaded
    assert second["began"] < first["ended"], loads
    dirs = {Path(r["file"]).stem: Path(r["extensions"]) for r in loads}
    assert dirs["one"] == dirs["two"] != dirs["variant"], dirs
    for name, folder in dirs.items():
        sha = hashlib.sha256((pytester.path / f"{name}.py").read_bytes()).hexdigest()
        assert folder.name == f"ks-{sha[:16]}" and folder.parent.parent == tmp_path / "ext"


BROKEN = '''
def helper():
    return 1 / 0


VALUE = helper()


def custom_kernel(data):
    return data[2]
'''


def test_a_load_that_fails_early_is_shown_whole_by_the_first_item(
        pytester: pytest.Pytester) -> None:
    (pytester.path / "broken.py").write_text(BROKEN)
    (pytester.path / "fine.py").write_text(LOGGED.replace('os.environ["LOAD_LOG"]',
                                                          'os.devnull'))
    result = pytester.runpytest_subprocess(str(AXPY), "-p", "no:cacheprovider", "--kernel",
                                           "broken.py", "--kernel", "fine.py", "-k", "check")
    result.assert_outcomes(passed=2, failed=2)
    text = result.stdout.str()
    first = text.index("broken check n1000-s1: failed to load: ")
    # the first item carries the traceback; the second points at it
    assert "ZeroDivisionError" in text[first:text.index("broken check n33-s2")]
    assert "(details under the first failed item of broken)" in text


def _children() -> list[int]:
    """The live (not zombie) child processes of this one, from /proc."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[1]) == os.getpid():
            pids.append(int(stat.parent.name))
    return pids


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_spares_taken_from_many_threads_keep_one_runner_waiting() -> None:
    before = set(_children())  # e.g. multiprocessing's resource tracker from an earlier test
    spares = Spares(ahead=True)
    taken: list = []

    def take() -> None:
        taken.append(spares.take(None, {"PATH": "/usr/bin:/bin", "KS_TEST": "1"}))

    threads = [threading.Thread(target=take) for _ in range(4)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        waiting = list(spares._ready.values())
        assert len(taken) == 4 and len(waiting) == 1
        assert len({p.proc.pid for p in [*taken, *waiting]}) == 5
        # and no other runner was started (one spare per take, each replacing the last, left
        # three behind, never killed)
        assert sorted(set(_children()) - before) == sorted(p.proc.pid for p in [*taken, *waiting])
    finally:
        for process in taken:
            process.discard()
        spares.close()
    assert spares._ready == {}


# A -p plugin for a session run in a subprocess: logs each runner process started, the end of
# collection and the runner each worker took, with the (system-wide) monotonic clock.
EARLY_PROBE = """
import json, os, time
from pytest_kscientist.harness import runners, spawn


def _log(**row):
    with open(os.environ["PROBE_LOG"], "a") as f:
        f.write(json.dumps({"t": time.monotonic(), **row}) + "\\n")


_runner_init, _worker_init = runners.RunnerProcess.__init__, spawn.Worker.__init__


def runner_init(self, *args, **kwargs):
    _runner_init(self, *args, **kwargs)
    _log(event="runner", pid=self.proc.pid)


def worker_init(self, *args, **kwargs):
    _worker_init(self, *args, **kwargs)
    _log(event="worker", pid=self.process.proc.pid)


runners.RunnerProcess.__init__, spawn.Worker.__init__ = runner_init, worker_init


def pytest_collection_finish(session):
    _log(event="collected")
"""


@pytest.mark.gpu
def test_a_gpu_session_starts_its_kernels_runner_while_it_collects(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """On a GPU a --kernel file's first worker takes a runner started while its task was
    collected, so the runner's import of torch runs beside pytest's own (collection imports
    torch to find the device). On an H100 host a CUDA seed's first check waited 3.7 s for its
    runner, begun after 3.1 s of collection."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA or ROCm device")
    log = tmp_path / "probe.log"
    monkeypatch.setenv("PROBE_LOG", str(log))
    (pytester.path / "early_probe.py").write_text(EARLY_PROBE)
    shutil.copy(AXPY / "seeds" / "good.py", pytester.path / "one.py")
    result = pytester.runpytest_subprocess(
        str(AXPY), "-p", "no:cacheprovider", "-p", "early_probe", "--kernel", "one.py",
        "--ks-device", "cuda", "--ks-profile", "full", "--ks-skip-reference")
    assert result.ret == 0, result.stdout.str()
    rows = _loads(log)
    collected = next(r["t"] for r in rows if r["event"] == "collected")
    started = {r["pid"]: r["t"] for r in rows if r["event"] == "runner"}
    first = next(r for r in rows if r["event"] == "worker")
    assert started[first["pid"]] < collected, rows


@pytest.mark.parametrize(("listing", "shows"), [
    ("--collect-only", "*::one::check[[]n1000-s1[]]*"),
    ("--setup-plan", "*::one::check[[]n1000-s1[]]*"),
    ("--setup-only", "*::one::check[[]n1000-s1[]]*"),
    ("--fixtures", "*ks_evaluate*"),
    # pytest's last line: "no tests ran in 0.12s", or "1 warning in 0.12s" where the
    # environment warns (PYTEST_PLUGINS naming an imported plugin, as on the device machine)
    ("--fixtures-per-test", r"re:.*(no tests ran|\d+ warnings?) in [\d.]+s"),
    ("--cache-show", "*cachedir:*"),
])
def test_listing_the_items_starts_no_worker_and_leaves_the_results(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        listing: str, shows: str) -> None:
    """--setup-plan and --setup-only run no item's call, but they imported every candidate in
    workers started ahead (a CUDA seed's build) and replaced --ks-json's file with `[]`, as
    --fixtures, --fixtures-per-test and --cache-show did (an ini's addopts may carry it)."""
    log = tmp_path / "loads.log"
    monkeypatch.setenv("LOAD_LOG", str(log))
    (pytester.path / "one.py").write_text(LOGGED)
    (pytester.path / "two.py").write_text(LOGGED)
    (pytester.path / "saved.json").write_text('{"earlier": "results"}')
    cache = [] if listing == "--cache-show" else ["-p", "no:cacheprovider"]
    result = pytester.runpytest_subprocess(str(AXPY), *cache, "--kernel", "one.py", "--kernel",
                                           "two.py", listing, "-q", "--ks-json", "saved.json")
    assert result.ret in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED)
    if shows.startswith("re:"):
        result.stdout.re_match_lines([shows[3:]])
    else:
        result.stdout.fnmatch_lines([shows])
    assert not log.exists()
    assert (pytester.path / "saved.json").read_text() == '{"earlier": "results"}'


# Stands in for torch.utils.cpp_extension: its precompiled-header step logs when it ran.
FAKE_EXTENSION = '''
import json, os, sys, time, types
sys.path.insert(0, {repo!r})
from pytest_kscientist.worker.runner import guard_pch

def _check_and_build_extension_h_precompiler_headers(*args):
    began = time.time()
    time.sleep(0.5)
    with open({log!r}, "a") as log:
        log.write(json.dumps([began, time.time()]) + "\\n")

module = types.SimpleNamespace(
    _check_and_build_extension_h_precompiler_headers=_check_and_build_extension_h_precompiler_headers)
guard_pch(module, {folder!r})
guard_pch(module, {folder!r})  # twice: wrapped once
module._check_and_build_extension_h_precompiler_headers([], [])
'''


def test_precompiled_header_builds_of_workers_loading_together_take_turns(
        tmp_path: Path) -> None:
    """torch builds its precompiled header unlocked into its own folder: workers loading
    together must take turns (three CUDA seed variants killed each other's compilers)."""
    import subprocess
    import sys

    log = tmp_path / "pch.log"
    script = FAKE_EXTENSION.format(repo=str(Path(__file__).parent.parent), log=str(log),
                                   folder=str(tmp_path / "ext"))
    procs = [subprocess.Popen([sys.executable, "-c", script]) for _ in range(3)]
    assert [p.wait(timeout=60) for p in procs] == [0, 0, 0]
    spans = sorted(json.loads(line) for line in log.read_text().splitlines())
    assert len(spans) == 3
    assert all(b[0] >= a[1] for a, b in zip(spans, spans[1:], strict=False)), spans


# Logs each call's wall clock and size to CALL_LOG: which calls ran while another candidate
# was still loading.
CALLS_LOGGED = '''
import json
import os
import time


def custom_kernel(data):
    x, y, out = data
    with open(os.environ["CALL_LOG"], "a") as log:
        log.write(json.dumps([time.time(), x.numel()]) + "\\n")
    out.copy_(2 * x + y)
    return out
'''


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2,
                    reason="workers start in the background only with two CPUs or more")
def test_checks_run_beside_a_slow_load_and_timing_waits_for_every_load(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Workers start in the background: an item waits only for its own candidate's load, so
    one candidate's checks run while another's build goes on, but no call is timed before every
    load has ended (issue 32: a GPU MODE folder's load_inline build is most of its first run)."""
    loads, calls = tmp_path / "loads.log", tmp_path / "calls.log"
    monkeypatch.setenv("LOAD_LOG", str(loads))
    monkeypatch.setenv("CALL_LOG", str(calls))
    (pytester.path / "early.py").write_text(CALLS_LOGGED)
    (pytester.path / "late.py").write_text(LOGGED.replace("time.sleep(1.0)", "time.sleep(6.0)"))
    # late has benchmarks only, so nothing but the wait for every load keeps early's timed
    # calls behind late's build
    result = pytester.runpytest_subprocess(str(AXPY), "-p", "no:cacheprovider", "--kernel",
                                           "early.py", "--kernel", "late.py",
                                           "-k", "not (late and check)",
                                           "--ks-bench-workers", "1")  # a GPU's auto is 4
    result.assert_outcomes(passed=1 + 1 + 3 + 1)  # validation, reference bench, early, late
    (late,) = _loads(loads)
    made = [json.loads(line) for line in calls.read_text().splitlines()]
    checked = [t for t, n in made if n != 4096]
    timed = [t for t, n in made if n == 4096]
    assert checked and min(checked) < late["ended"] - 3, (made, late)  # beside the load
    assert timed and min(timed) >= late["ended"], (made, late)  # after it


def test_a_run_stopped_by_maxfail_does_not_wait_for_kernels_still_loading(tmp_path: Path) -> None:
    """`-x` after a failing kernel still waited out the background import of one that would
    never run (a 30 s import held the session 30 s); the session now ends at once."""
    shutil.copytree(AXPY, tmp_path / "axpy")
    shutil.copy(CANDIDATES / "raises.py", tmp_path / "a_raises.py")
    (tmp_path / "b_slow.py").write_text(
        "import time\n\ntime.sleep(30)\n\n\ndef custom_kernel(data):\n    x, y, out = data\n"
        "    return out.copy_(2 * x + y)\n")
    started = time.monotonic()
    code, out, _ = run_pytest(["axpy", "--kernel", "a_raises.py", "--kernel", "b_slow.py",
                               "-x", "--ks-baselines", "none"], tmp_path, timeout=120)
    took = time.monotonic() - started
    assert code == 1 and "a_raises check" in out and "1 failed" in out, out
    assert took < 20, (took, out)  # the import alone takes 30 s


def test_a_hurried_close_takes_holders_a_start_adds_meanwhile() -> None:
    """After -x the session closes its workers without waiting for the starts still running in
    the background, which add their nodes to ``holders``: iterating the set then failed with
    "Set changed size during iteration" (once in a run of the suite). Here dropping one
    holder's worker adds another, as a start that ends at that moment does."""
    from pytest_kscientist.harness.baselines import Turns
    from pytest_kscientist.harness.session import KsSession

    ks = object.__new__(KsSession)
    ks.partners, ks.holders, ks.early_runners = {}, set(), None
    dropped: list[str] = []

    class Holder:
        def __init__(self, name: str, then: Holder | None = None) -> None:
            self.name, self.then, self.worker, self.turns = name, then, None, Turns()

        def drop_worker(self) -> None:
            dropped.append(self.name)
            if self.then is not None:
                ks.holders.add(self.then)

    ks.holders.add(Holder("first", then=Holder("late")))
    ks.close_workers(hurry=True)
    assert sorted(dropped) == ["first", "late"] and not ks.holders


# Logs each call's process (a token), wall clock span and size to CALL_LOG; a process's first
# call takes 1.5 s more, as CUDA's lazy loading or a Triton launcher build does on a GPU.
FIRST_CALL_SLOW = '''
import json
import os
import time
import uuid

PROCESS = uuid.uuid4().hex  # its pid is 1 in the sandbox's own PID namespace
_CALLS = []


def custom_kernel(data):
    x, y, out = data
    began = time.time()
    if not _CALLS:
        time.sleep(1.5)
    _CALLS.append(began)
    out.copy_(2 * x + y)
    with open(os.environ["CALL_LOG"], "a") as log:
        log.write(json.dumps([PROCESS, began, time.time(), x.numel()]) + "\\n")
    return out
'''


def _logged_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kernel: str,
                args: list[str]) -> tuple[int, str, list[Any]]:
    """axpy with ``kernel`` (source) as ``kernel.py`` and ``args``; its exit code, output and
    the calls it logged to CALL_LOG (outside the run's folder, which the sandbox keeps
    read-only)."""
    calls = tmp_path / "calls.log"
    monkeypatch.setenv("CALL_LOG", str(calls))
    project = tmp_path / "project"
    shutil.copytree(AXPY, project / "axpy")
    (project / "kernel.py").write_text(kernel)
    code, out, _ = run_pytest(["axpy", "--kernel", "kernel.py", "--ks-baselines", "none",
                               *args], project, timeout=120)
    made = [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []
    return code, out, made


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2,
                    reason="workers start in the background only with two CPUs or more")
def test_workers_make_their_first_calls_together_before_the_rounds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process pays for its kernel's first call (on an H100, 4-5 s for GPU MODE vectoradd's
    reference): made in the timing rounds, one worker after another, that was 24 s of the
    vectoradd folder's first benchmark with four workers a kernel. The workers whose first call
    would be a round's (here every one: twins, and a kernel with no check selected) now make
    it untimed, all at once, before the rounds; without that no two first calls overlap."""
    code, out, made = _logged_run(tmp_path, monkeypatch, FIRST_CALL_SLOW,
                                  ["-k", "bench", "--ks-bench-workers", "3"])
    assert code == 0, out
    first: dict[str, tuple[float, float]] = {}
    for process, began, ended, _ in made:
        first.setdefault(process, (began, ended))
    assert len(first) == 3, made  # one process a turn
    assert all(n == 4096 for *_, n in made), made  # the benchmark's case, no check ran
    # every first call began before any had ended: they ran together
    assert max(b for b, _ in first.values()) < min(e for _, e in first.values()), first



@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2,
                    reason="workers start in the background only with two CPUs or more")
def test_a_checked_candidates_twins_make_their_first_calls_together(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A candidate's own worker makes its first call in its checks; its twins, which run no
    check, make theirs together before the rounds. (Whether the own worker is given a first
    call too cannot be seen here: it would come after its checks, beside the rounds' calls.)"""
    code, out, made = _logged_run(tmp_path, monkeypatch, FIRST_CALL_SLOW,
                                  ["--ks-bench-workers", "3"])
    assert code == 0, out
    first: dict[str, tuple[float, float, int]] = {}
    for process, began, ended, n in made:
        first.setdefault(process, (began, ended, n))
    checks = [f for f in first.values() if f[2] != 4096]
    twins = [f for f in first.values() if f[2] == 4096]
    assert len(checks) == 1 and len(twins) == 2, first  # its own worker checked first
    assert max(b for b, _, _ in twins) < min(e for _, e, _ in twins), twins  # together



# Hangs on its first call of the benchmark's size in a process (axpy's checks are smaller),
# logging each call's process and size to CALL_LOG first.
HANGS_FIRST = '''
import json
import os
import time
import uuid

PROCESS = uuid.uuid4().hex


def custom_kernel(data):
    x, y, out = data
    with open(os.environ["CALL_LOG"], "a") as log:
        log.write(json.dumps([PROCESS, x.numel()]) + "\\n")
    if x.numel() == 4096:
        time.sleep(60)
    out.copy_(2 * x + y)
    return out
'''


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2,
                    reason="workers start in the background only with two CPUs or more")
def test_a_kernel_that_hangs_on_its_first_call_waits_out_one_timeout(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its workers' first calls hang together before the rounds, each killed after
    --ks-timeout; that hang is the round's verdict, not a fresh worker started in the round
    to hang for another --ks-timeout."""
    code, out, made = _logged_run(tmp_path, monkeypatch, HANGS_FIRST,
                                  ["-k", "bench", "--ks-bench-workers", "2", "--ks-timeout", "3"])
    assert code == 1 and "first call, made before the rounds" in out, out
    # the two workers' first calls only: none started again to call once more
    assert len({process for process, _ in made}) == 2 and len(made) == 2, made


class _Alarm(Exception):
    pass


def _interrupted(wait: Any) -> None:
    """Call ``wait`` and stop it after 0.3 s by a signal whose handler raises, as
    pytest-timeout's alarm does."""
    import signal

    def ring(*_: object) -> None:
        raise _Alarm

    previous = signal.signal(signal.SIGALRM, ring)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        with pytest.raises(_Alarm):
            wait()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_first_calls_left_running_by_an_interrupted_wait_are_joined_by_the_next() -> None:
    """pytest-timeout's alarm (or Ctrl-C) can stop the first bench item while it waits for the
    workers' first calls; the next item must not send a worker its request while a first call
    is still running in it (its answer would go to that request). The next wait joins them."""
    from pytest_kscientist.harness.session import KsSession

    ks = object.__new__(KsSession)
    ks.starting, ks.warming = [], []
    release, ended = threading.Event(), threading.Event()

    class Slow:
        def run(self) -> None:
            release.wait(10)
            ended.set()

    ks.warm_ups = [Slow()]
    _interrupted(ks.wait_for_starts)
    assert len(ks.warming) == 1 and not ended.is_set()  # still running, still listed
    threading.Timer(0.3, release.set).start()
    ks.wait_for_starts(warm=False)  # the close's wait: it too waits for them
    assert ended.is_set() and not ks.warming


def test_a_start_whose_wait_was_interrupted_is_waited_for_again() -> None:
    """A wait for a worker's start stopped by a signal (pytest-timeout's alarm) marked the
    start's thread ended while it ran on (a Thread.join interrupted so, CPython's bpo-45274):
    the next wait returned at once, beside the start still running."""
    from pytest_kscientist.harness.session import KsSession
    from pytest_kscientist.harness.starts import Starting

    ks = object.__new__(KsSession)
    ks.starting, ks.warming, ks.warm_ups = [], [], []
    release, ended = threading.Event(), threading.Event()

    def start() -> None:
        release.wait(10)
        ended.set()

    Starting(start, threading.BoundedSemaphore(2), ks.starting)
    _interrupted(ks.wait_for_starts)
    assert len(ks.starting) == 1 and not ended.is_set()
    threading.Timer(0.3, release.set).start()
    ks.wait_for_starts()
    assert ended.is_set() and not ks.starting


def test_a_broken_kernels_twins_leave_its_traceback_to_its_first_item(tmp_path: Path) -> None:
    """With twins (--ks-bench-workers 3, a GPU's auto), each twin's failed start in the
    background marked the load failure shown: no item showed the kernel's traceback, each
    said "(details under the first failed item of zbroken)". (Its items come after a slow
    kernel's checks, so its twins have failed by then.)"""
    shutil.copytree(AXPY, tmp_path / "axpy")
    (tmp_path / "zbroken.py").write_text(
        "def helper():\n    return 1 / 0\n\n\nVALUE = helper()\n\n\n"
        "def custom_kernel(data):\n    return data[2]\n")
    (tmp_path / "slow.py").write_text(
        "import time\n\n\ndef custom_kernel(data):\n    time.sleep(1.0)\n    x, y, out = data\n"
        "    return out.copy_(2 * x + y)\n")
    code, out, _ = run_pytest(["axpy", "--kernel", "slow.py", "--kernel", "zbroken.py", "-k",
                               "check", "--ks-bench-workers", "3", "--ks-baselines", "none"],
                              tmp_path, timeout=300)
    assert code == 1, out
    first = out.split("zbroken::check[n1000-s1] _", 1)[1].split("\n____", 1)[0]  # its report
    assert "in helper\n    return 1 / 0\n" in first and "ZeroDivisionError" in first, out
    assert "(details under the first failed item" not in first, out
