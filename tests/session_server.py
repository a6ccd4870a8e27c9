"""The pytest sessions the suite starts, forked from a process that has imported torch once.

Every ``python -m pytest`` the tests start (``helpers.run_pytest``, ``pytester``'s subprocess
runs) used to begin by importing torch, pytest and the plugin: a `--co` session of axpy took
1.7 s started, 0.7 s forked (wall, the 2-core CPU), ~200 sessions a suite run. Here one
server per test process imports them once and forks a child for each session. The child is
set up as that command would start:

- its own folder, environment (the request's, whole), ``sys.argv`` and ``sys.path`` (the
  folder first, then PYTHONPATH's folders, then the interpreter's own);
- stdin closed, stdout and stderr into the caller's files;
- fresh random state, import caches emptied;
- and at its end what the interpreter does on exit: the non-daemon threads joined, the
  ``atexit`` functions run, the streams flushed.

What a fork cannot give, the command is run for real instead: an environment that changes
how the interpreter or its libraries start (``PYTHON*`` but PYTHONPATH, ``LD_*``, OpenMP and
MKL threads), a PYTHONPATH that brings another copy of an imported package, stdin the caller
writes to, or any other command. ``KS_TEST_REAL_SESSIONS=1`` runs every session for real.

The forked child is not the command's process in three ways that no test here depends on:
it shares the server's string hash seed, its ``__main__`` is the server's, and its
``sys.orig_argv`` is the server's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# The server's program: import what every session imports, then fork one child a request.
SERVER = r'''
import importlib, json, os, random, select, signal, sys, threading
sys.path[:] = [p for p in sys.path if p not in ("", ".")]
import torch, pytest, _pytest.pytester, pytest_kscientist.plugin  # noqa: F401
base = [p for p in sys.path if p not in os.environ.get("PYTHONPATH", "").split(os.pathsep)]
main_py = os.path.join(os.path.dirname(pytest.__file__), "__main__.py")
control = os.fdopen(sys.stdout.fileno(), "w", buffering=1, closefd=False)
wake_r, wake_w = os.pipe()
os.set_blocking(wake_w, False)
signal.set_wakeup_fd(wake_w)
signal.signal(signal.SIGCHLD, lambda *_: None)
control.write(json.dumps({"ready": os.getpid()}) + "\n")


def child(req):
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, req["out"], os.O_WRONLY),
                            (2, req["err"], os.O_WRONLY)):
        opened = os.open(path, flags | (os.O_APPEND if fd else 0))
        os.dup2(opened, fd)
        os.close(opened)
    for fd in (wake_r, wake_w):
        os.close(fd)
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    extra = [p for p in req["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [req["cwd"], *extra, *base]
    importlib.invalidate_caches()
    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    sys.argv = [main_py, *req["args"]]
    code = 1
    try:
        # what `python -m pytest` runs: `_console_main` since pytest 9.1, where the public
        # `console_main` warns that it is deprecated (into every session's output)
        from _pytest import config as pytest_config

        code = getattr(pytest_config, "_console_main", pytest.console_main)()
    except SystemExit as exit:
        code = exit.code if isinstance(exit.code, int) else (0 if exit.code is None else 1)
    except BaseException:
        import traceback
        traceback.print_exc()
    try:
        threading._shutdown()
        import atexit
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


running = set()
stdin = os.fdopen(sys.stdin.fileno(), "r", closefd=False)
while True:
    try:
        ready, _, _ = select.select([stdin, wake_r], [], [])
    except InterruptedError:
        ready = [wake_r]
    if wake_r in ready:
        try:
            os.read(wake_r, 512)
        except BlockingIOError:
            pass
    for pid in list(running):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            running.discard(pid)
            control.write(json.dumps({"pid": pid, "code": os.waitstatus_to_exitcode(status)})
                          + "\n")
    if stdin in ready:
        line = stdin.readline()
        if not line:
            break
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:
            try:
                child(req)
            finally:
                os._exit(70)  # the session could not be set up (its traceback on stderr)
        running.add(pid)
        control.write(json.dumps({"started": pid}) + "\n")
'''

# What must reach an interpreter at its start (the server's was the test process's).
STARTUP = ("PYTHON", "LD_", "OMP_", "MKL_", "KMP_", "GOMP_", "OPENBLAS_", "MALLOC_")
# Packages the server imported: another copy of one on a session's PYTHONPATH needs a real start.
IMPORTED = ("torch", "pytest", "_pytest", "pytest_kscientist", "pluggy", "pydantic")


class ServedProcess:
    """A session forked by the server, with the part of ``subprocess.Popen`` that pytester
    and the helpers use: ``pid``, ``stdin`` (None), ``returncode``, ``poll``, ``wait`` and
    ``kill``."""

    def __init__(self, server: _Server, pid: int, args: Sequence[str]) -> None:
        self.server, self.pid, self.args = server, pid, list(args)
        self.stdin = None
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.server.code(self.pid, 0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self.server.code(self.pid, timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


class _Server:
    def __init__(self) -> None:
        self.env = dict(os.environ)  # what the server's interpreter started with
        self.proc = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=self.env)
        assert self.proc.stdout is not None
        ready = json.loads(self.proc.stdout.readline() or "{}")
        if "ready" not in ready:
            raise RuntimeError("the session server did not start")
        self.lock = threading.Condition()
        self.started: list[int] = []
        self.codes: dict[int, int] = {}
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            message = json.loads(line)
            with self.lock:
                if "started" in message:
                    self.started.append(message["started"])
                else:
                    self.codes[message["pid"]] = message["code"]
                self.lock.notify_all()
        with self.lock:
            self.proc.wait()
            self.lock.notify_all()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def start(self, request: dict[str, Any]) -> int:
        assert self.proc.stdin is not None
        with self.lock:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
            if not self.lock.wait_for(lambda: self.started or not self.alive(), 30):
                raise RuntimeError("the session server did not fork")
            if not self.started:
                raise RuntimeError("the session server died")
            return self.started.pop(0)

    def code(self, pid: int, timeout: float | None) -> int | None:
        with self.lock:
            self.lock.wait_for(lambda: pid in self.codes or not self.alive(), timeout)
            if pid not in self.codes and not self.alive():
                raise RuntimeError(f"the session server died while session {pid} ran")
            return self.codes.pop(pid, None)


_server: _Server | None = None
_server_lock = threading.Lock()


def _served(env: dict[str, str]) -> _Server | None:
    """The server for sessions in ``env``, or None where one must start for real."""
    global _server
    if os.environ.get("KS_TEST_REAL_SESSIONS") == "1":
        return None
    with _server_lock:
        if _server is None or not _server.alive():
            _server = _Server()
        server = _server
    for name in set(env) | set(server.env):
        if name != "PYTHONPATH" and name.startswith(STARTUP):
            if env.get(name) != server.env.get(name):
                return None
    ours = set(server.env.get("PYTHONPATH", "").split(os.pathsep))
    for folder in env.get("PYTHONPATH", "").split(os.pathsep):
        if folder and folder not in ours and any(
                (Path(folder) / name).exists() for name in IMPORTED):
            return None
    return server


def is_pytest(cmdargs: Sequence[Any]) -> bool:
    """Whether ``cmdargs`` is ``python -m pytest ...`` with this interpreter."""
    args = [os.fspath(a) for a in cmdargs]
    return len(args) >= 2 and args[0] == sys.executable and (
        args[1] == "-mpytest" or args[1:3] == ["-m", "pytest"])


def popen(cmdargs: Sequence[Any], stdout: Any, stderr: Any, cwd: str | os.PathLike[str] | None,
          env: dict[str, str] | None) -> ServedProcess | None:
    """``python -m pytest ...`` forked by the server, its output appended to the files
    ``stdout`` and ``stderr`` (open file objects or paths); None where it must start for real
    (the module docstring says when)."""
    if not is_pytest(cmdargs):
        return None
    env = dict(os.environ if env is None else env)
    server = _served(env)
    if server is None:
        return None
    args = [os.fspath(a) for a in cmdargs]
    args = args[2:] if args[1] == "-mpytest" else args[3:]
    paths = [os.fspath(f.name if hasattr(f, "write") else f) for f in (stdout, stderr)]
    for f in (stdout, stderr):
        if hasattr(f, "flush"):
            f.flush()
    pid = server.start({"args": args, "cwd": os.path.abspath(cwd or os.getcwd()), "env": env,
                        "out": paths[0], "err": paths[1]})
    return ServedProcess(server, pid, [os.fspath(a) for a in cmdargs])


def run(cmdargs: Sequence[Any], cwd: str | os.PathLike[str] | None = None,
        env: dict[str, str] | None = None, timeout: float | None = None,
        scratch: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(cmdargs, cwd=, env=, capture_output=True, text=True, timeout=)`` for a
    pytest session, forked by the server where it can be; ``scratch`` holds its output files
    (a temporary folder if None)."""
    with tempfile.TemporaryDirectory(dir=scratch) as folder:
        out, err = Path(folder, "stdout"), Path(folder, "stderr")
        out.touch()
        err.touch()
        proc = popen(cmdargs, out, err, cwd, env)
        if proc is None:
            return subprocess.run([os.fspath(a) for a in cmdargs], cwd=cwd, env=env,
                                  capture_output=True, text=True, timeout=timeout)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
        return subprocess.CompletedProcess(proc.args, proc.returncode,
                                           out.read_text(errors="replace"),
                                           err.read_text(errors="replace"))
