"""Runner processes started ahead of need (worker.Spares): real processes, CPU device."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers import REPO

from pytest_kscientist.formats.task import load_task
from pytest_kscientist.harness.forked import ForkedRunner
from pytest_kscientist.harness.mounts import quiet_prefix, sandbox_prefix
from pytest_kscientist.harness.runners import RunnerProcess, Spares
from pytest_kscientist.harness.spawn import Worker, _spawn_mounts, clean_environment

FP8 = REPO / "tasks" / "fp8_gemm"


def _worker(spares: Spares) -> Worker:
    task = load_task(FP8)
    return Worker(task.describe(), "cpu", task.spec.output_index, 120.0, sandbox=False,
                  spares=spares)


def _ready(spares: Spares) -> list:
    return list(spares._ready.values())


def test_taking_a_runner_starts_the_next_and_the_next_worker_uses_it() -> None:
    spares = Spares(ahead=True)
    first = _worker(spares)
    try:
        (waiting,) = _ready(spares)
        assert waiting.proc.poll() is None and waiting.proc.pid != first.proc.pid
        second = _worker(spares)
        try:
            assert second.proc.pid == waiting.proc.pid  # the spare, not a new process
            # It serves this worker's key: a request gets the runner's own answer.
            header, _ = second.request("fetch", count=0)
            assert header["ok"] is False and "without a call before it" in header["reason"]
            assert len(_ready(spares)) == 1
        finally:
            second.close()
    finally:
        first.close()
        left = _ready(spares)
        spares.close()
    assert all(p.proc.poll() is not None for p in left)  # close() ended the one waiting
    assert _ready(spares) == []


def test_a_spare_that_died_while_waiting_is_replaced() -> None:
    spares = Spares(ahead=True)
    first = _worker(spares)
    try:
        (waiting,) = _ready(spares)
        waiting.proc.kill()
        waiting.proc.wait()
        second = _worker(spares)
        try:
            assert second.proc.pid != waiting.proc.pid and second.alive()
            assert second.overhead_us >= 0.0
        finally:
            second.close()
    finally:
        first.close()
        spares.close()


def test_without_ahead_nothing_waits() -> None:
    spares = Spares(ahead=False)
    worker = _worker(spares)
    try:
        assert _ready(spares) == [] and worker.alive()
    finally:
        worker.close()


@pytest.mark.parametrize("device, ahead", [("cpu", False), ("cuda:0", True)])
def test_the_session_starts_runners_ahead_only_on_a_gpu(device: str, ahead: bool) -> None:
    from pytest_kscientist.harness.session import KsSession

    session = KsSession.__new__(KsSession)
    session.__dict__["device"] = device
    session.early_runners = None
    assert session.spares.ahead is ahead and session.spares.fork is not ahead


def test_a_runner_adopted_is_the_one_its_first_worker_takes() -> None:
    """A runner started before the session knew its device (KsSession.start_early, on a GPU)
    is handed to the spares for the mounts and environment it was started with: the first
    take of those gets it, a second adoption of the same key discards the first runner."""
    env = {"PATH": "/usr/bin:/bin", "KS_TEST": "adopt"}
    spares = Spares(ahead=False)
    early = [RunnerProcess(None, env), RunnerProcess(None, env)]
    try:
        spares.adopt(None, env, early[0])
        spares.adopt(None, env, early[1])
        assert early[0].proc.wait(timeout=10) is not None  # discarded
        assert spares.take(None, dict(env)) is early[1]
        assert spares._ready == {}
    finally:
        for process in early:
            process.discard()
        spares.close()


@pytest.mark.parametrize("device, kept", [("cpu", False), ("cuda:0", True)])
def test_runners_started_in_collection_go_to_a_gpu_sessions_spares(device: str,
                                                                     kept: bool) -> None:
    """KsSession.start_early on a GPU starts --kernel files' runners before the device is
    known: the session's spares adopt them where the device is a GPU, and discard them where
    torch found none (the device files were there, the build is CPU-only)."""
    from pytest_kscientist.harness.session import KsSession

    env = {"PATH": "/usr/bin:/bin", "KS_TEST": "early"}
    session = KsSession.__new__(KsSession)
    session.__dict__["device"] = device
    early = RunnerProcess(None, env)
    session.early_runners = [(None, env, early)]
    try:
        spares = session.spares
        assert session.early_runners == []
        if kept:
            assert spares.take(None, dict(env)) is early and early.proc.poll() is None
        else:
            assert early.proc.wait(timeout=10) is not None and spares._ready == {}
    finally:
        early.discard()
        session.spares.close()


def test_a_gpu_session_starts_one_runner_early_for_each_sandbox_of_its_kernels(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """KsSession._runners_early (start_early on a GPU): a --kernel file that builds an
    extension has a sandbox of its own (its build folder writable), so its runner is started;
    two files that build nothing share one sandbox, so one runner serves them (its first
    worker's take starts the next). Each is pinned to the GPU the session will use."""
    from types import SimpleNamespace

    from pytest_kscientist.harness.session import KsSession

    if quiet_prefix(FP8 / "task.toml") is None:
        pytest.skip("the worker sandbox does not work here")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    plain = "def custom_kernel(data):\n    return data\n"
    for name, text in (("a", plain), ("b", plain + "# b\n"),
                       ("c", "from torch.utils.cpp_extension import load_inline\n" + plain)):
        (tmp_path / f"{name}.py").write_text(text)
    session = KsSession.__new__(KsSession)
    session.early_runners = None
    session.settings = SimpleNamespace(kernels=tuple(tmp_path / f"{n}.py" for n in "abc"))
    session._runners_early(FP8 / "task.toml", "cuda:1")
    try:
        (plain_mounts, env, _), (own_mounts, _, _) = session.early_runners
        assert plain_mounts != own_mounts and env["CUDA_VISIBLE_DEVICES"] == "1"
        session._runners_early(FP8 / "task.toml", "cuda:1")  # a second task file: none more
        assert len(session.early_runners) == 2
    finally:
        for _, _, process in session.early_runners:
            process.discard()


def test_the_zygote_started_early_forks_the_first_workers() -> None:
    """KsSession.start_early: the zygote started before any worker is asked for (beside the
    pytest process's own import of torch) forks the task's sandboxed workers."""
    if quiet_prefix(FP8 / "task.toml") is None:
        pytest.skip("the worker sandbox does not work here")
    spares = Spares(ahead=False, fork=True)
    spares.start_zygote(clean_environment("cpu"))
    (zygote,) = spares._zygotes.values()
    task = load_task(FP8)
    worker = Worker(task.describe(), "cpu", task.spec.output_index, 120.0, spares=spares)
    try:
        assert isinstance(worker.process, ForkedRunner) and worker.alive()
        assert list(spares._zygotes.values()) == [zygote] and zygote.proc.poll() is None
    finally:
        worker.close()
        spares.close()
    assert zygote.proc.poll() is not None  # close() ended it


def test_the_early_prefix_is_the_one_a_worker_of_the_task_gets() -> None:
    spec = FP8 / "task.toml"
    prefix = quiet_prefix(spec)
    if prefix is None:
        pytest.skip("the worker sandbox does not work here")
    mounts = _spawn_mounts(spec, None)
    assert mounts is not None and prefix == sandbox_prefix(*mounts)


def test_each_runner_started_ahead_gets_a_folder_and_caches_of_its_own() -> None:
    """A spare is started before its candidate is known: its own folder (worker_folders.py) is
    made as it starts, so two runners of one kind never share one."""
    spares = Spares(ahead=True)
    first = _worker(spares)
    try:
        (waiting,) = _ready(spares)
        second = _worker(spares)
        try:
            assert second.proc.pid == waiting.proc.pid
            folders = [w.process.tmp.name for w in (first, second)]
            assert folders[0] != folders[1]
            for worker, folder in zip((first, second), folders, strict=True):
                environ = dict(entry.split("=", 1) for entry in Path(
                    f"/proc/{worker.proc.pid}/environ").read_text().split("\0") if "=" in entry)
                assert environ["TRITON_CACHE_DIR"] == os.path.join(folder, "triton")
        finally:
            second.close()
    finally:
        first.close()
        spares.close()
    assert not any(os.path.exists(f) for f in folders)
