"""Candidate runners started ahead of their candidates: exec'd here, or forked from a zygote.

``RunnerProcess`` is a ``python -m pytest_kscientist.worker.runner`` started (sandboxed where
``mounts`` say so) that waits, torch imported, for the hello that names its candidate;
``Spares`` hands them to new workers (``spawn.Worker``), starting the next ahead on GPUs and
forking sandboxed ones from a zygote on the CPU (``forked.py``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from pytest_kscientist.harness.forked import ForkedRunner, Zygote
from pytest_kscientist.harness.lifeline import Lifeline, StartedRunner
from pytest_kscientist.harness.mounts import Mounts, sandbox_prefix
from pytest_kscientist.protocol import channel


class RunnerProcess(StartedRunner):
    """A started ``pytest_kscientist.worker.runner`` that has not been told its candidate yet.

    Until its hello it only imports torch (~5 s of a worker's start on the H200, 95% of it) and
    waits on its request pipe; it touches no device before the hello.
    """

    def __init__(self, mounts: Mounts | None, env: dict[str, str]) -> None:
        self._take_folder()
        prefix = [] if mounts is None else sandbox_prefix(mounts[0],
                                                          (*mounts[1], Path(self.tmp.name)))
        req_r, self.req_w = os.pipe()
        self.res_r, res_w = os.pipe()
        channel.widen(res_w)  # outputs travel this way
        # A runner hung in a candidate's call never reads its request pipe's EOF: the lifeline
        # kills its group (with the sandbox, unshare, whose --kill-child takes the runner and
        # its PID namespace along) when this process dies.
        self.lifeline = Lifeline()
        runner = [*prefix, sys.executable, "-m", "pytest_kscientist.worker.runner", str(req_r),
                  str(res_w)]
        with open(self.log_path, "wb") as log, open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen(
                self.lifeline.command(runner, group=True),
                pass_fds=(req_r, res_w, self.lifeline.read_fd),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=err,
                cwd=self.tmp.name,
                env={**env, **self.tmp.env()},
                start_new_session=True,
            )
        os.close(req_r)
        os.close(res_w)
        self.lifeline.started()


class Spares:
    """Runner processes started ahead of need: taking one starts the next.

    A new worker (every candidate, and again after a failed item) then skips the runner's
    ``import torch``. Used on GPUs only: there the spare's start runs on other host cores while
    device time is measured; on a CPU it would take a core from the worker being timed.
    With ``fork``, a sandboxed worker is forked from a zygote of its environment instead
    (``harness/forked.py``), which imported torch once and then waits idle; one that cannot
    fork (its zygote died twice) gets a runner of its own, as without.
    State of one pytest session (``KsSession.spares``); ``close`` at its end.
    """

    def __init__(self, ahead: bool, fork: bool = False) -> None:
        self.ahead = ahead
        self.fork = fork
        self._zygotes: dict[tuple[Any, ...], Zygote] = {}  # environment -> its zygote
        self._ready: dict[tuple[Any, ...], RunnerProcess] = {}
        self._lock = threading.Lock()  # workers may be started from several threads at once
        self._starting: set[tuple[Any, ...]] = set()

    @classmethod
    def for_device(cls, gpu: bool) -> Spares:
        """A session's: on a GPU, spares started ahead; on the CPU, workers forked instead."""
        return cls(ahead=gpu, fork=not gpu)

    def start_zygote(self, env: dict[str, str]) -> None:
        """Start the zygote of ``env`` now, before any worker is asked for (``fork`` only)."""
        self._zygote(tuple(sorted(env.items())), env)

    def _zygote(self, key: tuple[Any, ...], env: dict[str, str], fresh: bool = False) -> Zygote:
        with self._lock:
            old = self._zygotes.pop(key, None) if fresh else None
            zygote = self._zygotes.get(key)
            if zygote is None:
                zygote = self._zygotes[key] = Zygote(env)
        if old is not None:
            old.close()
        return zygote

    def _forked(self, env: dict[str, str], mounts: Mounts) -> StartedRunner | None:
        """A worker forked from the zygote of ``env``, sandboxed with ``mounts``; None where
        neither the zygote nor a fresh one could fork it."""
        key = tuple(sorted(env.items()))
        for fresh in (False, True):
            try:
                return ForkedRunner(self._zygote(key, env, fresh), *mounts)
            except OSError:
                continue  # a dead zygote: one fresh try, then a runner of its own
        self.fork = False  # the kernel refuses it here: every worker of the session is exec'd
        return None

    def take(self, mounts: Mounts | None, env: dict[str, str], ahead: bool = True
             ) -> StartedRunner:
        """A started runner sandboxed with ``mounts`` (None: no sandbox) and ``env``;
        ``ahead``: start the next one now (not for mounts of one candidate's own, which no
        other worker can use). With ``fork`` and ``mounts``, a forked one."""
        if self.fork and mounts is not None:
            forked = self._forked(env, mounts)
            if forked is not None:
                return forked
        key = self._key(mounts, env)
        with self._lock:
            process = self._ready.pop(key, None)
        if process is not None and process.proc.poll() is not None:
            process.discard()  # died while waiting (killed from outside): start another
            process = None
        if process is None:
            process = RunnerProcess(mounts, env)
        if self.ahead and ahead:
            with self._lock:  # one spare per kind, however many threads take at once
                start = key not in self._ready and key not in self._starting
                if start:
                    self._starting.add(key)
            if start:
                spare = RunnerProcess(mounts, env)
                with self._lock:
                    self._ready[key] = spare
                    self._starting.discard(key)
        return process

    @staticmethod
    def _key(mounts: Mounts | None, env: dict[str, str]) -> tuple[Any, ...]:
        """The kind of runner ``mounts`` and ``env`` make: one ready a kind."""
        return (mounts, tuple(sorted(env.items())))

    def adopt(self, mounts: Mounts | None, env: dict[str, str], process: RunnerProcess) -> None:
        """Keep ``process``, started with ``mounts`` and ``env`` before this session knew its
        device (``KsSession.start_early``), for the first worker that takes those."""
        key = self._key(mounts, env)
        with self._lock:
            process, self._ready[key] = self._ready.get(key), process
        if process is not None:
            process.discard()

    def close(self) -> None:
        with self._lock:
            ready, self._ready = list(self._ready.values()), {}
        for process in ready:
            process.discard()
        with self._lock:
            zygotes, self._zygotes = list(self._zygotes.values()), {}
        for zygote in zygotes:
            zygote.close()
