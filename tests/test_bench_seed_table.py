"""bench/seed_table.sh (no GPU needed): --write puts an older CUDA seed from git under a build
name of its own, and the device part refuses, before any setup, a file that is missing or that
would share the seed's build."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from helpers import REPO

SCRIPT = REPO / "bench" / "seed_table.sh"
SEED = "tasks/fp8_gemm/seeds/cuda_wgmma.py"
SOURCE = 'module = load_inline(\n    name="ks_cuda_wgmma_v8",\n)\n'
pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def _run(args: list[str], cwd, tmp_path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OUT": str(tmp_path / "out")}
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=60)


@pytest.fixture
def history(tmp_path):
    """A repository whose first commit holds a seed built as ks_cuda_wgmma_v8, and whose
    second lacks it."""
    repo = tmp_path / "repo"
    (repo / "tasks/fp8_gemm/seeds").mkdir(parents=True)
    (repo / SEED).write_text(SOURCE)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run([*git, "init", "-q"], cwd=repo, check=True)
    subprocess.run([*git, "add", "-A"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "seed"], cwd=repo, check=True)
    subprocess.run([*git, "rm", "-q", SEED], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "no seed"], cwd=repo, check=True)
    return repo


def test_write_renames_the_older_seeds_build(history, tmp_path) -> None:
    rev = subprocess.run(["git", "rev-parse", "--short=7", "HEAD~1"], cwd=history,
                         capture_output=True, text=True, check=True).stdout.strip()
    proc = _run(["--write", "HEAD~1"], history, tmp_path)
    assert proc.returncode == 0, proc.stderr
    written = history / ".gl" / f"seed_{rev}.py"
    assert proc.stdout.split() == [f".gl/seed_{rev}.py"]
    assert f'name="ks_cuda_wgmma_{rev}_v8"' in written.read_text()
    assert written.read_text().replace(f"ks_cuda_wgmma_{rev}_v8", "ks_cuda_wgmma_v8") == SOURCE
    # the device part takes it past its checks (and would then set up the device)
    refused = _run([str(written), "no_such.py"], history, tmp_path)
    assert refused.returncode == 2 and "no_such.py: no such file" in refused.stderr


def test_write_names_a_revision_without_the_seed_or_not_a_commit(history, tmp_path) -> None:
    proc = _run(["--write", "HEAD"], history, tmp_path)
    assert proc.returncode == 2 and f"has no {SEED}" in proc.stderr, proc.stderr
    assert not list((history / ".gl").glob("*"))
    proc = _run(["--write", "no_such_rev"], history, tmp_path)
    assert proc.returncode == 2 and "no_such_rev is not a commit" in proc.stderr, proc.stderr


def test_the_device_part_refuses_the_seeds_own_build_and_no_arguments(tmp_path) -> None:
    same = tmp_path / "same.py"
    same.write_text((REPO / SEED).read_text())
    proc = _run([str(same)], REPO, tmp_path)
    assert proc.returncode == 2 and "builds under the seed's own name" in proc.stderr
    assert not (tmp_path / "out").exists()  # refused before the device setup
    for args in ([], ["--write"]):
        proc = _run(args, REPO, tmp_path)
        assert proc.returncode == 2 and "usage: bash bench/seed_table.sh --write REV" in (
            proc.stderr), (args, proc.stderr)
