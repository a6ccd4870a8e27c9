"""Hypothesis-drawn cases (issue 12): checks on cases drawn from a task's declared space, a
failure shrunk by Hypothesis and reproduced by --ks-salt."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from helpers import AXPY, run_pytest

from pytest_kscientist.errors import TaskSpecError
from pytest_kscientist.formats.task import load_task

SPACE = """
[profiles.cpu.space]
examples = 10
n = { min = 64, max = 4096 }
"""

# Right only when n is a multiple of 64. The task's public cases (n = 1000, 33) catch it too;
# the tests select the drawn item alone (-k drawn).
MOD64 = """
def custom_kernel(data):
    x, y, out = data
    if x.shape[0] % 64 != 0:
        return y.clone()
    return 2 * x + y
"""


# The cpu profile declares the space these tests draw from; a GPU's default profile (full)
# would be another.
ON_CPU = ("--ks-device", "cpu")

def _axpy(tmp_path: Path, space: str = SPACE) -> Path:
    task = tmp_path / "axpy"
    shutil.copytree(AXPY, task)
    (task / "task.toml").write_text((task / "task.toml").read_text() + space)
    (tmp_path / "mod64.py").write_text(MOD64)
    return task


def _drawn(data: dict) -> dict[str, tuple[str, str]]:
    return {c["name"]: (case["outcome"], case["reason"]) for c in data["candidates"]
            for case in c["cases"] if case["case_id"].startswith("drawn")}


def test_a_failure_is_shrunk_to_the_smallest_failing_case(tmp_path: Path) -> None:
    task = _axpy(tmp_path)
    args = [str(task), "--kernel", str(tmp_path / "mod64.py"), "--kernel",
            str(task / "seeds" / "good.py"), "-k", "drawn", "--ks-salt", "7", *ON_CPU]
    code, out, data = run_pytest(args, tmp_path)
    assert code == 1, out
    verdicts = _drawn(data)
    assert verdicts["good"] == ("passed", "10 drawn cases passed")
    outcome, reason = verdicts["mod64"]
    assert outcome == "failed"
    assert reason.startswith("fails at n=65: wrong result:"), reason
    assert "reproduce with --ks-salt 7" in reason
    # The same salt draws the same cases: the same verdict, word for word.
    _, _, again = run_pytest(args, tmp_path)
    assert _drawn(again)["mod64"] == (outcome, reason)


def test_drawn_item_is_collected_and_ks_drawn_overrides_its_count(
        pytester: pytest.Pytester, tmp_path: Path) -> None:
    task = _axpy(tmp_path)
    result = pytester.runpytest(str(task), "--collect-only", "-q", *ON_CPU)
    result.stdout.fnmatch_lines(["*axpy/task.toml::good::check[[]drawn[]]"])
    result = pytester.runpytest(str(task), "--collect-only", "-q", "--ks-drawn", "0", *ON_CPU)
    assert "check[drawn]" not in result.stdout.str()
    result = pytester.runpytest(str(task), "--ks-drawn", "two")
    result.stderr.fnmatch_lines(["*--ks-drawn expects a number of cases (0 or more), got 'two'"])


def test_ks_drawn_on_a_task_without_a_space_warns(pytester: pytest.Pytester) -> None:
    """It was ignored without a word: no check[drawn] item, exit 0."""
    result = pytester.runpytest(str(AXPY), "--collect-only", "-q", "--ks-drawn", "50", *ON_CPU)
    assert "check[drawn]" not in result.stdout.str()
    result.stdout.fnmatch_lines(["*KsWarning: --ks-drawn 50: task 'axpy' declares no "
                                 "[[]profiles.cpu.space[]], so no case is drawn for it; *"])


@pytest.mark.parametrize(("space", "message"), [
    ("[profiles.cpu.space]\nm = { min = 1, max = 9 }\n",
     "has spans for ['m'], expected one for each case key but the seed: ['n']"),
    ("[profiles.cpu.space]\nn = { min = 1, max = 9, multiple_of = 16 }\n",
     "no multiple of 16 lies in [1, 9]"),
])
def test_a_bad_space_names_the_field(tmp_path: Path, space: str, message: str) -> None:
    task = _axpy(tmp_path, space)
    with pytest.raises(TaskSpecError, match="profiles") as info:
        load_task(task)
    assert message in str(info.value)


def test_fp8_gemm_declares_the_challenges_space() -> None:
    task = load_task(Path(__file__).parent.parent / "tasks" / "fp8_gemm")
    full = task.profile("full").space
    assert full is not None
    assert (full.keys["n"].multiple_of, full.keys["k"].multiple_of) == (64, 128)
    assert task.profile("cpu").space is not None
