"""Each worker writes only its own folder, and its compiler caches are its candidate's own
(harness/worker_folders.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from helpers import AXPY, case_reasons, run_pytest

from pytest_kscientist.harness import worker_folders
from pytest_kscientist.harness.mounts import protected_paths, sandbox_available
from pytest_kscientist.harness.worker_folders import CACHE_VARIABLES, WorkerFolder

WHY = sandbox_available(tuple(protected_paths(AXPY / "reference.py")))
sandboxed = pytest.mark.skipif(WHY is not None, reason=f"no worker sandbox here: {WHY}")

KERNEL = '''
def custom_kernel(data):
    x, y, out = data
    out.copy_(2 * x + y)
    return out
'''

# At import, writes a module into every folder of the temporary directory's ks-* folders and
# of the workers' root it can reach (the workers' and zygotes' folders). The temporary folder
# is the pytest process's (a worker's own TMPDIR is inside its folder).
PLANTER = '''import glob, os
for folder in glob.glob(os.path.join(TMP, "ks-*")) + glob.glob(os.path.join(TMP, "ks-*", "*")):
    try:
        with open(os.path.join(folder, "ks_planted_module.py"), "w") as f:
            f.write("PLANTED = True\\n")
    except OSError:
        pass
''' + KERNEL


def planter() -> str:
    return f"TMP = {tempfile.gettempdir()!r}\n" + PLANTER


# Imports the planted module's name at every call, as a kernel imports triton on first use.
IMPORTER = '''
def custom_kernel(data):
    x, y, out = data
    try:
        import ks_planted_module  # noqa: F401
    except ImportError:
        pass
    else:
        raise RuntimeError("imported a module another candidate planted")
    out.copy_(2 * x + y)
    return out
'''


@sandboxed
def test_a_candidate_cannot_plant_a_module_in_another_workers_path(tmp_path: Path) -> None:
    """Before, workers ran in /tmp/ks-worker-* folders any worker could write, a forked one with
    its zygote's folder first on sys.path: the importer failed every check."""
    shutil.copytree(AXPY, tmp_path / "axpy")
    (tmp_path / "planter.py").write_text(planter())
    (tmp_path / "importer.py").write_text(IMPORTER)
    code, output, data = run_pytest(["axpy", "-k", "check", "--kernel", "planter.py",
                                     "--kernel", "importer.py"], cwd=tmp_path)
    assert code == 0, output
    outcomes = {key: outcome for key, (outcome, _) in case_reasons(data).items()}
    assert len(outcomes) == 4 and set(outcomes.values()) == {"passed"}, outcomes


# Says what it found in its caches at import, and leaves a file there; fails unless the
# outcomes are what the test expects (EXPECTED, prepended).
CACHES = '''import errno, os
FOUND = {}
for var in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "CUDA_CACHE_PATH",
            "PYTORCH_KERNEL_CACHE_PATH", "CUPY_CACHE_DIR"):
    folder = os.environ[var]
    FOUND[var] = os.path.exists(os.path.join(folder, "left.txt"))
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "left.txt"), "w") as f:
        f.write(var)
theirs = os.path.join(os.environ["TRITON_HOME"], ".triton", "planted.cubin")
try:
    open(theirs, "w").close()
    FOUND["pytest's triton cache"] = "written"
except OSError as exc:
    FOUND["pytest's triton cache"] = errno.errorcode[exc.errno]
for kept in os.listdir(STORE):
    try:
        open(os.path.join(STORE, kept, "planted"), "w").close()
        FOUND["store"] = "written"
    except OSError as exc:
        FOUND["store"] = errno.errorcode[exc.errno]


def custom_kernel(data):
    x, y, out = data
    if FOUND != EXPECTED:
        raise RuntimeError(f"found {FOUND}")
    out.copy_(2 * x + y)
    return out
'''


def _expect(path: Path, kept: bool, stored: bool) -> None:
    expected = {var: kept for var in CACHE_VARIABLES}
    expected["pytest's triton cache"] = "EROFS"
    if stored:  # a folder is in the store: it cannot write there
        expected["store"] = "EROFS"
    path.write_text(repr(expected))


