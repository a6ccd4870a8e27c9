"""Workers forked from a zygote (harness/forked.py, worker/zygote.py, worker/sandbox.py): the
same sandbox, descriptors and exit codes as a runner exec'd through the sandbox prefix."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from helpers import AXPY

from pytest_kscientist.formats.task import load_task
from pytest_kscientist.harness.forked import ForkedRunner
from pytest_kscientist.harness.mounts import protected_paths, sandbox_available
from pytest_kscientist.harness.runners import RunnerProcess, Spares
from pytest_kscientist.harness.spawn import Worker, WorkerDied, clean_environment

WHY = sandbox_available(tuple(protected_paths(AXPY / "reference.py")))
pytestmark = pytest.mark.skipif(WHY is not None, reason=f"no worker sandbox here: {WHY}")

# Imported by the worker's load: what the process can see and do, raised as JSON.
PROBE = '''
import errno, json, os, socket
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
seen = {k: status[k].strip() for k in ("Uid", "Gid", "CapInh", "CapPrm", "CapEff", "CapBnd",
                                        "CapAmb", "NoNewPrivs", "Seccomp")}
seen["pid"] = os.getpid()
seen["pids"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
seen["parent"] = os.getppid()
seen["group_leader"] = os.getpgrp() == os.getsid(0)
fds = {}
for fd in os.listdir("/proc/self/fd"):
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        continue
    kind = target.split(":")[0] if ":" in target else ("log" if target.endswith(".log")
                                                       else target)
    fds[kind] = fds.get(kind, 0) + 1
seen["fds"] = fds
seen["cwd"] = os.path.basename(os.path.dirname(os.getcwd()))  # the workers' root
for what, folder in (("own", os.getcwd()), ("root", os.path.dirname(os.getcwd())),
                     ("triton", os.environ["TRITON_CACHE_DIR"])):
    try:
        os.makedirs(folder, exist_ok=True)
        open(os.path.join(folder, "planted.py"), "w").close()
        seen[what] = "writable"
    except OSError as exc:
        seen[what] = errno.errorcode[exc.errno]
try:
    open(os.path.join(PROJECT, "planted.txt"), "w")
    seen["project"] = "writable"
except OSError as exc:
    seen["project"] = errno.errorcode[exc.errno]
try:
    socket.create_connection(("127.0.0.1", 9), timeout=2)
    seen["net"] = "connected"
except OSError as exc:
    seen["net"] = errno.errorcode.get(exc.errno, str(exc))
raise LookupError("SEEN" + json.dumps(seen, sort_keys=True))
'''


def _seen(spares: Spares, probe: Path) -> dict:
    task = load_task(AXPY)
    worker = Worker(task.describe(), "cpu", task.spec.output_index, 120.0, sandbox=True,
                    spares=spares)
    try:
        header, _ = worker.request("load", path=str(probe), entry="custom_kernel")
    finally:
        worker.close()
    assert not header["ok"], header
    return json.loads(header["detail"].rsplit("SEEN", 1)[1].strip().splitlines()[0])


def test_a_forked_worker_is_sandboxed_as_an_execd_one(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(f"PROJECT = {str(AXPY)!r}\n" + PROBE)
    forked = Spares(ahead=False, fork=True)
    try:
        seen = _seen(forked, probe)
        assert forked._zygotes  # it came from the zygote...
    finally:
        forked.close()
    execd = _seen(Spares(ahead=False), probe)  # ...and this one through the prefix
    assert seen == execd
    assert seen["CapEff"] == seen["CapBnd"] == seen["CapAmb"] == "0000000000000000"
    assert seen["NoNewPrivs"] == "1" and seen["pids"] == [1] and seen["pid"] == 1
    assert seen["project"] == "EROFS" and seen["net"] == "ENETUNREACH"
    # Its own folder and caches, no other worker's (worker_folders.py).
    assert seen["own"] == seen["triton"] == "writable" and seen["root"] == "EROFS"
    assert not (AXPY / "planted.txt").exists()


EXITS = '''
import os
os._exit(3)
'''


def test_a_forked_worker_reports_its_exit_code_and_a_kill(tmp_path: Path) -> None:
    exits = tmp_path / "exits3.py"
    exits.write_text(EXITS)
    task = load_task(AXPY)
    spares = Spares(ahead=False, fork=True)
    try:
        worker = Worker(task.describe(), "cpu", task.spec.output_index, 120.0, sandbox=True,
                        spares=spares)
        assert isinstance(worker.process, ForkedRunner)
        with pytest.raises(WorkerDied, match="worker exited with code 3 before answering"):
            worker.request("load", path=str(exits), entry="custom_kernel")
        worker = Worker(task.describe(), "cpu", task.spec.output_index, 120.0, sandbox=True,
                        spares=spares)
        assert worker.alive() and worker.cpus() >= 1 and worker.cpu_us() is not None
        assert worker.kill() == -signal.SIGKILL and not worker.alive()
    finally:
        spares.close()


def test_a_dead_zygote_is_replaced(tmp_path: Path) -> None:
    task = load_task(AXPY)
    spares = Spares(ahead=False, fork=True)
    try:
        first = Worker(task.describe(), "cpu", task.spec.output_index, 120.0, sandbox=True,
                       spares=spares)
        first.close()
        (zygote,) = spares._zygotes.values()
        os.killpg(zygote.proc.pid, signal.SIGKILL)
        zygote.proc.wait()
        second = Worker(task.describe(), "cpu", task.spec.output_index, 120.0, sandbox=True,
                        spares=spares)
        try:
            assert isinstance(second.process, ForkedRunner) and second.alive()
            assert spares._zygotes and zygote not in spares._zygotes.values()
        finally:
            second.close()
    finally:
        spares.close()


def test_without_the_sandbox_a_worker_is_execd_not_forked() -> None:
    task = load_task(AXPY)
    spares = Spares(ahead=False, fork=True)
    try:
        worker = Worker(task.describe(), "cpu", task.spec.output_index, 120.0, sandbox=False,
                        spares=spares)
        try:
            assert isinstance(worker.process, RunnerProcess) and not spares._zygotes
        finally:
            worker.close()
    finally:
        spares.close()


def test_where_the_forked_sandbox_fails_the_session_execs_its_workers(tmp_path: Path) -> None:
    """A step the kernel refuses in the forked child (here a bind mount of a folder that does
    not exist) is no worker: the zygote says so, and the session's workers are exec'd."""
    spares = Spares(ahead=False, fork=True)
    missing = tmp_path / "missing"
    try:
        with pytest.raises(OSError, match="did not set up its sandbox"):
            ForkedRunner(spares._zygote((), clean_environment("cpu")), [missing], [])
        process = spares.take(((missing,), ()), clean_environment("cpu"))
        try:
            assert isinstance(process, RunnerProcess) and spares.fork is False
        finally:
            process.discard()
    finally:
        spares.close()


@pytest.mark.parametrize("fork", [True, False], ids=["forked", "execd"])
def test_the_workers_cpu_time_is_its_threads_time(fork: bool) -> None:
    """``Worker.cpu_us`` reads the runner's process CPU clock (one system call, not a /proc file
    per thread): the same total as its threads' schedstat, growing with the work it does, for
    a sandboxed runner in its own PID namespace too."""
    task = load_task(AXPY)
    spares = Spares(ahead=False, fork=fork)
    try:
        worker = Worker(task.describe(), "cpu", task.spec.output_index, 120.0, sandbox=True,
                        spares=spares)
        worker.request("load", path=str(AXPY / "seeds" / "good.py"), entry="custom_kernel")
        before = worker.cpu_us()
        for seed in range(3):
            worker.request("call", case={"n": 1 << 22, "seed": 1}, seed=seed)
        after = worker.cpu_us()
        pid = worker._runner_pid()
        threads = sum(int((task_dir / "schedstat").read_text().split()[0])
                      for task_dir in Path(f"/proc/{pid}/task").iterdir()) / 1000.0
        assert before is not None and after is not None and after > before
        assert threads == pytest.approx(after, rel=0.05), (threads, after)
        worker.close()
    finally:
        spares.close()


# Where a fresh 30 MB block comes from, twice: glibc's default serves the first by mmap and,
# once it is freed, the second from the heap (its threshold follows what was freed).
MALLOC_PROBE = '''
import ctypes, json
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.sbrk.restype, libc.sbrk.argtypes = ctypes.c_void_p, [ctypes.c_long]
libc.free.argtypes = [ctypes.c_void_p]
where = []
for _ in range(2):
    block = libc.malloc(30 << 20)
    where.append("heap" if block < libc.sbrk(0) else "mmap")
    libc.free(block)
raise LookupError("SEEN" + json.dumps({"where": where}))
'''


@pytest.mark.parametrize("fork", [True, False], ids=["forked", "execd"])
def test_a_workers_allocations_do_not_depend_on_what_it_freed_before(
        tmp_path: Path, fork: bool) -> None:
    """On the 2-core CPU two copies of the torch seed read 0.83-0.85x or 1.26-1.37x of each
    other in every round of one shape: glibc's mmap threshold had risen in one worker's process
    (a freed block) and not in the other's, so only one paid fresh pages each call. Workers now
    run with fixed thresholds: a block's size alone says where it comes from."""
    probe = tmp_path / "probe.py"
    probe.write_text(MALLOC_PROBE)
    spares = Spares(ahead=False, fork=fork)
    try:
        assert _seen(spares, probe) == {"where": ["heap", "heap"]}
    finally:
        spares.close()


