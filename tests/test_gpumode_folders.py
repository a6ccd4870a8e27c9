"""GPU MODE folders in the shapes GPU MODE's own eval.py accepts (issue 30): each pattern of the
reference-kernels problems that failed collection, reproduced in a small CPU-runnable folder
written here (the problems themselves are never copied: notes/formats.md has the survey)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import case_reasons, run_pytest

from pytest_kscientist.formats import gpumode

# These problems draw their inputs on the CPU (GPU MODE's generate_input takes no device):
# on a GPU machine they run with --ks-device cpu, as a user would run them.
ON_CPU = ("--ks-device", "cpu")
TASK_PY = "import torch\ninput_t = torch.Tensor\noutput_t = torch.Tensor\n"
FILES = ('files:\n  - {"name": "submission.py", "source": "@SUBMISSION@"}\n'
         '  - {"name": "task.py", "source": "task.py"}\n'
         '  - {"name": "reference.py", "source": "reference.py"}\n'
         '  - {"name": "eval.py", "source": "eval.py"}\nlang: "py"\nconfig:\n  main: "eval.py"\n')
# A check as GPU MODE's utils.make_match_reference gives it: (ok, message).
MATCH = ("def check_implementation(data, output):\n"
         "    expected = ref_kernel(data)\n"
         "    ok = output.shape == expected.shape and torch.allclose(output, expected, atol=1e-5)\n"
         "    return ok, '' if ok else 'mismatch found! values differ'\n")


def _folder(root: Path, name: str, reference: str, cases: str,
            candidates: dict[str, str] | None = None, submission: str | None = None) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "task.py").write_text(TASK_PY)
    (folder / "reference.py").write_text("import torch\n\n" + reference)
    (folder / "task.yml").write_text(FILES + cases)
    if submission is not None:
        (folder / "submission.py").write_text(submission)
    for file, text in (candidates or {}).items():
        (folder / "solutions" / "correct").mkdir(parents=True, exist_ok=True)
        (folder / "solutions" / "correct" / file).write_text(text)
    return folder


def _ragged(root: Path) -> Path:
    """linalg/cholesky_py's pattern: some cases add a key (``case``) the others lack."""
    return _folder(root, "ragged_py", (
        "def generate_input(n, seed, case='dense'):\n"
        "    gen = torch.Generator().manual_seed(seed)\n"
        "    x = torch.randn(n, generator=gen)\n"
        "    return x.abs() if case == 'positive' else x\n\n"
        "def ref_kernel(data):\n    return data.sqrt().nan_to_num(-1.0)\n\n" + MATCH),
        "tests:\n  - {\"n\": 8, \"seed\": 1}\n  - {\"n\": 8, \"seed\": 2, \"case\": \"positive\"}\n"
        "benchmarks: []\n",
        submission="def custom_kernel(data):\n    return data.sqrt().nan_to_num(-1.0)\n")


def _seedless(root: Path) -> Path:
    """princeton/cross_entropy_py's cases (no ``seed``), with the interface the harness drives:
    generate_input draws from the global generator."""
    return _folder(root, "seedless_py", (
        "def generate_input(size):\n    return torch.randn(size)\n\n"
        "def ref_kernel(data):\n    return data * 2\n\n" + MATCH),
        "tests:\n  - {\"size\": 16}\nbenchmarks:\n  - {\"size\": 32}\n",
        {"double.py": "def custom_kernel(data):\n    return data * 2\n"})


def _grouped(root: Path) -> Path:
    """nvidia/nvfp4_group_gemm's pattern: list values, given to generate_input as tuples; and
    nvfp4_gemv's: one case listed twice."""
    return _folder(root, "grouped_py", (
        "def generate_input(m, g, seed):\n"
        "    assert isinstance(m, tuple) and len(m) == g, m\n"
        "    gen = torch.Generator().manual_seed(seed)\n"
        "    return torch.randn(sum(m), generator=gen)\n\n"
        "def ref_kernel(data):\n    return data + 1\n\n" + MATCH),
        "tests:\n  - {\"m\": [2, 3], \"g\": 2, \"seed\": 5}\n"
        "  - {\"m\": [2, 3], \"g\": 2, \"seed\": 5}\n"
        "  - {\"m\": [4, 1, 2], \"g\": 3, \"seed\": 6}\nbenchmarks: []\n",
        {"inc.py": "def custom_kernel(data):\n    return data + 1\n"})


