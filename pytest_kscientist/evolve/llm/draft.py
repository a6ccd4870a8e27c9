"""The writer's reply turned into a candidate file and checked before any GPU time is spent.

Checks: the reply holds one complete ``python`` block, it compiles, it defines the task's entry
(``custom_kernel``, or ``ModelNew`` for a KernelBench problem: ``TaskBrief.entry``) at top
level, its HIP or CUDA source (``load_inline`` with targets in ``KS_HIP_ARCH`` or
``KS_REQUIRES``) compiles for them where a compiler is found, and it is not a copy of a known
kernel once comments, docstrings and formatting are normalised away.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import re
import threading

from pytest_kscientist.evolve.llm.provider import truncated
from pytest_kscientist.formats.source_ast import compile_module, parse

_FENCE = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
_OPEN_FENCE = re.compile(r"```[ \t]*(?:python|py|python3)[ \t]*\n", re.IGNORECASE)
EXPLANATION_CHARS = 4000


def extract(text: str, finish_reason: str = "", entry: str = "custom_kernel",
            ) -> tuple[str | None, str, str]:
    """Split a writer reply into (source or None, explanation, problem when source is None)."""
    blocks = _FENCE.findall(text)
    if not blocks:
        if _OPEN_FENCE.search(text):
            cause = (
                f"the reply stopped at the output token cap (finish reason {finish_reason})"
                if truncated(finish_reason)
                else "the ```python block is never closed"
            )
            return (
                None,
                "",
                f"the reply holds no complete ```python block: {cause}; write a shorter file",
            )
        if text.strip() and _defines_kernel_quietly(text, entry):
            return text.strip() + "\n", "", ""
        what = "empty" if not text.strip() else "prose without a ```python block"
        return None, "", f"the reply was {what} (finish reason {finish_reason or 'unknown'})"
    with_kernel = [b for b in blocks if entry in b]
    source = (with_kernel or sorted(blocks, key=len))[-1]
    explanation = _FENCE.sub("", text).replace("## Explanation", "").strip()
    return source.strip("\n") + "\n", explanation[:EXPLANATION_CHARS], ""


def _defines_kernel_quietly(text: str, entry: str) -> bool:
    try:
        return defines_entry(parse(text), entry)
    except (SyntaxError, ValueError):
        return False


def entry_label(entry: str) -> str:
    """How messages name the entry: ``custom_kernel(data)``, ``class ModelNew``."""
    return f"class {entry}" if entry[:1].isupper() else f"{entry}(data)"


def defines_entry(tree: ast.Module, entry: str = "custom_kernel") -> bool:
    """Whether ``entry`` is bound at module level (def, class, assignment or import)."""
    for node in tree.body:
        if (
            isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and node.name == entry
        ):
            return True
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == entry for t in targets):
                return True
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            if any((a.asname or a.name) == entry for a in node.names):
                return True
    return False


def _strip_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            body = node.body
            if (
                body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                node.body = body[1:] or [ast.Pass()]
    return tree


# Every role call hashes the whole population again (scientist._remember): at generation 50
# (150 members) that was 930 parses and unparses, 14 of test_llm_prompt_bounds' 26 s profiled.
@functools.lru_cache(maxsize=4096)
def normalised_sha256(source: str) -> str:
    """sha256 of the code with comments, docstrings and formatting normalised away."""
    try:
        text = ast.unparse(_strip_docstrings(parse(source)))
    except (SyntaxError, ValueError):
        text = "\n".join(line.rstrip() for line in source.splitlines() if line.strip())
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class KnownSources:
    """Normalised hashes of every kernel the roles have seen or written (thread-safe)."""

    def __init__(self) -> None:
        self._names: dict[str, str] = {}
        self._lock = threading.Lock()

    def add(self, source: str, name: str) -> None:
        """Remember ``source`` under ``name`` (the first name stays)."""
        digest = normalised_sha256(source)
        with self._lock:
            self._names.setdefault(digest, name)

    def match(self, source: str) -> str | None:
        """The name of a known kernel with the same normalised code, if any."""
        with self._lock:
            return self._names.get(normalised_sha256(source))


def check(source: str, known: KnownSources, entry: str = "custom_kernel") -> str:
    """The first problem of a candidate file, or "" when it may go to the GPU."""
    try:
        tree = parse(source, "<candidate>")
        compile_module(tree, "<candidate>")
    except SyntaxError as exc:
        line = (exc.text or "").rstrip()
        return f"SyntaxError: {exc.msg} at line {exc.lineno}" + (
            f": {line.strip()}" if line else ""
        )
    except ValueError as exc:  # e.g. null bytes in the source
        return f"the file does not compile: {exc}"
    if not defines_entry(tree, entry):
        return f"the file does not define {entry_label(entry)} at module level"
    from pytest_kscientist.cuda.compile_gate import draft_problem as cuda_problem
    from pytest_kscientist.hip.compile_gate import draft_problem as hip_problem

    # A HIP or CUDA draft is compiled for its targets (issues 14 and 32).
    compiler_errors = hip_problem(source) or cuda_problem(source)
    if compiler_errors:
        return compiler_errors
    twin = known.match(source)
    if twin is not None:
        return (
            f"the file is the same code as {twin} once comments, docstrings and formatting are "
            "ignored: an experiment must change the code"
        )
    return ""
