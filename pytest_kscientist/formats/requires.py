"""``KS_REQUIRES``: a candidate file's declaration of the devices it can run on.

A hand-written CUDA or HIP kernel cannot run on a CPU-only CI machine. Declaring, at module level,

    KS_REQUIRES = "sm_90"            # or a list: ["nvidia", "sm_90"]

(the vocabulary of a baseline's ``requires``: cuda, nvidia, rocm, sm_XY) makes the harness skip
the candidate's items with the reason on other devices, instead of failing them. The file is
read as text and parsed, never imported, in the pytest process. Skipping is not passing: a
skipped candidate has no geomean, fails no gate but passes none either, and an evolved
candidate that is skipped is recorded as skipped ("not run here").
"""

from __future__ import annotations

import ast
from pathlib import Path

from pytest_kscientist.formats.declarations import assignments, parse
from pytest_kscientist.formats.task import unknown_requirement

NAME = "KS_REQUIRES"


class RequiresError(ValueError):
    """A ``KS_REQUIRES`` that is not a requirement or a list of them."""


def declared(path: Path) -> list[str]:
    """The requirements ``path`` declares ([] when none, or when the file does not parse: the
    worker then reports the syntax error as the candidate's failure)."""
    tree = parse(path)
    if tree is None:
        return []
    for name, node, line in assignments(tree):
        if name != NAME:
            continue
        try:
            value = ast.literal_eval(node)
        except ValueError:
            value = None
        needs = [value] if isinstance(value, str) else value
        if not isinstance(needs, (list, tuple)) or not all(isinstance(n, str) for n in needs):
            raise RequiresError(
                f"{path.name}:{line}: {NAME} must be a string or a list of strings such "
                f"as 'sm_90' or ['nvidia', 'sm_90'], got {ast.unparse(node)}"
            )
        for need in needs:
            problem = unknown_requirement(need)
            if problem:
                raise RequiresError(f"{path.name}:{line}: {NAME} names {problem}")
        return list(needs)
    return []