SPD = (
    # linalg/cholesky_py's pattern: symmetric positive definite inputs, judged by properties of
    # the output against the input (one changed element leaves that domain).
    "from dataclasses import dataclass\n\n"  # amd/mla-decode's reference defines a dataclass
    "@dataclass\nclass Spec:\n    n: int\n\n"
    "def generate_input(n, seed):\n"
    "    gen = torch.Generator().manual_seed(seed)\n"
    "    x = torch.randn(Spec(n).n, n, generator=gen, dtype=torch.float64)\n"
    "    return x @ x.T + n * torch.eye(n, dtype=torch.float64)\n\n"
    "def ref_kernel(data):\n    return torch.linalg.cholesky(data)\n\n"
    "def check_implementation(data, output):\n"
    "    if not torch.equal(output, output.tril()):\n"
    "        return False, 'output must be lower triangular'\n"
    "    if not bool((output.diagonal() > 0).all()):\n"
    "        return False, 'output diagonal must be strictly positive'\n"
    "    residual = (output @ output.T - data).abs().max().item()\n"
    "    return residual < 1e-8, f'reconstruction residual {residual:.3g}'\n")
CHOLESKY = "import torch\n\ndef custom_kernel(data):\n    return torch.linalg.cholesky_ex(data).L\n"
CACHED = ("import torch\n_seen = {}\n\n"
          "def custom_kernel(data):\n"
          "    key = (data.data_ptr(), tuple(data.shape))\n"
          "    if key not in _seen:\n        _seen[key] = torch.linalg.cholesky_ex(data).L\n"
          "    return _seen[key]\n")


def test_the_folders_gpu_modes_eval_accepts_collect_and_pass(tmp_path: Path) -> None:
    """Each folder failed collection before (keys that differ, no seed, list values), so the
    whole run stopped; now each runs with the verdicts of its own check."""
    folders = [_ragged(tmp_path), _seedless(tmp_path), _grouped(tmp_path),
               _folder(tmp_path, "spd_py", SPD, "tests:\n  - {\"n\": 6, \"seed\": 3}\n"
                       "benchmarks: []\n", {"cholesky.py": CHOLESKY})]
    code, out, data = run_pytest([*ON_CPU, *map(str, folders), "--ks-bench-budget", "0.05"],
                                 tmp_path)
    assert code == 0, out
    reasons = {(run["task"], *key): value for run in data for key, value
               in case_reasons(run).items()}
    assert reasons == {
        # submission.py is the seed of a folder without solutions/correct.
        ("ragged_py", "submission", "n8-s1"): ("passed", ""),
        ("ragged_py", "submission", "n8-s2-casepositive"): ("passed", ""),
        ("seedless_py", "double", "size16"): ("passed", ""),
        ("seedless_py", "double", "size32"): ("passed", ""),
        ("seedless_py", "reference", "size32"): ("passed", ""),
        # The case listed twice is one item.
        ("grouped_py", "inc", "m2_3-g2-s5"): ("passed", ""),
        ("grouped_py", "inc", "m4_1_2-g3-s6"): ("passed", ""),
        # The re-run draws the case again (a changed element broke positive definiteness).
        ("spd_py", "cholesky", "n6-s3"): ("passed", ""),
    }, out


def test_a_result_cached_by_address_fails_the_rerun_of_a_redrawn_case(tmp_path: Path) -> None:
    folder = _folder(tmp_path, "spd_py", SPD, "tests:\n  - {\"n\": 6, \"seed\": 3}\n"
                     "benchmarks: []\n", {"cached.py": CACHED})
    code, out, data = run_pytest([*ON_CPU, str(folder)], tmp_path)
    assert code == 1, out
    outcome, reason = case_reasons(data)[("cached", "n6-s3")]
    assert outcome == "failed"
    # (The worker poisons a returned output after its snapshot: the cached one comes back NaN.)
    assert reason.startswith("re-run in the same input tensors with every tensor drawn again by "
                             "generate_input: wrong result: "), reason
    assert reason.endswith("returned again from an earlier call reads so; a result cached "
                           "across calls?)"), reason


# pmpp/sort_py's pattern: the seed is a number in the data (each row drawn around seed + row),
# so at a large seed float32 holds one value and an unsorted copy is "sorted".
SORT = ("def generate_input(size, seed):\n"
        "    rows = int(size ** 0.5)\n"
        "    out = torch.empty(rows, size // rows)\n"
        "    for i in range(rows):\n"
        "        gen = torch.Generator().manual_seed(seed + i)\n"
        "        out[i] = torch.randn(size // rows, generator=gen) + (seed + i)\n"
        "    x = out.flatten().contiguous()\n"
        "    return x, torch.empty_like(x)\n\n"
        "def ref_kernel(data):\n    x, out = data\n    out[...] = torch.sort(x)[0]\n"
        "    return out\n\n" + MATCH)


