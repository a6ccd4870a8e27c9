"""``pytest --evolve N`` end to end: conftest roles, options, kill -9 resume, real harness."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import time
from pathlib import Path

import pytest
import session_server
import torch
from evolve_fakes import REFERENCE, SEED, TASK_TOML
from helpers import PYTEST

from pytest_kscientist.evolve.sessions import ChildSession

TESTS = Path(__file__).parent

CONFTEST = f"""
import json, os, sys
sys.path.insert(0, {str(TESTS)!r})
from evolve_fakes import FakeEvaluator, ScriptedDesigner, ScriptedSelector, ScriptedWriter
from pytest_kscientist.evolve.sessions import EVALUATOR_KEY


def pytest_configure(config):
    if os.environ.get("KS_FAKE_EVALUATOR"):
        block = os.environ.get("KS_FAKE_BLOCK_AT")
        config.stash[EVALUATOR_KEY] = FakeEvaluator(block_at_call=int(block) if block else None)


def _record(role, task):
    log = os.environ.get("KS_ROLE_LOG")
    if log:
        with open(log, "a") as f:
            f.write(json.dumps({{"role": role, "task": task.model_dump()}}) + "\\n")


class LoggedSelector(ScriptedSelector):
    def select(self, task, population, findings):
        with open(os.environ["KS_ROLE_LOG"], "a") as f:
            f.write(json.dumps({{"role": "select", "ids": [c.id for c in population],
                                 "findings": findings}}) + "\\n")
        return super().select(task, population, findings)


def pytest_kscientist_make_selector(config, task):
    if os.environ.get("KS_SCRIPTED_ROLES"):
        _record("selector", task)
        return LoggedSelector()


def pytest_kscientist_make_designer(config, task):
    if os.environ.get("KS_SCRIPTED_ROLES"):
        return ScriptedDesigner()


def pytest_kscientist_make_writer(config, task):
    if os.environ.get("KS_SCRIPTED_ROLES"):
        return ScriptedWriter()
