"""HIP candidates, read without importing them: their targets and the source they compile.

A HIP candidate follows GPU MODE's ``template-hip.py``: a ``.py`` file whose HIP source strings
are compiled by ``torch.utils.cpp_extension.load_inline`` on ROCm torch, and which declares the
AMD GPU targets it is written for at module level::

    KS_HIP_ARCH = ["gfx942"]          # or a string; gfx90a, gfx942, gfx950, gfx1100 ...

Each declared target gets a ``compile[<arch>]`` item (``compile_gate.py``) on every machine.
The source is what the file's ``load_inline(...)`` call receives: ``cuda_sources``,
``extra_cuda_cflags`` (and ``name``), each a literal, a module-level name bound to one, or an
expression over those (lists, ``+``, f-strings, subscripts, a comprehension over
``TUNABLES.items()``); the file is parsed, never imported. A HIP candidate can only run on a
ROCm GPU of a declared target: ``rocm`` is implied in its requirements (``requires.py``).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_kscientist.formats.declarations import assignments, parse
from pytest_kscientist.formats.source_ast import parse as parse_source

NAME = "KS_HIP_ARCH"
ARCH = re.compile(r"^gfx[0-9]{2,4}[0-9a-f]?(:(sramecc|xnack)[+-])*$")
# Flags of extra_cuda_cflags the gate passes to the compiler; the target comes from the item,
# and linking or output options do not apply to a device-only compile.
PASSED_FLAG = re.compile(r"^(-D|-U|-std=|-O|-f|-m|-w$|-W(?!l,))")


class HipDeclarationError(ValueError):
    """A ``KS_HIP_ARCH`` that is not a target or a list of them."""


class HipSourceError(ValueError):
    """The HIP source of a candidate cannot be read without running it."""


@dataclass(frozen=True)
class Chunk:
    """One source string; ``line`` is the .py line of its first line when the string maps onto
    the file line by line (a plain literal), else None."""

    text: str
    line: int | None
    label: str


@dataclass(frozen=True)
class HipSource:
    """What the candidate's ``load_inline`` call compiles for the device."""

    chunks: list[Chunk]
    flags: list[str]
    ignored_flags: list[str] = field(default_factory=list)
    module_name: str = "candidate"
    call_line: int = 0


def declared_archs(path: Path) -> list[str]:
    """The targets ``path`` declares in ``KS_HIP_ARCH`` ([] when none, or when the file does not
    parse: the worker and the compile item then report the syntax error)."""
    tree = parse(path)
    if tree is None:
        return []
    for name, value, line in assignments(tree):
        if name != NAME:
            continue
        try:
            archs = ast.literal_eval(value)
        except ValueError:
            archs = None
        archs = [archs] if isinstance(archs, str) else archs
        if not isinstance(archs, (list, tuple)) or not archs or not all(
                isinstance(a, str) for a in archs):
            raise HipDeclarationError(
                f"{path.name}:{line}: {NAME} must be a target or a non-empty list of them such "
                f"as 'gfx942' or ['gfx942', 'gfx950'], got {ast.unparse(value)}")
        for arch in archs:
            if not ARCH.match(arch):
                raise HipDeclarationError(
                    f"{path.name}:{line}: {NAME} names {arch!r}, which is not an AMD GPU target; "
                    "expected a name such as gfx90a, gfx942, gfx950 or gfx1100 (see rocminfo)")
        return list(dict.fromkeys(archs))
    return []


class _NotStatic(Exception):
    def __init__(self, node: ast.AST, why: str) -> None:
        super().__init__(why)
        self.node = node