def test_drawn_seeds_stay_in_the_range_of_the_problems_own(tmp_path: Path) -> None:
    """With the 56-bit seeds drawn before, the copy passed every check and task validation
    failed the problem ("a constant output ... passes")."""
    folder = _folder(tmp_path, "sort_py", SORT, "tests:\n  - {\"size\": 64, \"seed\": 4242}\n"
                     "  - {\"size\": 100, \"seed\": 5236}\nbenchmarks: []\n", {
                         "copy.py": "def custom_kernel(data):\n    x, out = data\n"
                                    "    out[...] = x\n    return out\n",
                         "sort.py": "import torch\n\ndef custom_kernel(data):\n    x, out = data\n"
                                    "    out[...] = torch.sort(x)[0]\n    return out\n"})
    code, out, data = run_pytest([*ON_CPU, str(folder), "-k", "check or validate"], tmp_path)
    assert code == 1, out
    outcomes = {key: outcome for key, (outcome, _) in case_reasons(data).items()}
    assert outcomes == {("copy", "size64-s4242"): "failed", ("copy", "size100-s5236"): "failed",
                        ("sort", "size64-s4242"): "passed", ("sort", "size100-s5236"): "passed"}
    assert "PASSED sort_py/task.yml::task::validate" in out, out


def _other_interface(root: Path) -> Path:
    """princeton/cross_entropy_py's pattern: its own eval.py calls other entry points."""
    return _folder(root, "two_entries_py", (
        "def generate_inputs(batch_size, vocab_size, seed=42):\n    return None\n\n"
        "def reference_forward(logits, targets):\n    return None\n"),
        "tests:\n  - {\"vocab_size\": 32}\nbenchmarks: []\n",
        submission="def cross_entropy_forward(logits, targets):\n    return None\n")


def test_what_the_harness_cannot_drive_is_one_skip_each(pytester: pytest.Pytester) -> None:
    _other_interface(pytester.path)
    _folder(pytester.path, "needs_module_py", "import not_installed_here\n" + MATCH,
            "tests:\n  - {\"n\": 1, \"seed\": 1}\n")
    _folder(pytester.path, "no_candidate_py", "def generate_input(n, seed):\n"
            "    return torch.ones(n)\n\n" + MATCH, "tests:\n  - {\"n\": 1, \"seed\": 1}\n")
    runs = _folder(pytester.path, "runs_py", "def generate_input(n, seed):\n"
                   "    return torch.ones(n)\n\n" + MATCH.replace("ref_kernel(data)", "data"),
                   "tests:\n  - {\"n\": 1, \"seed\": 1}\n"
                   "benchmarks:\n  - {\"n\": 2, \"seed\": 1}\n",
                   submission="def custom_kernel(data):\n    return data.clone()\n")
    result = pytester.runpytest_subprocess(*ON_CPU, "-rs", "-v", "--ks-bench-budget", "0.05")
    # The folder that can run does, beside one skip per folder that cannot; without a
    # ref_kernel there is no reference to time, the check alone judges, and nothing to shape
    # a trivial output by: its task::validate item skips, saying so.
    result.assert_outcomes(passed=2, skipped=4)
    result.stdout.fnmatch_lines_random([
        "*two_entries_py/reference.py: defines no generate_input, check_implementation (it "
        "defines generate_inputs, reference_forward): its eval drives another interface than "
        "the one pytest-kscientist runs (generate_input(**case) -> data, custom_kernel(data) "
        "-> output, check_implementation(data, output))",
        "*needs_module_py/reference.py: importing it needs the module 'not_installed_here', "
        "which is not installed here*install it, or run where it is",
        "*task 'no_candidate_py': no candidate: * has neither solutions/correct/*.py nor "
        "submission.py, and no --kernel was given; pass --kernel PATH",
        "*task 'runs_py': not checked: the problem defines no ref_kernel, so there is no "
        "reference output to compare seeds or to shape a trivial output",
    ])
    assert f"{runs.name}/task.yml::submission::bench[n2-s1] PASSED" in result.stdout.str()
    assert f"{runs.name}/task.yml::reference" not in result.stdout.str()


