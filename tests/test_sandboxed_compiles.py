"""Compilers run at once in the workers' sandbox each keep their own temporary files.

The sandbox gives every command its own PID namespace, so two compilers started at once run
under the same PIDs, and nvcc names its intermediate files in ``TMPDIR`` after its PID
(``tmpxft_00000001_...``). With /tmp shared, three of a session's four shared load_inline
builds failed with the same errors on an H100, and on this CPU two compiles made the same
object. ``compiles.run`` (the compile items, the shared builds, the captured
imports) now gives each run a ``TMPDIR`` of its own.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from pytest_kscientist.harness import compiles
from pytest_kscientist.harness.mounts import sandbox_available, sandbox_prefix

NVCC = shutil.which("nvcc")
SANDBOX_WHY = sandbox_available()


def _prefix() -> list[str]:
    return sandbox_prefix(()) if SANDBOX_WHY is None else []


def test_each_run_has_a_writable_tmpdir_of_its_own_that_is_removed_after(
        tmp_path: Path) -> None:
    probe = [sys.executable, "-c",
             "import os, tempfile; d = os.environ['TMPDIR']; "
             "open(os.path.join(d, 'x'), 'w').write('x'); print(d, tempfile.gettempdir())"]
    seen = []
    for _ in range(2):
        code, out = compiles.run([*_prefix(), *probe], tmp_path, 60.0)
        assert code == 0, out
        folder, python_sees = out.split()
        assert folder == python_sees  # what the tools read as their temporary folder
        seen.append(folder)
    assert seen[0] != seen[1]
    assert not any(Path(folder).exists() for folder in seen)


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
@pytest.mark.skipif(SANDBOX_WHY is not None, reason=f"no sandbox here: {SANDBOX_WHY}")
def test_two_runs_of_nvcc_name_different_intermediate_files(tmp_path: Path) -> None:
    """nvcc -dryrun prints the paths of its intermediate files: two runs of one file, each as
    the sandbox runs it, must not name the same (on the old code every path was the same
    /tmp/tmpxft_00000001_...)."""
    (tmp_path / "cuda.cu").write_text(_many_kernels("a", 1))
    named = []
    for _ in range(2):
        code, out = compiles.run([*_prefix(), NVCC, "-dryrun", "-c", "-o", "cuda.o", "cuda.cu",
                                  "-gencode=arch=compute_90a,code=sm_90a"], tmp_path, 60.0)
        assert code == 0, out
        paths = set(re.findall(r'"(/[^" ]*tmpxft[^" ]*)"', out))
        assert paths, out
        named.append(paths)
    assert not named[0] & named[1], sorted(named[0] & named[1])


def _many_kernels(tag: str, count: int = 1000) -> str:
    return "\n".join(f"__global__ void k_{tag}_{i}(float* x) {{ x[threadIdx.x] += {i}.f; }}"
                     for i in range(count)) + "\n"


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
@pytest.mark.skipif(SANDBOX_WHY is not None, reason=f"no sandbox here: {SANDBOX_WHY}")
def test_two_nvcc_compiles_at_once_in_the_sandbox_each_build_their_own_source(
        tmp_path: Path) -> None:
    """Two files of one name (load_inline's cuda.cu), different kernels, compiled at once as
    the shared builds compile them (--split-compile=0, the CUDA seed's flag): the old code failed
    this 1 run in 4 (in a shell, 3 runs of 3 made one object twice or failed on the other's
    names)."""
    results: dict[str, tuple[int | None, str]] = {}
    both = threading.Barrier(2)

    def compile_one(tag: str) -> None:
        folder = tmp_path / tag
        folder.mkdir()
        (folder / "cuda.cu").write_text(_many_kernels(tag))
        both.wait()
        results[tag] = compiles.run(
            [*_prefix(), NVCC, "-c", "-o", "cuda.o", "cuda.cu",
             "-gencode=arch=compute_90a,code=sm_90a", "--split-compile=0"], folder, 300.0)

    threads = [threading.Thread(target=compile_one, args=(tag,)) for tag in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for tag, other in (("a", "b"), ("b", "a")):
        code, out = results[tag]
        assert code == 0, f"{tag}: {out[-2000:]}"
        obj = (tmp_path / tag / "cuda.o").read_bytes()
        assert f"k_{tag}_999".encode() in obj, f"{tag}'s object lacks its own kernels"
        assert f"k_{other}_".encode() not in obj, f"{tag}'s object holds {other}'s kernels"


@pytest.mark.skipif(SANDBOX_WHY is not None, reason=f"no sandbox here: {SANDBOX_WHY}")
def test_commands_in_the_sandbox_share_pids_which_is_why_tmpdir_is_private(
        tmp_path: Path) -> None:
    """The premise: two sandboxed commands see themselves as the same PID."""
    pids = []
    for _ in range(2):
        out = subprocess.run([*_prefix(), sys.executable, "-c", "import os; print(os.getpid())"],
                             capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        pids.append(out.stdout.strip())
    assert pids[0] == pids[1]
