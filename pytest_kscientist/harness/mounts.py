"""What a candidate worker's sandbox keeps read-only, and the command that sets it up.

Where ``unshare`` can create user namespaces, a worker runs with no network, in its own PID
namespace, with every capability dropped, and with these folders mounted read-only
(``protected_paths``): the task's project, the pytest working folder, the installed code
(``installed_code``: Python, its packages, the CUDA/ROCm toolkit), torch's extension root
except the candidate's own build folder (``build_folder``), the compile items' kept
verdicts, and the workers' folders and compiler caches but the worker's own
(``worker_folders.py``). ``spawn.py`` starts workers with these mounts; the compile items
(their captured imports too) and the shared load_inline builds run their compilers in the
same sandbox.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import re
import shlex
import shutil
import site
import subprocess
import sys
import tempfile
import types
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pytest_kscientist.harness import worker_folders
from pytest_kscientist.harness.worker_folders import cache_base
from pytest_kscientist.kswarnings import KsWarning
from pytest_kscientist.worker.inline_builds import builds_extensions
from pytest_kscientist.worker.sandbox import in_order

PROJECT_MARKERS = (".git", "pyproject.toml", "setup.cfg", "tox.ini", "pytest.ini")


class KsSandboxUnavailable(KsWarning):
    """Candidate workers run without the OS sandbox (no user namespaces or no ``unshare``)."""


def installed_code() -> list[Path]:
    """Where Python, its packages (torch, pytest, this plugin when pip-installed) and the CUDA
    or ROCm toolkit live. A candidate that wrote there could plant code that runs in every
    later Python process (a ``.pth`` file in site-packages runs at each start), the pytest
    process of the next session or ``--evolve`` generation included, or change the headers and
    compilers every later build uses: with Python under the home folder (pyenv, conda, a
    venv) it could, before these were kept read-only."""
    found = [sys.prefix, sys.base_prefix, sys.exec_prefix, *site.getsitepackages()]
    user_site = site.getusersitepackages()
    found += [user_site] if isinstance(user_site, str) else []
    nvcc = shutil.which("nvcc")
    found += [os.environ.get(v, "") for v in ("CUDA_HOME", "CUDA_PATH", "ROCM_HOME", "ROCM_PATH")]
    found += [str(Path(nvcc).resolve().parent.parent)] if nvcc else []
    paths = [Path(f).resolve() for f in dict.fromkeys(found) if f and Path(f).is_dir()]
    inside = mount_points()
    # The sandbox's bind mount of a folder leaves out the mounts inside it (a GPU container's
    # driver libraries are bound one by one into /usr/lib...): such a folder is not protected
    # whole; a deeper one of the list (site-packages) may be.
    return [p for p in paths if not any(p in m.parents for m in inside)]


def mount_points() -> list[Path]:
    """The mount points of this process's mount namespace (/proc/self/mountinfo)."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    points = []
    for line in lines:
        fields = line.split()
        if len(fields) > 4:  # the fifth field, its spaces and the like written as \ooo
            points.append(Path(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)),
                                      fields[4])))
    return points


def protected_paths(reference: Path) -> list[Path]:
    """Folders a candidate must not write to: the task's project, the pytest working folder
    and the installed code (``installed_code``).

    A folder that holds the temporary directory, the home directory or a cache that compilers
    write to (Triton, torch extensions) is left writable, or legitimate kernels would break.
    """
    task_dir = reference.resolve().parent
    root = next((d for d in (task_dir, *task_dir.parents)
                 if any((d / m).exists() for m in PROJECT_MARKERS)), task_dir)
    needed = [Path(tempfile.gettempdir()), Path.home()]
    needed += [Path(os.environ[v]) for v in ("XDG_CACHE_HOME", "TRITON_CACHE_DIR",
               "TORCH_EXTENSIONS_DIR") if os.environ.get(v)]
    needed = [p.resolve() for p in needed]
    chosen: list[Path] = []
    for path in (root, Path.cwd().resolve(), *installed_code()):
        if not path.is_dir() or path == Path(path.anchor):
            continue
        if any(n == path or path in n.parents for n in needed):
            continue
        if any(c == path or c in path.parents for c in chosen):
            continue
        chosen = [c for c in chosen if path not in c.parents] + [path]
    return chosen


