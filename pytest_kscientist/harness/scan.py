"""A static look at a candidate's source for constructs that cheating kernels rely on.

Findings are warnings for a reviewer (``KsSuspiciousCode``) and a JSON field, never verdicts:
each construct has honest uses too. The pytest process parses the file; it never imports it.
"""

from __future__ import annotations

import ast
from pathlib import Path

from pytest_kscientist.formats.source_ast import parse as parse_source
from pytest_kscientist.kswarnings import KsWarning

MODULES = {
    "gc": "can reach the harness's objects",
    "inspect": "can read the callers' frames",
    "ctypes": "can write any memory, including the harness's",
    "threading": "work can continue after the kernel returns",
    "concurrent": "work can continue after the kernel returns",
    "multiprocessing": "work can continue in another process",
    "subprocess": "can start other programs",
    "socket": "can reach the network",
    "__main__": "is the harness's runner",
    "pytest": "can skip or exit the test from inside the kernel",
    "pytest_kscientist": "is the harness itself",
}
ATTRIBUTES = {
    "data_ptr": "a cache keyed by address returns stale results for new data",
    "_version": "a cache keyed by version counters returns stale results for new data",
    "_getframe": "can read the callers' frames",
    "_current_frames": "can read every thread's frames",
    "f_back": "can read the callers' frames",
    "f_locals": "can read or rewrite the callers' variables",
    "get_objects": "can reach the harness's objects",
    "get_referrers": "can reach the harness's objects",
    "setprofile": "can run code inside the harness after the clock stops",
    "settrace": "can run code inside the harness after the clock stops",
    "_exit": "ends the worker before it answers",
    "Stream": "work on a side stream can escape a timer that waits only for its own stream",
    "stream": "work on a side stream can escape a timer that waits only for its own stream",
    "environ": "reads the environment",
    "exit": "ends the worker before it answers",
    "as_subclass": "a tensor subclass can fake comparisons",
    "allow_tf32": "changes a process-wide precision setting",
    "set_default_dtype": "changes a process-wide setting",
    "set_float32_matmul_precision": "changes a process-wide precision setting",
}
BUILTINS = {
    "exec": "runs code the scan cannot see",
    "eval": "runs code the scan cannot see",
    "compile": "builds code the scan cannot see",
    "__import__": "imports modules the scan cannot see",
    "open": "reads or writes files",
}
CACHE_CALLS = {"dict", "list", "set", "defaultdict", "OrderedDict", "WeakValueDictionary"}
MUTATORS = {"append", "extend", "insert", "add", "update", "setdefault", "__setitem__", "pop"}


class KsSuspiciousCode(KsWarning):
    """A candidate uses a construct that cheating kernels rely on; read it before trusting it."""


def scan_source(text: str) -> list[str]:
    """One line per kind of suspicious construct (its first occurrence): ``line N: what (why)``."""
    try:
        tree = parse_source(text)
    except SyntaxError:
        return []  # the worker reports the syntax error as the verdict
    found: dict[str, tuple[int, str]] = {}
    imported = {(a.asname or a.name).split(".")[0] for n in ast.walk(tree)
                if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}

    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}

    def note(key: str, line: int, text: str) -> None:
        if key not in found or line < found[key][0]:
            found[key] = (line, text)

    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [
                node.module or ""]
            for name in names:
                top = name.split(".")[0]
                if top in MODULES:
                    note(f"import {top}", node.lineno, f"imports {top} ({MODULES[top]})")
        elif isinstance(node, ast.Attribute) and node.attr in ATTRIBUTES:
            if node.attr == "data_ptr" and _passes_address(node, parents):
                continue
            note(node.attr, node.lineno, f"uses .{node.attr} ({ATTRIBUTES[node.attr]})")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id in BUILTINS:
                why = BUILTINS[node.func.id]
                note(node.func.id, node.lineno, f"calls {node.func.id}() ({why})")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if node.name in ("__torch_function__", "__torch_dispatch__"):
                note(node.name, node.lineno, f"defines {node.name} (an object that intercepts "
                     "torch calls can fake results or comparisons)")
        if isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                dotted = _dotted(target)
                if dotted and dotted.split(".")[0] in imported:
                    note(f"patch {dotted}", node.lineno, f"assigns {dotted} (monkeypatching a "
                         "module others rely on)")
    for line, what in _module_caches(tree):
        note(what, line, what)
    return [f"line {line}: {text}" for line, text in sorted(found.values())]


