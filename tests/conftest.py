"""Shared helpers for the project's own tests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch  # noqa: F401 - imported once here: pytester restores sys.modules after inline runs

collect_ignore = ["data"]

DATA = Path(__file__).parent / "data"
AXPY = DATA / "axpy"
CANDIDATES = DATA / "candidates"
REPO = Path(__file__).parent.parent


def run_pytest(args: list[str], cwd: Path, timeout: float = 600) -> tuple[int, str, Any]:
    """Run pytest in a subprocess with --ks-json; return (exit code, output, parsed JSON)."""
    out = cwd / "ks-results.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", "--ks-json", str(out),
         *args],
        cwd=cwd, capture_output=True, text=True, timeout=timeout,
    )
    data = json.loads(out.read_text()) if out.exists() else None
    return proc.returncode, proc.stdout + proc.stderr, data


def case_reasons(data: Any) -> dict[tuple[str, str], tuple[str, str]]:
    """(candidate, case_id) -> (outcome, reason) from a RunResults JSON."""
    return {
        (c["name"], case["case_id"]): (case["outcome"], case["reason"])
        for c in data["candidates"]
        for case in c["cases"]
    }


@pytest.fixture
def axpy_dir(tmp_path: Path) -> Path:
    """A private copy of the tiny axpy task."""
    import shutil

    dest = tmp_path / "axpy"
    shutil.copytree(AXPY, dest)
    return dest
