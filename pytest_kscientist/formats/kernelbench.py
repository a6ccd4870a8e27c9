"""KernelBench problem files as tasks, collected unchanged (issue 12).

A problem is one file with ``class Model(nn.Module)``, ``get_inputs()`` and
``get_init_inputs()``; a solution defines ``ModelNew`` with Model's constructor. Kept from
KernelBench's evaluation: weights seeded the same for both models (built under one seed, so a
solution that creates its parameters in Model's order gets Model's weights), inputs from
``get_inputs()`` under a per-trial seed, ``forward`` under ``no_grad``, correctness as
``allclose`` with atol = rtol = 1e-2 (KernelBench v0/v0.1's fp32 setting) over
``CHECK_TRIALS`` seeded trials, timing of ``forward``. Changed: the seeds mix in the session's
secret salt; inputs are drawn on the run's device (``torch.device`` as the default), where
KernelBench draws on the CPU and copies; every timed call gets fresh inputs.
"""

from __future__ import annotations

import ast
from pathlib import Path

from pytest_kscientist.errors import TaskSpecError
from pytest_kscientist.formats.source_ast import parse
from pytest_kscientist.formats.task import CheckSpec, Profile, Task, TaskSpec

NEEDED = ("Model", "get_inputs", "get_init_inputs")
CHECK_TRIALS = (42, 1234, 2025, 31337, 777)  # public case seeds of the check trials
BENCH_SEED = 20250
TOLERANCE = 1e-2


def _definitions(path: Path) -> dict[str, ast.stmt] | None:
    """Top-level classes and functions by name; None for a file that cannot be one."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    if "get_init_inputs" not in text or "Model" not in text:
        return None  # cheap test first: most .py files in a tree are not problems
    try:
        tree = parse(text)
    except (SyntaxError, ValueError):
        return None
    return {node.name: node for node in tree.body
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))}


def looks_like_problem(path: Path) -> bool:
    """Whether ``path`` is a KernelBench problem: ``Model``, ``get_inputs`` and
    ``get_init_inputs`` defined at top level, and no ``ModelNew`` (that is a solution)."""
    if (path.suffix != ".py" or path.name.startswith(("conftest", "test_"))
            or path.stem.endswith("_test")):  # pytest's test files, both default patterns
        return False
    names = _definitions(path)
    return names is not None and set(NEEDED) <= set(names) and "ModelNew" not in names


def load_problem(path: Path, tolerance: float = TOLERANCE) -> Task:
    found = _definitions(path) or {}
    missing = [n for n in NEEDED if n not in found]
    if missing:
        raise TaskSpecError(f"{path}: defines no {', '.join(missing)} at top level; a KernelBench "
                            "problem defines Model, get_inputs() and get_init_inputs()")
    model = found["Model"]
    doc = (ast.get_docstring(model) if isinstance(model, ast.ClassDef) else None) or ""
    profile = Profile.model_validate({"tests": [{"seed": s} for s in CHECK_TRIALS],
                                      "benchmarks": [{"seed": BENCH_SEED}]})
    spec = TaskSpec(
        name=path.stem, description=doc, reference=path.name, seeds="", case_keys=["seed"],
        output_index=None, check=CheckSpec(atol=tolerance, rtol=tolerance),
        profiles={"full": profile, "cpu": profile},
    )
    return Task(path.parent, spec, form="kernelbench", spec_path=path)