class _Static:
    """Evaluates the few expression forms a kernel file builds its source and flags with."""

    def __init__(self, tree: ast.Module) -> None:
        self.nodes: dict[str, ast.expr] = {}
        for name, value, _ in assignments(tree):
            self.nodes[name] = value  # the last binding wins, as when the module runs
        self.values: dict[str, Any] = {}

    def name(self, node: ast.Name) -> Any:
        if node.id not in self.values:
            if node.id not in self.nodes:
                raise _NotStatic(node, f"'{node.id}' is not bound at module level")
            self.values[node.id] = self.value(self.nodes[node.id])
        return self.values[node.id]

    def value(self, node: ast.expr, scope: dict[str, Any] | None = None) -> Any:
        scope = scope or {}
        ev = lambda n: self.value(n, scope)  # noqa: E731
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return scope[node.id] if node.id in scope else self.name(node)
        if isinstance(node, (ast.List, ast.Tuple)):
            out: list[Any] = []
            for elt in node.elts:
                if isinstance(elt, ast.Starred):
                    out.extend(ev(elt.value))
                else:
                    out.append(ev(elt))
            return out
        if isinstance(node, ast.Dict) and None not in node.keys:
            return {ev(k): ev(v) for k, v in zip(node.keys, node.values, strict=True)}  # type: ignore[arg-type]
        if isinstance(node, ast.Subscript):
            return ev(node.value)[ev(node.slice)]
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return ev(node.left) + ev(node.right)
        if isinstance(node, ast.JoinedStr):
            return "".join(self._formatted(v, scope) for v in node.values)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and not (
                node.keywords) and node.func.attr in ("items", "keys", "values", "join"):
            owner, method = ev(node.func.value), node.func.attr
            if isinstance(owner, dict) and method in ("items", "keys", "values") and not (
                    node.args):
                return list(getattr(owner, method)())
            if isinstance(owner, str) and method == "join" and len(node.args) == 1:
                return owner.join(ev(node.args[0]))
        if isinstance(node, ast.ListComp) and len(node.generators) == 1:
            gen = node.generators[0]
            out = []
            for item in ev(gen.iter):
                inner = dict(scope, **self._bind(gen.target, item))
                if all(self.value(cond, inner) for cond in gen.ifs):
                    out.append(self.value(node.elt, inner))
            return out
        raise _NotStatic(node, f"'{ast.unparse(node)}' is computed when the module runs")

    def _formatted(self, node: ast.expr, scope: dict[str, Any]) -> str:
        if isinstance(node, ast.Constant):
            return str(node.value)
        assert isinstance(node, ast.FormattedValue)
        value = self.value(node.value, scope)
        value = {ord("r"): repr, ord("s"): str, ord("a"): ascii}.get(node.conversion, lambda v: v)(
            value)
        spec = self.value(node.format_spec, scope) if node.format_spec else ""
        return format(value, spec)

    def _bind(self, target: ast.expr, item: Any) -> dict[str, Any]:
        if isinstance(target, ast.Name):
            return {target.id: item}
        if isinstance(target, ast.Tuple) and all(isinstance(t, ast.Name) for t in target.elts):
            return {t.id: v for t, v in zip(target.elts, item, strict=True)}  # type: ignore[attr-defined]
        raise _NotStatic(target, f"loop target '{ast.unparse(target)}'")


def _load_inline_call(tree: ast.Module) -> ast.Call | None:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name == "load_inline":
                return node
    return None


def _maps_lines(node: ast.Constant, lines: list[str]) -> bool:
    """Whether the string literal's text lies in the file line by line (no escaped newlines,
    no implicit concatenation), so its line i is file line node.lineno + i."""
    text = node.value
    if not isinstance(text, str) or node.end_lineno is None:
        return False
    parts = text.split("\n")
    if len(parts) - 1 != node.end_lineno - node.lineno:
        return False
    return all(part in lines[node.lineno - 1 + i] for i, part in enumerate(parts) if part)


def _chunks(static: _Static, node: ast.expr, lines: list[str], label: str) -> list[Chunk]:
    """The strings of a ``cuda_sources=`` argument, each with its line in the file if it has
    one: a literal, a name bound to one, or a list of these; anything else evaluated."""
    if isinstance(node, (ast.List, ast.Tuple)) and not any(
            isinstance(e, ast.Starred) for e in node.elts):
        return [c for i, e in enumerate(node.elts)
                for c in _chunks(static, e, lines, f"{label}[{i}]")]
    if isinstance(node, ast.Name) and node.id in static.nodes:
        return _chunks(static, static.nodes[node.id], lines, node.id)
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [Chunk(node.value, node.lineno if _maps_lines(node, lines) else None, label)]
    value = static.value(node)
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise _NotStatic(node, f"'{ast.unparse(node)}' is not a string or a list of strings")
    return [Chunk(t, None, label) for t in texts]


