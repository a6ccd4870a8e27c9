"""Read and rewrite a kernel's tunable knobs: the module-level ``TUNABLES = {...}`` dict literal.

A tunable kernel declares ``TUNABLES = {"knob": value, ...}`` (literal keys and values) and
``TUNABLE_SPACE = {"knob": [value, ...]}``. Rewriting goes through the ``ast`` node positions of
the dict's value nodes, so comments, layout and everything else in the file stay byte-identical.
"""

from __future__ import annotations

import ast
import hashlib
import itertools
from collections.abc import Iterator, Mapping
from typing import TypeAlias

from pytest_kscientist.declarations import assignments

Knob: TypeAlias = int | float | str | bool | None
TUNABLES_NAME = "TUNABLES"
SPACE_NAME = "TUNABLE_SPACE"


class KnobError(ValueError):
    """A kernel's TUNABLES cannot be read or rewritten as asked."""


def _module_dict(tree: ast.Module, name: str) -> ast.Dict | None:
    """The last module-level ``name = {...}`` (or annotated) dict literal, or None."""
    found: ast.Dict | None = None
    for bound, value, _ in assignments(tree):
        if bound == name:
            if not isinstance(value, ast.Dict):
                raise KnobError(
                    f"{name} must be a dict literal {{'knob': value, ...}}, found "
                    f"{type(value).__name__}; write the knobs out literally"
                )
            found = value
    return found


def _parse(source: str) -> ast.Module:
    try:
        return ast.parse(source)
    except SyntaxError as exc:
        raise KnobError(f"kernel source does not parse (line {exc.lineno}: {exc.msg})") from None


def _items(node: ast.Dict, name: str) -> Iterator[tuple[str, ast.expr]]:
    for key, value in zip(node.keys, node.values, strict=True):
        if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
            found = ast.unparse(key) if key is not None else f"**{ast.unparse(value)}"
            raise KnobError(f"{name} keys must be string literals, found {found}")
        yield key.value, value


def _literal(value: ast.expr, name: str, knob: str) -> object:
    try:
        return ast.literal_eval(value)
    except ValueError:
        raise KnobError(
            f"{name}[{knob!r}] must be a literal value, found {ast.unparse(value)!r}"
        ) from None


def read_tunables(source: str) -> dict[str, Knob]:
    """The kernel's ``TUNABLES`` values, or an empty dict when it declares none."""
    node = _module_dict(_parse(source), TUNABLES_NAME)
    if node is None:
        return {}
    return {k: _literal(v, TUNABLES_NAME, k) for k, v in _items(node, TUNABLES_NAME)}  # type: ignore[misc]


def read_space(source: str) -> dict[str, list[Knob]]:
    """The kernel's ``TUNABLE_SPACE`` (knob -> allowed values), or an empty dict."""
    node = _module_dict(_parse(source), SPACE_NAME)
    if node is None:
        return {}
    space: dict[str, list[Knob]] = {}
    for knob, value in _items(node, SPACE_NAME):
        values = _literal(value, SPACE_NAME, knob)
        if not isinstance(values, (list, tuple)) or not values:
            raise KnobError(f"{SPACE_NAME}[{knob!r}] must be a non-empty list of values")
        space[knob] = list(values)
    return space


def _line_offsets(data: bytes) -> list[int]:
    offsets = [0]
    for line in data.splitlines(keepends=True):
        offsets.append(offsets[-1] + len(line))
    return offsets


def _check_literal(knob: str, value: object) -> None:
    try:
        same = ast.literal_eval(repr(value)) == value
    except (ValueError, SyntaxError):
        same = False
    if not same or type(value) not in (int, float, str, bool, type(None)):
        raise KnobError(
            f"{TUNABLES_NAME}[{knob!r}]: {value!r} is not a plain literal "
            "(int, float, str, bool or None); pick a value from TUNABLE_SPACE"
        )


def rewrite_tunables(source: str, changes: Mapping[str, Knob]) -> str:
    """``source`` with the given ``TUNABLES`` entries set to new literal values, all else intact."""
    node = _module_dict(_parse(source), TUNABLES_NAME)
    if node is None:
        raise KnobError(f"kernel declares no module-level {TUNABLES_NAME} dict; nothing to rewrite")
    nodes = dict(_items(node, TUNABLES_NAME))
    unknown = sorted(set(changes) - set(nodes))
    if unknown:
        raise KnobError(
            f"{TUNABLES_NAME} has no knob {', '.join(map(repr, unknown))} "
            f"(it has: {', '.join(map(repr, nodes))}); change only declared knobs"
        )
    for knob, value in changes.items():
        _check_literal(knob, value)
    # ast columns are UTF-8 byte offsets, so splice the encoded text.
    data = source.encode("utf-8")
    starts = _line_offsets(data)
    spans = []
    for knob, value in changes.items():
        v = nodes[knob]
        assert v.end_lineno is not None and v.end_col_offset is not None
        begin = starts[v.lineno - 1] + v.col_offset
        end = starts[v.end_lineno - 1] + v.end_col_offset
        spans.append((begin, end, repr(value).encode("utf-8")))
    for begin, end, text in sorted(spans, reverse=True):
        data = data[:begin] + text + data[end:]
    out = data.decode("utf-8")
    got = read_tunables(out)
    expected = {k: _literal(v, TUNABLES_NAME, k) for k, v in nodes.items()} | dict(changes)
    if got != expected:  # pragma: no cover - a bug in the splice, never user input
        raise KnobError(f"rewriting {TUNABLES_NAME} produced {got}, expected {expected}")
    return out


def skeleton_sha(source: str) -> str:
    """A hash of the code with knob values blanked: equal for kernels that differ only in knobs."""
    tree = _parse(source)
    node = _module_dict(tree, TUNABLES_NAME)
    if node is not None:
        node.values = [ast.Constant(value=None) for _ in node.values]
    return hashlib.sha256(ast.unparse(tree).encode("utf-8")).hexdigest()


def moves(
    values: Mapping[str, Knob], space: Mapping[str, list[Knob]], steps: int = 1
) -> Iterator[dict[str, Knob]]:
    """Single-knob moves to values up to ``steps`` positions away in the knob's space."""
    for knob, options in space.items():
        if knob not in values:
            continue
        current = values[knob]
        index = options.index(current) if current in options else None
        for j, option in enumerate(options):
            if option == current:
                continue
            if index is None or 0 < abs(j - index) <= steps:
                yield {knob: option}


def paired_moves(
    values: Mapping[str, Knob], space: Mapping[str, list[Knob]]
) -> Iterator[dict[str, Knob]]:
    """Moves of two different knobs at once, each to a neighbouring value."""
    singles = list(moves(values, space, steps=1))
    for a, b in itertools.combinations(singles, 2):
        if set(a).isdisjoint(b):
            yield a | b