def test_case_ids_name_the_keys_each_case_has(tmp_path: Path) -> None:
    task = gpumode.load_problem(_ragged(tmp_path) / "task.yml")
    assert task.spec.case_keys == ["n", "seed", "case"]
    assert [task.case_id(c) for c in task.profile("full").tests] == ["n8-s1", "n8-s2-casepositive"]
    grouped = gpumode.load_problem(_grouped(tmp_path) / "task.yml")
    assert [grouped.case_id(c) for c in grouped.profile("full").tests] == [
        "m2_3-g2-s5", "m4_1_2-g3-s6"]


def test_two_folders_of_one_name_keep_a_record_each(tmp_path: Path) -> None:
    """GPU MODE's pmpp and pmpp_v2 hold folders of the same names: run together, the two tasks
    were one record in the summary and --ks-json, the second folder's path on both, one
    validation line, and the checks of both counted as one candidate's."""
    double = "import torch\n\ndef ref_kernel(data):\n    return data * 2\n\n"
    cases = "tests:\n  - {\"size\": 16, \"seed\": 3}\nbenchmarks: []\n"
    draw = ("def generate_input(size, seed):\n"
            "    return torch.randn(size, generator=torch.Generator().manual_seed(seed))\n\n")
    first = _folder(tmp_path / "pmpp", "twice_py", draw + double + MATCH, cases)
    second = _folder(tmp_path / "pmpp_v2", "twice_py",
                     draw + double.replace("* 2", "* 3") + MATCH, cases)
    (tmp_path / "k.py").write_text("def custom_kernel(data):\n    return data * 2\n")
    code, out, data = run_pytest([*ON_CPU, str(first), str(second), "--kernel", "k.py"], tmp_path)
    assert code == 1, out  # right for the first, wrong for the second
    assert [(run["task"], run["task_path"]) for run in data] == [
        ("twice_py", str(first)), ("pmpp_v2/twice_py", str(second))], data
    assert [case_reasons(run)[("k", "size16-s3")][0] for run in data] == ["passed", "failed"]


def test_an_output_of_another_dtype_that_its_own_check_accepts_is_warned_of(
        pytester: pytest.Pytester) -> None:
    """GPU MODE's check is the judge (allclose ignores dtype), so the harness passes it as
    GPU MODE would, and says once per candidate that the output is of another kind than the
    reference's: its times are of other work."""
    folder = _folder(pytester.path, "double_py", (
        "def generate_input(size, seed):\n"
        "    gen = torch.Generator().manual_seed(seed)\n"
        "    return torch.randn(size, generator=gen, dtype=torch.float16)\n\n"
        "def ref_kernel(data):\n    return data * 2\n\n"
        "def check_implementation(data, output):\n"  # values only, as some problems' checks
        "    ok = torch.allclose(output.float(), ref_kernel(data).float(), atol=1e-3)\n"
        "    return ok, '' if ok else 'mismatch'\n"),
        "tests:\n  - {\"size\": 16, \"seed\": 1}\n  - {\"size\": 8, \"seed\": 2}\n"
        "benchmarks: []\n",
        {"wide.py": "def custom_kernel(data):\n    return data.float() * 2\n",
         "same.py": "def custom_kernel(data):\n    return data * 2\n"})
    result = pytester.runpytest(str(folder), "-p", "no:cacheprovider", "-k", "check")
    result.assert_outcomes(passed=4)
    text = result.stdout.str()
    assert text.count("KsUnlikeOutput") == 1, text
    result.stdout.fnmatch_lines([
        "*KsUnlikeOutput: wide size16-s1: output is (16,) torch.float32 where the reference's "
        "is (16,) torch.float16; the problem's own check accepts it, as GPU MODE's would*"])
    assert "KsUnlikeOutput: same" not in text
    # Shown at the candidate's entry point, not at the folder's task.yml:1.
    result.stdout.fnmatch_lines(["*wide.py:1: KsUnlikeOutput*"])
    assert "task.yml:1" not in text


def test_a_seedless_case_seeds_numpy_as_gpu_modes_set_seed(tmp_path: Path) -> None:
    """GPU MODE's utils.set_seed seeds numpy too: a seedless problem drawing with numpy gave
    the worker other inputs than the pytest process, and every correct candidate failed."""
    folder = _folder(tmp_path, "np_py", (
        "import numpy as np\n\n"
        "def generate_input(size):\n    return torch.from_numpy(np.random.randn(size))\n\n"
        "def ref_kernel(data):\n    return data * 2\n\n" + MATCH),
        "tests:\n  - {\"size\": 16}\nbenchmarks: []\n",
        {"double.py": "def custom_kernel(data):\n    return data * 2\n"})
    code, out, data = run_pytest([*ON_CPU, str(folder), "-k", "check or validate"], tmp_path)
    assert code == 0, out
    assert case_reasons(data[0] if isinstance(data, list) else data)[("double", "size16")] == (
        "passed", ""), out


