"""Messages a user sees first (issue 29): each failure says its message once."""

from __future__ import annotations

import pytest
from helpers import AXPY

from pytest_kscientist.harness.items import _beyond

WRONG_SHAPE = """
import torch


def custom_kernel(data):
    return torch.zeros(3)
"""
NAN_OUT = """
def custom_kernel(data):
    x, y, out = data
    out.fill_(float("nan"))
    return out
"""


def test_shape_and_nan_failures_print_their_message_once(pytester: pytest.Pytester) -> None:
    (pytester.path / "wrong_shape.py").write_text(WRONG_SHAPE)
    (pytester.path / "nan_out.py").write_text(NAN_OUT)
    result = pytester.runpytest_subprocess(
        str(AXPY), "-p", "no:cacheprovider", "-k", "check and n33", "--kernel", "wrong_shape.py",
        "--kernel", "nan_out.py", "--ks-device", "cpu")  # its kernels answer on the CPU
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    # the failures section; pytest's short summary repeats whole messages when CI is set
    text = result.stdout.str().split("short test summary info")[0]
    shape = "output shape (3,), expected (33,)"
    assert f"wrong_shape check n33-s2: wrong result: {shape}" in text
    assert text.count(shape) == 1, text
    nan = "33 of 33 elements outside |out-ref| <= 1e-06 + 1e-06*|ref|"
    assert f"nan_out check n33-s2: wrong result: {nan}" in text
    assert text.count(nan) == 1, text
    # what the detail adds is kept: where the output differs
    assert "first: (0,): got nan, expected " in text


@pytest.mark.parametrize(("reason", "detail", "shown"), [
    ("wrong result: shape (3,)", "shape (3,)", ""),
    ("wrong result: 3 of 9 off", "3 of 9 off; first: (0,): got 1", "first: (0,): got 1"),
    ("raised ValueError: x", "Traceback (most recent call last):\n  ...", "Traceback (most "
     "recent call last):\n  ..."),
    ("timed out", "", ""),
])
def test_the_detail_shown_is_what_it_adds_to_the_reason(reason: str, detail: str,
                                                         shown: str) -> None:
    assert _beyond(reason, detail) == shown


EXITS_ALWAYS = """
import os


def custom_kernel(data):
    os._exit(0)
"""
EXITS_ON_WIDE_M = """

import os as _os

_seed_kernel = custom_kernel


def custom_kernel(data):
    if data[0].shape[0] > 64:
        _os._exit(0)
    return _seed_kernel(data)
"""


def test_a_worker_that_dies_at_every_case_is_not_a_shapes_failure(
        pytester: pytest.Pytester) -> None:
    """Issue 29: a worker that exits on its own read "fails at m=1, n=1, k=128" in the drawn
    check, after shrinking. A crash that the task's own case shows too is said as such; one
    that only some shapes bring is still shrunk to the smallest."""
    from helpers import REPO

    (pytester.path / "always.py").write_text(EXITS_ALWAYS)
    seed = REPO / "tasks" / "fp8_gemm" / "seeds" / "torch_dequant.py"
    (pytester.path / "wide.py").write_text(seed.read_text() + EXITS_ON_WIDE_M)
    result = pytester.runpytest_subprocess(
        str(REPO / "tasks" / "fp8_gemm"), "-p", "no:cacheprovider", "-k", "drawn",
        "--kernel", "always.py", "--kernel", "wide.py", "--ks-drawn", "12", "--ks-salt", "1",
        "--ks-device", "cpu")  # the cpu profile's space: a GPU's full profile draws others
    text = result.stdout.str()
    assert result.ret == pytest.ExitCode.TESTS_FAILED, text
    result.stdout.fnmatch_lines([
        "always drawn check: worker exited with code 0 before answering 'check', at the first "
        "drawn case (*) and at the task's own case * alike: not a shape's failure, so not "
        "shrunk"])
    result.stdout.fnmatch_lines([
        "wide drawn check: fails at m=65, n=*: worker exited with code 0 before answering "
        "'check' (shrunk by Hypothesis, 12 drawn; reproduce with --ks-salt *)"])