"""


def _evolve_cmd(generations: str, task: str) -> list[str]:
    """``python -m pytest --evolve N TASK`` with the offline scientist, for a subprocess."""
    return [*PYTEST, "--evolve", generations,
            task, "--ks-llm", "offline"]


@pytest.fixture
def toy(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """A pytester folder holding the toy task, the fake-role conftest and an ini file."""
    for var in (
        "KS_FAKE_EVALUATOR",
        "KS_FAKE_BLOCK_AT",
        "KS_SCRIPTED_ROLES",
        "KS_ROLE_LOG",
        "PYTEST_ADDOPTS",
        "GEMINI_API_KEY",
        "GOOGLE_API_KEY",
    ):
        monkeypatch.delenv(var, raising=False)
    task = pytester.mkdir("toy")
    (task / "task.toml").write_text(TASK_TOML)
    (task / "reference.py").write_text(REFERENCE)
    (task / "seeds").mkdir()
    (task / "seeds" / "tunable.py").write_text(SEED)
    pytester.makeconftest(CONFTEST)
    pytester.makeini("[pytest]\n")
    return pytester


def events(root: Path) -> list[dict]:
    return [json.loads(line) for line in (root / "events.jsonl").read_text().splitlines()]


def test_conftest_roles_drive_the_generations(
    toy: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = toy.path / "roles.jsonl"
    monkeypatch.setenv("KS_FAKE_EVALUATOR", "1")
    monkeypatch.setenv("KS_SCRIPTED_ROLES", "1")
    monkeypatch.setenv("KS_ROLE_LOG", str(log))
    result = toy.runpytest("--evolve", "2", "toy", "--ks-candidates", "2")
    assert result.ret == 0
    result.stdout.fnmatch_lines(
        [
            "*toy | gen 0/2 | seed     | 1 new of 1 seed(s): c0001",
            "*toy | gen 1/2 | roles    | selector=LoggedSelector, designer=ScriptedDesigner, "
            "writer=ScriptedWriter",
            "*toy | gen 1/2 | select   | scripted: best is c0001",
            "*toy | gen 1/2 | design   | 10 avenues, 5 plans, kept 2: *",
            "*toy | gen 1/2 | write    | c0002 *: written",
            "*toy | gen 1/2 | evaluate | c0002 c0003 in a child pytest session",
            "*kscientist toy: generation 1*",
            "id*parent*change*verdict*geomean_us*vs parent",
            "c0002*c0001*passed*",
            "best so far: *x [[]*[]] over seed c0001 (tunable.py), ratios timed beside each "
            "parent along its lineage",
            "*stopped: 2 generation(s) done*",
            "population: 5 candidates in 3 generations (5 passed, 0 failed, 0 pending)",
            "best kernel: *c000*.py",
            "check it again: pytest *toy --kernel *c000*.py",
            "*2 generations in *",
        ]
    )
    result.stdout.no_fnmatch_line("*no tests ran*")
    assert "::tunable::" not in result.stdout.str()  # the task's items are not collected here
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert calls[0]["role"] == "selector"
    assert calls[0]["task"]["name"] == "toy"
    assert calls[0]["task"]["benchmark_ids"] == ["n1024-s3", "n4096-s4"]
    assert "out = 2*x" not in calls[0]["task"]["reference_source"]  # the toy reference
    assert [c["ids"] for c in calls if c["role"] == "select"] == [
        ["c0001"],
        ["c0001", "c0002", "c0003"],
    ]
    assert "# Findings: toy" in calls[2]["findings"]  # the findings reach the next generation
    root = toy.path / "population" / "toy"
    assert sorted(p.name for p in root.iterdir() if p.name.startswith("c")) == [
        "c0001",
        "c0002",
        "c0003",
        "c0004",
        "c0005",
    ]
    for name in ("findings.md", "lineage.md", "progress.png", "events.jsonl"):
        assert (root / name).is_file()


def test_offline_scientist_is_the_default_without_hooks_or_llm(
    toy: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KS_FAKE_EVALUATOR", "1")
    result = toy.runpytest("--evolve", "1", "toy", "--ks-llm", "offline")
    assert result.ret == 0
    result.stdout.fnmatch_lines(
        ["*roles    | selector=OfflineSelector, designer=OfflineDesigner, writer=OfflineWriter"]
    )
    meta = json.loads((toy.path / "population" / "toy" / "c0002" / "meta.json").read_text())
    assert meta["plan"]["knobs"] and meta["selection"]["base_id"] == "c0001"
    assert meta["roles"] == {
        "selector": "OfflineSelector",
        "designer": "OfflineDesigner",
        "writer": "OfflineWriter",
    }


@pytest.mark.parametrize(
    ("args", "ini", "message"),
    [
        (
            ["--ks-candidates", "0"],
            "",
            "--ks-candidates expects a positive integer (new candidates per generation), got '0'*",
        ),
        (["--ks-candidates", "two"], "", "--ks-candidates expects a positive integer*got 'two'*"),
        ([], "ks_candidates = -2", "ks_candidates (ini) expects a positive integer*got '-2'*"),
        (
            ["--ks-time-limit", "soon"],
            "",
            "--ks-time-limit expects a positive number of seconds, got 'soon'*",
        ),
        ([], "ks_time_limit = 0", "ks_time_limit (ini) expects a positive number of seconds*"),
        (["--ks-population", "afile"], "", "--ks-population expects a directory, found a file*"),
    ],
)
def test_bad_options_are_usage_errors(
    toy: pytest.Pytester, args: list[str], ini: str, message: str
) -> None:
    toy.makeini(f"[pytest]\n{ini}\n")
    (toy.path / "afile").write_text("")
    result = toy.runpytest("--evolve", "1", "toy", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{message}"])


def test_population_folder_from_ini_and_flag(
    toy: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KS_FAKE_EVALUATOR", "1")
    toy.makeini("[pytest]\nks_population = pops\nks_candidates = 1\n")
    assert toy.runpytest("--evolve", "1", "toy", "--ks-llm", "offline").ret == 0
    assert len(list((toy.path / "pops" / "toy").glob("c0*"))) == 2  # seed + 1 (ini twin)
    assert toy.runpytest("--evolve", "1", "toy", "--ks-population", "flagpop").ret == 0
    assert (toy.path / "flagpop" / "toy" / "c0002" / "c0002.py").is_file()


def test_kill_9_mid_generation_then_resume(toy: pytest.Pytester) -> None:
    """A run killed while evaluating generation 2 resumes there: no renumbering, no duplicates."""
    calls = toy.path / "calls.jsonl"
    read_fd, write_fd = os.pipe()
    env = dict(
        os.environ,
        KS_FAKE_EVALUATOR="1",
        KS_FAKE_BLOCK_AT="3",
        KS_FAKE_READY_FD=str(write_fd),
        KS_FAKE_CALL_LOG=str(calls),
    )
    cmd = _evolve_cmd("3", "toy")
    proc = subprocess.Popen(
        cmd,
        cwd=toy.path,
        env=env,
        pass_fds=(write_fd,),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    os.close(write_fd)
    try:
        ready, _, _ = select.select([read_fd], [], [], 120)
        assert ready and os.read(read_fd, 6) == b"READY\n", "the run never reached generation 2"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        os.close(read_fd)
    root = toy.path / "population" / "toy"
    before = [json.loads(line) for line in calls.read_text().splitlines()]
    assert before == [["c0001"], ["c0002", "c0003", "c0004"], ["c0005", "c0006", "c0007"]]
    assert [e["generation"] for e in events(root) if e["kind"] == "generation_done"] == [0, 1]
    assert not (root / "c0005" / "results.json").exists()

    env.pop("KS_FAKE_BLOCK_AT")
    done = session_server.run(cmd, cwd=toy.path, env=env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "gen 2/3 | resume   | 3 candidate(s) written but never evaluated: c0005 c0006 c0007" in (
        done.stdout
    )
    after = [json.loads(line) for line in calls.read_text().splitlines()][len(before) :]
    assert after == [["c0005", "c0006", "c0007"], ["c0008", "c0009", "c0010"]]
    gens = [e["generation"] for e in events(root) if e["kind"] == "generation_done"]
    assert gens == [0, 1, 2, 3]
    ids = sorted(p.name for p in root.glob("c0*"))
    assert ids == [f"c{i:04d}" for i in range(1, 11)]
    metas = [json.loads((root / i / "meta.json").read_text()) for i in ids]
    assert len({m["sha256"] for m in metas}) == 10
    assert all((root / i / "results.json").is_file() for i in ids)


def test_two_concurrent_runs_share_one_population_safely(toy: pytest.Pytester) -> None:
    env = dict(os.environ, KS_FAKE_EVALUATOR="1")
    cmd = _evolve_cmd("3", "toy")
    procs = [
        subprocess.Popen(
            cmd, cwd=toy.path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert not any("warning: population record" in out for out in outs)
    root = toy.path / "population" / "toy"
    ids = sorted(p.name for p in root.glob("c0*"))
    assert ids == [f"c{i:04d}" for i in range(1, len(ids) + 1)] and len(ids) >= 10
    metas = [json.loads((root / i / "meta.json").read_text()) for i in ids]
    results = [json.loads((root / i / "results.json").read_text()) for i in ids]
    assert len({m["sha256"] for m in metas}) == len(ids)
    assert [r["id"] for r in results] == ids and all(r["status"] == "passed" for r in results)
    runs = {e["run_id"] for e in events(root) if e["kind"] == "run_end"}
    assert len(runs) == 2


FAST_SEED = '''"""A real, tunable toy kernel: out = 2*x + y in chunks of ``chunk`` elements."""

import torch

TUNABLES = {"chunk": 64}
TUNABLE_SPACE = {"chunk": [16, 64, 256, 1024, 0]}


def custom_kernel(data):
    x, y, out = data
    step = TUNABLES["chunk"] or x.numel()
    for i in range(0, x.numel(), step):
        torch.add(y[i:i + step], x[i:i + step], alpha=2, out=out[i:i + step])
    return out
'''


def _axpy_with_fast_seed(pytester: pytest.Pytester) -> None:
    """The toy axpy task in pytester's folder, seeded with FAST_SEED only."""
    task = pytester.mkdir("axpy")
    axpy = TESTS / "data" / "axpy"
    (task / "task.toml").write_text((axpy / "task.toml").read_text())
    (task / "reference.py").write_text((axpy / "reference.py").read_text())
    (task / "seeds").mkdir()
    (task / "seeds" / "chunked.py").write_text(FAST_SEED)


