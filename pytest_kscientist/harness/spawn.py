"""The pytest side of a candidate worker: spawn, talk, watch, kill, replace.

Each candidate runs in a fresh ``python -m pytest_kscientist.worker.runner`` process in its own
session (process group), pinned to one device, in a temporary working directory, with secrets
removed from its environment, its stdout and stderr going to two log files that are never
parsed (shown in its items' reports, each under its own name: ``Worker.new_output``).
Results come back over a dedicated pipe as HMAC-authenticated frames (``protocol/channel.py``).

Where ``unshare`` can create user namespaces, the worker also runs sandboxed: no network, its own
PID namespace (it cannot see the pytest process, and nothing it starts outlives it), the folders
of ``mounts.py`` mounted read-only (the project, the working directory, the installed code,
torch's extension root but its own build folder), with every capability dropped before the
runner starts. Without it, one warning says so and the worker runs unsandboxed.

A worker dies with the pytest process that started it, however that process ends: a
``Lifeline`` (``lifeline.py``; also what ties an ``--evolve`` child session to its parent;
notes/processes.md). Its runner process is started ahead of it (``runners.py``): exec'd, or, for
a CPU session's sandboxed workers, forked from a zygote (``forked.py``), with the same sandbox
set up by system calls after the fork (``worker/sandbox.py``).
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pytest_kscientist.errors import CandidateFailure, ChannelError
from pytest_kscientist.harness.mounts import (
    Mounts,
    extension_root,
    sandbox_plan,
    warn_cache_writable,
    warn_unsandboxed,
)
from pytest_kscientist.harness.runners import Spares
from pytest_kscientist.protocol import channel

SECRET_NAME = re.compile(
    r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE|SESSION|PRIVATE|"
    r"^(GEMINI|GOOGLE|OPENAI|ANTHROPIC|AWS|AZURE|HF|HUGGING|GITHUB|GH|CI_JOB)_|^PYTEST_|^KS_",
    re.IGNORECASE,
)


CPU_THREADS = 1
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
# glibc's malloc serves a block of 128 KB or more by mmap until one such block is freed, then
# raises that threshold to the freed size (to 32 MB): so whether a call's temporaries cost
# fresh pages depends on what its worker process allocated and freed before. Two workers of
# one kernel then differ for their whole lives (on the 2-core CPU, two copies of the torch
# seed read 0.83-0.85x or 1.26-1.37x of each other in every round of one shape). Fixed
# thresholds make it a function of the block's size alone; a user's own settings win.
# variable -> (value, the glibc tunable it stands for, which GLIBC_TUNABLES may set instead)
MALLOC_VARIABLES = {
    "MALLOC_MMAP_THRESHOLD_": (str(64 << 20), "glibc.malloc.mmap_threshold"),
    "MALLOC_TRIM_THRESHOLD_": (str(256 << 20), "glibc.malloc.trim_threshold"),
}

# A worker's own request while it answers one of ours (a load's builds), with the answer's
# deadline -> the reply; at most MAX_INTERIM of them per answer are passed on.
Interim = Callable[[dict[str, Any], float], dict[str, Any]]
MAX_INTERIM = 16
# Seconds a worker has to start (the interpreter, torch, the device's context, the task's own
# modules), at least: no candidate code runs before its hello, so a short --ks-timeout meant
# for the kernel's calls must not fail the kernel on a machine that starts workers slowly.
HELLO_MIN_S = 60.0


# Characters of a worker's new output shown in one item's report (its head and tail beyond).
OUTPUT_SHOWN = 8000


class WorkerDied(CandidateFailure):
    """The worker did not answer: it exited, crashed, hung or sent something not authentic.

    A candidate failure like any other (its ``detail`` is the worker's log tail), so callers
    handle one type; ``hung`` says the watchdog killed it.
    """

    def __init__(self, reason: str, log_tail: str = "", hung: bool = False) -> None:
        super().__init__(reason, log_tail)
        self.hung = hung

    @property
    def log_tail(self) -> str:
        return self.detail


class MachineFailed(WorkerDied):
    """A worker did not start on this machine, before any candidate code ran: the device's
    context or memory, the timer's calibration, the sandbox, a start that died or hung. Not a
    verdict on the kernel: its items say "not judged", the session's results list the ones
    that became an item's verdict (``machine_failures``; one the rounds got past with fewer
    workers is not), and ``--evolve`` stops rather than record the kernel as failed."""

    def __init__(self, reason: str, log_tail: str = "", hung: bool = False,
                 out_of_memory: bool = False) -> None:
        super().__init__(f"not judged: the worker did not start, and no candidate code had "
                         f"run: the machine failed (or the task's own modules), not the kernel: "
                         f"{reason}", log_tail, hung)
        self.cause = reason
        self.out_of_memory = out_of_memory


def clean_environment(device: str) -> dict[str, str]:
    """The parent's environment without secrets, pinned to ``device``."""
    env = {k: v for k, v in os.environ.items() if not SECRET_NAME.search(k)}
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    for name, (value, tunable) in MALLOC_VARIABLES.items():
        if tunable not in env.get("GLIBC_TUNABLES", ""):
            env.setdefault(name, value)
    if device.startswith("cuda"):
        env.update(visible_devices(device.partition(":")[2] or "0"))
        # One hardware queue for all of the worker's streams: work a call starts on a side
        # stream then queues behind the timer's lead, flush and start event, as the caller's
        # does. With several queues, such work ran beside the lead (a spin on one SM) and was
        # timed as nothing (docs/timing.md). Forced, not defaulted: the user's setting for
        # other jobs must not reopen that.
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
    else:
        env["TRITON_INTERPRET"] = "1"
        env["CUDA_VISIBLE_DEVICES"] = ""
        # One compute thread per CPU worker, so a worker's timing does not fight the pytest
        # process, other workers or its own idle thread pool for the cores (NOTES.md: a
        # call's slowest stayed within 1.1-1.7x of its median with one thread, 7.5x without).
        for name in THREAD_VARIABLES:
            env[name] = str(CPU_THREADS)
    return env


