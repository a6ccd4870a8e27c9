"""Every user-facing error for bad options: subject, expectation, finding, fix."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import torch
from helpers import AXPY


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--kernel", "nope.py"], "--kernel nope.py: no such file in "),
        (["--kernel", "notes.txt"], "--kernel notes.txt: expected a .py file exposing "
         "custom_kernel(data), got '.txt'"),
        (["--kernel", "a/k.py", "--kernel", "b/k.py"],
         "--kernel/--ks-beside: two kernels are named 'k'"),
        # one file, not two of one name: "rename one" was no fix
        (["--kernel", "a/k.py", "--ks-beside", "./a/k.py"], "/a/k.py is given to both, expected "
         "each kernel once (--kernel makes it a candidate with items, --ks-beside times it "
         "beside the candidates without items of its own); drop one of the two"),
        (["--ks-salt", "abc"],
         "--ks-salt expects the integer printed by an earlier run, got 'abc'"),
        (["--ks-timeout", "0"], "--ks-timeout expects a positive number of seconds, got '0'"),
        (["--ks-timeout", "nan"], "--ks-timeout expects a positive number of seconds, got 'nan'"),
        (["--ks-timeout", "inf"], "--ks-timeout expects a positive number of seconds, got 'inf'"),
        (["--ks-bench-budget", "nan"], "--ks-bench-budget expects a positive number of seconds, "
         "got 'nan'"),
        (["--ks-beside", "nope.py"], "--ks-beside nope.py: no such file"),
        (["--kernel", "a/k[1].py"], "--kernel a/k[1].py: the file's stem 'k[1]' names its test "
         "items (task.toml::k[1]::check[...]), and pytest reads a node id's first '[' as the "
         "start of its last part's parameters, so those ids could not be passed back to "
         "pytest; rename the file without '[' and ']'"),
        (["--kernel", "a"], "--kernel a: is a folder; expected a Python file exposing "
         "custom_kernel(data) (for a folder of solutions matched to tasks by name: "
         "--ks-solutions DIR)"),
        (["--ks-json", "a"], "--ks-json a: is a folder, expected the path of the JSON file to "
         "write; e.g. --ks-json a/results.json"),
        (["--ks-json", "notes.txt/r.json"], "--ks-json notes.txt/r.json: cannot be written, "),
        (["--ks-bench-budget", "soon"], "--ks-bench-budget expects a positive number of seconds, "
         "got 'soon'"),
        (["--ks-device", "tpu"], "--ks-device expects auto, cpu, cuda or cuda:N, got 'tpu'"),
        (["--evolve", "0"], "--evolve expects a positive integer, got '0'"),
        (["--ks-bench-workers", "0"], "--ks-bench-workers expects auto or a number of worker "
         "processes per kernel from 1 to 8 (2 spreads each kernel's rounds over two), got '0'"),
        pytest.param(["--ks-device", "cuda"], "--ks-device cuda: no CUDA/ROCm device is visible "
                     "to torch", marks=pytest.mark.skipif(
                         torch.cuda.is_available(), reason="a CUDA device is visible here")),
        (["--evolve", "2", "--kernel", "a/k.py"], "--evolve cannot be combined with --kernel"),
        (["--evolve", "2", "--ks-json", "r.json"], "--evolve cannot be combined with --ks-json"),
        (["--evolve", "2", "--co"], "--evolve cannot be combined with --collect-only: each "
         "generation is evaluated in a child session"),  # it evolved a whole generation
        (["--evolve", "2", "--setup-plan"], "--evolve cannot be combined with --setup-plan: "
         "each generation is evaluated"),  # it evolved, as --co did
        (["--evolve", "2", "--ks-min-speedup", "reference=100"], "--evolve cannot be combined "
         "with --ks-min-speedup: its generations are judged by their timings beside their "
         "parents, not by gates; drop --ks-min-speedup"),
        (["--evolve", "2", "--ks-compare", "r.json"], "--evolve cannot be combined with "
         "--ks-compare"),
        (["--ks-skip-reference", "--ks-min-speedup", "reference=2"],
         "--ks-min-speedup reference=...: the gate needs the reference timed, but "
         "--ks-skip-reference leaves it out; drop one of the two"),
    ],
)
def test_bad_option_is_a_usage_error(pytester: pytest.Pytester, args: list[str], message: str):
    for sub in ("a", "b"):
        (pytester.path / sub).mkdir()
        for name in ("k.py", "k[1].py"):
            (pytester.path / sub / name).write_text("def custom_kernel(data):\n    return data\n")
    (pytester.path / "notes.txt").write_text("")
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert message in result.stderr.str()


@pytest.mark.parametrize(("ini", "message"), [
    ("ks_timeout = never", "ks_timeout (ini) expects a positive number of seconds, got 'never'"),
    ("ks_device = gpu", "ks_device (ini) expects auto, cpu, cuda or cuda:N, got 'gpu'"),
    ("ks_bench_budget = 0", "ks_bench_budget (ini) expects a positive number of seconds"),
    ("ks_bench_workers = 9", "ks_bench_workers (ini) expects auto or a number of worker"),
    ("ks_min_speedup = cublas", "ks_min_speedup (ini) expects NAME=FACTOR"),
    ("ks_baselines = a,,b", "ks_baselines (ini) expects all, none or comma-separated"),
    ("ks_drawn = some", "ks_drawn (ini) expects a number of cases"),
    ("ks_min_own_share = 2", "ks_min_own_share (ini) expects a share"),
    ("ks_kernelbench_tol = -1", "ks_kernelbench_tol (ini) expects a tolerance"),
    ("ks_max_regression = lots", "ks_max_regression (ini) expects a non-negative percentage"),
    ("ks_compare = nowhere.json", "nowhere.json: no such file"),
    ("ks_lenient_task = maybe", "ks_lenient_task (ini): invalid truth value 'maybe'; expected "
     "true or false"),
    ("ks_attribution = maybe", "ks_attribution (ini): invalid truth value 'maybe'"),
])
def test_ini_twin_is_validated_and_named_as_the_ini_key(
        pytester: pytest.Pytester, ini: str, message: str) -> None:
    """A bad value from the ini file is named by the key the user wrote there, not by a flag
    they never typed."""
    pytester.makeini(f"[pytest]\n{ini}\n")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert message in result.stderr.str()


def test_a_kernel_missed_from_a_subfolder_says_where_it_was_looked_for(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """An ini's addopts `--kernel k.py` is read from where pytest runs, as pytest's own paths:
    from a subfolder the error said "no such file" and not where it had looked."""
    pytester.makeini("[pytest]\naddopts = --kernel k.py\n")
    (pytester.path / "k.py").write_text("def custom_kernel(data):\n    return data\n")
    sub = pytester.mkdir("sub")
    monkeypatch.chdir(sub)
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert (f"--kernel k.py: no such file in {sub}; expected a Python file exposing "
            "custom_kernel(data)") in result.stderr.str()


def test_the_flag_is_named_when_the_flag_gave_the_value(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nks_timeout = 30\n")
    result = pytester.runpytest("--ks-timeout", "never")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--ks-timeout expects a positive number of seconds, got 'never'" in result.stderr.str()


def test_unknown_profile_names_the_known_ones(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest(str(AXPY), "--ks-profile", "huge", "--collect-only")
    result.stdout.fnmatch_lines(["*task 'axpy' has no profile 'huge' (it has: cpu, full)*"])
    assert result.ret == pytest.ExitCode.INTERRUPTED


def test_unknown_profile_from_the_ini_names_the_ini_key(pytester: pytest.Pytester) -> None:
    """A profile the task lacks, set by the ini file, was named as `--ks-profile`, a flag the
    user never typed."""
    pytester.makeini("[pytest]\nks_profile = nope\n")
    shutil.copytree(AXPY, pytester.path / "axpy")  # under the ini's folder, so it is read
    result = pytester.runpytest("axpy", "--collect-only")
    result.stdout.fnmatch_lines(["*task 'axpy' has no profile 'nope' (it has: cpu, full); "
                                 "pick one of those with ks_profile (ini)"])
    assert "--ks-profile" not in result.stdout.str()
    assert result.ret == pytest.ExitCode.INTERRUPTED


def test_a_device_from_the_ini_that_is_not_here_names_the_ini_key(
        pytester: pytest.Pytester) -> None:
    """Likewise `--ks-device`: cuda:99 is no device on this machine, with or without a GPU."""
    pytester.makeini("[pytest]\nks_device = cuda:99\n")
    shutil.copytree(AXPY, pytester.path / "axpy")  # under the ini's folder, so it is read
    result = pytester.runpytest("axpy", "--collect-only")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "ks_device (ini) cuda:99: " in result.stderr.str(), result.stderr.str()
    assert "--ks-device" not in result.stderr.str()


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


def test_help_shows_the_options_in_sections_by_concern(pytester: pytest.Pytester) -> None:
    """Issue 29: 31 options in one group of `pytest --help` hid which a task needs. Each option
    is listed once, in the section of its table row's concern, the sections in their order."""
    from pytest_kscientist.evolve.llm.llm_options import LLM_OPTIONS
    from pytest_kscientist.evolve.run_options import EVOLVE_OPTIONS
    from pytest_kscientist.options import CORE_OPTIONS, GROUPS

    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--help")
    section, found, order = "", {}, []
    for line in result.stdout.lines:
        if line and not line.startswith(" ") and line.endswith(":"):
            section = line[:-1]
            order.append(section)
        elif flag := re.match(r"^  (--[\w-]+)", line):
            found.setdefault(flag.group(1), []).append(section)
    titles = [title for _, title in GROUPS.values()]
    assert [s for s in order if s in titles] == titles
    for option in (*CORE_OPTIONS, *EVOLVE_OPTIONS, *LLM_OPTIONS):
        assert found.get(option.flag) == [GROUPS[option.group][1]], option.flag
    assert {o.group for o in EVOLVE_OPTIONS if o.flag != "--ks-devices"} == {"evolve"}
    assert {o.group for o in LLM_OPTIONS} == {"llm"}


