"""Verdicts on outputs and inputs off the common path: wrapping integers, empty outputs,
structured inputs on the re-run, a reference that raises (found by trying tasks nobody here
wrote, 2026-12-05)."""

from __future__ import annotations

import textwrap
import warnings
from pathlib import Path

import pytest
import torch
from helpers import run_pytest

from pytest_kscientist.harness.correctness import compare

SPEC = """\
name = "{name}"
description = "an edge of the verdicts"
case_keys = ["n", "seed"]

[check]
atol = {atol}
rtol = {rtol}

[bench]
warmup = 1
min_runs = 3
max_runs = 10
budget_s = 0.05

[profiles.full]
tests = {tests}
benchmarks = [{{ n = 16, seed = 3 }}]

[profiles.cpu]
tests = {tests}
benchmarks = [{{ n = 16, seed = 3 }}]
"""


def _task(root: Path, name: str, draw: str, ref: str, kernels: dict[str, str],
          tests: str = "[{ n = 16, seed = 1 }, { n = 8, seed = 2 }]",
          atol: float = 1e-6, rtol: float = 1e-6, output_index: int | None = None) -> Path:
    folder = root / name
    folder.mkdir()
    spec = SPEC.format(name=name, atol=atol, rtol=rtol, tests=tests)
    if output_index is not None:
        spec = spec.replace("case_keys", f"output_index = {output_index}\ncase_keys")
    (folder / "task.toml").write_text(spec)
    (folder / "reference.py").write_text(
        "import torch\n\n\ndef generate_input(n, seed, device='cpu'):\n"
        "    g = torch.Generator(device=device)\n    g.manual_seed(seed)\n"
        + textwrap.indent(textwrap.dedent(draw), "    ")
        + "\n\ndef ref_kernel(data):\n" + textwrap.indent(textwrap.dedent(ref), "    "))
    for stem, body in kernels.items():
        (root / f"{stem}.py").write_text(
            "import torch\n\n_C = {}\n\n\ndef custom_kernel(data):\n"
            + textwrap.indent(textwrap.dedent(body), "    "))
    return folder


def _checks(root: Path, task: Path, kernels: list[str],
            select: str = "check") -> tuple[int, str, dict[str, list]]:
    args = [str(task), "--ks-device", "cpu", "-k", select]
    for k in kernels:
        args += ["--kernel", str(root / f"{k}.py")]
    code, output, data = run_pytest(args, cwd=root, timeout=300)
    assert data is not None, output
    outcomes = {c["name"]: [(case["outcome"], case["reason"]) for case in c["cases"]]
                for c in data["candidates"]}
    return code, output, outcomes


def test_integer_outputs_are_judged_without_wrapping() -> None:
    """int64 arithmetic wraps: 3 and 3 - 2**63 read 2**63 apart, which int64 takes for -2**63,
    "close"; |-2**63| is negative there too; uint64's upper half wraps in int64."""
    x = torch.arange(64, dtype=torch.int64)
    assert compare(x * 3 - 2**63, x * 3, 0.0, 1e-6) is not None  # passed before
    r = x.clone()
    r[:16] = -2**63
    assert compare(r.clone(), r, 0.0, 1e-6) is None  # failed before: 16 of 64 elements
    u = (x * 4 + 3).view(torch.uint64)
    assert compare(((x * 4 + 3) ^ -2**63).view(torch.uint64), u, 0.0, 0.0) is not None
    assert compare(u.clone(), u, 0.0, 0.0) is None
    big = torch.tensor([2**60, 5])
    assert compare(big + 1, big, 0.0, 0.0) is not None  # as float64 one value
    assert compare(big + torch.tensor([1, 0]), big, 0.0, 1e-6) is None  # within 1e-6 of 2**60


