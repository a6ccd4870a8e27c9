"""Task validation (issue 30, point 5): one ``task::validate`` item per task fails when the task
lets a trivial kernel pass: an all-zeros or constant output passing its check, or a reference
output that does not change with the seed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers import AXPY, DATA, REPO

from pytest_kscientist.formats.gpumode import load_problem
from pytest_kscientist.harness.collect import load_any
from pytest_kscientist.harness.task_validation import cache_key, task_files, validate

SEEDLESS_REFERENCE = '''import torch


def generate_input(n, seed, device="cpu"):
    x = torch.arange(n, dtype=torch.float32, device=device)
    return x, x.clone(), torch.empty(n, device=device)


def ref_kernel(data):
    x, y, _ = data
    return 2 * x + y
'''


def _copy(tmp: Path, name: str = "axpy") -> Path:
    dest = tmp / name
    shutil.copytree(AXPY, dest)
    return dest


def _validate_edited(pytester: pytest.Pytester, old: str, new: str) -> pytest.RunResult:
    """The validate item of a copy of axpy whose reference has ``old`` replaced by ``new``,
    run and failed."""
    task = _copy(pytester.path)
    ref = task / "reference.py"
    ref.write_text(ref.read_text().replace(old, new))
    result = pytester.runpytest(str(task), "-q", "-p", "no:cacheprovider", "-k", "validate")
    result.assert_outcomes(failed=1)
    return result


def _loose(task: Path) -> Path:
    """The task with a tolerance so wide that zeros (and any constant) pass."""
    spec = task / "task.toml"
    spec.write_text(spec.read_text().replace("atol = 1e-6", "atol = 1e3"))
    return task


def test_the_shipped_axpy_task_passes_its_validation(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest(str(AXPY), "-q", "-p", "no:cacheprovider", "-k", "validate")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*task validation: passed on case n1000-s1"])


def test_the_validation_item_comes_first_and_k_selects_it(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest(str(AXPY), "--collect-only", "-q", "-k", "validate")
    result.stdout.fnmatch_lines(["*axpy/task.toml::task::validate", "1/5 tests collected*"])
    ids = pytester.runpytest(str(AXPY), "--collect-only", "-q").stdout.lines
    assert ids[0].endswith("axpy/task.toml::task::validate"), ids[:3]


def test_a_tolerance_that_accepts_zeros_fails_with_the_hole_named(
        pytester: pytest.Pytester) -> None:
    task = _loose(_copy(pytester.path))
    result = pytester.runpytest(str(task), "-q", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=4, failed=1)
    result.stdout.fnmatch_lines(["*_ task::validate _*", "task 'axpy' lets trivial kernels pass*"])
    text = result.stdout.str()
    assert ("the reference output for one seed passes the task's check for the other, so the "
            "check cannot tell the seeds apart (case n1000-s1, seeds 1 and ") in text
    assert ("an all-zeros output passes the task's check on case n1000-s1 (tolerance "
            "atol=1000, rtol=1e-06)") in text
    assert "a constant output (the reference's mean) passes the task's check" in text
    assert "task validation: FAILED: " in text


def test_a_reference_that_ignores_the_seed_fails_with_the_hole_named(
        pytester: pytest.Pytester) -> None:
    task = _copy(pytester.path)
    (task / "reference.py").write_text(SEEDLESS_REFERENCE)
    result = pytester.runpytest(str(task), "-q", "-p", "no:cacheprovider", "-k", "validate")
    result.assert_outcomes(failed=1)
    text = result.stdout.str()
    assert "the reference output does not change with the seed (case n1000-s1, seeds 1 and " in text
    assert "all-zeros output passes" not in text  # the tolerance itself is tight


def test_a_generate_input_that_ignores_its_seed_is_a_task_error(
        pytester: pytest.Pytester) -> None:
    """torch.randn without a generator: the pytest process draws other inputs than the worker
    for the same seed, so every candidate (the reference too) would fail its check."""
    result = _validate_edited(pytester, ", generator=gen)", ")")
    result.stdout.fnmatch_lines([
        "task 'axpy': case n1000-s1 drawn twice with seed 1 gives inputs whose reference "
        "outputs differ (wrong result: * elements outside *): generate_input (or the reference) "
        "does not follow the seed; draw from a torch.Generator seeded with it"])


@pytest.mark.parametrize(("index", "what"), [
    ("5", "is past the 3 value(s)"),
    ("0", None),
])
def test_an_output_index_that_names_no_output_is_a_task_error(
        pytester: pytest.Pytester, index: str, what: str | None) -> None:
    task = _copy(pytester.path)
    spec = task / "task.toml"
    spec.write_text(spec.read_text().replace("output_index = 2", f"output_index = {index}"))
    if what is None:  # a plain number among the values instead of a tensor
        ref = task / "reference.py"
        ref.write_text(ref.read_text().replace("return x, y, torch.empty(n, device=device)",
                                               "return n, x, y, torch.empty(n, device=device)")
                       .replace("x, y, _ = data", "_, x, y, _ = data"))
        what = "names an int, not a tensor, among the values"
    result = pytester.runpytest(str(task), "-q", "-p", "no:cacheprovider")
    text = result.stdout.str()
    assert (f"task 'axpy': task.toml's output_index = {index} {what} generate_input returns "
            in text), text
    # The candidates' items say the same, not an IndexError from inside the worker.
    assert "IndexError" not in text
    result.stdout.fnmatch_lines([f"*good check n1000-s1: task.toml's output_index = {index}*"])


def test_a_task_whose_kernel_returns_its_own_output_needs_no_output_index(
        pytester: pytest.Pytester) -> None:
    task = _copy(pytester.path)
    spec = task / "task.toml"
    spec.write_text(spec.read_text().replace("output_index = 2\n", ""))
    ref = task / "reference.py"
    ref.write_text(ref.read_text().replace("return x, y, torch.empty(n, device=device)",
                                           "return x, y").replace("x, y, _ = data", "x, y = data"))
    (task / "seeds" / "good.py").write_text(
        "def custom_kernel(data):\n    x, y = data\n    return 2 * x + y\n")
    (task / "seeds" / "in_place.py").write_text(
        "def custom_kernel(data):\n    x, y = data\n    return y.add_(2 * x)\n")
    result = pytester.runpytest(str(task), "-q", "-p", "no:cacheprovider",
                                "-k", "check or validate")
    result.assert_outcomes(passed=3, failed=2)
    result.stdout.fnmatch_lines(["*in_place check *: modified input 1 in place*"])


def test_a_reference_that_fails_at_import_is_named_in_every_candidates_items(
        pytester: pytest.Pytester) -> None:
    """Not the worker's exit code and the zygote's traceback: what the task's code raised."""
    task = _copy(pytester.path)
    ref = task / "reference.py"
    ref.write_text(ref.read_text() + "\nif True:\n    raise RuntimeError('data file missing')\n")
    result = pytester.runpytest(str(task), "-q", "-p", "no:cacheprovider", "-k", "check")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines([
        "good check n1000-s1: failed to load: the task's own code failed in the worker, before "
        "any candidate code ran: RuntimeError: data file missing; fix the task*"])
    assert "Traceback" not in result.stdout.str()


