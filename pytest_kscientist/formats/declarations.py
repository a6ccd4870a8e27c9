"""Module-level declarations of a kernel file (``KS_REQUIRES``, ``KS_HIP_ARCH``, ``TUNABLES``),
read by parsing its source, never by importing it. Standard library only."""

from __future__ import annotations

import ast
from pathlib import Path

from pytest_kscientist.formats.source_ast import parse as parse_source


def parse(path: Path) -> ast.Module | None:
    """The file's syntax tree, or None when it does not parse (the worker reports that)."""
    try:
        return parse_source(path.read_text(encoding="utf-8", errors="replace"))
    except (SyntaxError, ValueError):
        return None


def assignments(tree: ast.Module) -> list[tuple[str, ast.expr, int]]:
    """Module-level ``name = value`` (or annotated) statements, in order: (name, value, line)."""
    found = []
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign):
            targets, value = stmt.targets, stmt.value
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            targets, value = [stmt.target], stmt.value
        else:
            continue
        found += [(t.id, value, stmt.lineno) for t in targets if isinstance(t, ast.Name)]
    return found