def test_right_kernels_pass_the_rerun_on_structured_inputs(tmp_path: Path) -> None:
    """The re-run used to change one element of each float input: a symmetric positive
    definite matrix lost its structure, and the reference's own code failed (at random: the
    element was drawn from the system's randomness). It now draws the case again with another
    seed into the same tensors; a cache by shape is still caught, integer inputs now too."""
    chol = _task(tmp_path, "chol", """\
        a = torch.randn(n, n, generator=g, device=device, dtype=torch.float64)
        return (a @ a.T + n * torch.eye(n, device=device, dtype=torch.float64),)
        """, "return torch.linalg.cholesky(data[0])\n", {
        "as_reference": "return torch.linalg.cholesky(data[0])\n",
        "upper": "return torch.linalg.cholesky(data[0], upper=True).mT\n",
        "checked_ex": "return torch.linalg.cholesky_ex(data[0]).L\n",
    }, atol=1e-8, rtol=1e-8)
    code, output, outcomes = _checks(tmp_path, chol, ["as_reference", "upper", "checked_ex"])
    assert code == 0, output
    ints = _task(tmp_path, "ints", "return (torch.randint(-100, 100, (n,), generator=g),)\n",
                 "return data[0] * 3\n", {
                     "by_shape": """\
                         x = data[0]
                         if x.shape not in _C:
                             _C[x.shape] = x * 3
                         return _C[x.shape].clone()
                         """,
                     "honest": "return data[0] * 3\n"}, atol=0.0, rtol=0.0)
    code, output, outcomes = _checks(tmp_path, ints, ["by_shape", "honest"])
    assert code == 1, output
    assert all(o == "passed" for o, _ in outcomes["honest"])
    failed = [reason for o, reason in outcomes["by_shape"] if o == "failed"]
    assert len(failed) == 2 and all("drawn again" in r and "cached" in r for r in failed), failed


def test_an_empty_output_shares_no_memory(tmp_path: Path) -> None:
    """Empty tensors have no storage: every two of them used to overlap [0, 1)."""
    task = _task(tmp_path, "empty", """\
        return (torch.randn(n, generator=g), torch.randn(n, generator=g))
        """, "return 2 * data[0] + data[1]\n", {"honest": "return 2 * data[0] + data[1]\n"},
        tests="[{ n = 64, seed = 1 }, { n = 0, seed = 2 }]")
    code, output, outcomes = _checks(tmp_path, task, ["honest"])
    assert code == 0 and [o for o, _ in outcomes["honest"]] == ["passed", "passed"], output


def test_a_reference_that_raises_is_named_not_a_traceback(tmp_path: Path) -> None:
    task = _task(tmp_path, "picky", "return (torch.randn(n, generator=g),)\n", """\
        if data[0].numel() == 8:
            raise ValueError("eight elements are not supported")
        return data[0] * 2
        """, {"honest": "return data[0] * 2\n"})
    code, output, outcomes = _checks(tmp_path, task, ["honest"])
    assert code == 1, output
    assert [o for o, _ in outcomes["honest"]] == ["passed", "failed"], outcomes
    assert "the task's reference raised ValueError: eight elements are not supported (at " in \
        output and "reference.py:12)" in output, output  # the line of its raise
    assert "Traceback" not in output and "INTERNALERROR" not in output, output


@pytest.mark.parametrize("ref", ["return data[0].sum().item()\n",
                                 "return {'a': data[0]}\n"])
def test_a_reference_returning_no_tensor_is_named(tmp_path: Path, ref: str) -> None:
    task = _task(tmp_path, "untensored", "return (torch.randn(n, generator=g),)\n", ref,
                 {"honest": "return data[0] * 2\n"})
    code, output, _ = _checks(tmp_path, task, ["honest"], "check or validate")
    assert code == 1 and "AttributeError" not in output, output
    assert "honest check n16-s1: the task's reference returned a " in output, output
    assert "task 'untensored': the task's reference returned a " in output, output