def test_lenient_task_turns_a_hole_into_a_warning(pytester: pytest.Pytester) -> None:
    task = _loose(_copy(pytester.path))
    out = pytester.path / "r.json"
    result = pytester.runpytest(str(task), "-q", "-p", "no:cacheprovider", "-k", "validate",
                                "--ks-lenient-task", "--ks-json", str(out))
    result.assert_outcomes(passed=1)
    _one_hole_warning(result)
    result.stdout.fnmatch_lines(["*KsTaskHole: task 'axpy' lets trivial kernels pass: *an "
                                 "all-zeros output passes*(--ks-lenient-task: a warning, not a "
                                 "failure)"])
    record = json.loads(out.read_text())["task_validation"]
    assert record["outcome"] == "warned" and len(record["holes"]) == 3, record


def test_lenient_task_has_an_ini_twin(pytester: pytest.Pytester) -> None:
    task = _loose(_copy(pytester.path))
    pytester.makeini("[pytest]\nks_lenient_task = true\n")
    result = pytester.runpytest(str(task), "-q", "-p", "no:cacheprovider", "-k", "validate")
    result.assert_outcomes(passed=1)
    _one_hole_warning(result)


def _one_hole_warning(result: pytest.RunResult) -> None:
    # counted by name: an in-process run under an installed plugin may add pytest's own
    # "already imported so cannot be rewritten" warnings to the total
    summary = result.stdout.str().split("warnings summary")[-1]
    assert summary.count("KsTaskHole: task 'axpy' lets trivial kernels pass") == 1, summary


def test_a_reference_that_raises_is_a_one_line_reason(pytester: pytest.Pytester) -> None:
    result = _validate_edited(pytester, "return 2 * x + y", "raise ValueError('no luck')")
    result.stdout.fnmatch_lines([
        "task 'axpy': the reference failed on case n1000-s1: ValueError: no luck"])


def test_the_verdict_is_cached_by_the_task_files(pytester: pytest.Pytester) -> None:
    """Five sessions of the validate item alone, in this process (it starts no worker, and the
    verdicts travel through pytest's cache on disk): 18.3 s as subprocesses, each importing
    torch again."""
    task = _loose(_copy(pytester.path))
    first = pytester.runpytest(str(task), "-q", "-k", "validate")
    first.assert_outcomes(failed=1)
    assert "(cached)" not in first.stdout.str()
    again = pytester.runpytest(str(task), "-q", "-k", "validate")
    again.assert_outcomes(failed=1)
    again.stdout.fnmatch_lines(["task 'axpy' lets trivial kernels pass: *all-zeros output "
                                "passes*(cached)"])
    # A new seed kernel is not part of the task: still cached; a changed spec is a new key.
    shutil.copy(task / "seeds" / "good.py", task / "seeds" / "other.py")
    assert "(cached)" in pytester.runpytest(str(task), "-q", "-k", "validate").stdout.str()
    spec = task / "task.toml"
    spec.write_text(spec.read_text().replace("atol = 1e3", "atol = 1e-6"))
    fixed = pytester.runpytest(str(task), "-q", "-k", "validate")
    fixed.assert_outcomes(passed=1)
    fixed.stdout.fnmatch_lines(["*task validation: passed on case n1000-s1"])
    cached = pytester.runpytest(str(task), "-q", "-k", "validate")
    cached.stdout.fnmatch_lines(["*task validation: passed on case n1000-s1 (cached)"])
    (entries,) = pytester.path.glob("**/.pytest_cache/v/kscientist/task-validation")
    assert len(list(entries.iterdir())) == 2  # one per version of the spec