def read_source(path: Path) -> HipSource:
    """The device source and flags of the candidate's ``load_inline`` call."""
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        tree = parse_source(text)
    except SyntaxError as exc:
        raise HipSourceError(f"{path.name}:{exc.lineno}: the file does not parse: {exc.msg}; "
                             "fix the Python syntax") from None
    call = _load_inline_call(tree)
    if call is None:
        raise HipSourceError(
            f"{path.name} declares {NAME} but calls no load_inline(...); compile the HIP source "
            "with torch.utils.cpp_extension.load_inline(cuda_sources=..., ...) as GPU MODE's "
            "template-hip.py does, or drop KS_HIP_ARCH")
    args = {kw.arg: kw.value for kw in call.keywords if kw.arg}
    static = _Static(tree)
    lines = text.splitlines()
    try:
        if "cuda_sources" not in args:
            raise _NotStatic(call, "load_inline(...) has no cuda_sources= keyword argument")
        chunks = _chunks(static, args["cuda_sources"], lines, "cuda_sources")
        raw = static.value(args["extra_cuda_cflags"]) if "extra_cuda_cflags" in args else []
        if not isinstance(raw, list) or not all(isinstance(f, str) for f in raw):
            raise _NotStatic(args["extra_cuda_cflags"], "extra_cuda_cflags is not a list of "
                             "strings")
        name = static.value(args["name"]) if "name" in args else "candidate"
    except _NotStatic as exc:
        line = getattr(exc.node, "lineno", call.lineno)
        raise HipSourceError(
            f"{path.name}:{line}: the load_inline(...) call at line {call.lineno} cannot be read "
            f"without running the file: {exc}; bind the source and flags to module-level "
            "literals (strings, lists, f-strings over TUNABLES)") from None
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise HipSourceError(
            f"{path.name}: the load_inline(...) call at line {call.lineno} cannot be read "
            f"without running the file: {type(exc).__name__}: {exc}") from None
    passed = [f for f in raw if PASSED_FLAG.match(f)]
    return HipSource(chunks=chunks, flags=passed, ignored_flags=[f for f in raw if f not in passed],
                     module_name=str(name), call_line=call.lineno)


# What load_inline puts before a HIP source (hipified): torch's and HIP's headers.
PRELUDE = "#include <torch/types.h>\n#include <hip/hip_runtime.h>\n"


def translation_unit(source: HipSource, shown_as: str, precompiled: bool = False) -> str:
    """The file the compiler sees: load_inline's prelude (hipified), then each chunk behind a
    ``#line`` directive, so diagnostics name the candidate's own lines. ``precompiled``: the
    prelude comes from a PCH (``hip.prelude``), and the extension's name is defined here, where
    the command line would differ from the PCH's."""
    parts = ([f"#define TORCH_EXTENSION_NAME {source.module_name}"] if precompiled
             else [PRELUDE.rstrip("\n")])
    for chunk in source.chunks:
        if chunk.line is not None:
            parts.append(f'#line {chunk.line} "{shown_as}"')
        else:
            parts.append(f'#line 1 "{shown_as} ({chunk.label})"')
        parts.append(chunk.text)
    return "\n".join(parts) + "\n"


def device_arch(device: str) -> str:
    """The AMD target of ``device`` (``gfx942``), or what the device is when it has none."""
    if not device.startswith("cuda"):
        return device
    import torch

    if torch.version.hip is None:
        return f"{torch.cuda.get_device_name(device)} (not ROCm)"
    return str(torch.cuda.get_device_properties(device).gcnArchName).split(":")[0]


def unmet_on(path: Path, device: str) -> str:
    """Why ``device`` cannot run the HIP candidate at ``path`` ("" if it can, or if the file
    declares no KS_HIP_ARCH)."""
    archs = declared_archs(path)
    if not archs:
        return ""
    found = device_arch(device)
    if found in {a.split(":")[0] for a in archs}:
        return ""
    return (f"candidate '{path.stem}' is HIP for {', '.join(archs)} (its {NAME}), this run's "
            f"device is {found}; its compile items check it here, run it on such a ROCm GPU")
