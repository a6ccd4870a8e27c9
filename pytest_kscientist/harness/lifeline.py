"""A process that dies with this one, however this one ends, and a started runner's end.

``Lifeline``: a pipe whose write end only this process holds; a process started through it is
killed by the kernel (or a forked watcher) once that end is released, ``kill -9`` included
(notes/processes.md, "The lifeline"). ``StartedRunner``: what a candidate's runner holds before
it is told its candidate, however it was started (``runners.RunnerProcess``, exec'd here, or
``forked.ForkedRunner``), and how it is killed with its whole process group.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pytest_kscientist.harness.worker_folders import WorkerFolder

# Run as `python -S -c ARM FD WHO HOW CMD...` in a started process before it execs CMD: from then
# on the release of the lifeline's write end (its starter exiting, kill -9 included) SIGKILLs CMD
# (WHO "group": its whole process group, which it leads; "self": only itself). On Linux the
# kernel sends the signal (F_SETSIG on an O_ASYNC pipe: no thread, so a call hung in C code or
# holding the GIL dies too, and nothing is added to the worker's timed calls); elsewhere a
# forked watcher blocked on the pipe sends it. A starter already gone before the arming is seen
# as a readable (EOF) pipe: nothing is ever written to it.
_ARM = """
import os, select, signal, sys
fd, who, how, cmd = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4:]
group = who == "group" and os.getpgrp() == os.getpid()
try:
    import fcntl
    setsig = fcntl.F_SETSIG if how == "auto" else None
except (ImportError, AttributeError):
    setsig = None
def die():
    os.killpg(os.getpgrp(), signal.SIGKILL) if group else os.kill(os.getpid(), signal.SIGKILL)
if setsig is not None:
    fcntl.fcntl(fd, fcntl.F_SETOWN, -os.getpgrp() if group else os.getpid())
    fcntl.fcntl(fd, setsig, signal.SIGKILL)
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_ASYNC)
else:
    target = os.getpid()
    if os.fork() == 0:
        os.closerange(3, fd)
        os.closerange(fd + 1, os.sysconf("SC_OPEN_MAX"))
        try:
            os.read(fd, 1)
        except OSError:
            pass
        if os.getppid() == target:
            os.killpg(target, signal.SIGKILL) if group else os.kill(target, signal.SIGKILL)
        os._exit(0)
if select.select([fd], [], [], 0)[0]:
    die()
os.execvp(cmd[0], cmd)
"""


class Lifeline:
    """A pipe whose write end only this process holds, so that a process started through
    ``command`` dies with this one, however this one ends (issue 31: a ``kill -9``'d run left
    its child session and workers running for 20 s and more, timed beside its resumed run).

    ``command`` wraps a command line; pass ``read_fd`` in ``pass_fds``, call ``started`` once
    the process is started and ``cut`` once it has ended (cutting it earlier kills it).
    """

    def __init__(self, how: str = "auto") -> None:
        self.read_fd, self._write_fd = os.pipe()  # neither is inherited by other processes
        self.how = how  # "fork": the portable watcher even where the kernel's signal exists

    def command(self, cmd: Sequence[str], group: bool) -> list[str]:
        """``cmd`` run so that it dies with this process: its process group (which it must
        lead: ``start_new_session``) with ``group``, else only itself."""
        who = "group" if group else "self"
        return [sys.executable, "-S", "-c", _ARM, str(self.read_fd), who, self.how, *cmd]

    def started(self) -> None:
        """Close this process's copy of the read end (the started process holds its own)."""
        _close(self.read_fd)
        self.read_fd = -1

    def cut(self) -> None:
        """Release the write end: whatever was started through it and still runs is killed."""
        _close(self._write_fd)
        self._write_fd = -1


def _close(fd: int) -> None:
    if fd >= 0:
        try:
            os.close(fd)
        except OSError:
            pass


class StartedRunner:
    """What a runner not yet told its candidate holds, however it was started (exec'd here, or
    forked: ``forked.ForkedRunner``): ``proc`` (``pid``, ``poll``, ``wait``), the pipes
    ``req_w`` and ``res_r``, its ``lifeline``, its folder ``tmp`` and the logs of its stdout
    and stderr, ``log_path`` and ``err_path``."""

    proc: Any
    req_w: int
    res_r: int
    lifeline: Lifeline
    tmp: WorkerFolder
    log_path: Path
    err_path: Path

    def _take_folder(self) -> None:
        """Its own worker folder (the only one of the workers' root it may write, where its
        compiler caches go: worker_folders.py), with its logs inside."""
        self.tmp = WorkerFolder()
        self.log_path = Path(self.tmp.name) / "candidate.log"
        self.err_path = Path(self.tmp.name) / "candidate-stderr.log"

    def kill(self) -> int:
        """Kill its whole process group and close its pipes; return its exit code."""
        if self.req_w == -1 and self.proc.returncode is not None:
            return self.proc.returncode  # killed before: its group id may be another's by now
        # The whole group, even after the leader exited: a candidate may leave children behind.
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        code = self.proc.wait()
        self.lifeline.cut()
        _close(self.req_w)
        _close(self.res_r)
        self.req_w = self.res_r = -1
        return code

    def discard(self) -> None:
        """Kill it and remove its folder."""
        self.kill()
        self.tmp.cleanup()
