"""Each worker's own folder, and the compiler caches a candidate may write.

A worker's working folder, its log and its compiler caches (Triton's, Inductor's, the CUDA
driver's, torch's jiterator's, CuPy's: ``CACHE_VARIABLES``) live in a folder of its own under
``root()``, which the sandbox keeps read-only but for that one folder (``mounts.sandbox_plan``).
Before, workers ran in ``/tmp/ks-worker-*`` folders every other worker could write, and a
forked worker's ``sys.path`` began with its zygote's folder there: a candidate planted a module
in them, and the next candidate's ``import`` of that name ran its code (a sibling or a parent
made to fail or run slow). The compiler caches were the home folder's, shared by every
candidate and by the pytest process (which runs the reference): a candidate that can predict
another's cache key could plant a binary there. The pytest process's own caches
(``pytest_caches``) are read-only in the sandbox now.

A candidate keeps its caches across sessions, by its file's bytes: a worker's caches start as
a copy of ``store()/ks-<sha>`` (``seed``), and go back there when the worker is done
(``keep``), so an unchanged file (an ``--evolve`` parent re-timed in every generation, a CI
gate) does not compile its Triton kernels again. No candidate reads what another wrote.
"""

from __future__ import annotations

import functools
import getpass
import os
import re
import shutil
import stat
import tempfile
import time
from pathlib import Path

from pytest_kscientist.harness.files import owner_alive
from pytest_kscientist.worker.inline_builds import extensions_base

# Environment variable -> the subfolder of a worker's folder it points at.
CACHE_VARIABLES = {
    "TRITON_CACHE_DIR": "triton",
    "TORCHINDUCTOR_CACHE_DIR": "inductor",
    "CUDA_CACHE_PATH": "nv",
    "PYTORCH_KERNEL_CACHE_PATH": "torch-kernels",
    "CUPY_CACHE_DIR": "cupy",
}
# Where a worker's tools put their other caches and settings: its own, not kept.
OWN_VARIABLES = {
    "XDG_CACHE_HOME": "xdg-cache",
    "XDG_CONFIG_HOME": "xdg-config",
    "MPLCONFIGDIR": "matplotlib",
    "MIOPEN_USER_DB_PATH": "miopen-db",
    "MIOPEN_CUSTOM_CACHE_DIR": "miopen-cache",
    # Temporary files, and what tools keep under the temporary folder by default: Inductor's
    # precompiled headers (torch 2.13 puts them under ``tempfile.gettempdir()`` whatever
    # TORCHINDUCTOR_CACHE_DIR says), which the sandbox keeps read-only as the pytest process's.
    "TMPDIR": "tmp",
}
# A worker's caches larger than this are not kept for the next session (copied twice a worker).
KEEP_BYTES = 256 * 1024 * 1024
# The store keeps the files used last within this many bytes (an --evolve run adds a folder a
# child): the least recently seeded or kept go first.
STORE_BYTES = 2 * 1024 * 1024 * 1024
# Leftovers of a store update that died half-way are removed after this long.
STALE_S = 3600.0
_OWNED = re.compile(r"^[wz]-(\d+)-")


def cache_base() -> Path:
    """The user's cache folder (``XDG_CACHE_HOME``, else ``~/.cache``)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")


def root() -> Path:
    """Where the workers' own folders are (``w-<pid>-*``, zygotes' ``z-<pid>-*``: the pid of
    the pytest process that made them), created private to this user; folders of pytest
    processes that are gone are removed the first time it is asked for."""
    folder = Path(tempfile.gettempdir()) / f"ks-workers-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    found = folder.lstat()
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid():
        what = "not a folder" if not stat.S_ISDIR(found.st_mode) else f"uid {found.st_uid}'s"
        raise OSError(f"the workers' folder {folder} is {what}, not this user's (uid "
                      f"{os.getuid()}): whoever made it could reach the workers' files; remove "
                      "it, or set TMPDIR to a folder of your own")
    if stat.S_IMODE(found.st_mode) != 0o700:
        folder.chmod(0o700)
    _sweep(folder)
    return folder


@functools.cache
def _sweep(folder: Path) -> None:
    for entry in folder.iterdir():
        found = _OWNED.match(entry.name)
        if found and not owner_alive(int(found.group(1))):
            shutil.rmtree(entry, ignore_errors=True)


def store() -> Path:
    """Where candidates' caches are kept between sessions, one ``ks-<sha>`` folder a file."""
    folder = cache_base() / "pytest-kscientist" / "jit"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def pytest_caches() -> list[Path]:
    """The compiler caches this process and the user's own programs read (Triton's home
    folder, Inductor's, the CUDA driver's, torch's jiterator's), created so that the sandbox
    can keep them read-only; those that cannot be created are left out."""
    home = Path.home()
    found = [Path(os.environ.get("TRITON_HOME") or home) / ".triton",
             Path(os.environ.get("CUDA_CACHE_PATH") or home / ".nv"),
             Path(os.environ.get("TORCHINDUCTOR_CACHE_DIR")
                  or Path(tempfile.gettempdir()) / f"torchinductor_{_user()}"),
             Path(os.environ.get("PYTORCH_KERNEL_CACHE_PATH")
                  or cache_base() / "torch" / "kernels")]
    found += [Path(os.environ["TRITON_CACHE_DIR"])] if os.environ.get("TRITON_CACHE_DIR") else []
    # A variable set to the temporary or home folder itself (or above them) is not kept
    # read-only: the workers write there.
    needed = [Path(tempfile.gettempdir()).resolve(), home.resolve()]
    kept = []
    for path in found:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        path = path.resolve()
        if not any(n == path or path in n.parents for n in needed):
            kept.append(path)
    return kept