@sandboxed
def test_a_candidates_caches_are_its_own_and_kept_for_its_bytes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("TRITON_HOME", str(tmp_path / "triton-home"))
    for var in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "PYTORCH_KERNEL_CACHE_PATH"):
        monkeypatch.delenv(var, raising=False)
    store = tmp_path / "cache" / "pytest-kscientist" / "jit"
    store.mkdir(parents=True)
    shutil.copytree(AXPY, tmp_path / "axpy")
    expect = tmp_path / "expect.txt"  # read at import: the bytes stay the same
    head = (f"import ast\nSTORE = {str(store)!r}\n"
            f"EXPECTED = ast.literal_eval(open({str(expect)!r}).read())\n")
    (tmp_path / "x.py").write_text(head + CACHES)
    (tmp_path / "y.py").write_text("# other bytes\n" + head + CACHES)
    _expect(expect, kept=False, stored=False)
    code, output, _ = run_pytest(["axpy", "-k", "check", "--kernel", "x.py"], cwd=tmp_path)
    assert code == 0, output
    (kept,) = store.iterdir()  # its caches, kept by the bytes of x.py
    assert {p.name for p in kept.iterdir()} == set(CACHE_VARIABLES.values())
    # The same bytes again (a parent re-timed in the next generation) find their caches and
    # cannot write the store; other bytes find nothing.
    _expect(expect, kept=True, stored=True)
    code, output, _ = run_pytest(["axpy", "-k", "check", "--kernel", "x.py"], cwd=tmp_path)
    assert code == 0, output
    _expect(expect, kept=False, stored=True)
    code, output, _ = run_pytest(["axpy", "-k", "check", "--kernel", "y.py"], cwd=tmp_path)
    assert code == 0, output
    assert len(list(store.iterdir())) == 2
    assert not list((tmp_path / "triton-home").rglob("planted.cubin"))


def test_a_worker_folder_keeps_its_caches_for_the_same_bytes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    first = WorkerFolder()
    first.seed("ab" * 32)
    triton = Path(first.env()["TRITON_CACHE_DIR"])
    triton.mkdir()
    (triton / "kernel.cubin").write_text("1")
    first.cleanup()
    assert not Path(first.name).exists()
    kept = worker_folders.store() / f"ks-{'ab' * 16}"
    assert (kept / "triton" / "kernel.cubin").read_text() == "1"
    second, other = WorkerFolder(), WorkerFolder()
    second.seed("ab" * 32)
    other.seed("cd" * 32)
    try:
        assert (Path(second.env()["TRITON_CACHE_DIR"]) / "kernel.cubin").read_text() == "1"
        assert not Path(other.env()["TRITON_CACHE_DIR"]).exists()
        before = (kept / "triton").stat().st_ino
    finally:
        second.cleanup()  # nothing new: the store is left as it was
        other.cleanup()
    assert (kept / "triton").stat().st_ino == before
    assert sorted(p.name for p in worker_folders.store().iterdir()) == [f"ks-{'ab' * 16}"]


def test_folders_of_pytest_processes_that_are_gone_are_removed(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    pid = int(dead.stdout)
    root = tmp_path / "root"
    root.mkdir()
    (root / f"w-{pid}-gone").mkdir()
    (root / f"z-{pid}-gone").mkdir()
    (root / f"w-{os.getpid()}-mine").mkdir()
    (root / "other").mkdir()
    worker_folders._sweep(root)
    assert sorted(p.name for p in root.iterdir()) == ["other", f"w-{os.getpid()}-mine"]


def test_a_workers_folder_that_is_not_this_users_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another user who made <tmp>/ks-workers-<uid> first (or a link there) could plant
    modules in every worker's folder: refused with what to do, not used."""
    monkeypatch.setattr(worker_folders.tempfile, "gettempdir", lambda: str(tmp_path))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / f"ks-workers-{os.getuid()}").symlink_to(elsewhere)
    with pytest.raises(OSError, match=r"is not a folder, not this user's .* set TMPDIR"):
        worker_folders.root()
    (tmp_path / f"ks-workers-{os.getuid()}").unlink()
    (tmp_path / f"ks-workers-{os.getuid()}").mkdir(mode=0o777)
    assert worker_folders.root().stat().st_mode & 0o777 == 0o700


def test_the_store_keeps_the_folders_used_last_within_its_size(tmp_path: Path) -> None:
    for age, name in enumerate(("ks-newest", "ks-middle", "ks-oldest")):
        (tmp_path / name / "triton").mkdir(parents=True)
        (tmp_path / name / "triton" / "k.cubin").write_bytes(b"x" * 100)
        os.utime(tmp_path / name, (1e9 - age, 1e9 - age))
    worker_folders.prune(tmp_path, limit=250)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ks-middle", "ks-newest"]
    worker_folders.prune(tmp_path, limit=100)
    assert [p.name for p in tmp_path.iterdir()] == ["ks-newest"]


def test_a_cache_variable_set_to_the_temporary_folder_leaves_it_writable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker_folders.tempfile, "gettempdir", lambda: str(tmp_path))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TRITON_HOME", str(tmp_path / "th"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "th" / "cache"))
    caches = worker_folders.pytest_caches()
    assert tmp_path.resolve() not in caches
    assert (tmp_path / "th" / ".triton").resolve() in caches
    assert (tmp_path / "th" / "cache").resolve() in caches