def test_a_users_own_malloc_settings_win(monkeypatch: pytest.MonkeyPatch) -> None:
    """The thresholds are set where the user has not: by the variable or by GLIBC_TUNABLES
    (a GLIBC_TUNABLES that sets other tunables leaves the rest to us)."""
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.cpu.hwcaps=-AVX512F:glibc.malloc.mmap_threshold=1")
    env = clean_environment("cpu")
    assert "MALLOC_MMAP_THRESHOLD_" not in env
    assert env["MALLOC_TRIM_THRESHOLD_"] == str(256 << 20)
    monkeypatch.delenv("GLIBC_TUNABLES")
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "5")
    env = clean_environment("cuda:1")
    assert env["MALLOC_MMAP_THRESHOLD_"] == str(64 << 20) and env["MALLOC_TRIM_THRESHOLD_"] == "5"


@pytest.mark.parametrize(("parent", "device", "worker"), [
    ({}, "cuda:1", {"CUDA_VISIBLE_DEVICES": "1", "HIP_VISIBLE_DEVICES": "1"}),
    ({"CUDA_VISIBLE_DEVICES": "3"}, "cuda:0", {"CUDA_VISIBLE_DEVICES": "3"}),
    ({"CUDA_VISIBLE_DEVICES": "2, 3"}, "cuda:1", {"CUDA_VISIBLE_DEVICES": "3"}),
    ({"CUDA_VISIBLE_DEVICES": "MIG-5c3a9f0e-1111"}, "cuda:0",
     {"CUDA_VISIBLE_DEVICES": "MIG-5c3a9f0e-1111"}),
    ({"HIP_VISIBLE_DEVICES": "4,5"}, "cuda:1", {"HIP_VISIBLE_DEVICES": "5"}),
])
def test_a_worker_sees_the_gpu_this_process_numbers_so(
        monkeypatch: pytest.MonkeyPatch, parent: dict, device: str, worker: dict) -> None:
    """Under a job's CUDA_VISIBLE_DEVICES=2,3 the pytest process's cuda:1 is GPU 3; its
    workers were given "1", and under a UUID or a MIG slice "0": another GPU than the one the
    reference ran on."""
    for name in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    for name, value in parent.items():
        monkeypatch.setenv(name, value)
    env = clean_environment(device)
    shown = {name: env[name] for name in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")
             if name in env}
    assert shown == worker


def test_a_gpu_worker_has_one_hardware_queue_whatever_the_user_set(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A side stream's work must queue behind the timer's lead (test_gpu_corpus.py's
    under-the-lead test): forced to 1, for a user's 8 from other jobs would reopen that."""
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "8")
    assert clean_environment("cuda:0")["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    assert clean_environment("cpu")["CUDA_DEVICE_MAX_CONNECTIONS"] == "8"  # no GPU to queue on