def test_a_reference_that_reads_the_preallocated_output_fails_validation(tmp_path: Path) -> None:
    """Each candidate gets the output tensor filled with NaN: a reference computing from it
    (output_index naming an input) judges every candidate against numbers none can compute."""
    task = _task(tmp_path, "reads_out", "return (torch.randn(n, generator=g),)\n",
                 "return data[0] * 2\n", {"honest": "data[0].mul_(2)\nreturn data[0]\n"},
                 output_index=0)
    code, output, _ = _checks(tmp_path, task, ["honest"], "validate")
    assert code == 1, output
    assert ("task 'reads_out': the reference's output depends on what generate_input's "
            "output tensor (output_index = 0) holds before the call: with that tensor filled "
            "with NaN") in output, output


def test_validations_constant_output_of_a_complex_reference_keeps_both_parts() -> None:
    from pytest_kscientist.harness.task_validation import _filled

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the real part alone warned
        filled = _filled(torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64), "mean")
    assert filled.dtype == torch.complex64 and filled.tolist() == [2 + 0.5j, 2 + 0.5j]


def test_a_reference_that_raises_on_a_benchmark_is_named_once_for_every_kernel(
        tmp_path: Path) -> None:
    """The benchmark's verified outputs meet the reference too: its error fails each member's
    bench item as the task's fault, from one set of rounds, and is in --ks-json."""
    task = _task(tmp_path, "picky_timing", "return (torch.randn(n, generator=g),)\n", """\
        if data[0].numel() == 16:
            raise ValueError("sixteen elements are not supported")
        return data[0] * 2
        """, {"one": "return data[0] * 2\n", "two": "return data[0] * 2\n"},
        tests="[{ n = 8, seed = 1 }]")
    code, output, outcomes = _checks(tmp_path, task, ["one", "two"], "bench")
    assert code == 1, output
    for name in ("one", "two"):
        assert outcomes[name] == [("failed", outcomes[name][0][1])], outcomes
        assert "the task's reference raised ValueError: sixteen elements" in \
            outcomes[name][0][1], outcomes
    assert "Traceback" not in output and "INTERNALERROR" not in output, output


def test_a_reference_that_raises_on_a_drawn_case_stops_the_search(tmp_path: Path) -> None:
    """Hypothesis shrank the task's error as if it were the candidate's, calling the kernel
    again each time, and the item published nothing: now it stops at once and says so."""
    task = _task(tmp_path, "picky_space", "return (torch.randn(n, generator=g),)\n", """\
        if data[0].numel() > 100:
            raise ValueError("over a hundred elements are not supported")
        return data[0] * 2
        """, {"honest": "return data[0] * 2\n"}, tests="[{ n = 16, seed = 1 }]")
    spec = task / "task.toml"
    spec.write_text(spec.read_text() + "\n[profiles.cpu.space]\nexamples = 10\n"
                    "n = { min = 101, max = 4096 }\n")
    code, output, outcomes = _checks(tmp_path, task, ["honest"], "drawn")
    assert code == 1, output
    [(outcome, reason)] = outcomes["honest"]
    assert outcome == "failed" and reason.startswith("at n=") and (
        "the task's reference raised ValueError: over a hundred" in reason), outcomes
    assert "shrunk" not in reason and "Traceback" not in output, output


@pytest.mark.parametrize(("old", "new", "field"), [
    ("atol = 1e-06", "atol = true", "check.atol"),
    ("atol = 1e-06", 'atol = "1e-6"', "check.atol"),
    ("warmup = 1", 'warmup = "3"', "bench.warmup")])
def test_a_spec_value_of_the_wrong_type_is_refused(tmp_path: Path, old: str, new: str,
                                                   field: str) -> None:
    """`atol = true` was read as 1.0 (a kernel off by 0.9 passed), strings as numbers."""
    from pytest_kscientist.errors import TaskSpecError
    from pytest_kscientist.formats.task import load_task

    task = _task(tmp_path, "typed", "return (torch.randn(n, generator=g),)\n",
                 "return data[0] * 2\n", {})
    spec = task / "task.toml"
    assert old in spec.read_text()
    spec.write_text(spec.read_text().replace(old, new, 1))
    with pytest.raises(TaskSpecError, match=rf"field '{field}'"):
        load_task(task)