def _user() -> str:
    """The user name as Inductor puts it in its default folder's name."""
    try:
        name = getpass.getuser()
    except (KeyError, OSError):
        name = str(os.getuid())
    return re.sub(r'[\\/:*?"<>|]', "_", name)


class WorkerFolder:
    """One worker's folder (or a zygote's, ``kind`` "z"), with ``TemporaryDirectory``'s
    ``name`` and ``cleanup``; ``env`` points the compiler caches into it."""

    def __init__(self, kind: str = "w") -> None:
        self.name = tempfile.mkdtemp(prefix=f"{kind}-{os.getpid()}-", dir=root())
        os.mkdir(os.path.join(self.name, OWN_VARIABLES["TMPDIR"]))  # gettempdir needs it
        self.keep_as: str | None = None  # the sha whose store folder it goes back to
        self._seeded: set[str] = set()

    def env(self) -> dict[str, str]:
        """Its compiler caches (kept, ``seed``), and where its tools put other caches and
        settings (not kept): all in its folder, for the home folder may be read-only
        (``mounts.home_folder``). Torch's extension root stays the user's (it is read-only
        there but for the candidate's own build folder), named so that moving the cache
        folder does not move it."""
        env = {var: os.path.join(self.name, sub) for var, sub in CACHE_VARIABLES.items()}
        env.update({var: os.path.join(self.name, sub) for var, sub in OWN_VARIABLES.items()})
        env["TORCH_EXTENSIONS_DIR"] = extensions_base()
        return env

    def seed(self, sha: str) -> None:
        """Start the caches as the ones kept for the file whose bytes hash to ``sha``; they go
        back there at ``cleanup``. A store folder being replaced meanwhile seeds in part (a
        cache miss compiles again)."""
        self.keep_as = sha
        kept = store() / f"ks-{sha[:32]}"
        try:
            os.utime(kept)  # used now: the store's pruning keeps it longer
        except OSError:
            pass
        for sub in CACHE_VARIABLES.values():
            if (kept / sub).is_dir():
                try:
                    shutil.copytree(kept / sub, Path(self.name) / sub, symlinks=True,
                                    dirs_exist_ok=True)
                except (OSError, shutil.Error):
                    continue
        self._seeded = _files(Path(self.name))

    def keep(self) -> None:
        """Put its caches back in the store (``seed``) when they hold anything new."""
        if self.keep_as is None:
            return
        here = Path(self.name)
        files = _files(here)
        if files <= self._seeded or _size(here, files) > KEEP_BYTES:
            return
        folder = store()
        _sweep_store(folder)
        target = folder / f"ks-{self.keep_as[:32]}"
        new = Path(tempfile.mkdtemp(prefix=".new-", dir=folder))
        old = folder / f".old-{new.name[5:]}"
        try:
            for sub in CACHE_VARIABLES.values():
                if (here / sub).is_dir():
                    shutil.copytree(here / sub, new / sub, symlinks=True)
            try:
                target.rename(old)
            except FileNotFoundError:
                pass
            new.rename(target)  # another worker's update came first: its caches stay
        except (OSError, shutil.Error):
            pass
        finally:
            shutil.rmtree(new, ignore_errors=True)
            shutil.rmtree(old, ignore_errors=True)
        prune(folder)

    def cleanup(self) -> None:
        try:
            self.keep()
        finally:
            shutil.rmtree(self.name, ignore_errors=True)


def prune(folder: Path, limit: int = STORE_BYTES) -> None:
    """Remove the store's least recently used ``ks-*`` folders until it holds ``limit`` bytes
    or fewer."""
    used = []
    for kept in folder.glob("ks-*"):
        try:
            used.append((kept.stat().st_mtime, kept, _size(kept, _files(kept))))
        except OSError:
            continue
    total = sum(size for _, _, size in used)
    for _, kept, size in sorted(used, key=lambda x: x[0]):
        if total <= limit:
            break
        shutil.rmtree(kept, ignore_errors=True)
        total -= size


def _files(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for sub in CACHE_VARIABLES.values()
            for p in (folder / sub).rglob("*") if p.is_file()}


def _size(folder: Path, files: set[str]) -> int:
    total = 0
    for name in files:
        try:
            total += (folder / name).stat().st_size
        except OSError:
            continue
    return total


def _sweep_store(folder: Path) -> None:
    """Remove a store update's leftovers (``.new-*``, ``.old-*``) older than STALE_S."""
    now = time.time()
    for entry in folder.glob(".*-*"):
        try:
            if now - entry.stat().st_mtime > STALE_S:
                shutil.rmtree(entry, ignore_errors=True)
        except OSError:
            continue