def test_a_candidate_named_task_is_refused(pytester: pytest.Pytester) -> None:
    task = _copy(pytester.path)
    shutil.copy(task / "seeds" / "good.py", task / "seeds" / "task.py")
    result = pytester.runpytest(str(task), "--collect-only", "-q")
    result.stdout.fnmatch_lines(["*candidate 'task' has the name of the task's task node*"])


def test_fp8_gemm_passes_its_validation_on_the_cpu_profile(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest(str(REPO / "tasks" / "fp8_gemm"), "-q", "-p",
                                "no:cacheprovider", "-k", "validate", "--ks-profile", "cpu",
                                "--ks-device", "cpu")
    result.assert_outcomes(passed=1)


def test_kernelbench_and_gpumode_tasks_are_validated_too() -> None:
    relu = load_any(DATA / "formats" / "kernelbench" / "level1" / "2_ReLU.py")
    verdict = validate(relu, relu.profile("cpu").tests[0], "cpu")
    assert verdict.ran == 3 and not verdict.holes and not verdict.error, verdict
    loose = load_any(DATA / "formats" / "kernelbench" / "level1" / "2_ReLU.py", 1e3)
    holes = validate(loose, loose.profile("cpu").tests[0], "cpu").holes
    assert [h.split(" (")[0].split(" passes")[0] for h in holes] == [
        "the reference output for one seed", "an all-zeros output", "a constant output"]
    scale = load_problem(DATA / "formats" / "gpumode" / "cpu" / "scale_py" / "task.yml")
    verdict = validate(scale, scale.profile("cpu").tests[0], "cpu")
    assert verdict.ran == 3 and not verdict.holes, verdict
    assert set(task_files(scale)) == {"task.yml", "listed/task.py", "listed/utils.py",
                                      "listed/reference.py"}


def test_a_gpumode_case_without_a_seed_compares_two_draws(tmp_path: Path) -> None:
    folder = tmp_path / "fixed_py"
    folder.mkdir()
    (folder / "task.py").write_text("import torch\ninput_t = torch.Tensor\n")
    (folder / "reference.py").write_text(
        "import torch\n\ndef generate_input(size):\n    return torch.arange(size) * 1.0\n\n"
        "def ref_kernel(data):\n    return data * 2\n\n"
        "def check_implementation(data, output):\n"
        "    return '' if torch.allclose(output, data * 2) else 'mismatch'\n")
    (folder / "task.yml").write_text(
        'files:\n  - {"name": "submission.py", "source": "@SUBMISSION@"}\n'
        '  - {"name": "task.py", "source": "task.py"}\n'
        '  - {"name": "reference.py", "source": "reference.py"}\n'
        'lang: "py"\ntests:\n  - {"size": 16}\n')
    task = load_problem(folder / "task.yml")
    verdict = validate(task, task.profile("cpu").tests[0], "cpu")
    assert len(verdict.holes) == 1 and verdict.holes[0].startswith(
        "the reference output does not change with the seed (case size16, global generator "
        "seeds (the case has no seed key) 0 and "), verdict
    key = cache_key(task, task.profile("cpu").tests[0], "cpu")
    (folder / "reference.py").write_text((folder / "reference.py").read_text() + "\n# edit\n")
    edited = load_problem(folder / "task.yml")
    assert cache_key(edited, edited.profile("cpu").tests[0], "cpu") != key


TOTAL = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.sum(x)


def get_inputs():
    return [torch.randn(64, 32)]


def get_init_inputs():
    return []
'''


def test_a_one_value_output_is_not_failed_for_passing_as_its_own_mean(tmp_path: Path) -> None:
    """GPU MODE's vectorsum returns one value: the "constant output" made of the reference's
    mean was the answer itself, so validation failed the task and every correct run exited 1.
    (A KernelBench MSELoss of 64 x 32 fails by the seed probe instead: the losses of two seeds
    agree within its tolerance.)"""
    (tmp_path / "total.py").write_text(TOTAL)
    task = load_any(tmp_path / "total.py")
    verdict = validate(task, task.profile("cpu").tests[0], "cpu")
    assert not verdict.holes and not verdict.error and verdict.ran == 2, verdict
    assert any("each tensor of the reference output holds one value" in n
               for n in verdict.notes), verdict.notes