def test_a_work_function_that_cannot_give_a_floor_fails_validation(tmp_path: Path) -> None:
    """None, a negative, a misspelled or a NaN count: a traceback in every benchmark or a floor
    of nothing before. One session for the four tasks."""
    works = ["None", "{'flops': -1.0}", "{'flop': 2.0 * n}", "{'flops': float('nan')}"]
    tasks = []
    for i, work in enumerate(works):
        task = _task(tmp_path, f"floored{i}", "return (torch.randn(n, generator=g),)\n",
                     "return data[0] * 2\n", {"honest": "return data[0] * 2\n"})
        ref = task / "reference.py"
        ref.write_text(ref.read_text() + f"\n\ndef work(n, seed):\n    return {work}\n")
        tasks.append(str(task))
    code, output, _ = run_pytest([*tasks, "--ks-device", "cpu", "-k", "validate", "--kernel",
                                  str(tmp_path / "honest.py")], cwd=tmp_path, timeout=300)
    assert code == 1 and "Traceback" not in output, output
    for i in range(len(works)):
        assert (f"task 'floored{i}': the task's work(n=16, seed=1) returned" in output
                and "expected a dict of non-negative finite 'flops' and/or 'bytes'" in output
                ), output


def test_a_case_listed_twice_is_refused(tmp_path: Path) -> None:
    """Both ran under one node id (check[n16-s1] twice in --co)."""
    from pytest_kscientist.errors import TaskSpecError
    from pytest_kscientist.formats.task import load_task

    task = _task(tmp_path, "twice", "return (torch.randn(n, generator=g),)\n",
                 "return data[0] * 2\n", {},
                 tests="[{ n = 16, seed = 1 }, { n = 8, seed = 2 }, { n = 16, seed = 1 }]")
    with pytest.raises(TaskSpecError, match=r"tests\[2\] repeats \[0\] \(case n16-s1\)"):
        load_task(task)


def test_writing_into_an_input_hints_at_output_index_when_the_task_sets_none(
        tmp_path: Path) -> None:
    task = _task(tmp_path, "no_index", """\
        return (torch.randn(n, generator=g), torch.empty(n))
        """, "return data[0] * 2\n",
        {"into": "torch.mul(data[0], 2, out=data[1])\nreturn data[1]\n"})
    code, output, outcomes = _checks(tmp_path, task, ["into"])
    assert code == 1, output
    assert ("modified input 1 in place; inputs must be left unchanged (if input 1 is a "
            "preallocated output the kernel writes, the task's task.toml sets output_index = 1)"
            ) in output, output


def test_a_reference_that_changes_its_inputs_fails_validation(tmp_path: Path) -> None:
    """It passed validation; only the reference node's own benchmarks said "modified input"."""
    task = _task(tmp_path, "mutating", "return (torch.randn(n, generator=g),)\n",
                 "data[0].mul_(2)\nreturn data[0].clone()\n", {"honest": "return data[0] * 2\n"})
    code, output, _ = _checks(tmp_path, task, ["honest"], "validate")
    assert code == 1, output
    assert "task 'mutating': the reference changes input 0 of case n16-s1 in place" in output


def test_a_kernel_that_cannot_take_the_data_is_named_at_its_load(tmp_path: Path) -> None:
    """custom_kernel() and custom_kernel(data, scale) failed every item with Python's bare
    "takes 0 positional arguments but 1 was given"."""
    task = _task(tmp_path, "arity", "return (torch.randn(n, generator=g),)\n",
                 "return data[0] * 2\n", {"honest": "return data[0] * 2\n"})
    (tmp_path / "noarg.py").write_text("def custom_kernel():\n    return None\n")
    (tmp_path / "twoarg.py").write_text("def custom_kernel(data, scale):\n    return None\n")
    (tmp_path / "loose.py").write_text(
        "def custom_kernel(data, scale=2, *rest, **named):\n    return data[0] * scale\n")
    code, output, outcomes = _checks(tmp_path, task, ["noarg", "twoarg", "loose", "honest"])
    assert code == 1, output
    assert "noarg check n16-s1: failed to load: custom_kernel() cannot be called as " \
        "custom_kernel(data): too many positional arguments" in output, output
    assert "twoarg check n16-s1: failed to load: custom_kernel(data, scale) cannot be called " \
        "as custom_kernel(data): missing a required argument: 'scale'" in output, output
    assert "define def custom_kernel(data)" in output, output
    assert [o for o, _ in outcomes["loose"]] == ["passed", "passed"], outcomes
    assert [o for o, _ in outcomes["honest"]] == ["passed", "passed"], outcomes


