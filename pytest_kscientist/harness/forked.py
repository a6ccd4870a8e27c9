"""The pytest side of ``worker/zygote.py``: workers forked from a process that imported torch.

A ``Zygote`` is one such process, started with a worker's environment; ``spawn`` hands it a new
worker's pipes, lifeline, log and status pipe over a ``SOCK_SEQPACKET`` socket and gets back a
``ForkedRunner``, which stands where ``runners.RunnerProcess`` stands (``Spares.take``). Used for
sandboxed CPU workers (``KsSession.spares``): on the 2-core CPU a worker's start went from the
~1.4 s of its torch import to a fork (notes/timing.md, "The test suite's time").
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from pytest_kscientist.harness.lifeline import Lifeline, StartedRunner
from pytest_kscientist.harness.worker_folders import WorkerFolder
from pytest_kscientist.protocol import channel

STATUS_SIZE = 4  # zygote.STATUS: the runner's exit code, packed by the worker's parent


class ForkedProcess:
    """What ``RunnerProcess.proc`` (a ``Popen``) offers, for a worker the zygote forked: its
    pid leads its process group; its exit code comes over its status pipe (none there and the
    pipe closed: its parent was killed, read as SIGKILL)."""

    def __init__(self, pid: int, status_fd: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._fd = status_fd
        self._lock = threading.Lock()

    def poll(self) -> int | None:
        return self._read(0.0)

    def wait(self, timeout: float | None = None) -> int:
        code = self._read(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(f"forked worker {self.pid}", timeout or 0.0)
        return code

    def _read(self, timeout: float | None) -> int | None:
        with self._lock:
            if self.returncode is not None:
                return self.returncode
            if not select.select([self._fd], [], [], timeout)[0]:
                return None
            data = b""
            while len(data) < STATUS_SIZE:
                chunk = os.read(self._fd, STATUS_SIZE - len(data))
                if not chunk:
                    break
                data += chunk
            os.close(self._fd)
            self._fd = -1
            self.returncode = (int.from_bytes(data, sys.byteorder, signed=True)
                               if len(data) == STATUS_SIZE else -signal.SIGKILL)
            return self.returncode


class ForkedRunner(StartedRunner):
    """A forked worker's runner, not yet told its candidate: ``RunnerProcess``'s interface."""

    def __init__(self, zygote: Zygote, protect: Sequence[Path], writable: Sequence[Path]
                 ) -> None:
        self._take_folder()
        req_r, self.req_w = os.pipe()
        self.res_r, res_w = os.pipe()
        channel.widen(res_w)
        status_r, status_w = os.pipe()
        self.lifeline = Lifeline()
        log, err = (os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                    for path in (self.log_path, self.err_path))
        fds = [req_r, res_w, self.lifeline.read_fd, log, err, status_w]
        try:
            pid = zygote.fork({"cwd": self.tmp.name, "protect": [str(p) for p in protect],
                               "writable": [*(str(p) for p in writable), self.tmp.name],
                               "env": self.tmp.env()}, fds)
        except BaseException:
            for fd in (self.req_w, self.res_r, status_r):
                os.close(fd)
            self.lifeline.started()
            self.lifeline.cut()
            self.tmp.cleanup()
            raise
        finally:
            for fd in (req_r, res_w, log, err, status_w):
                os.close(fd)
        self.lifeline.started()
        self.proc = ForkedProcess(pid, status_r)

class Zygote:
    """One ``python -m pytest_kscientist.worker.zygote`` with the environment ``env``, tied to
    this process by a lifeline; ``fork`` asks it for a worker (one request at a time)."""

    def __init__(self, env: dict[str, str]) -> None:
        # Its folder is the first of its workers' sys.path (``-m``): one no worker can write.
        self.tmp = WorkerFolder("z")
        self._sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._lock = threading.Lock()
        self.lifeline = Lifeline()
        command = [sys.executable, "-m", "pytest_kscientist.worker.zygote", str(theirs.fileno())]
        with open(Path(self.tmp.name) / "zygote.log", "wb") as log:
            self.proc = subprocess.Popen(
                self.lifeline.command(command, group=True),
                pass_fds=(theirs.fileno(), self.lifeline.read_fd), stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, cwd=self.tmp.name, env=env,
                start_new_session=True)
        theirs.close()
        self.lifeline.started()

    def fork(self, request: dict[str, object], fds: list[int]) -> int:
        """The pid of a worker forked for ``request`` and given ``fds``; OSError when the
        zygote cannot (it died: the caller starts another or a plain runner)."""
        with self._lock:
            socket.send_fds(self._sock, [json.dumps(request).encode()], fds)
            ready = select.select([self._sock], [], [], 60)[0]
            answer = self._sock.recv(65536) if ready else b""
        if not answer:
            raise OSError(f"the zygote {self.proc.pid} did not answer (exit code "
                          f"{self.proc.poll()}): {self.log_tail()}")
        found = json.loads(answer)
        if "pid" not in found:
            raise OSError(found.get("error", answer.decode()))
        return int(found["pid"])

    def log_tail(self, limit: int = 2000) -> str:
        try:
            return (Path(self.tmp.name) / "zygote.log").read_bytes()[-limit:].decode(
                errors="replace")
        except OSError:
            return ""

    def close(self) -> None:
        self._sock.close()
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        self.lifeline.cut()
        self.tmp.cleanup()
