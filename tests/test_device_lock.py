"""A GPU's machine-wide lock (harness/device_lock.py): two sessions' items take turns on it.

The lock itself runs anywhere (flock on a file); a session takes it only on a GPU, so the
plugin's items are tested on the CPU with the session's lock swapped for one of the test's
(a conftest of the run), and on a GPU with the real one (the gpu-marked test).
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from helpers import PYTEST

from pytest_kscientist.harness import device_lock
from pytest_kscientist.harness.device_lock import DeviceLock, lock_path
from pytest_kscientist.kswarnings import KsNoDeviceLock

HOLD_S = 2.0
SAID_AFTER = device_lock.SAID_AFTER_S + 0.2  # a wait this long is said when it ends


def _lock(tmp_path: Path, device: str = "cuda:0") -> DeviceLock:
    return DeviceLock(lock_path("GPU-test", tmp_path), device)


def test_a_second_holder_waits_says_who_holds_the_gpu_and_goes_on_once_it_is_free(
        tmp_path: Path) -> None:
    first, second = _lock(tmp_path), _lock(tmp_path)  # two opens: as two sessions have
    said: list[str] = []
    entered = threading.Event()

    def hold() -> None:
        with first.held("tasks/a.py::bench[n1]", said.append):
            entered.set()
            time.sleep(HOLD_S)

    holder = threading.Thread(target=hold)
    holder.start()
    assert entered.wait(10)
    start = time.monotonic()
    with second.held("tasks/b.py::check[n2]", said.append, remind_s=0.5) as waited_b:
        waited = time.monotonic() - start
        assert f"pid {os.getpid()}" in second.holder()
        assert "tasks/b.py::check[n2]" in second.holder()
    holder.join()
    assert waited >= HOLD_S - 0.5 and waited_b >= HOLD_S - 0.5, (waited, said)
    busy = [line for line in said if "is busy" in line]
    assert len(busy) >= 3, said  # the first line, then one every remind_s while it lasted
    assert busy[0].startswith("cuda:0 is busy: another pytest-kscientist session")
    assert f"pid {os.getpid()}" in busy[0] and "tasks/a.py::bench[n1]" in busy[0], busy[0]
    assert "tasks/b.py::check[n2] waits for its turn" in busy[0]
    assert said[-1].startswith("cuda:0: this session's turn came after "), said
    assert second.holder() == "", "the file is emptied when the lock is given back"


def test_a_free_lock_is_taken_at_once_and_says_nothing(tmp_path: Path) -> None:
    said: list[str] = []
    lock = _lock(tmp_path)
    for _ in range(2):  # and again, once given back
        with lock.held("x::check", said.append) as waited:
            assert waited == 0.0
    assert said == []


def test_the_lock_is_free_once_its_holder_is_killed(tmp_path: Path) -> None:
    path = lock_path("GPU-test", tmp_path)
    code = ("import sys, time\nfrom pathlib import Path\n"
            "from pytest_kscientist.harness.device_lock import DeviceLock\n"
            f"with DeviceLock(Path({str(path)!r}), 'cuda:0').held('killed::bench', print):\n"
            "    print('held', flush=True)\n    time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        said: list[str] = []
        lock = DeviceLock(path, "cuda:0")
        waiter = threading.Thread(target=lambda: lock.held("w::check", said.append).__enter__())
        waiter.start()
        time.sleep(0.5)
        assert waiter.is_alive(), "the lock of a live process was taken"
        assert f"pid {proc.pid}" in said[0] and "killed::bench" in said[0], said
        proc.kill()
        waiter.join(10)
        assert not waiter.is_alive(), "the lock of a killed process was not freed"
    finally:
        proc.kill()
        proc.wait()


def test_the_lock_file_is_every_users_under_any_umask(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        lock = _lock(tmp_path)
    finally:
        os.umask(old)
    assert stat.S_IMODE(lock.path.stat().st_mode) == 0o666
    assert lock.path.name.startswith("pytest-kscientist-gpu-")
    assert lock_path("GPU-1/2 x", tmp_path).name == "pytest-kscientist-gpu-GPU-1_2_x.lock"


def test_a_lock_that_cannot_be_opened_is_a_warning_and_the_session_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class Props:  # what torch says of a GPU, on a machine that has none
        name, uuid = "Test GPU", "GPU-not-a-file"

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: Props())
    monkeypatch.setattr(device_lock, "lock_path",
                        lambda key: lock_path(key, tmp_path))
    (tmp_path / "pytest-kscientist-gpu-GPU-not-a-file.lock").mkdir()  # in the file's place
    with pytest.warns(KsNoDeviceLock, match=r"cuda:0: its lock .*GPU-not-a-file\.lock could not "
                      r"be opened \(.*\); this session checks and times kernels without taking "
                      r"turns"):
        assert device_lock.open_lock("cuda:0") is None


# The session's lock, swapped for the test's (KS_TEST_LOCK) on this CPU.
SWAP = """
import os
from pathlib import Path
from pytest_kscientist.harness.device_lock import DeviceLock
from pytest_kscientist.harness.session import KsSession