def test_an_input_drawn_on_another_device_fails_validation(tmp_path: Path) -> None:
    """generate_input ignoring its device argument: the candidates would be judged and timed
    on inputs that live elsewhere (here a meta tensor, on a CPU run)."""
    task = _task(tmp_path, "elsewhere", """\
        return (torch.randn(n, generator=g), torch.empty(n, device="meta"))
        """, "return data[0] * 2\n", {"honest": "return data[0] * 2\n"})
    code, output, _ = _checks(tmp_path, task, ["honest"], "validate")
    assert code == 1, output
    assert "task 'elsewhere': generate_input put input 1 of case n16-s1 ((16,)) on meta, " \
        "expected cpu, the device it was asked for: create every tensor with device=device" \
        in output, output


def test_a_misspelled_spec_key_gets_the_closest_known_one(tmp_path: Path) -> None:
    from pytest_kscientist.errors import TaskSpecError
    from pytest_kscientist.formats.task import load_task

    task = _task(tmp_path, "typos", "return (torch.randn(n, generator=g),)\n",
                 "return data[0] * 2\n", {})
    spec = (task / "task.toml").read_text()
    (task / "task.toml").write_text(
        "outputindex = 0\n" + spec.replace("atol =", "atoll =").replace("budget_s", "budget")
        .replace("benchmarks = [{ n = 16, seed = 3 }]\n\n[profiles.cpu]",
                 "benchmarks = [{ n = 16, seed = 3 }]\nspce = 1\n\n[profiles.cpu]"))
    with pytest.raises(TaskSpecError) as err:
        load_task(task)
    text = str(err.value)
    assert "field 'check.atoll': Extra inputs are not permitted, found 1e-06; did you mean " \
        "'atol'? (known here: atol, rtol, rerun)" in text, text
    assert "field 'bench.budget': Extra inputs are not permitted, found 0.05; did you mean " \
        "'budget_s'?" in text, text
    assert "field 'outputindex': Extra inputs are not permitted, found 0; did you mean " \
        "'output_index'?" in text, text
    assert "field 'profiles.full.spce': Extra inputs are not permitted, found 1; did you mean " \
        "'space'? (known here: tests, benchmarks, space)" in text, text


def test_a_reference_faster_than_the_floor_blames_the_task(tmp_path: Path) -> None:
    """The reference below the physical floor was told "the timing was tampered with"."""
    task = _task(tmp_path, "low_peaks", "return (torch.randn(n, generator=g),)\n",
                 "return data[0] * 2\n", {"honest": "return data[0] * 2\n"})
    with open(task / "reference.py", "a") as f:
        f.write("\n\ndef work(n, seed):\n    return {'flops': 1e12 * n}\n")
    with open(task / "task.toml", "a") as f:
        f.write('\n[[floor]]\ndevice = "*"\npeak_tflops = 1.0\npeak_tbps = 1.0\n')
    code, output, outcomes = _checks(tmp_path, task, ["honest"], "bench")
    assert code == 1, output
    assert "reference bench n16-s3: the task's floor is wrong: the task's reference (the " \
        "task's own code) ran faster than physics allows: fastest call" in output, output
    assert "work() counts more flops or bytes than the case needs, or the [[floor]] peaks " \
        "for " in output, output
    assert [r for _, r in outcomes["honest"]][0].startswith("impossible time"), outcomes