def test_a_case_key_that_generate_input_does_not_take_is_a_task_error(
        pytester: pytest.Pytester) -> None:
    """A typo in task.yml's case (``sise``) failed every candidate with a TypeError of its own;
    task::validate now names the case and the parameters, whichever case has it."""
    folder = _folder(pytester.path, "typo_py", (
        "def generate_input(size, seed):\n"
        "    gen = torch.Generator().manual_seed(seed)\n"
        "    return torch.randn(size, generator=gen)\n\n"
        "def ref_kernel(data):\n    return data * 2\n\n" + MATCH),
        "tests:\n  - {\"size\": 16, \"seed\": 1}\nbenchmarks:\n  - {\"sise\": 32, \"seed\": 2}\n",
        {"double.py": "def custom_kernel(data):\n    return data * 2\n"})
    result = pytester.runpytest(str(folder), "-p", "no:cacheprovider", "-k", "validate",
                                "--ks-profile", "full")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "task 'typo_py': generate_input(size, seed) cannot take case s2-sise32 (missing a "
        "required argument: 'size'); fix the case's keys or generate_input's "
        "parameters"])


# A problem's draw of n seeded values, and a folder's one test case (the tests below).
SEEDED_DRAW = ("def generate_input(n, seed):\n"
               "    return torch.randn(n, generator=torch.Generator().manual_seed(seed))\n\n")
ONE_CASE = "tests:\n  - {\"n\": 100, \"seed\": 1}\nbenchmarks: []\n"


def test_a_check_raising_in_the_problems_own_code_is_the_tasks_fault(tmp_path: Path) -> None:
    """check_implementation calling the problem's ref_kernel, which raised on a case: the
    candidate was failed with a wrong result; and a check raising on a dict output crashed
    validation with the harness's AttributeError."""
    raising = _folder(tmp_path, "refraise_py", (
        SEEDED_DRAW +
        "def ref_kernel(data):\n    if data.numel() == 64:\n"
        "        raise ValueError('ref does not support 64')\n    return data * 2\n\n" + MATCH),
        "tests:\n  - {\"n\": 100, \"seed\": 1}\n  - {\"n\": 64, \"seed\": 2}\nbenchmarks: []\n",
        submission="def custom_kernel(data):\n    return data * 2\n")
    code, out, data = run_pytest([*ON_CPU, str(raising), "-k", "check"], tmp_path)
    assert code == 1, out
    reasons = case_reasons(data)
    assert reasons[("submission", "n100-s1")] == ("passed", ""), reasons
    outcome, reason = reasons[("submission", "n64-s2")]
    assert outcome == "failed" and reason.startswith(
        "the task's reference raised ValueError: ref does not support 64 (at "), reason
    assert "wrong result" not in reason, reason


def _validated(root: Path, name: str, reference: str) -> tuple[int, str]:
    """A one-case folder of SEEDED_DRAW and ``reference`` (its ref_kernel and check), with a
    doubling submission; its task::validate item run: (exit code, output)."""
    folder = _folder(root, name, SEEDED_DRAW + reference, ONE_CASE,
                     submission="def custom_kernel(data):\n    return data * 2\n")
    code, out, _ = run_pytest([*ON_CPU, str(folder), "-k", "validate"], root)
    return code, out


def test_a_check_answering_a_bare_true_is_named_not_blamed_on_the_seed(tmp_path: Path) -> None:
    """GPU MODE's eval reads a truthy answer as the failure's message; validation said the
    problem's generate_input did not follow its seed."""
    code, out = _validated(tmp_path, "booltrue_py", (
        "def ref_kernel(data):\n    return data * 2\n\n"
        "def check_implementation(data, output):\n"
        "    return torch.allclose(output, ref_kernel(data))\n"))
    assert code == 1, out
    assert "check_implementation rejects the reference's own output on case n100-s1 (wrong " \
        "result: True), so every right kernel fails" in out, out
    assert "does not follow the seed" not in out, out


