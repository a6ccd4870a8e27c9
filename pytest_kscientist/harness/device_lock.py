"""One pytest session at a time checks or times kernels on a GPU, across processes and users.

The rounds keep a session's own comparisons fair when something else runs on its GPU, but not
its times, and a saved run compared later (the CI gate's ``--ks-compare``) reads those. A CI
gate started in a second terminal during an ``--evolve``, or two pytest-xdist workers on one
GPU, would slow each other's kernels unseen. So each item of a GPU session that runs kernels
(the task's validation, checks, drawn checks, benchmarks) holds its GPU's lock while it runs:
two sessions' items take turns, and the waiting one says so on the terminal (who holds the GPU,
since when).

The lock is ``flock`` on a file under /tmp named after the GPU's UUID (the same GPU under
any ``CUDA_VISIBLE_DEVICES``), readable and writable by every user of the machine; the kernel
drops it when its holder exits, however it exits. Its holder writes who it is into the file.
CPU sessions take no lock (the test suite runs many at once). Not covered: a session's worker
starts and first calls, made before its items (background work that ends before any timing of
its own), and GPU work by programs other than pytest-kscientist.
"""

from __future__ import annotations

import fcntl
import getpass
import os
import re
import socket
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

from pytest_kscientist.kswarnings import KsNoDeviceLock

# /tmp, not $TMPDIR: the lock must be the machine's, and TMPDIR differs between users and jobs
FOLDER = Path("/tmp") if Path("/tmp").is_dir() else Path(tempfile.gettempdir())
PREFIX = "pytest-kscientist-gpu-"
REMIND_S = 60.0  # a waiting session repeats its line this often
POLL_S = 0.05
SAID_AFTER_S = 1.0  # a wait at least this long is reported when it ends


def lock_path(key: str, folder: Path = FOLDER) -> Path:
    """The lock file of the GPU ``key`` (its UUID) under ``folder``."""
    return folder / f"{PREFIX}{re.sub(r'[^A-Za-z0-9._-]', '_', key)[:120]}.lock"


def _open(path: Path) -> int:
    """The lock file, opened for reading and writing, created (for every user) if missing.

    An existing file is opened without O_CREAT: where /tmp is sticky and the kernel protects
    regular files there (``fs.protected_regular``), O_CREAT on another user's file fails."""
    try:
        return os.open(path, os.O_RDWR)
    except FileNotFoundError:
        pass
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
    except FileExistsError:  # another session made it just now
        return os.open(path, os.O_RDWR)
    os.fchmod(fd, 0o666)  # the umask took other users' write bit away
    return fd


class DeviceLock:
    """A GPU's machine-wide lock, opened once a session (``open_lock``) and held a while at a
    time (``held``); ``device`` names the GPU in lines, as the session does (``cuda:0``)."""

    def __init__(self, path: Path, device: str) -> None:
        self.path = path
        self.device = device
        self._fd = _open(path)

    @contextmanager
    def held(self, who: str, say: Callable[[str], None], remind_s: float = REMIND_S,
             poll_s: float = POLL_S) -> Iterator[float]:
        """Wait for the lock (``say``-ing who holds it, then every ``remind_s`` while that
        lasts), write ``who`` into the file, and give the lock back on exit; yields the seconds
        waited (0.0 where the lock was free)."""
        start, said = time.monotonic(), None
        while not self._try():
            now = time.monotonic()
            if said is None or now - said >= remind_s:
                said = now
                say(self._waiting(who, now - start))
            time.sleep(poll_s)
        waited = 0.0 if said is None else time.monotonic() - start
        if waited >= SAID_AFTER_S:
            say(f"{self.device}: this session's turn came after {waited:.1f} s; {who} goes on")
        try:
            self._claim(who)
            yield waited
        finally:
            self._release()

    def _waiting(self, who: str, waited_s: float) -> str:
        holder = self.holder() or "a process that has not yet said who it is"
        return (f"{self.device} is busy: another pytest-kscientist session is checking or timing "
                f"kernels on it ({holder}); {who} waits for its turn, so that neither session's "
                f"timings are slowed by the other (waited {waited_s:.0f} s; lock {self.path})")

    def holder(self) -> str:
        """What the lock's holder wrote into the file ('' when nothing)."""
        return os.pread(self._fd, 4096, 0).decode(errors="replace").strip()

    def _try(self) -> bool:
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def _claim(self, who: str) -> None:
        line = (f"pid {os.getpid()} ({_user()}@{socket.gethostname()}), {who}, since "
                f"{time.strftime('%H:%M:%S')}\n").encode()
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, line, 0)

    def _release(self) -> None:
        try:
            os.ftruncate(self._fd, 0)
        finally:  # given back even where the file could not be emptied
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        os.close(self._fd)


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container)
        return str(os.getuid())


def open_lock(device: str) -> DeviceLock | None:
    """The lock of the CUDA ``device`` ("cuda:0") by its UUID; None, warned of, where the file
    cannot be opened."""
    import torch

    props = torch.cuda.get_device_properties(device)
    path = lock_path(str(getattr(props, "uuid", "") or f"{props.name}-{device}"))
    try:
        return DeviceLock(path, device)
    except OSError as exc:
        warnings.warn(KsNoDeviceLock(
            f"{device}: its lock {path} could not be opened ({exc}); this session checks and "
            "times kernels without taking turns with other pytest-kscientist sessions on the "
            "GPU; make the file readable and writable for every user, or remove it"),
            stacklevel=2)
        return None


def say_now(config: Any) -> Callable[[str], None]:
    """A writer of lines to pytest's terminal at once, in the middle of an item too (its
    capture suspended); of nothing where there is no terminal (a pytest-xdist worker's)."""
    plugins = config.pluginmanager

    def say(line: str) -> None:
        terminal = plugins.get_plugin("terminalreporter")
        if terminal is None:
            return
        capture = plugins.get_plugin("capturemanager")
        with capture.global_and_fixture_disabled() if capture else nullcontext():
            terminal.write_line(f"pytest-kscientist: {line}", yellow=True)
            terminal.flush()  # now, through a pipe too (a CI log, `| tee`)

    return say
