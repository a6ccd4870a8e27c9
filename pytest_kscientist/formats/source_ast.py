"""Python source to a syntax tree, and a tree to code, one thread at a time.

CPython 3.11 keeps the AST conversion's recursion depth in interpreter-wide state, so two threads
converting at once can fail with ``SystemError: AST constructor recursion depth mismatch``: seen
on 2026-12-01 in ``tests/test_llm_long_run.py``, where a generation's writer calls run in threads
and each parses its draft (that test failed in 7 of 13 runs of the fast test lane on the 2-core
CPU, the run inspected with this error; 5 of 5 passed with the lock). Every parse the
pytest process makes goes through here; the worker parses nothing.
"""

from __future__ import annotations

import ast
import threading
from types import CodeType

_LOCK = threading.Lock()


def parse(source: str, filename: str = "<unknown>") -> ast.Module:
    """``ast.parse(source)``, never at the same time as another thread's."""
    with _LOCK:
        return ast.parse(source, filename=filename)


def compile_module(tree: ast.Module, filename: str) -> CodeType:
    """``compile(tree, filename, "exec")``, never at the same time as another thread's parse."""
    with _LOCK:
        return compile(tree, filename, "exec", dont_inherit=True)