def test_the_budget_help_says_it_caps_the_population(pytester: pytest.Pytester) -> None:
    """The ledger is one per population (evolve/llm/ledger.py): the help says so, as the
    README does."""
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--help")
    text = " ".join(" ".join(result.stdout.lines).split())
    assert ("--ks-llm-budget-usd=USD hard cap in US dollars on the LLM spending of the task's "
            "population, all its runs together") in text


def test_one_kernel_given_twice_runs_once(pytester: pytest.Pytester) -> None:
    """As pytest runs a path given twice once; before, it read "two kernels are named 'k' ...
    rename one", for one file."""
    from helpers import AXPY

    (pytester.path / "k.py").write_text("def custom_kernel(data):\n    return data\n")
    result = pytester.runpytest(str(AXPY), "--collect-only", "-q", "--kernel", "k.py",
                                "--kernel", "./k.py", "-k", "check and n33")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str() + result.stderr.str()
    assert len([line for line in result.stdout.lines if "::k::check[n33" in line]) == 1, \
        result.stdout.str()


def test_ks_json_is_written_when_no_task_ran(pytester: pytest.Pytester) -> None:
    """An earlier run's file left in place would be read by a CI step as this run's results."""
    stale = pytester.path / "r.json"
    stale.write_text('{"task": "an earlier run"}')
    pytester.makepyfile(test_plain="def test_nothing():\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider", "--ks-json", str(stale))
    assert result.ret == 0
    assert stale.read_text() == "[]"
