"""Bad task specs are collection errors that name the file and the field."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers import AXPY

from pytest_kscientist.errors import TaskSpecError
from pytest_kscientist.formats.task import load_task


def _spec(dir_: Path, edit) -> Path:
    import shutil

    shutil.copytree(AXPY, dir_ / "axpy")
    spec = dir_ / "axpy" / "task.toml"
    spec.write_text(edit(spec.read_text()))
    return spec


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t.replace('name = "axpy"\n', ""), "field 'name': Field required"),
        (lambda t: t.replace("atol = 1e-6", 'atol = "tiny"'),
         "field 'check.atol': Input should be a valid number"),
        (lambda t: t.replace("n = 33, seed = 2", "n = 33"),
         "profiles.full.tests[1] has keys ['n'], expected exactly case_keys ['n', 'seed']"),
        (lambda t: t.replace("[profiles.full]", "[profiles.gpu]"),
         "needs a [profiles.full] table"),
        (lambda t: "bogus = 1\n" + t, "field 'bogus': Extra inputs are not permitted"),
        (lambda t: t.replace('name = "axpy"', 'name = "axpy'), "not valid TOML"),
        (lambda t: t.replace("case_keys", 'reference = "ref.py"\ncase_keys'),
         "field 'reference' names 'ref.py', which does not exist"),
    ],
)
def test_bad_spec_message(tmp_path: Path, edit, message: str) -> None:
    spec = _spec(tmp_path, edit)
    with pytest.raises(TaskSpecError) as err:
        load_task(spec.parent)
    assert str(err.value).startswith(str(spec))
    assert message in str(err.value)
    # a check of the whole spec: its values not shown (axpy's description)
    assert "float32 vectors" not in str(err.value)


@pytest.mark.parametrize(("edit", "message"), [
    (lambda t: t.replace("def generate_input", "def make_input"),
     "reference.py defines no generate_input; the reference of "),
    (lambda t: t.replace("def generate_input", "def make_input").replace(
        "def ref_kernel", "def reference"), "defines no generate_input or ref_kernel"),
    (lambda t: t + "\ndef broken(:\n", "reference.py: not valid Python (line "),
])
def test_a_reference_that_cannot_serve_is_a_collection_error(tmp_path: Path, edit,
                                                             message: str) -> None:
    """Found in the reference's source at collection, without importing it: otherwise every
    candidate failed to load, each with the worker's traceback."""
    spec = _spec(tmp_path, lambda t: t)
    reference = spec.parent / "reference.py"
    reference.write_text(edit(reference.read_text()))
    with pytest.raises(TaskSpecError, match=re.escape(message)):
        load_task(spec.parent)


def test_a_reference_bound_otherwise_is_left_to_its_import(tmp_path: Path) -> None:
    spec = _spec(tmp_path, lambda t: t)
    reference = spec.parent / "reference.py"
    text = reference.read_text().replace("def generate_input", "def _draw")
    reference.write_text(text + "\ngenerate_input = _draw\n")
    load_task(spec.parent)
    reference.write_text(text.replace("import torch", "import torch\nfrom helpers import *"))
    load_task(spec.parent)  # a star import may bring it


def test_bad_spec_is_a_collection_error(pytester: pytest.Pytester) -> None:
    spec = _spec(pytester.path, lambda t: t.replace("peak_tbps = 10.0", "peak_tbps = -1"))
    result = pytester.runpytest(str(spec.parent))
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines([
        f"*{spec}: invalid task spec (1 error(s)):*",
        "*field 'floor[[]0[]].peak_tbps': Input should be greater than 0, found -1*",
    ])
    assert "Traceback" not in result.stdout.str()


def test_task_without_candidates(pytester: pytest.Pytester) -> None:
    spec = _spec(pytester.path, lambda t: t)
    for seed in (spec.parent / "seeds").glob("*.py"):
        seed.unlink()
    result = pytester.runpytest(str(spec.parent))
    result.stdout.fnmatch_lines(["*task 'axpy': no candidates:*no --kernel was given*"])


def test_fp8_gemm_spec_matches_the_challenge() -> None:
    task = load_task(Path(__file__).parent.parent / "tasks" / "fp8_gemm")
    full = task.profile("full")
    assert len(full.tests) == 11 and len(full.benchmarks) == 18
    assert {c["m"] for c in full.benchmarks} == {1024, 6144}
    assert {(c["n"], c["k"]) for c in full.benchmarks if c["m"] == 1024} == {
        (c["n"], c["k"]) for c in full.benchmarks if c["m"] == 6144
    }
    assert task.floor_for("NVIDIA H200").peak_tbps == 4.8