# Calls that turn an address into a lookup: an address handed to one is a cache key.
KEYING = {"hash", "id", "tuple", "frozenset", "str", "repr", "get", "setdefault", "pop",
          "__getitem__", "__contains__", "index", "count"}


def _passes_address(attr: ast.Attribute, parents: dict[ast.AST, ast.AST]) -> bool:
    """Whether ``x.data_ptr()`` only hands the address to a call (a compiled launcher's
    argument, with an offset added or a choice between two such values on the way) or tests
    its alignment (``% 16``): the ways a raw-pointer wrapper uses it. Kept, compared, returned
    or used as a key, it is reported."""
    call = parents.get(attr)
    if not isinstance(call, ast.Call) or call.func is not attr:
        return False
    node: ast.AST = call
    parent = parents.get(node)
    while isinstance(parent, ast.IfExp) and node is not parent.test or (
            isinstance(parent, ast.BinOp) and isinstance(parent.op, (ast.Add, ast.Sub))):
        node, parent = parent, parents.get(parent)
    if isinstance(parent, ast.BinOp) and isinstance(parent.op, ast.Mod) and node is parent.left:
        return True
    if isinstance(parent, ast.keyword):
        parent = parents.get(parent)
    elif not isinstance(parent, ast.Call) or node not in parent.args:
        return False
    if not isinstance(parent, ast.Call):
        return False
    func = parent.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return name not in KEYING


def _module_caches(tree: ast.Module) -> list[tuple[int, str]]:
    """Module-level containers that functions fill, and memoising decorators: state kept
    across calls (a constant table that nothing writes to is not reported)."""
    containers: dict[str, int] = {}
    out: list[tuple[int, str]] = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and _is_container(node.value):
            for bound in node.targets:
                if isinstance(bound, ast.Name):
                    containers[bound.id] = node.lineno
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            if _is_container(node.value) and isinstance(node.target, ast.Name):
                containers[node.target.id] = node.lineno
    written: set[str] = set()
    for func in ast.walk(tree):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for deco in func.decorator_list:
            called = deco.func if isinstance(deco, ast.Call) else deco
            label = called.attr if isinstance(called, ast.Attribute) else getattr(called, "id", "")
            if label in ("lru_cache", "cache"):
                out.append((func.lineno, f"memoises {func.name}() with @{label} (a result "
                                         "cache returns stale outputs)"))
        for inner in ast.walk(func):
            target: ast.expr | None = None
            if isinstance(inner, ast.Subscript) and isinstance(inner.ctx, ast.Store):
                target = inner.value
            elif isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute):
                if inner.func.attr in MUTATORS:
                    target = inner.func.value
            if isinstance(target, ast.Name) and target.id in containers:
                written.add(target.id)
    for kept in sorted(written):
        out.append((containers[kept], f"keeps module-level state '{kept}' that calls write "
                                      "to (a result cache returns stale outputs)"))
    return out


def _dotted(node: ast.expr) -> str:
    """``a.b.c`` for an attribute chain on a plain name; "" otherwise."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not parts or not isinstance(node, ast.Name):
        return ""
    return ".".join([node.id, *reversed(parts)])


def _is_container(value: ast.expr) -> bool:
    if isinstance(value, (ast.Dict, ast.List, ast.Set)):
        return True
    if isinstance(value, ast.Call):
        func = value.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        return name in CACHE_CALLS
    return False


def scan_file(path: Path) -> list[str]:
    """``scan_source`` of a file; nothing when it cannot be read."""
    try:
        return scan_source(path.read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return []
