"""The pytest plugins people already run beside this one: their habits must not change a
kernel's verdict (pytest-timeout's alarm, pytest-rerunfailures' reruns)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from helpers import AXPY, run_pytest

NAPS_ONCE = """import time

napped = []


def custom_kernel(data):
    x, y, out = data
    if x.numel() == 33 and not napped:
        napped.append(1)
        time.sleep(30)
    out.copy_(2 * x + y)
    return out
"""


def test_a_check_stopped_by_pytest_timeout_leaves_no_answer_for_the_next_item(
        tmp_path: Path) -> None:
    """pytest-timeout's alarm stopped a check while its kernel slept: the worker's answer then
    came to the next request, and the kernel's benchmark failed with "worker answered 'check'
    to 'call'" (the reference's timed out waiting behind it). The stopped item fails as
    pytest-timeout says; its worker is ended, and the benchmarks run in a fresh one."""
    pytest.importorskip("pytest_timeout")
    shutil.copytree(AXPY, tmp_path / "axpy")
    (tmp_path / "nap.py").write_text(NAPS_ONCE)
    code, output, _ = run_pytest(["axpy", "--kernel", "nap.py", "--ks-baselines", "none",
                                  "--timeout", "6"], cwd=tmp_path)
    assert code == 1, output
    assert "FAILED axpy/task.toml::nap::check[n33-s2] - Failed: Timeout" in output, output
    assert "answered" not in output, output
    assert "PASSED axpy/task.toml::nap::bench[n4096-s3]" in output, output
    assert "PASSED axpy/task.toml::reference::bench[n4096-s3]" in output, output


WRONG_ONCE = """calls = []


def custom_kernel(data):
    x, y, out = data
    calls.append(1)
    out.copy_(2 * x + y + (1.0 if len(calls) == 2 else 0.0))  # a race that lost, once
    return out
"""


def test_reruns_do_not_pass_a_kernel_that_was_wrong_once(tmp_path: Path) -> None:
    """`pytest -k check --reruns 2` reran the failed check of a kernel that returned a wrong
    output in 1 of 2 calls, and the run passed ("2 passed, 1 rerun") while the summary counted
    the failure. A candidate's items are never rerun: the wrong call fails the run."""
    pytest.importorskip("pytest_rerunfailures")
    shutil.copytree(AXPY, tmp_path / "axpy")
    (tmp_path / "wrong_once.py").write_text(WRONG_ONCE)
    code, output, _ = run_pytest(["axpy", "--kernel", "wrong_once.py", "--ks-baselines", "none",
                                  "-k", "check", "--reruns", "2", "--strict-markers"],
                                 cwd=tmp_path)
    assert code == 1, output
    assert "FAILED axpy/task.toml::wrong_once::check[n1000-s1]" in output, output
    summary = [line for line in output.splitlines() if re.search(r"\d+ failed.* in ", line)]
    assert summary and "rerun" not in summary[-1], output
