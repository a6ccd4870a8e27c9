"""The seeds of an ``--evolve`` run: the task's own kernels, or, for an imported problem that
has none, one derived from the problem itself (its reference, as a candidate).

A KernelBench problem never ships a solution: its seed is the problem file with ``Model``
renamed ``ModelNew`` (every use of the name, so ``super(Model, self)`` follows). A GPU MODE
folder without ``solutions/correct/`` gets ``reference.py`` with ``custom_kernel`` calling
``ref_kernel``. Either is written into the population's ``derived-seeds/`` folder and recorded
in the candidate's meta as what it is: the reference, correct by construction and as slow as
the reference, a starting point for the LLM scientist.
"""

from __future__ import annotations

import io
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

from pytest_kscientist.formats.task import Task
from pytest_kscientist.harness.files import atomic_write

DERIVED_DIR = "derived-seeds"


@dataclass(frozen=True)
class Seeds:
    """Seed files, and for derived ones (by file name) the note stored as their explanation."""

    paths: list[Path]
    notes: dict[str, str] = field(default_factory=dict)


def rename(source: str, old: str, new: str) -> str:
    """``source`` with every name token ``old`` (not strings, not comments) spelled ``new``."""
    lines = source.splitlines(keepends=True)
    spots = [tok.start for tok in tokenize.generate_tokens(io.StringIO(source).readline)
             if tok.type == tokenize.NAME and tok.string == old]
    for row, col in reversed(spots):  # right to left, so earlier columns stay valid
        line = lines[row - 1]
        lines[row - 1] = line[:col] + new + line[col + len(old):]
    return "".join(lines)


def _kernelbench(task: Task) -> tuple[str, str, str]:
    problem = task.spec_path
    source = rename(problem.read_text(encoding="utf-8"), "Model", "ModelNew")
    header = (f"# The seed of {problem.name}, derived by pytest-kscientist: the problem's Model\n"
              "# renamed ModelNew, i.e. the reference itself (correct, as fast as it).\n")
    note = (f"the reference itself: {problem.name} with Model renamed ModelNew (KernelBench "
            "problems ship no solution)")
    return f"{task.name}_reference.py", header + source, note


def _gpumode(task: Task) -> tuple[str, str, str]:
    name = task.reference.name
    source = task.files.get(name) or task.reference.read_text(encoding="utf-8")
    header = (f"# The seed of {task.name}, derived by pytest-kscientist: {name} with\n"
              "# custom_kernel calling ref_kernel, i.e. the reference itself.\n")
    tail = "\n\ndef custom_kernel(data):\n    return ref_kernel(data)\n"
    note = (f"the reference itself: {name} with custom_kernel calling ref_kernel (the folder "
            "has no solutions/correct/)")
    return f"{task.name}_reference.py", header + source.rstrip("\n") + "\n" + tail, note


def seeds_for(task: Task, population_root: Path) -> Seeds:
    """The task's seeds; for a KernelBench problem or a GPU MODE folder without any, the seed
    derived from the problem, written under ``population_root / DERIVED_DIR``."""
    own = task.seeds()
    if own or task.form == "native":
        return Seeds(own)
    name, source, note = (_kernelbench if task.form == "kernelbench" else _gpumode)(task)
    path = population_root / DERIVED_DIR / name
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, source)
    return Seeds([path], {name: note})