@pytest.mark.slow
def test_real_child_sessions_evaluate_and_improve(pytester: pytest.Pytester) -> None:
    """Generations evaluated by the real harness in child pytest sessions on the CPU."""
    _axpy_with_fast_seed(pytester)
    result = pytester.runpytest_subprocess(
        "-p",
        "no:cacheprovider",
        "--evolve",
        "2",
        "axpy",
        "--ks-candidates",
        "2",
        "--ks-llm",
        "offline",
        "--ks-profile",
        "cpu",
        "--ks-salt",
        "5",
        timeout=600,
    )
    assert result.ret == 0, result.stdout.str()
    root = pytester.path / "population" / "axpy"
    records = {
        p.parent.name: json.loads(p.read_text()) for p in sorted(root.glob("c0*/results.json"))
    }
    assert list(records) == ["c0001", "c0002", "c0003", "c0004", "c0005"]
    assert all(r["status"] == "passed" and r["salt"] == 5 for r in records.values())
    assert all(r["profile"] == "cpu" and r["bench_median_us"] for r in records.values())
    seed = records["c0001"]["geomean_us"]
    best = min(r["geomean_us"] for r in records.values())
    assert best < seed  # chunk=64 over 4096 elements is 64 launches; bigger chunks are faster
    logs = sorted((root / "sessions").glob("*.log"))
    assert len(logs) == 3 and "--ks-salt 5" in logs[0].read_text()
    # The loop ranks candidates among themselves: the reference is not timed again each time.
    assert all("--ks-skip-reference" in log.read_text() for log in logs)
    assert not any("::reference::" in log.read_text() or "reference (reference)" in
                   log.read_text() for log in logs)


