"""Fixtures and hooks for the project's own tests; shared helpers live in ``helpers.py``.

Tests that start a candidate worker, a pytest session or another process are marked ``slow``
automatically, so ``pytest tests -m "not slow"`` is the fast lane (README, Development).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch  # noqa: F401 - imported once here: pytester restores sys.modules after inline runs
from helpers import AXPY, spawns

collect_ignore = ["data"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``slow`` every test that starts a process (``helpers.spawns``)."""
    for item in items:
        function = getattr(item, "function", None)
        module = getattr(item, "module", None)
        if function is not None and module is not None and spawns(function, module):
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def axpy_dir(tmp_path: Path) -> Path:
    """A private copy of the tiny axpy task."""
    dest = tmp_path / "axpy"
    shutil.copytree(AXPY, dest)
    return dest
