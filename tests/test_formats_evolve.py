"""``pytest --evolve`` on tasks from the ecosystem (issue 12): a GPU MODE problem folder and a
KernelBench problem file, evolved through the real Gemini client against the fake service, and
the offline scientist's stop when no seed declares knobs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from fake_llm_server import FakeLLMServer
from fake_scientist import ScientistResponder
from helpers import DATA, case_reasons, run_pytest

from pytest_kscientist.evolve.assemble import task_brief
from pytest_kscientist.evolve.llm import draft
from pytest_kscientist.evolve.seeding import DERIVED_DIR, rename, seeds_for
from pytest_kscientist.harness.collect import load_any

FORMATS = DATA / "formats"
GPUMODE = FORMATS / "gpumode" / "cpu"
RELU = FORMATS / "kernelbench" / "level1" / "2_ReLU.py"
KEY = "AIzaFAKE-formats-key-77777"


@pytest.fixture
def scientist(monkeypatch: pytest.MonkeyPatch):
    """The fake Gemini service playing every role, with a key only the fake accepts."""
    monkeypatch.delenv("GOOGLE_API_KEY", raising=False)
    monkeypatch.setenv("GEMINI_API_KEY", KEY)
    with FakeLLMServer(ScientistResponder()) as server:
        yield server


def evolve(pytester: pytest.Pytester, target: str, *flags: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "--evolve", "1", target,
                                         "--ks-candidates", "1", *flags, timeout=300)


def meta(population: Path, cid: str) -> dict:
    return json.loads((population / cid / "meta.json").read_text())


def results(population: Path, cid: str) -> dict:
    return json.loads((population / cid / "results.json").read_text())


def test_kernelbench_problem_evolves_from_its_own_model(
    pytester: pytest.Pytester, scientist: FakeLLMServer
) -> None:
    """No solution ships with a KernelBench problem: the seed is the problem with Model renamed
    ModelNew. The offline scientist has nothing to move in it (exit 4, said so); the LLM
    scientist then goes on from the same population and its candidate is evaluated."""
    shutil.copy(RELU, pytester.path / RELU.name)
    offline = evolve(pytester, RELU.name, "--ks-llm", "offline")
    assert offline.ret == 4, offline.stdout.str()
    offline.stdout.fnmatch_lines([
        "*2_ReLU | gen 0/1 | seed * c0001 is the reference itself: 2_ReLU.py with Model renamed "
        "ModelNew*",
        "*c0001 passed*",
        "stopped: the offline scientist has nothing to move in task '2_ReLU': its base c0001 "
        "declares no knobs (TUNABLES and TUNABLE_SPACE); evolve this task with the LLM scientist "
        "(--ks-llm gemini *",
    ])
    population = pytester.path / "population" / "2_ReLU"
    seed = meta(population, "c0001")
    assert (seed["origin"], seed["seed_file"]) == ("seed", "2_ReLU_reference.py")
    assert seed["explanation"].startswith("the reference itself")
    assert (population / DERIVED_DIR / "2_ReLU_reference.py").is_file()
    assert "class ModelNew(nn.Module)" in (population / "c0001" / "c0001.py").read_text()

    live = evolve(pytester, RELU.name, "--ks-llm", "gemini", "--ks-llm-base-url", scientist.url)
    assert live.ret == 0, live.stdout.str()
    live.stdout.fnmatch_lines(["*c0002 passed*", "*generation 1*"])
    assert [r.prompt.splitlines()[0] for r in scientist.requests] == [
        "# Stage 2: design experiments", "# Stage 3: write the kernel"]
    writer = scientist.requests[1].prompt
    assert "class Model(nn.Module):" in writer  # the problem itself is the reference shown
    assert "It defines\n  `class ModelNew(torch.nn.Module)` with Model's constructor" in writer
    assert "custom_kernel" not in writer
    child = results(population, "c0002")
    assert child["status"] == "passed" and child["geomean_us"] > 0
    assert meta(population, "c0002")["parents"] == ["c0001"]
    # The child session collected the problem file itself, with the candidate.
    logs = sorted((population / "sessions").glob("*.log"))
    assert f"{pytester.path / RELU.name} " in logs[-1].read_text().splitlines()[0]


def test_gpumode_folder_evolves_from_its_correct_solutions(
    pytester: pytest.Pytester, scientist: FakeLLMServer
) -> None:
    shutil.copytree(GPUMODE, pytester.path / "cpu")
    result = evolve(pytester, "cpu/scale_py", "--ks-llm", "gemini",  # it draws on the CPU
                    "--ks-llm-base-url", scientist.url, "--ks-device", "cpu")
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(["*1 new of 1 seed(s): c0001*", "*c0002 passed*",
                                 "*generation 1*"])
    population = pytester.path / "population" / "scale_py"
    assert meta(population, "c0001")["seed_file"] == "torch_ops.py"
    assert results(population, "c0002")["status"] == "passed"
    writer = scientist.requests[-1].prompt
    assert writer.startswith("# Stage 3")
    assert "Scale a float32 vector by 3 and add its square" in writer  # task.yml's description
    assert "def check_implementation(data, output):" in writer  # reference.py
    assert "# ---- task.py (the input and output types) ----" in writer
    assert "`custom_kernel(data)`: `data` is what the reference's `generate_input`" in writer


def test_evolve_accepts_a_task_file_and_refuses_what_no_format_claims(
    pytester: pytest.Pytester,
) -> None:
    (pytester.path / "notes").mkdir()
    (pytester.path / "notes" / "task.toml").write_text('[task]\nname = "build docs"\n')
    (pytester.path / "helper.py").write_text("def f():\n    return 1\n")
    for args in (["notes"], ["helper.py"], ["notes", "helper.py"]):
        result = pytester.runpytest("--evolve", "1", *args)
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        result.stderr.fnmatch_lines([
            "ERROR: --evolve expects exactly one task: a folder holding task.toml or a GPU MODE "
            "task.yml, or a KernelBench problem file (a .py defining Model, get_inputs and "
            f"get_init_inputs), got '{' '.join(args)}'; e.g. pytest --evolve 3 tasks/fp8_gemm"])
    # A problem that loads badly is named, as a task.toml's error is.
    (pytester.path / "broken").mkdir()
    (pytester.path / "broken" / "reference.py").write_text("x = 1\n")
    (pytester.path / "broken" / "task.yml").write_text(
        'files: []\nlang: "py"\ntests:\n  - {"size": 8}\n')
    result = pytester.runpytest("--evolve", "1", "broken/task.yml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --evolve broken/task.yml: *broken/reference.py: defines "
                                 "no generate_input, check_implementation*"])


def test_rename_touches_names_only() -> None:
    source = ('class Model(nn.Module):\n    """Model docstring."""\n'
              "    def __init__(self):\n        super(Model, self).__init__()  # Model\n"
              "ModelX = Model\n")
    assert rename(source, "Model", "ModelNew") == (
        'class ModelNew(nn.Module):\n    """Model docstring."""\n'
        "    def __init__(self):\n        super(ModelNew, self).__init__()  # Model\n"
        "ModelX = ModelNew\n")


def test_a_gpumode_folder_without_solutions_gets_its_reference_as_seed(tmp_path: Path) -> None:
    """The derived seed is a candidate the harness accepts as correct."""
    shutil.copytree(GPUMODE, tmp_path / "cpu")
    folder = tmp_path / "cpu" / "scale_py"
    shutil.rmtree(folder / "solutions")
    task = load_any(folder / "task.yml")
    seeds = seeds_for(task, tmp_path / "pop")
    assert [p.name for p in seeds.paths] == ["scale_py_reference.py"]
    assert "custom_kernel calling ref_kernel" in seeds.notes["scale_py_reference.py"]
    code, out, data = run_pytest([str(folder), "--kernel", str(seeds.paths[0]),
                                  "--ks-device", "cpu"], tmp_path)  # it draws on the CPU
    assert code == 0, out
    assert {outcome for outcome, _ in case_reasons(data).values()} == {"passed"}


def test_llm_draft_check_follows_the_tasks_entry() -> None:
    brief = task_brief(load_any(RELU), [])
    assert brief.entry == "ModelNew" and "class ModelNew" in brief.contract
    known = draft.KnownSources()
    assert draft.check("def custom_kernel(data):\n    return data\n", known, brief.entry) == (
        "the file does not define class ModelNew at module level")
    assert draft.check("class ModelNew:\n    pass\n", known, brief.entry) == ""
    source, _, problem = draft.extract(
        "## Explanation\nx\n\n```python\nimport torch\n```\n\n```python\nclass ModelNew:\n"
        "    pass\n```\n```python\nx = 1\n```\n", entry="ModelNew")
    assert problem == "" and source == "class ModelNew:\n    pass\n"


def test_evolve_without_a_task_is_refused_before_collecting(pytester: pytest.Pytester) -> None:
    """Issue 29: a bare `pytest --evolve 2` collected the whole test suite (12.4 s) before its
    error. The module below would fail collection if it were collected."""
    pytester.makeini("[pytest]\ntestpaths = suite\n")
    (pytester.path / "suite").mkdir()
    (pytester.path / "suite" / "test_never.py").write_text("raise RuntimeError('collected')\n")
    result = pytester.runpytest("--evolve", "2")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([
        "ERROR: --evolve expects exactly one task: * got none (pytest fell back to testpaths: "
        "suite); e.g. pytest --evolve 3 tasks/fp8_gemm"])
    assert "collected" not in result.stdout.str() and "RuntimeError" not in result.stdout.str()