def _torch_version() -> Any:
    """``torch.version``, without importing torch where this process has not yet: its
    ``version.py`` run on its own (it imports only typing), so a worker's sandbox is known
    before this process's own import of torch (Spares.start). A torch that another thread is
    still importing is in ``sys.modules`` without its ``version`` yet (a background start
    during the main thread's import): read the file then too."""
    version = getattr(sys.modules.get("torch"), "version", None)
    if version is not None:
        return version
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("No module named 'torch'", name="torch")
    path = Path(next(iter(spec.submodule_search_locations))) / "version.py"
    namespace: dict[str, Any] = {}
    exec(compile(path.read_text(), str(path), "exec"), namespace)  # noqa: S102 - torch's own
    return types.SimpleNamespace(**namespace)


def _extension_dir(key: str) -> Path:
    """runner.extension_dir in this process (the worker's environment is this one's)."""
    from pytest_kscientist.worker.runner import extension_dir

    return Path(extension_dir(types.SimpleNamespace(version=_torch_version()), key))


def extension_root() -> Path:
    """Torch's extension build folder for this Python and accelerator, under which every
    candidate file builds in its own ``ks-<sha>`` folder (runner.extension_dir), created."""
    root = _extension_dir("0" * 16).parent
    root.mkdir(parents=True, exist_ok=True)
    (root / "pch.lock").touch()  # runner.guard_pch locks it; it cannot create it read-only
    return root


def build_folder(source: Path) -> Path | None:
    """The one folder of the extension root a worker loading ``source`` may write: its own
    (runner.extension_dir of the file's bytes), created, when the file builds torch extensions
    (mentions load_inline or cpp_extension); None otherwise (nothing there is writable)."""
    data = source.read_bytes()
    if not builds_extensions(data):
        return None
    folder = _extension_dir(hashlib.sha256(data).hexdigest())
    extension_root()
    folder.mkdir(exist_ok=True)
    return folder


def sandbox_prefix(protect: Sequence[Path], writable: Sequence[Path] = ()) -> list[str]:
    """The command prefix that sandboxes what follows it (see the module docstring);
    ``writable``: folders inside ``protect`` bound writable again (a candidate's own build
    folder inside the read-only extension root)."""
    mounts = "".join(
        f"mount --bind {q} {q} && mount -o remount,bind,{'ro' if ro else 'rw'} {q} && "
        for q, ro in ((shlex.quote(p), ro) for p, ro in in_order([str(p) for p in protect],
                                                                  [str(p) for p in writable]))
    )
    script = (f"{mounts}exec setpriv --inh-caps=-all --ambient-caps=-all --bounding-set=-all "
              '--no-new-privs -- "$@"')
    return ["unshare", "--map-current-user", "--keep-caps", "--mount", "--net", "--pid",
            "--kill-child", "--mount-proc", "--", "sh", "-c", script, "ks-sandbox"]