def test_a_case_generate_input_cannot_draw_is_the_tasks_fault(tmp_path: Path) -> None:
    """The worker draws first: generate_input's error on a case read as the candidate's."""
    task = _task(tmp_path, "undrawable", """\
        if n in (8, 16):
            raise ValueError(f"n={n} not drawable")
        return (torch.randn(n, generator=g),)
        """, "return data[0] * 2\n", {"honest": "return data[0] * 2\n"},
        tests="[{ n = 4, seed = 1 }, { n = 8, seed = 2 }]")
    code, output, outcomes = _checks(tmp_path, task, ["honest"], "check or bench")
    assert code == 1, output
    assert outcomes["honest"][0] == ("passed", ""), outcomes
    for who, case in (("honest check", "n8-s2"), ("reference bench", "n16-s3")):
        assert f"{who} {case}: the task's generate_input raised ValueError: n=" in output, output
        assert f"not drawable (at {task / 'reference.py'}:8) drawing case {case}, so no " \
            "kernel was judged on it" in output, output
    assert "honest bench n16-s3: not timed: check n8-s2 could not be judged" in output, output


def test_an_output_that_requires_grad_is_judged(tmp_path: Path) -> None:
    """The worker's poison of a returned leaf that requires grad raised the harness's own
    RuntimeError, as the kernel's failure (the reference's too)."""
    task = _task(tmp_path, "leafgrad", "return (torch.randn(n, generator=g),)\n",
                 "return (data[0] * 2).requires_grad_()\n",
                 {"honest": "return (data[0] * 2).requires_grad_()\n",
                  "wrong": "return (data[0] * 3).requires_grad_()\n"})
    code, output, outcomes = _checks(tmp_path, task, ["honest", "wrong"], "check or bench")
    assert code == 1 and "leaf Variable" not in output, output
    assert [o for o, _ in outcomes["honest"]] == ["passed"] * 3, outcomes
    assert outcomes["wrong"][0][1].startswith("wrong result"), outcomes


@pytest.mark.parametrize(("ref", "said"), [
    ("return data[0][::2]\n", "the reference returned a tensor sharing memory with input 0 on "
                              "case n16-s1"),
    ("return data[0].sum(0, keepdim=True).expand(4)\n",
     "the reference returned an expanded tensor (stride 0, strides (0,)) on case n16-s1")])
def test_a_reference_returning_what_no_kernel_may_fails_validation(tmp_path: Path, ref: str,
                                                                   said: str) -> None:
    """It passed validation, then its own benchmarks failed with the candidate's message."""
    task = _task(tmp_path, "aliasing", "return (torch.randn(n, generator=g),)\n", ref, {})
    from pytest_kscientist.formats.task import load_task
    from pytest_kscientist.harness.task_validation import validate

    loaded = load_task(task)
    verdict = validate(loaded, loaded.profile("cpu").tests[0], "cpu")
    assert verdict.error.startswith(said), verdict.error
    assert "so the reference node's benchmarks fail on it; return a tensor of its own" in \
        verdict.error, verdict.error


def test_a_gpu_mode_problem_may_keep_some_inputs_off_the_runs_device() -> None:
    """GPU MODE's nvfp4 problems keep their reference scale factors on the CPU by design
    (``sfa_ref_cpu``), and their generate_input takes no device: validation refused every one
    on a GPU. It now needs one input on the run's device (here "meta" stands for the GPU)."""
    import torch

    from pytest_kscientist.harness.task_validation import _off_device

    on, cpu = torch.empty(4, device="meta"), torch.ones(4)
    assert _off_device((on, on, cpu, cpu, on), "meta", "m4", gpumode=True) == ""
    assert "input 2 of case m4" in _off_device((on, on, cpu), "meta", "m4")  # a native task
    found = _off_device((cpu, 3, cpu), "meta", "m4", gpumode=True)
    assert found == ("generate_input put every input of case m4 on cpu, none on meta, the run's "
                     "device: its kernels would be timed on a device their inputs are not on; "
                     "run it with --ks-device cpu"), found