HOME_PROBE = '''import errno, os
FOUND = {}
for what, path in (("bashrc", os.path.join(os.path.expanduser("~"), ".bashrc")),
                   ("local bin", os.path.join(os.path.expanduser("~"), ".local", "bin", "ls")),
                   ("xdg cache", os.path.join(os.environ["XDG_CACHE_HOME"], "tool", "x")),
                   ("xdg config", os.path.join(os.environ["XDG_CONFIG_HOME"], "tool.rc"))):
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        open(path, "w").close()
        FOUND[what] = "written"
    except OSError as exc:
        FOUND[what] = errno.errorcode[exc.errno]
EXPECTED = {"bashrc": "EROFS", "local bin": "EROFS", "xdg cache": "written",
            "xdg config": "written"}
''' + KERNEL.replace("    x, y, out = data\n", """    x, y, out = data
    if FOUND != EXPECTED:
        raise RuntimeError(f"found {FOUND}")
""")


@sandboxed
@pytest.mark.parametrize("tmp_inside", [False, True], ids=["tmp-apart", "tmp-inside-home"])
def test_the_home_folder_is_read_only_and_a_workers_tools_write_its_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tmp_inside: bool) -> None:
    """A candidate wrote the user's shell start files (~/.bashrc, a new ~/.local/bin/ls), which
    run later outside any sandbox; its tools' caches and settings go to its own folder. A
    temporary folder inside the home folder stays writable, and the workers' folders in it
    are still each their own (the binds go in order of depth)."""
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bashrc").write_text("# the user's\n")
    monkeypatch.setenv("HOME", str(home))
    if tmp_inside:
        (home / "tmp").mkdir()
        monkeypatch.setenv("TMPDIR", str(home / "tmp"))
        monkeypatch.setattr(worker_folders.tempfile, "tempdir", None)
    for var in ("XDG_CACHE_HOME", "XDG_CONFIG_HOME", "TORCH_EXTENSIONS_DIR", "TRITON_HOME",
                "TRITON_CACHE_DIR", "CUDA_CACHE_PATH", "PYTORCH_KERNEL_CACHE_PATH"):
        monkeypatch.delenv(var, raising=False)
    from pytest_kscientist.harness.mounts import home_folder

    monkeypatch.setattr(Path, "home", classmethod(lambda cls: home))
    if home_folder() is None:
        pytest.skip("the home folder here has mounts inside or holds the temporary folder")
    shutil.copytree(AXPY, tmp_path / "axpy")
    (tmp_path / "probe.py").write_text(HOME_PROBE)
    (tmp_path / "planter.py").write_text(planter())
    (tmp_path / "importer.py").write_text(IMPORTER)
    code, output, _ = run_pytest(["axpy", "-k", "check", "--kernel", "probe.py", "--kernel",
                                  "planter.py", "--kernel", "importer.py"], cwd=tmp_path)
    assert code == 0, output
    assert (home / ".bashrc").read_text() == "# the user's\n"
    assert not (home / ".local").exists()


def test_binds_go_in_order_of_depth_so_none_hides_another() -> None:
    from pytest_kscientist.worker.sandbox import in_order

    assert in_order(["/home/u/tmp/ks/w", "/home/u"], ["/home/u/tmp", "/home/u/tmp/ks/w/own"]) \
        == [("/home/u", True), ("/home/u/tmp", False), ("/home/u/tmp/ks/w", True),
            ("/home/u/tmp/ks/w/own", False)]
    assert in_order(["/a"], ["/a"]) == [("/a", True), ("/a", False)]  # ends writable


COMPILED = '''
import torch


@torch.compile
def _axpy(x, y):
    return 2 * x + y


def custom_kernel(data):
    x, y, out = data
    out.copy_(_axpy(x, y))
    return out
'''


@sandboxed
@pytest.mark.slow
def test_a_torch_compile_candidate_passes(tmp_path: Path) -> None:
    """torch 2.13's Inductor keeps its precompiled headers under the temporary folder whatever
    TORCHINDUCTOR_CACHE_DIR says; that folder is the pytest process's, read-only to workers,
    so every torch.compile candidate failed on the CPU ("Read-only file system") until a
    worker's TMPDIR became its own."""
    shutil.copytree(AXPY, tmp_path / "axpy")
    (tmp_path / "compiled.py").write_text(COMPILED)
    code, output, data = run_pytest(["axpy", "-k", "check", "--kernel", "compiled.py"],
                                    cwd=tmp_path)
    assert code == 0, output
    outcomes = {key: outcome for key, (outcome, _) in case_reasons(data).items()}
    assert outcomes and set(outcomes.values()) == {"passed"}, outcomes