def test_a_named_tuple_output_keeps_its_names_for_the_problems_check(tmp_path: Path) -> None:
    """torch.topk's values and indices arrived as a plain tuple: the problem's own check read
    output.values and every right kernel failed, the reference node too."""
    folder = _folder(tmp_path, "topk_py", (
        "def generate_input(n, k, seed):\n"
        "    return torch.randn(8, n, generator=torch.Generator().manual_seed(seed)), k\n\n"
        "def ref_kernel(data):\n    x, k = data\n    return torch.topk(x, k)\n\n"
        "def check_implementation(data, output):\n    r = ref_kernel(data)\n"
        "    ok = torch.equal(output.values, r.values) and torch.equal(output.indices, r.indices)\n"
        "    return ok, '' if ok else 'mismatch'\n"),
        "tests:\n  - {\"n\": 100, \"k\": 5, \"seed\": 1}\n"
        "benchmarks:\n  - {\"n\": 64, \"k\": 3, \"seed\": 3}\n",
        {"topk.py": "import torch\n\ndef custom_kernel(data):\n    return torch.topk(*data)\n",
         "mine.py": "import collections\nimport torch\n\nOut = collections.namedtuple('Out', "
                    "'values indices')\n\ndef custom_kernel(data):\n"
                    "    v, i = torch.topk(*data)\n    return Out(v, i)\n",
         "swapped.py": "import collections\nimport torch\n\nOut = collections.namedtuple('Out', "
                       "'indices values')\n\ndef custom_kernel(data):\n"
                       "    v, i = torch.topk(*data)\n    return Out(v, i)\n"})
    code, out, data = run_pytest([*ON_CPU, str(folder), "--ks-bench-budget", "0.05"], tmp_path)
    assert code == 1, out
    reasons = case_reasons(data)
    for name in ("topk", "mine", "reference"):
        found = [outcome for (who, _), (outcome, _) in reasons.items() if who == name]
        assert found and set(found) == {"passed"}, (name, reasons)
    assert reasons[("swapped", "n100-k5-s1")][0] == "failed", reasons


@pytest.mark.parametrize(("name", "reference", "said"), [
    # the check raised on validation's all-zeros output and its message read each part's
    # shape: the int crashed it (AttributeError, a traceback)
    ("intpart_py", "def ref_kernel(data):\n    return (data * 2, 100)\n\n"
     "def check_implementation(data, output):\n"
     "    if not output[0].any():\n        raise ValueError('degenerate output')\n"
     "    return bool((output[0] - data * 2).abs().max() < 1e-5), 'differs'\n",
     "the reference returns builtins.int inside its output on case n100-s1"),
    ("dictout_py", "def ref_kernel(data):\n    return {'y': data * 2}\n\n"
     "def check_implementation(data, output):\n"
     "    return bool((output['y'] - data * 2).abs().max() < 1e-5), 'differs'\n",
     "the reference returns builtins.dict on case n100-s1"),
])
def test_an_output_the_harness_cannot_hand_over_fails_validation_once(
        tmp_path: Path, name: str, reference: str, said: str) -> None:
    """Validation passed, then every kernel failed as its own fault ("returned builtins.dict"),
    the reference's benchmarks too."""
    code, out = _validated(tmp_path, name, reference)
    assert code == 1 and "Traceback" not in out, out
    assert f"{said}: the harness hands over and judges outputs that are a tensor or a tuple or " \
        "list of tensors" in out, out


@pytest.mark.gpu
def test_a_problem_drawn_on_the_cpu_timed_on_a_gpu_fails_its_bench_and_says_why(
        tmp_path: Path) -> None:
    """Its kernel computes on the host, which the GPU's events (behind their lead) do not see:
    the bench read 0.0 us and the session crashed at its end on a geomean of zero (INTERNALERROR,
    every result lost; seen on an H100). Now the bench fails and names the fix."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA or ROCm device")
    _folder(tmp_path, "host_py", "def generate_input(n, seed):\n    return torch.ones(n)\n\n"
            "def ref_kernel(data):\n    return data.clone()\n\n" + MATCH,
            "tests:\n  - {\"n\": 1, \"seed\": 1}\nbenchmarks:\n  - {\"n\": 2, \"seed\": 1}\n",
            submission="def custom_kernel(data):\n    return data.clone()\n")
    code, out, data = run_pytest([str(tmp_path / "host_py"), "-k", "bench",
                                  "--ks-bench-budget", "0.05"], tmp_path)
    assert code == 1 and data is not None, out
    outcome, reason = case_reasons(data)[("submission", "n2-s1")]
    assert outcome == "failed" and reason.startswith("impossible time: median "), reason
    assert "is timed with --ks-device cpu" in reason, reason