def test_devices_split_a_generation_over_parallel_sessions(pytester: pytest.Pytester) -> None:
    """--ks-devices: one child session per device at once, one salt, results merged."""
    _axpy_with_fast_seed(pytester)
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--evolve", "1", "axpy", "--ks-candidates", "3",
        "--ks-llm", "offline", "--ks-profile", "cpu", "--ks-devices", "cpu,cpu",
        timeout=600,
    )
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines([
        "*gen 0/1 | evaluate | c0001 in a child pytest session (cpu-0)",
        "*gen 1/1 | evaluate | c0002 c0003 c0004 in 2 child pytest sessions at once "
        "(cpu-0, cpu-1)",
    ])
    root = pytester.path / "population" / "axpy"
    records = {
        p.parent.name: json.loads(p.read_text()) for p in sorted(root.glob("c0*/results.json"))
    }
    assert list(records) == ["c0001", "c0002", "c0003", "c0004"]
    assert all(r["status"] == "passed" for r in records.values())
    generation_1 = [records[c]["salt"] for c in ("c0002", "c0003", "c0004")]
    assert len(set(generation_1)) == 1  # one salt for the sessions of one generation
    logs = sorted((root / "sessions").glob("*.log"))
    assert len(logs) == 3
    texts = [log.read_text() for log in logs]
    # c0001 alone; then c0002 and c0004 in one session, c0003 in the other
    assert sorted(t.count("--kernel") for t in texts) == [1, 1, 2]
    assert all("--ks-device cpu" in t for t in texts)
    assert sorted(log.name.rsplit("-", 2)[-2] for log in logs) == ["cpu", "cpu", "cpu"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--ks-devices", "gpu0"], "--ks-devices expects comma-separated cuda:N or cpu entries, "
         "or all; got 'gpu0' in 'gpu0'; e.g. cuda:0,cuda:1"),
        (["--ks-devices", "cuda:0,cuda:0"], "--ks-devices names a GPU twice in 'cuda:0,cuda:0'"),
        # one GPU, two spellings: two sessions on it, and torch refused "cuda:01" in the child
        (["--ks-devices", "cuda:1,cuda:01"],
         "--ks-devices names a GPU twice in 'cuda:1,cuda:01'"),
        (["--ks-devices", "cuda:\u00b2"], "got 'cuda:\u00b2' in"),  # isdigit() took it
        (["--ks-devices", "cpu,cuda:0"], "--ks-devices 'cpu,cuda:0' mixes cpu with GPUs"),
        # it wrote and evaluated generation 0 before the child session refused it (exit 3)
        (["--ks-devices", "cuda:9,cuda:0"], "--ks-devices names cuda:9, but torch sees "),
        (["--ks-devices", "cpu,cpu", "--ks-device", "cpu"],
         "--ks-devices and --ks-device both pick devices"),
    ],
)
def test_bad_devices_are_usage_errors(pytester: pytest.Pytester, args: list[str],
                                      message: str) -> None:
    task = pytester.mkdir("axpy")
    (task / "task.toml").write_text((TESTS / "data" / "axpy" / "task.toml").read_text())
    result = pytester.runpytest("--evolve", "1", "axpy", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert message in result.stderr.str()


def _child_reported_an_item(sessions: Path) -> bool:
    """Whether the newest of two or more child-session logs has output past its command line."""
    logs = sorted(sessions.glob("*.log"))
    if len(logs) < 2:
        return False
    return bool(logs[-1].read_text(errors="replace").partition("\n\n")[2].strip())


@pytest.mark.slow
def test_ctrl_c_during_a_child_session_stops_cleanly_and_resumes(pytester: pytest.Pytester) -> None:
    """SIGINT to the process group (a terminal's Ctrl-C) while a real child session runs."""
    _axpy_with_fast_seed(pytester)
    cmd = [
        *_evolve_cmd("1", "axpy"),
        "--ks-candidates",
        "2",
    ]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        cmd,
        cwd=pytester.path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        # a suite started in the background (nohup, `cmd &` without job control) passes SIGINT
        # on ignored, and Python then keeps it ignored: the run would never see the Ctrl-C
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:  # blocks until the parent announces generation 1's child session
        seen.append(line)
        if "gen 1/1 | evaluate | c0002 c0003 in a child pytest session" in line:
            break
    else:
        pytest.fail("the run never started generation 1's evaluation:\n" + "".join(seen))
    # Interrupt only once the child session is inside its test loop (it has reported an item),
    # not while it is still starting: the announcement comes before the child exists, and a
    # loaded machine used to let SIGINT land during its start-up.
    sessions = pytester.path / "population" / "axpy" / "sessions"
    deadline = time.monotonic() + 120
    while not _child_reported_an_item(sessions):
        assert time.monotonic() < deadline, "generation 1's child session never ran an item"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)
    out = "".join(seen) + proc.stdout.read()
    code = proc.wait(timeout=120)
    assert code == pytest.ExitCode.INTERRUPTED, out  # 2, as README says
    assert "stopped: interrupted (Ctrl-C)" in out, out
    with pytest.raises(ProcessLookupError):
        os.killpg(proc.pid, 0)  # nothing of the run (child session included) is left running
    root = pytester.path / "population" / "axpy"
    assert (root / "c0001" / "results.json").is_file()
    assert not (root / "c0002" / "results.json").exists()
    done = session_server.run(cmd, cwd=pytester.path, env=env, timeout=300)
    assert done.returncode == 0, done.stdout
    assert "2 candidate(s) written but never evaluated: c0002 c0003" in done.stdout
    assert sorted(p.name for p in root.glob("c0*")) == ["c0001", "c0002", "c0003"]
    assert all((root / c / "results.json").is_file() for c in ("c0002", "c0003"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_all_devices_without_a_gpu_is_a_usage_error(pytester: pytest.Pytester) -> None:
    task = pytester.mkdir("axpy")
    (task / "task.toml").write_text((TESTS / "data" / "axpy" / "task.toml").read_text())
    result = pytester.runpytest("--evolve", "1", "axpy", "--ks-devices", "all")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--ks-devices all: this machine has no CUDA device" in result.stderr.str()


def test_a_broken_task_under_evolve_is_a_usage_error(toy: pytest.Pytester) -> None:
    (toy.path / "toy" / "task.toml").write_text('name = "toy"\ncase_keys = 3\n')
    result = toy.runpytest("--evolve", "1", "toy")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--evolve toy: *task.toml*"])


def test_an_unusable_population_folder_is_a_usage_error(toy: pytest.Pytester) -> None:
    (toy.path / "population").mkdir()
    (toy.path / "population" / "toy").write_text("not a folder")
    result = toy.runpytest("--evolve", "1", "toy")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--evolve toy: population folder *toy is a file*"])
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()


def test_evolve_and_llm_options_are_resolved_once_per_run(
        toy: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_kscientist.evolve import run_options
    from pytest_kscientist.evolve.llm import llm_options

    calls = {"evolve": 0, "llm": 0}

    def counted(name: str, real):  # type: ignore[no-untyped-def]
        def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
            calls[name] += 1
            return real(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(run_options, "resolve", counted("evolve", run_options.resolve))
    monkeypatch.setattr(llm_options, "resolve_settings",
                        counted("llm", llm_options.resolve_settings))
    monkeypatch.setenv("KS_FAKE_EVALUATOR", "1")
    assert toy.runpytest("--evolve", "2", "toy", "--ks-llm", "offline").ret == 0
    assert calls == {"evolve": 1, "llm": 1}


def test_a_provider_that_cannot_go_on_exits_3_and_a_rerun_resumes(
    toy: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Exit codes end to end (issue 13: they were 1): a role that cannot go on is 3."""
    from fake_llm_server import FakeLLMServer, FakeReply

    monkeypatch.setenv("KS_FAKE_EVALUATOR", "1")
    monkeypatch.setenv("GEMINI_API_KEY", "AIzaFAKE-exit-code-key-00000")
    with FakeLLMServer(lambda request: FakeReply.error(401, "API key not valid")) as server:
        refused = toy.runpytest_subprocess("--evolve", "1", "toy", "--ks-llm", "gemini",
                                           "--ks-llm-base-url", server.url)
    assert refused.ret == 3, refused.stdout.str()
    refused.stdout.fnmatch_lines([
        "*stopped: the LLM provider cannot go on (designer): designer: Gemini answered HTTP 401"
        "*the provider refuses calls (HTTP 401): check the API key*rerun the same command to "
        "resume*",
    ])
    resumed = toy.runpytest_subprocess("--evolve", "1", "toy", "--ks-llm", "offline")
    assert resumed.ret == 0, resumed.stdout.str()
    resumed.stdout.fnmatch_lines(["*1 generation in *"])


def test_evolve_with_a_refused_key_stops_before_generation_0(
    toy: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """End to end: exit 3 (resumable) before any evaluation, with the fix in the message.
    Without the conftest's role hooks, so that the built-in LLM scientist plays (a run whose
    own hooks may play the roles is not checked, as its cost is not projected)."""
    (toy.path / "conftest.py").write_text("")
    monkeypatch.setenv("GEMINI_API_KEY", "AIzaFAKE-start-check-key-0000")
    from fake_llm_server import FakeLLMServer, FakeReply

    with FakeLLMServer() as server:
        server.lookup_reply = FakeReply.error(400, "API key not valid. Please pass a valid key.")
        refused = toy.runpytest_subprocess("--evolve", "1", "toy", "--ks-llm", "gemini",
                                           "--ks-llm-base-url", server.url)
        assert server.requests == []
    assert refused.ret == 3, refused.stdout.str()
    refused.stdout.fnmatch_lines([
        "*stopped: the LLM provider cannot go on: start check: Gemini answered HTTP 400 to a "
        "lookup of model*API key not valid*check the API key*nothing was evaluated or spent*",
    ])
    assert "gen 0/1 | evaluate" not in refused.stdout.str()
    assert "AIzaFAKE-start-check-key-0000" not in refused.stdout.str()


def test_child_sessions_get_the_parents_timing_flags(pytester: pytest.Pytester) -> None:
    """How to evaluate is the user's choice for every generation: the budget and the workers
    a kernel is timed in reach each child session; the reference and baselines stay off."""
    config = pytester.parseconfig("--ks-bench-budget", "0.5", "--ks-bench-workers", "2")
    args = ChildSession.for_config(config, pytester.path, pytester.path / "logs").args
    joined = " ".join(args)
    assert "--ks-bench-budget 0.5" in joined and "--ks-bench-workers 2" in joined, args
    assert "--ks-skip-reference" in args and "--ks-baselines none" in joined, args


def test_devices_of_different_gpu_models_are_a_usage_error(monkeypatch) -> None:
    """Each generation's kernels are ranked together whichever session timed them: on an
    H100 beside an A100 the second's were recorded as the first's machine."""
    import torch

    from pytest_kscientist.evolve.run_options import _one_model

    models = {0: "NVIDIA H100 80GB HBM3", 1: "NVIDIA A100-SXM4-80GB", 2: "NVIDIA H100 80GB HBM3"}
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: models[index])
    assert _one_model(("cuda:0", "cuda:2"), "--ks-devices", "cuda:0,cuda:2") == ("cuda:0",
                                                                                   "cuda:2")
    with pytest.raises(pytest.UsageError, match="names GPUs of different models .cuda:0 NVIDIA "
                       "H100 80GB HBM3, cuda:1 NVIDIA A100-SXM4-80GB.: their sessions"):
        _one_model(("cuda:0", "cuda:1"), "--ks-devices", "all")
