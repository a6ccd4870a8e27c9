"""Every user-facing error for bad options: subject, expectation, finding, fix."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import AXPY


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--kernel", "nope.py"], "--kernel nope.py: no such file; expected a Python file "
         "exposing custom_kernel(data)"),
        (["--kernel", "notes.txt"], "--kernel notes.txt: expected a .py file exposing "
         "custom_kernel(data), got '.txt'"),
        (["--kernel", "a/k.py", "--kernel", "b/k.py"],
         "--kernel/--ks-beside: two kernels are named 'k'"),
        (["--ks-salt", "abc"],
         "--ks-salt expects the integer printed by an earlier run, got 'abc'"),
        (["--ks-timeout", "0"], "--ks-timeout expects a positive number of seconds, got '0'"),
        (["--ks-timeout", "nan"], "--ks-timeout expects a positive number of seconds, got 'nan'"),
        (["--ks-timeout", "inf"], "--ks-timeout expects a positive number of seconds, got 'inf'"),
        (["--ks-bench-budget", "nan"], "--ks-bench-budget expects a positive number of seconds, "
         "got 'nan'"),
        (["--ks-beside", "nope.py"], "--ks-beside nope.py: no such file"),
        (["--ks-bench-budget", "soon"], "--ks-bench-budget expects a positive number of seconds, "
         "got 'soon'"),
        (["--ks-device", "tpu"], "--ks-device expects auto, cpu, cuda or cuda:N, got 'tpu'"),
        (["--evolve", "0"], "--evolve expects a positive integer, got '0'"),
        pytest.param(["--ks-device", "cuda"], "--ks-device cuda: no CUDA/ROCm device is visible "
                     "to torch", marks=pytest.mark.skipif(
                         torch.cuda.is_available(), reason="a CUDA device is visible here")),
        (["--evolve", "2", "--kernel", "a/k.py"], "--evolve cannot be combined with --kernel"),
        (["--evolve", "2", "--ks-json", "r.json"], "--evolve cannot be combined with --ks-json"),
        (["--ks-skip-reference", "--ks-min-speedup", "reference=2"],
         "--ks-min-speedup reference=...: the gate needs the reference timed, but "
         "--ks-skip-reference leaves it out; drop one of the two"),
    ],
)
def test_bad_option_is_a_usage_error(pytester: pytest.Pytester, args: list[str], message: str):
    for sub in ("a", "b"):
        (pytester.path / sub).mkdir()
        (pytester.path / sub / "k.py").write_text("def custom_kernel(data):\n    return data\n")
    (pytester.path / "notes.txt").write_text("")
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert message in result.stderr.str()


def test_ini_twin_is_validated_too(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nks_timeout = never\n")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--ks-timeout expects a positive number of seconds, got 'never'" in result.stderr.str()


def test_unknown_profile_names_the_known_ones(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest(str(AXPY), "--ks-profile", "huge", "--collect-only")
    result.stdout.fnmatch_lines(["*task 'axpy' has no profile 'huge' (it has: cpu, full)*"])
    assert result.ret == pytest.ExitCode.INTERRUPTED


def test_help_lists_the_options_without_importing_torch(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--help",
    )
    result.stdout.fnmatch_lines(["*--kernel=PATH*", "*--ks-json=PATH*", "*--evolve=N*"])
    probe = pytester.makepyfile(
        probe="import sys, pytest_kscientist.plugin\nprint('torch' in sys.modules)\n"
    )
    out = pytester.run(__import__("sys").executable, str(Path(probe)))
    assert out.stdout.lines[-1] == "False"