def visible_devices(index: str) -> dict[str, str]:
    """The variables that show a worker only the GPU this process numbers ``index``. Torch
    numbers the GPUs its ``CUDA_VISIBLE_DEVICES`` (on ROCm ``HIP_VISIBLE_DEVICES``) lists: under
    a job's ``CUDA_VISIBLE_DEVICES=2,3`` cuda:1 is the list's "3" (an index, a GPU-... or
    MIG-... UUID), where the worker was given "1", another GPU, perhaps a colleague's. A
    variable this process has is read through; one it lacks is set to ``index`` only where it
    has neither (the other pins the device: ROCm reads both)."""
    found = {}
    listed = {name: os.environ.get(name, "") for name in ("CUDA_VISIBLE_DEVICES",
                                                           "HIP_VISIBLE_DEVICES")}
    for name, value in listed.items():
        entries = [entry.strip() for entry in value.split(",") if entry.strip()]
        if entries:
            found[name] = entries[int(index)] if index.isdigit() and int(index) < len(
                entries) else index
        elif not any(listed.values()):
            found[name] = index
    return found


def process_cpu_clock(pid: int) -> int:
    """The clock id of process ``pid``'s CPU time, all threads (Linux's ``clock_getcpuclockid``:
    CPUCLOCK_SCHED of the whole thread group), for ``time.clock_gettime_ns``."""
    return (~pid << 3) | 2


def _spawn_mounts(reference: Path, sandbox: bool | None, builds: Path | None = None
                  ) -> Mounts | None:
    """``mounts.sandbox_plan``'s mounts, warning once for what it cannot protect (with
    ``sandbox`` True, a sandbox that does not work is the worker's death); None: no
    sandbox."""
    if sandbox is False:
        return None
    mounts, why, cache_why = sandbox_plan(reference, builds)
    if why is not None:
        if sandbox:
            raise WorkerDied(f"the worker sandbox was required but does not work here: {why}")
        warn_unsandboxed(why)
    elif cache_why is not None:
        warn_cache_writable(cache_why)
    return mounts


def gpu_visible() -> bool:
    """Whether this machine shows a GPU's device files (NVIDIA, ROCm, WSL)."""
    return any(os.path.exists(p) for p in ("/dev/nvidiactl", "/dev/kfd", "/dev/dxg"))


