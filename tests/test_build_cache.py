"""In the worker sandbox, torch's extension folder is read-only except the candidate's own
``ks-<sha>`` build folder: no candidate writes into another's load_inline build (issue 32)."""

from __future__ import annotations

import shutil
import site
import sys
from pathlib import Path

import pytest
from helpers import AXPY, run_pytest

from pytest_kscientist.harness.mounts import build_folder, extension_root, sandbox_available


def writer(targets: str, expected: str) -> str:
    """A candidate that, at import, tries to write each of ``targets`` (a Python expression:
    (what, path) pairs; a path ending in "/" is a new folder) and whose kernel fails unless
    the outcomes are ``expected`` (a Python expression: what -> "written" or "OSError"). It
    says load_inline, so it gets a build folder, whose path it reads from
    TORCH_EXTENSIONS_DIR."""
    return f'''import os, site, sys

# builds with torch.utils.cpp_extension.load_inline (not here: only folders are probed)
OWN = os.environ["TORCH_EXTENSIONS_DIR"]
ROOT = os.path.dirname(OWN)
FOUND = {{}}
for what, path in {targets}:
    try:
        if path.endswith("/"):
            os.mkdir(path)
        else:
            with open(path, "w") as f:
                f.write("import os\\n")
        FOUND[what] = "written"
    except OSError as exc:
        FOUND[what] = type(exc).__name__


def custom_kernel(data):
    x, y, out = data
    if FOUND != {expected}:
        raise RuntimeError(f"writes: {{FOUND}}")
    out.copy_(2 * x + y)
    return out
'''


# Into its own folder, a sibling's, and a new folder of the extension root: only the first.
PROBE = writer(
    '''(("own", os.path.join(OWN, "probe")),
     ("other", os.path.join(ROOT, "ks-0123456789abcdef", "planted.so")),
     ("new", os.path.join(ROOT, "ks-fedcba9876543210") + "/"))''',
    '''{"own": "written", "other": "OSError", "new": "OSError"}''')


def test_a_candidate_writes_only_its_own_build_folder(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    root = extension_root()
    other = root / "ks-0123456789abcdef"
    other.mkdir()  # another candidate's build folder
    if sandbox_available((root,), (other,)) is not None:
        pytest.skip("the worker sandbox does not work here (unshare)")
    shutil.copytree(AXPY, tmp_path / "axpy")
    (tmp_path / "probe.py").write_text(PROBE)
    own = build_folder(tmp_path / "probe.py")
    assert own is not None and own.parent == root and own.name.startswith("ks-")
    code, output, _ = run_pytest(["axpy", "-k", "check", "--kernel", "probe.py"], cwd=tmp_path)
    assert code == 0, output
    assert (own / "probe").read_text() == "import os\n"
    assert not (other / "planted.so").exists() and not (root / "ks-fedcba9876543210").exists()


def test_only_files_that_build_extensions_get_a_folder(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    plain = tmp_path / "plain.py"
    plain.write_text((AXPY / "seeds" / "good.py").read_text())
    assert build_folder(plain) is None
    builds = tmp_path / "builds.py"
    builds.write_text("from torch.utils.cpp_extension import load_inline\n")
    first = build_folder(builds)
    assert first is not None and first.is_dir() and (first.parent / "pch.lock").exists()
    copy = tmp_path / "copy.py"
    copy.write_bytes(builds.read_bytes())
    assert build_folder(copy) == first  # one folder per content, as the worker computes it


def test_the_extension_root_is_known_while_another_thread_imports_torch(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A background start (starts.Starting) asks for the extension root while the main thread
    # is inside `import torch`: torch is then in sys.modules without its `version` yet. Under
    # load in the full suite this raised AttributeError ("partially initialized module 'torch'")
    # and the candidate failed to load.
    import importlib.util
    import sys
    import types

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    whole = extension_root()
    partial = types.ModuleType("torch")  # as the import system holds it mid-import: a spec,
    partial.__spec__ = importlib.util.find_spec("torch")  # no attributes yet
    monkeypatch.setitem(sys.modules, "torch", partial)
    assert extension_root() == whole


# A .pth file in site-packages (it would run in every later Python process: the next
# session's pytest process too) and a script beside Python: neither.
PLANTER = writer(
    '''(("site-packages", os.path.join(site.getsitepackages()[0], "ks_planted.pth")),
     ("prefix", os.path.join(sys.prefix, "bin", "ks_planted")))''',
    '''{"site-packages": "OSError", "prefix": "OSError"}''')


def test_a_candidate_cannot_plant_code_in_the_python_installation(tmp_path: Path) -> None:
    from pytest_kscientist.harness.mounts import installed_code, protected_paths

    if sandbox_available(tuple(protected_paths(AXPY / "reference.py"))) is not None:
        pytest.skip("the worker sandbox does not work here (unshare)")
    assert installed_code(), "no Python installation found to protect"
    shutil.copytree(AXPY, tmp_path / "axpy")
    (tmp_path / "planter.py").write_text(PLANTER)
    planted = [Path(site.getsitepackages()[0]) / "ks_planted.pth",
               Path(sys.prefix) / "bin" / "ks_planted"]
    try:
        code, output, _ = run_pytest(["axpy", "-k", "check", "--kernel", "planter.py",
                                      "--ks-device", "cpu"], cwd=tmp_path)
        assert code == 0, output
        assert not any(p.exists() for p in planted)
    finally:
        for p in planted:
            p.unlink(missing_ok=True)


def test_a_candidate_cannot_write_the_kept_compile_verdicts(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    """A candidate that forged an entry could pass another's compile item unseen: the folder
    is read-only in its sandbox (the pytest process writes it after the compiler exits)."""
    verdicts = tmp_path / "verdicts"
    monkeypatch.setenv("KS_COMPILE_CACHE", str(verdicts))
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    if sandbox_available((extension_root(),)) is not None:
        pytest.skip("the worker sandbox does not work here (unshare)")
    shutil.copytree(AXPY, tmp_path / "axpy")
    forged = verdicts / "forged.json"
    (tmp_path / "forger.py").write_text(writer(f'(("verdict", {str(forged)!r}),)',
                                               '{"verdict": "OSError"}'))
    code, output, _ = run_pytest(["axpy", "-k", "check", "--kernel", "forger.py",
                                  "--ks-device", "cpu"], cwd=tmp_path)
    assert code == 0, output
    assert not forged.exists()