@functools.cache
def sandbox_available(protect: tuple[Path, ...] = (),
                      writable: tuple[Path, ...] = ()) -> str | None:
    """None when the sandbox works here with ``protect`` read-only (``writable`` within it
    writable), else why it does not."""
    missing = [tool for tool in ("unshare", "setpriv", "mount", "sh") if not shutil.which(tool)]
    if missing:
        return f"{', '.join(missing)} not found"
    try:
        proc = subprocess.run([*sandbox_prefix(protect, writable), "true"], capture_output=True,
                              text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines()
        return lines[-1] if lines else f"exit code {proc.returncode}"
    return None


Mounts = tuple[tuple[Path, ...], tuple[Path, ...]]  # (read-only, writable again within them)


def sandbox_plan(reference: Path, builds: Path | None
                  ) -> tuple[Mounts | None, str | None, str | None]:
    """The sandbox mounts of a worker of ``reference``'s task: read-only, the project, the
    working folder and the installed code (``protected_paths``), torch's extension root but
    ``builds`` (the candidate's own build folder, ``build_folder``), the kept compile verdicts,
    the workers' folders and kept caches, this process's compiler caches, and the home folder
    where it can be (``home_folder``). Returns (mounts, why the sandbox does not work here (no
    mounts then), why the folders beyond the project cannot be kept read-only (the mounts
    then protect the project and the installed code only))."""
    protect = tuple(protected_paths(reference))
    why = sandbox_available(protect)
    if why is not None:
        return None, why, None
    writable = (builds,) if builds is not None else ()
    # A worker's own folder under the workers' root is bound writable as it starts
    # (runners.RunnerProcess, forked.ForkedRunner).
    caches = (*protect, extension_root(), *_verdict_cache(), worker_folders.root(),
              worker_folders.store(), *worker_folders.pytest_caches())
    home = home_folder()
    if home is not None:
        tmp = Path(tempfile.gettempdir()).resolve()
        rw = (*writable, tmp) if home in tmp.parents else writable  # bound in order of depth
        if sandbox_available((*caches, home), rw) is None:
            return ((*caches, home), rw), None, None
    cache_why = sandbox_available(caches, writable)
    if cache_why is None:
        return (caches, writable), None, None
    return (protect, ()), None, cache_why


def home_folder() -> Path | None:
    """The home folder, where the sandbox can keep it read-only whole: a candidate could
    otherwise write the user's shell start files, ``~/.local/bin`` or ``~/.gitconfig``, which
    run later outside any sandbox. Not where it is the temporary folder (workers write
    there; a temporary folder inside it stays writable), nor where mounts sit inside it (the
    bind would hide them, as for ``installed_code``). A worker's tools write their caches and
    settings to its own folder instead (``worker_folders.WorkerFolder.env``)."""
    home = Path.home().resolve()
    if home == Path(home.anchor) or Path(tempfile.gettempdir()).resolve() == home:
        return None
    if any(home in m.parents for m in mount_points()):
        return None
    return home


def cache_folder() -> Path | None:
    """Where the compile items keep their results (``harness/compiles.py``); None when
    ``KS_COMPILE_CACHE=off``."""
    chosen = os.environ.get("KS_COMPILE_CACHE", "")
    if chosen.lower() in ("off", "0", "no", "false"):
        return None
    if chosen:
        return Path(chosen)
    return cache_base() / "pytest-kscientist" / "hip-compiles"


def _verdict_cache() -> tuple[Path, ...]:
    """The compile items' kept verdicts (``cache_folder``), made here so a worker cannot make
    it first: read by the pytest process, written only by it."""
    folder = cache_folder()
    if folder is None:
        return ()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return ()
    return (folder.resolve(),)


def quiet_prefix(reference: Path) -> list[str] | None:
    """The sandbox prefix of ``spawn._spawn_mounts`` for a worker of ``reference``'s task that
    builds no extension (before its own folder is added), where it needs no warning; None
    where it would warn (left to the worker)."""
    mounts, why, cache_why = sandbox_plan(reference, None)
    if mounts is None or why is not None or cache_why is not None:
        return None
    return sandbox_prefix(*mounts)


@functools.lru_cache(maxsize=1)
def warn_cache_writable(why: str) -> None:
    warnings.warn(KsSandboxUnavailable(
        f"the worker sandbox cannot keep the build and cache folders read-only here ({why}): "
        "a candidate can write into another's load_inline build, compiler caches or worker "
        "folder"), stacklevel=3)


@functools.lru_cache(maxsize=1)
def warn_unsandboxed(why: str) -> None:
    warnings.warn(KsSandboxUnavailable(
        f"candidate workers run without the OS sandbox (unshare: {why}): they can reach the "
        "network and write to the project; install util-linux and allow unprivileged user "
        "namespaces to enable it"), stacklevel=3)