class Worker:
    """One live candidate process. Any failure to answer kills it; make a new one to go on.

    ``sandbox``: None uses the OS sandbox when it works here, True requires it, False skips it.
    ``spares``: where to take the process from (started ahead of time), else one is started.
    """

    def __init__(self, problem: dict[str, Any], device: str, output_index: int | None,
                 timeout: float, sandbox: bool | None = None, protect: Path | None = None,
                 spares: Spares | None = None, builds: Path | None = None):
        # ``problem``: how the worker draws inputs (task.Task.describe()); ``protect``: a file
        # of the task whose project the sandbox keeps read-only (default: the problem's path);
        # ``builds``: the one extension folder it may write (build_folder of its candidate).
        mounts = _spawn_mounts(Path(protect or problem["path"]), sandbox, builds)
        # Its load_inline calls may be built by the pytest process (harness/shared_builds.py)
        # only where no candidate can write the extension root, its own folder excepted.
        self.shares_builds = (builds is not None and mounts is not None
                              and extension_root() in mounts[0])
        process = (spares or Spares(ahead=False)).take(mounts, clean_environment(device),
                                                       ahead=builds is None)
        self.sandboxed = mounts is not None
        self.timeout = timeout
        self.key = secrets.token_bytes(32)
        self.seq_out = 0
        self.seq_in = 0
        self._pid: int | None = None
        self.process = process
        # Bytes of its stdout and stderr logs handed to an item's report (new_output).
        self._shown = {"out": 0, "err": 0}
        worker_device = "cuda:0" if device.startswith("cuda") else "cpu"
        hello = {
            "key": self.key.hex(),
            "device": worker_device,
            "problem": problem,
            "output_index": output_index,
        }
        try:
            self._send(hello, key=b"")
            answer = self._receive("hello", max(timeout * 2, HELLO_MIN_S))[0]
        except WorkerDied as exc:
            raise MachineFailed(exc.reason, exc.log_tail, exc.hung) from None
        if answer.get("ok") is False:  # the task's code or the machine (runner._NotStarted)
            self.kill()
            if not answer.get("machine"):
                raise WorkerDied(str(answer.get("reason")), "")
            raise MachineFailed(str(answer.get("reason")),
                                out_of_memory=bool(answer.get("out_of_memory")))
        self.overhead_us = answer.get("overhead_us", 0.0)
        # Seconds its candidate's import took, from the load request (baselines.start_worker).
        self.load_s: float | None = None
        # The package modules the worker had loaded before any candidate code ran (the runner
        # refuses others; tests/test_units.py holds this list to the worker side).
        self.worker_modules: list[str] = answer.get("modules", [])

    def keep_caches_of(self, source: Path) -> None:
        """Start its compiler caches as the last workers of ``source`` (the file about to be
        loaded) left them, and keep them for that file's next workers (worker_folders.py)."""
        self.process.tmp.seed(hashlib.sha256(source.read_bytes()).hexdigest())

    def _send(self, header: dict[str, Any], key: bytes = b"") -> None:
        try:
            channel.send(self.process.req_w, key, self.seq_out, header)
        except OSError as exc:
            self.kill()
            raise WorkerDied(f"worker closed its request pipe ({exc.strerror})",
                             self.log_tail()) from None
        self.seq_out += 1

    def _receive(self, op: str, timeout: float, interim: Interim | None = None
                 ) -> tuple[dict[str, Any], bytes]:
        deadline = time.monotonic() + timeout
        header, payload = self._frame(op, deadline, timeout)
        asked = 0
        while interim is not None and header.get("op") == "build":
            asked += 1  # past MAX_INTERIM a load's calls build on their own, unanswered here
            reply = interim(header, deadline) if asked <= MAX_INTERIM else {"declined": True}
            self._send({"op": "built", **reply})
            header, payload = self._frame(op, deadline, timeout)
        if header.get("op") != op:
            self.kill()
            raise WorkerDied(f"worker answered '{header.get('op')}' to '{op}'", self.log_tail())
        return header, payload

    def _frame(self, op: str, deadline: float, timeout: float
               ) -> tuple[dict[str, Any], bytes]:
        """The worker's next authenticated frame, while it answers ``op`` (within ``timeout``
        seconds in all, until ``deadline``)."""
        try:
            header, payload = channel.read_frame(self.process.res_r, self.key, self.seq_in,
                                                 deadline)
        except TimeoutError:
            self.kill()
            fix = ("the worker had not started (no candidate code runs before it): its log "
                   "tail shows how far it came; look at the task's modules and the machine's "
                   "load") if op == "hello" else (
                "raise --ks-timeout if the kernel is legitimately slow")
            raise WorkerDied(f"no answer to '{op}' within {timeout:g} s (hang?); worker "
                             f"killed; {fix}", self.log_tail(), hung=True) from None
        except EOFError:
            code = self.kill()
            how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
            raise WorkerDied(f"worker {how} before answering '{op}'", self.log_tail()) from None
        except ChannelError as exc:
            self.kill()
            raise WorkerDied(f"{exc}; worker killed", self.log_tail()) from None
        self.seq_in += 1
        return header, payload

    def request(
        self, op: str, timeout: float | None = None, interim: Interim | None = None,
        **fields: Any
    ) -> tuple[dict[str, Any], bytes]:
        """Send one request and wait for its authenticated answer; ``interim`` answers the
        worker's own requests on the way (a load's builds: harness/shared_builds.py), given
        the request and the answer's deadline."""
        try:
            self._send({"op": op, **fields})
            return self._receive(op, self.timeout if timeout is None else timeout, interim)
        except WorkerDied:
            raise
        except BaseException:
            # Stopped while it worked (pytest-timeout's alarm, Ctrl-C): its answer would come
            # to the next request, which took a check's answer for a call's; it is ended, so
            # the next request starts a fresh worker.
            self.kill()
            raise

    def cpu_us(self) -> float | None:
        """CPU time the runner process has used so far, all its threads (those that exited
        too), from the kernel's scheduler accounting, which code inside the worker cannot patch.

        Read through the process's CPU clock (one system call: 1 us, where reading each
        thread's /proc schedstat cost ~0.7 ms for 25 threads on the 2-core CPU, twice per timed
        call). None where the clock cannot be read (the runner gone, not Linux): the two
        clocks' check is then left out.
        """
        pid = self._runner_pid()
        if pid is None:
            return None
        try:
            return time.clock_gettime_ns(process_cpu_clock(pid)) / 1000.0
        except (OSError, AttributeError):
            return None

    def _runner_pid(self) -> int | None:
        """The runner's pid as seen from here (inside the sandbox it is unshare's child)."""
        if self._pid is None and not self.sandboxed:
            self._pid = self.proc.pid
        elif self._pid is None:
            try:
                with open(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children") as f:
                    children = f.read().split()
                self._pid = int(children[0]) if children else None
            except (OSError, ValueError):
                return None
        return self._pid

    def cpus(self) -> int:
        """How many CPUs the runner may run on at once."""
        pid = self._runner_pid()
        try:
            return len(os.sched_getaffinity(pid or self.proc.pid))
        except OSError:
            return os.cpu_count() or 1

    def new_output(self, limit: int = OUTPUT_SHOWN) -> tuple[str, str]:
        """What the worker wrote to its stdout and to its stderr (the candidate's prints) since
        the last call; each over ``limit`` characters, its head and tail with the count left
        out between."""
        return (self._new("out", self.process.log_path, limit),
                self._new("err", self.process.err_path, limit))

    def _new(self, stream: str, path: Path, limit: int) -> str:
        try:
            with open(path, "rb") as log:
                size = os.fstat(log.fileno()).st_size
                new = size - self._shown[stream]
                if new <= 0:
                    return ""
                log.seek(self._shown[stream])
                if new <= limit:
                    data = log.read(new)
                else:
                    head = log.read(limit // 2)
                    log.seek(size - limit // 2)
                    data = (head + f"\n... {new - limit} bytes left out ...\n".encode()
                            + log.read(limit // 2))
        except OSError:
            return ""
        self._shown[stream] = size
        return data.decode(errors="replace")

    def log_tail(self, limit: int = 4000) -> str:
        """The end of what it wrote: its stdout's, then its stderr's (a traceback, a crash),
        each named when both wrote something."""
        tails = []
        for path in (self.process.log_path, self.process.err_path):
            try:
                tails.append(path.read_bytes().decode(errors="replace"))
            except OSError:
                tails.append("")
        out, err = tails
        if not (out and err):
            return (out or err)[-limit:]
        err = err[-max(limit - len(out), limit // 2):]
        out = out[-(limit - len(err)):]
        return f"stdout:\n{out.rstrip()}\nstderr:\n{err}"

    @property
    def proc(self) -> subprocess.Popen[bytes]:
        return self.process.proc

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> int:
        """Kill the worker's whole process group; return its exit code."""
        return self.process.kill()

    def close(self) -> None:
        """Ask the worker to exit; kill it if it does not."""
        if self.proc.poll() is None:
            try:
                channel.send(self.process.req_w, b"", self.seq_out, {"op": "exit"})
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.process.discard()
