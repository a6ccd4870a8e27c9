"""Tasks from the ecosystem (issue 12): GPU MODE problem folders and KernelBench problem files
collected unchanged, CPU-runnable forms written for these tests in tests/data/formats."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from helpers import DATA, case_reasons, run_pytest

from pytest_kscientist.formats import forms, gpumode, kernelbench
from pytest_kscientist.harness.evaluate import check_message

FORMATS = DATA / "formats"
SCALE = FORMATS / "gpumode" / "cpu" / "scale_py"
KB = FORMATS / "kernelbench"


def test_gpumode_folder_runs_its_seeds_and_judges_with_its_own_check(tmp_path: Path) -> None:
    wrong = SCALE / "solutions" / "wrong"
    code, out, data = run_pytest(
        [str(SCALE), "--ks-device", "cpu", "--kernel",  # it draws on the CPU
         str(SCALE / "solutions/correct/torch_ops.py"),
         "--kernel", str(wrong / "no_square.py"), "--kernel", str(wrong / "peeks.py")], tmp_path)
    assert code == 1, out
    reasons = case_reasons(data)
    assert reasons[("torch_ops", "size1000-s11")] == ("passed", "")
    assert reasons[("torch_ops", "size4096-s13")][0] == "passed"
    outcome, reason = reasons[("no_square", "size64-s12")]
    # The problem's check_implementation decided, with its own words.
    assert outcome == "failed"
    # 3x against 3x + x^2 on 64 salted normals: the x with x^2 under the tolerance match (one
    # in about thirty runs has one)
    assert re.search(r"custom implementation doesn't match reference: Number of mismatched "
                     r"elements: 6[0-4]\b", reason), reason
    assert reasons[("no_square", "size4096-s13")] == (
        "failed", "not timed: check size1000-s11 failed earlier in this run")
    # The candidate's process has the problem's task.py but never a module named reference.
    assert "No module named 'reference'" in reasons[("peeks", "size64-s12")][1]


def test_gpumode_seeds_come_from_solutions_correct(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest(str(SCALE), "--collect-only", "-q")
    result.stdout.fnmatch_lines_random([
        "*scale_py/task.yml::reference::bench[[]size4096-s13[]]",
        "*scale_py/task.yml::torch_ops::check[[]size1000-s11[]]",
        "*scale_py/task.yml::torch_ops::bench[[]size4096-s13[]]",
    ])


def _problem(root: Path, name: str, yml_extra: str = "", draw: str = "torch.randn(size)") -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "task.py").write_text(f"KIND = {name!r}\n")
    (folder / "reference.py").write_text(
        "import torch\nimport task\n\n"
        f"def generate_input(size, seed):\n    torch.manual_seed(seed)\n    return {draw}\n\n"
        "def ref_kernel(data):\n    return data * 2 if task.KIND == 'double_py' else data + 1\n\n"
        "def check_implementation(data, output):\n"
        "    ok = torch.allclose(output, ref_kernel(data))\n"
        "    return (ok, 'values differ' if not ok else '')\n")
    (folder / "task.yml").write_text(
        'files:\n  - {"name": "submission.py", "source": "@SUBMISSION@"}\n'
        '  - {"name": "task.py", "source": "task.py"}\n'
        '  - {"name": "reference.py", "source": "reference.py"}\n'
        f'lang: "py"\n{yml_extra}tests:\n  - {{"size": 8, "seed": 1}}\nbenchmarks: []\n')
    return folder


def test_two_problems_in_one_session_keep_their_own_task_module(tmp_path: Path) -> None:
    """Both folders import a module named ``task``; each reference sees its own (the pair form
    of check_implementation's answer is honoured too)."""
    for name, body in (("double_py", "data * 2"), ("inc_py", "data + 1")):
        folder = _problem(tmp_path, name)
        (folder / "solutions" / "correct").mkdir(parents=True)
        (folder / "solutions" / "correct" / "mine.py").write_text(
            f"def custom_kernel(data):\n    return {body}\n")
    code, out, data = run_pytest([str(tmp_path / "double_py"), str(tmp_path / "inc_py"),
                                  "--ks-device", "cpu"], tmp_path)  # they draw on the CPU
    assert code == 0, out
    assert "4 passed" in out  # each problem's check and its task::validate


def test_unsupported_problems_are_skipped_with_the_reason(pytester: pytest.Pytester) -> None:
    _problem(pytester.path, "cu_py", yml_extra='lang: "cu"\n')
    _problem(pytester.path, "multi_py", yml_extra="multi_gpu: true\n")
    _problem(pytester.path, "gpu_py", draw="torch.randn(size, device='cuda')")
    result = pytester.runpytest("-rs", "--ks-device", "cpu")
    result.assert_outcomes(skipped=3)
    import torch

    # Where CUDA is, its generate_input runs, and the folder is skipped for having no candidate.
    drawn = ("*task 'gpu_py': no candidate: *" if torch.cuda.is_available() else
             "*task 'gpu_py': its generate_input fails on cpu*run it on a GPU*")
    result.stdout.fnmatch_lines_random([
        "*lang 'cu' problems are not run by pytest-kscientist*",
        "*multi_gpu problems are not run*",
        drawn,
    ])


def test_a_generate_input_that_is_broken_is_an_error_not_a_gpu_skip(
        pytester: pytest.Pytester) -> None:
    """Any failure of the draw read "run it on a GPU" (a skip, exit 5) before, a typo too."""
    _problem(pytester.path, "typo_py", draw="torch.randnt(size)")
    result = pytester.runpytest("--ks-device", "cpu")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([
        "*task 'typo_py': its generate_input failed on case * (AttributeError: module 'torch' "
        "has no attribute 'randnt'), not for want of a GPU; fix the problem's reference.py*"])


def test_a_gpu_skip_reason_ends_on_a_whole_sentence() -> None:
    from pytest_kscientist.harness.collect import first_sentence

    torch_says = ("Cannot get CUDA generator without ATen_cuda library. PyTorch splits its "
                  "backend into two shared libraries: a CPU library and a CUDA library")
    assert first_sentence(torch_says) == "Cannot get CUDA generator without ATen_cuda library."
    assert first_sentence("x" * 300, 20) == "x" * 17 + "..."
    assert first_sentence("one line\nand another") == "one line"


def test_only_recognisable_files_are_claimed(tmp_path: Path) -> None:
    (tmp_path / "task.yml").write_text("jobs:\n  build: {runs-on: ubuntu}\n")
    (tmp_path / "reference.py").write_text("x = 1\n")
    assert not gpumode.looks_like_problem(tmp_path / "task.yml")
    solution = KB / "solutions" / "1_Scaled_Linear.py"
    assert not kernelbench.looks_like_problem(solution)
    assert kernelbench.looks_like_problem(KB / "level1" / "2_ReLU.py")
    other = tmp_path / "model.py"
    other.write_text("class Model:\n    pass\n")
    assert not kernelbench.looks_like_problem(other)
    # a user's test file that defines a problem's names is pytest's, by either default pattern
    for name in ("test_model.py", "model_test.py"):
        (tmp_path / name).write_text((KB / "level1" / "2_ReLU.py").read_text())
        assert not kernelbench.looks_like_problem(tmp_path / name)


def test_kernelbench_solutions_folder_matched_by_problem_name(tmp_path: Path) -> None:
    code, out, data = run_pytest([str(KB / "level1"), "--ks-solutions", str(KB / "solutions")],
                                 tmp_path)
    assert code == 1, out
    assert [run["task"] for run in data] == ["1_Scaled_Linear", "2_ReLU"]
    reasons = {k: v for run in data for k, v in case_reasons(run).items()}
    # 1_Scaled_Linear.py (same weights: both models built under one seed) and 2_ReLU/clamp.py
    for name in ("1_Scaled_Linear", "clamp"):
        for seed in kernelbench.CHECK_TRIALS:
            assert reasons[(name, f"s{seed}")] == ("passed", ""), (name, out)
        assert reasons[(name, f"s{kernelbench.BENCH_SEED}")][0] == "passed"
    outcome, reason = reasons[("leaky", "s42")]
    assert outcome == "failed" and "outside |out-ref| <= 0.01 + 0.01*|ref|" in reason


def test_kernelbench_problem_without_a_match_is_skipped(pytester: pytest.Pytester) -> None:
    shutil.copy(KB / "level1" / "2_ReLU.py", pytester.path / "7_Other.py")
    result = pytester.runpytest("-rs", "--ks-solutions", str(KB / "solutions"))
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*no candidate in * (looked for 7_Other.py and 7_Other/*.py)*"])


def test_kernelbench_problems_without_a_kernel_are_skipped_with_the_way_to_give_one(
        pytester: pytest.Pytester) -> None:
    """They were collection errors asking to "add a seed", which a KernelBench problem never
    has: a folder of problems stopped the run at collection."""
    shutil.copy(KB / "level1" / "2_ReLU.py", pytester.path / "2_ReLU.py")
    result = pytester.runpytest("-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*task '2_ReLU': a KernelBench problem brings no kernel of its "
                                 "own; pass --kernel PATH (a file defining ModelNew) or "
                                 "--ks-solutions DIR*"])


def test_kernelbench_solution_without_modelnew_fails_to_load(tmp_path: Path) -> None:
    bad = tmp_path / "sol"
    bad.mkdir()
    (bad / "2_ReLU.py").write_text("def custom_kernel(data):\n    return data\n")
    code, out, data = run_pytest(
        [str(KB / "level1" / "2_ReLU.py"), "--ks-solutions", str(bad)], tmp_path)
    assert code == 1
    assert "failed to load: defines no class ModelNew (found nothing)" in out


def test_check_message_reads_both_answer_forms() -> None:
    assert check_message("") == "" and check_message(None) == ""
    assert check_message("mismatch") == "mismatch"
    assert check_message((True, "")) == ""
    assert check_message((False, "too far")) == "too far"
    assert check_message((False, "")) == "check_implementation said it failed"
    # as GPU MODE's eval reads them: a falsy answer passes, a tuple by its first item's truth
    assert check_message([]) == "" and check_message({}) == ""
    assert check_message(["row 3 differs"]) == "['row 3 differs']"

    class NumpyBool:  # numpy.bool_ is not a bool but has one's truth
        def __init__(self, value: bool) -> None:
            self.value = value

        def __bool__(self) -> bool:
            return self.value

    assert check_message((NumpyBool(True), "")) == ""
    assert check_message((NumpyBool(False), "off by one")) == "off by one"


def test_leaves_and_rebuild_keep_structure() -> None:
    import torch

    x, y = torch.zeros(2), torch.ones(3)
    data = (x, {"w": y, "n": 4}, [x])
    assert [id(t) for t in forms.leaves(data)] == [id(x), id(y), id(4), id(x)]
    copy = forms.rebuild(data, lambda t: t.clone() if isinstance(t, torch.Tensor) else t)
    assert type(copy) is tuple and set(copy[1]) == {"w", "n"} and copy[1]["n"] == 4
    assert copy[0] is not x and torch.equal(copy[0], x)
    single = torch.arange(3.0)
    assert forms.leaves(single) == [single]


PAIR_PROBLEM = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    """Two outputs: the ReLU of x and its row sums."""
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x), x.sum(dim=1)


def get_inputs():
    return [torch.randn(8, 64)]


def get_init_inputs():
    return []
'''


def _pair_solution(second: str, container: str = "({a}, {b})") -> str:
    body = container.format(a="torch.relu(x)", b=second)
    return ("import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n"
            f"    def forward(self, x):\n        return {body}\n")


def test_outputs_of_several_tensors_are_judged_part_by_part(tmp_path: Path) -> None:
    (tmp_path / "3_Pair.py").write_text(PAIR_PROBLEM)
    sols = tmp_path / "sols" / "3_Pair"
    sols.mkdir(parents=True)
    (sols / "right.py").write_text(_pair_solution("x.sum(dim=1)"))
    (sols / "off.py").write_text(_pair_solution("x.sum(dim=1) + 1"))
    (sols / "dict.py").write_text(_pair_solution("x.sum(dim=1)", "{{'a': {a}, 'b': {b}}}"))
    (sols / "nested.py").write_text(_pair_solution("x.sum(dim=1)", "({a}, ({b},))"))
    code, out, data = run_pytest([str(tmp_path / "3_Pair.py"), "--ks-solutions",
                                  str(tmp_path / "sols")], tmp_path)
    assert code == 1, out
    reasons = case_reasons(data)
    assert reasons[("right", "s42")] == ("passed", "")
    assert reasons[("right", f"s{kernelbench.BENCH_SEED}")][0] == "passed"
    outcome, reason = reasons[("off", "s42")]
    assert outcome == "failed" and reason.startswith("wrong result: output 1: 8 of 8 elements")
    outcome, reason = reasons[("dict", "s42")]
    assert outcome == "failed"
    assert "returned builtins.dict, expected a plain torch.Tensor (or a tuple of them)" in reason
    outcome, reason = reasons[("nested", "s42")]
    assert outcome == "failed" and ("returned builtins.tuple whose part 1 is builtins.tuple, "
                                    "expected a plain torch.Tensor (or a tuple of them)") in reason


def test_kernelbench_tolerance_is_an_option(tmp_path: Path) -> None:
    """A ReLU off by 1e-3 passes KernelBench v0's 1e-2 and fails its newer fp32 1e-4."""
    sols = tmp_path / "sols"
    sols.mkdir()
    (sols / "2_ReLU.py").write_text(
        "import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n"
        "    def forward(self, x):\n        return torch.relu(x) + 1e-3\n")
    args = [str(KB / "level1" / "2_ReLU.py"), "--ks-solutions", str(sols), "-k", "check"]
    code, out, _ = run_pytest(args, tmp_path)
    assert code == 0, out
    code, out, data = run_pytest([*args, "--ks-kernelbench-tol", "1e-4"], tmp_path)
    assert code == 1
    assert "outside |out-ref| <= 0.0001 + 0.0001*|ref|" in case_reasons(data)[("2_ReLU", "s42")][1]
    code, out, _ = run_pytest([*args, "--ks-kernelbench-tol", "tight"], tmp_path)
    assert code == 4 and "--ks-kernelbench-tol expects a tolerance of 0 or more" in out


def test_a_long_check_message_is_cut_between_words() -> None:
    """GPU MODE's mismatch lines are long lists of numbers: cut mid-number, '1.0244140625'
    read as an expected value of '1.02'."""
    import types

    import torch

    from pytest_kscientist.errors import CandidateFailure
    from pytest_kscientist.harness.evaluate import Evaluator

    said = "ERROR AT (0, 4): " + "0.701171875 1.0244140625 " * 20
    problem = types.SimpleNamespace(check_implementation=lambda data, out: (False, said))
    task = types.SimpleNamespace(form="gpumode", module=problem)
    evaluator = Evaluator(task, "cpu", salt=1)  # type: ignore[arg-type]
    with pytest.raises(CandidateFailure) as failed:
        evaluator._own_check(None, torch.zeros(2))
    reason = failed.value.reason
    assert reason.endswith(" ...") and len(reason) <= len("wrong result: ") + 304, reason
    assert reason[:-4].rsplit(" ", 1)[1] in ("0.701171875", "1.0244140625"), reason
    assert failed.value.detail == said  # whole in the detail


def test_a_kernelbench_model_changing_its_input_fails_validation(tmp_path: Path) -> None:
    """It passed validation (the check was native tasks' only); its own benchmarks then failed,
    and a mirroring solution was told to set output_index in a task.toml it does not have."""
    from pytest_kscientist.harness.task_validation import validate

    problem = tmp_path / "4_InPlace.py"
    problem.write_text(PAIR_PROBLEM.replace("return torch.relu(x), x.sum(dim=1)",
                                            "x.relu_()\n        return x * 2"))
    task = kernelbench.load_problem(problem)
    verdict = validate(task, task.profile("cpu").tests[0], "cpu")
    assert verdict.error is not None and "the reference changes input 0 of case " in \
        verdict.error, verdict.error
    assert verdict.error.endswith("compute on a copy"), verdict.error


def test_a_problems_own_check_gets_the_output_on_its_inputs_device() -> None:
    """On a GPU the output was moved to the session's device whatever the problem's inputs: a
    GPU MODE problem drawing them on the CPU failed every candidate ("Expected all tensors to
    be on the same device"), and a named tuple's move raised TypeError. Here the inputs sit
    on the meta device while the session is the CPU's."""
    import collections
    import types

    import torch

    from pytest_kscientist.harness import received
    from pytest_kscientist.harness.evaluate import Evaluator

    seen = []
    problem = types.SimpleNamespace(
        check_implementation=lambda data, out: (seen.append(out) or True, ""))
    task = types.SimpleNamespace(form="gpumode", module=problem)
    evaluator = Evaluator(task, "cpu", salt=1)  # type: ignore[arg-type]
    data = ({"n": 3}, [torch.empty(3, device="meta")])
    evaluator._own_check(data, torch.zeros(3))
    assert seen[-1].device.type == "meta"
    pair = collections.namedtuple("Pair", "a b")(torch.zeros(2), torch.ones(2))
    moved = received.to_device(pair, "meta")
    assert type(moved) is type(pair) and moved.b.device.type == "meta"
    assert received.device_of({"x": 1, "y": (2, torch.zeros(1))}).type == "cpu"
    assert received.device_of([1, "a"]) is None


def _current_device(monkeypatch) -> list[str]:
    """torch.cuda.device faked on a CPU torch: the list's one entry is the current device."""
    import contextlib

    import torch

    now = ["cuda:0"]

    @contextlib.contextmanager
    def device(which):
        before, now[0] = now[0], str(which)
        try:
            yield
        finally:
            now[0] = before

    monkeypatch.setattr(torch.cuda, "device", device)
    return now

def test_on_cuda_n_the_reference_runs_with_cuda_n_current(monkeypatch) -> None:
    """Only the draw ran with the run's GPU current: on --ks-device cuda:1 (an evolve's second
    child session) a GPU MODE reference's ``.cuda()`` and its check ran on cuda:0, so every
    kernel failed "Expected all tensors to be on the same device"."""
    import types

    import torch

    from pytest_kscientist.harness.evaluate import Evaluator

    now = _current_device(monkeypatch)
    seen = {}
    problem = types.SimpleNamespace(
        ref_kernel=lambda data: seen.setdefault("ref_kernel", now[0]),
        check_implementation=lambda data, out: (seen.setdefault("check", now[0]), ""))
    task = types.SimpleNamespace(form="gpumode", module=problem)
    evaluator = Evaluator(task, "cuda:1", salt=1)  # type: ignore[arg-type]
    data = (torch.empty(2, device="meta"),)  # the check's output goes where its inputs are
    evaluator.reference_output(data)
    evaluator._own_check(data, torch.zeros(2, device="meta"))
    assert seen == {"ref_kernel": "cuda:1", "check": "cuda:1"} and now == ["cuda:0"]


def test_a_kernelbench_draw_on_cuda_n_has_cuda_n_current(monkeypatch) -> None:
    """get_inputs() that says .cuda() drew on cuda:0 in an evolve's cuda:1 session (only
    torch.device was entered), beside the other session's timing."""
    from pytest_kscientist.formats import forms

    now = _current_device(monkeypatch)
    seen = []
    draw = forms._kernelbench_inputs(lambda: seen.append(now[0]) or [])
    assert draw({}, 1, "cuda:1") == [] and seen == ["cuda:1"]