def _lock(self):
    if "_test_lock" not in self.__dict__:
        self._test_lock = DeviceLock(Path(os.environ["KS_TEST_LOCK"]), "cuda:7")
    return self._test_lock

KsSession.device_lock = property(_lock)
"""


def _run_while_held(args: list[str], lock: DeviceLock, env: dict[str, str] | None = None,
                    cwd: Path | None = None) -> str:
    """A pytest session's output, run while the test holds ``lock`` until the session says it
    waits for it (its line comes through the pipe at once), then a little over the wait that
    is said when it ends (SAID_AFTER)."""
    lines: list[str] = []
    waiting = threading.Event()
    with lock.held("the test's own turn", print):
        proc = subprocess.Popen(args, cwd=cwd, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.append(line)
                if "is busy" in line:
                    waiting.set()
            waiting.set()  # the end of its output: it never said so

        reader = threading.Thread(target=read)
        reader.start()
        waiting.wait(300)
        time.sleep(SAID_AFTER)
        alive = proc.poll() is None
    proc.wait(300)
    reader.join(60)
    out = "".join(lines)
    assert "is busy" in out, f"the session never said it waited:\n{out}"
    assert alive, f"the session ended while the GPU was held:\n{out}"
    assert proc.returncode == 0, out
    return out


@pytest.mark.parametrize("kind", ["validate", "check", "bench"])
def test_a_sessions_items_that_run_kernels_wait_for_another_sessions_turn(
        tmp_path: Path, axpy_dir: Path, kind: str) -> None:
    (tmp_path / "conftest.py").write_text(SWAP)
    path = lock_path("GPU-test", tmp_path)
    env = {**os.environ, "KS_TEST_LOCK": str(path)}
    args = [*PYTEST, str(axpy_dir), "--ks-baselines", "none", "-k", kind]

    free = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert free.returncode == 0 and "is busy" not in free.stdout, free.stdout + free.stderr
    out = _run_while_held(args, DeviceLock(path, "cuda:7"), env, tmp_path)
    busy = [line for line in out.splitlines() if "is busy" in line]
    assert len(busy) == 1, out  # one item waited; the rest found the GPU free
    assert busy[0].startswith("pytest-kscientist: cuda:7 is busy: another pytest-kscientist "
                              f"session is checking or timing kernels on it (pid {os.getpid()}")
    assert "the test's own turn" in busy[0] and f"::{kind}" in busy[0], busy[0]
    assert "pytest-kscientist: cuda:7: this session's turn came after " in out, out
    assert path.read_text() == "", "every item gave the lock back"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU")
def test_a_gpu_session_waits_while_another_holds_its_gpu(tmp_path: Path, axpy_dir: Path) -> None:
    lock = device_lock.open_lock("cuda:0")  # by the GPU's UUID, as a session opens it
    assert lock is not None
    uuid = str(torch.cuda.get_device_properties(0).uuid)
    assert uuid and uuid in lock.path.name, lock.path
    args = [*PYTEST, str(axpy_dir), "--ks-baselines", "none", "--ks-device", "cuda:0"]
    out = _run_while_held(args, lock, cwd=tmp_path)
    assert f"cuda:0 is busy: another pytest-kscientist session is checking or timing kernels " \
           f"on it (pid {os.getpid()}" in out, out
    assert "cuda:0: this session's turn came after " in out, out
