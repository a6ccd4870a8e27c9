"""Read and rewrite a kernel's tunable knobs: the module-level ``TUNABLES = {...}`` dict literal.

A tunable kernel declares ``TUNABLES = {"knob": value, ...}`` (literal keys and values) and
``TUNABLE_SPACE = {"knob": [value, ...]}``. Rewriting goes through the ``ast`` node positions of
the dict's value nodes, so comments, layout and everything else in the file stay byte-identical.

A kernel that can run other knob values per class of shapes also declares ``SHAPE_KEYS`` (the
shape values it passes to its ``tunables_for(**shape)``, named as the task's case keys) and
``TUNABLES_BY_SHAPE = [{"when": {key: [low, high]}, "knobs": {...}}, ...]``: the first rule whose
every ``low <= shape[key] < high`` holds (``None``: no bound) sets its knobs over ``TUNABLES``;
no rule, ``TUNABLES``. ``compose.dispatch`` states the same rule on this side.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import itertools
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, TypeAlias

from pytest_kscientist.formats.declarations import assignments
from pytest_kscientist.formats.source_ast import parse

Knob: TypeAlias = int | float | str | bool | None
TUNABLES_NAME = "TUNABLES"
SPACE_NAME = "TUNABLE_SPACE"
BY_SHAPE_NAME = "TUNABLES_BY_SHAPE"
SHAPE_KEYS_NAME = "SHAPE_KEYS"
# One rule of TUNABLES_BY_SHAPE: {"when": {key: [low, high]}, "knobs": {knob: value}}.
Rule: TypeAlias = dict[str, Any]
_RULES = "a list literal of {'when': {key: [low, high]}, 'knobs': {knob: value}} rules"


class KnobError(ValueError):
    """A kernel's TUNABLES cannot be read or rewritten as asked."""


def _module_dict(tree: ast.Module, name: str) -> ast.Dict | None:
    """The last module-level ``name = {...}`` (or annotated) dict literal, or None."""
    found = _module_literal(tree, name, ast.Dict, "a dict literal {'knob': value, ...}")
    return found if isinstance(found, ast.Dict) else None


def _module_literal(
    tree: ast.Module, name: str, kind: type[ast.expr], what: str
) -> ast.expr | None:
    """The value node of the last module-level ``name = ...`` (or annotated), which must be a
    ``kind`` node; None when the module binds no ``name``."""
    found: ast.expr | None = None
    for bound, value, _ in assignments(tree):
        if bound == name:
            if not isinstance(value, kind):
                raise KnobError(
                    f"{name} must be {what}, found {type(value).__name__}; write it out literally"
                )
            found = value
    return found


def _parse(source: str) -> ast.Module:
    """A fresh tree of ``source`` (the caller may change it)."""
    try:
        return parse(source)
    except SyntaxError as exc:
        raise KnobError(f"kernel source does not parse (line {exc.lineno}: {exc.msg})") from None


# Shared by every reader of one source, never changed: a population's findings and prompts read
# the knobs of each member many times over (3664 parses of ~460 sources at generation 50 in
# test_llm_prompt_bounds).
_shared_tree = functools.lru_cache(maxsize=1024)(_parse)


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


def _whole(node: ast.expr, name: str) -> object:
    try:
        return ast.literal_eval(node)
    except ValueError:
        raise KnobError(f"{name} must be written with literal values only, found "
                        f"{ast.unparse(node)!r}") from None


def read_tunables(source: str) -> dict[str, Knob]:
    """The kernel's ``TUNABLES`` values, or an empty dict when it declares none."""
    node = _module_dict(_shared_tree(source), TUNABLES_NAME)
    if node is None:
        return {}
    return {k: _literal(v, TUNABLES_NAME, k) for k, v in _items(node, TUNABLES_NAME)}  # type: ignore[misc]


def read_space(source: str) -> dict[str, list[Knob]]:
    """The kernel's ``TUNABLE_SPACE`` (knob -> allowed values), or an empty dict."""
    node = _module_dict(_shared_tree(source), SPACE_NAME)
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


def read_shape_keys(source: str) -> list[str]:
    """The kernel's ``SHAPE_KEYS`` (the shape values its ``tunables_for`` receives), or []."""
    node = _module_literal(_shared_tree(source), SHAPE_KEYS_NAME, ast.List, "a list of key names")
    if node is None:
        return []
    keys = _whole(node, SHAPE_KEYS_NAME)
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise KnobError(f"{SHAPE_KEYS_NAME} must list case keys as strings, e.g. ['m', 'n', 'k']")
    return keys


def read_by_shape(source: str) -> list[Rule] | None:
    """The kernel's ``TUNABLES_BY_SHAPE`` rules, checked; None when it declares none."""
    tree = _shared_tree(source)
    node = _module_literal(tree, BY_SHAPE_NAME, ast.List, _RULES)
    if node is None:
        return None
    rules = _whole(node, BY_SHAPE_NAME)
    return check_rules(rules, set(read_tunables(source)), read_shape_keys(source))


def check_rules(rules: object, knobs: set[str], keys: Sequence[str]) -> list[Rule]:
    """``rules`` as TUNABLES_BY_SHAPE holds them (bounds as [low, high] lists), or KnobError
    naming the first rule that is not one over ``keys`` setting declared ``knobs``."""
    if not isinstance(rules, (list, tuple)):
        raise KnobError(f"{BY_SHAPE_NAME} must be {_RULES}")
    out = []
    for i, rule in enumerate(rules):
        where = f"{BY_SHAPE_NAME}[{i}]"
        if not isinstance(rule, Mapping) or set(rule) != {"when", "knobs"}:
            raise KnobError(f"{where} must be a dict with the keys 'when' and 'knobs'")
        when, values = rule["when"], rule["knobs"]
        if not isinstance(when, Mapping) or not isinstance(values, Mapping):
            raise KnobError(f"{where}: 'when' and 'knobs' must be dicts")
        unknown = sorted(set(values) - knobs)
        if unknown:
            raise KnobError(f"{where} sets {', '.join(map(repr, unknown))}, which "
                            f"{TUNABLES_NAME} does not declare; set only declared knobs")
        for knob, value in values.items():
            _check_literal(knob, value)
        bounds = {}
        for key, pair in when.items():
            if key not in keys:
                raise KnobError(f"{where} bounds {key!r}, which is not in {SHAPE_KEYS_NAME} "
                                f"({', '.join(map(repr, keys)) or 'none declared'})")
            ok = isinstance(pair, (list, tuple)) and len(pair) == 2 and all(
                b is None or (isinstance(b, (int, float)) and not isinstance(b, bool))
                for b in pair)
            if not ok or (pair[0] is not None and pair[1] is not None and pair[0] >= pair[1]):
                raise KnobError(f"{where}: {key!r} must be bounded by [low, high] with low < "
                                f"high (numbers, or None for no bound), found {pair!r}")
            bounds[key] = list(pair)
        out.append({"when": bounds, "knobs": dict(values)})
    return out


def _splice(source: str, spans: Sequence[tuple[ast.expr, str]]) -> str:
    """``source`` with the text of each node replaced; every other byte stays as it was."""
    # ast columns are UTF-8 byte offsets, so splice the encoded text.
    data = source.encode("utf-8")
    starts = _line_offsets(data)
    cuts = []
    for node, text in spans:
        assert node.end_lineno is not None and node.end_col_offset is not None
        begin = starts[node.lineno - 1] + node.col_offset
        end = starts[node.end_lineno - 1] + node.end_col_offset
        cuts.append((begin, end, text.encode("utf-8")))
    for begin, end, encoded in sorted(cuts, reverse=True):
        data = data[:begin] + encoded + data[end:]
    return data.decode("utf-8")


def _wrapped(head: str, items: Sequence[str], tail: str, width: int = 99) -> list[str]:
    """``head`` + comma-separated ``items`` + ``tail``, broken into lines of at most ``width``
    characters (continuation lines indented under the first item)."""
    lines, line = [], head
    indent = " " * len(head)
    for i, item in enumerate(items):
        piece = item + ("," if i < len(items) - 1 else tail)
        if line != head and len(line) + len(piece) + 1 > width:
            lines.append(line.rstrip())
            line = indent
        line += piece + " "
    if not items:
        line += tail
    return lines + [line.rstrip()]


def _rules_text(rules: Sequence[Rule], notes: Sequence[str]) -> str:
    """TUNABLES_BY_SHAPE's literal: one rule a line pair, each after its note as a comment."""
    if not rules:
        return "[]"
    lines = ["["]
    for i, rule in enumerate(rules):
        if i < len(notes) and notes[i]:
            lines.append("    # " + " ".join(notes[i].split()))
        lines.append(f"    {{'when': {rule['when']!r},")
        items = [f"{k!r}: {v!r}" for k, v in rule["knobs"].items()]
        lines.extend(_wrapped("     'knobs': {", items, "}},"))
    lines.append("    # any other shape: TUNABLES")
    return "\n".join(lines + ["]"])


def rewrite_tunables(
    source: str,
    changes: Mapping[str, Knob],
    by_shape: Sequence[Rule] | None = None,
    notes: Sequence[str] = (),
) -> str:
    """``source`` with the given ``TUNABLES`` entries set to new literal values, all else intact;
    with ``by_shape``, its ``TUNABLES_BY_SHAPE`` replaced by those rules (``notes``: a comment
    above each)."""
    tree = _shared_tree(source)
    node = _module_dict(tree, TUNABLES_NAME)
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
    spans: list[tuple[ast.expr, str]] = [(nodes[k], repr(v)) for k, v in changes.items()]
    rules = None
    if by_shape is not None:
        rules_node = _module_literal(tree, BY_SHAPE_NAME, ast.List, _RULES)
        if rules_node is None:
            raise KnobError(f"kernel declares no module-level {BY_SHAPE_NAME} list; it cannot "
                            "run other knob values per shape")
        rules = check_rules(by_shape, set(nodes), read_shape_keys(source))
        spans.append((rules_node, _rules_text(rules, notes)))
    out = _splice(source, spans)
    got = read_tunables(out)
    expected = {k: _literal(v, TUNABLES_NAME, k) for k, v in nodes.items()} | dict(changes)
    if got != expected or (rules is not None and read_by_shape(out) != rules):  # pragma: no cover
        raise KnobError(f"rewriting {TUNABLES_NAME} produced {got}, expected {expected}")
    return out


def skeleton_sha(source: str) -> str:
    """A hash of the code with knob values (and per-shape rules) blanked: equal for kernels
    that differ only in those."""
    tree = _parse(source)
    node = _module_dict(tree, TUNABLES_NAME)
    if node is not None:
        node.values = [ast.Constant(value=None) for _ in node.values]
    rules = _module_literal(tree, BY_SHAPE_NAME, ast.List, _RULES)
    if rules is not None:
        rules.elts = []
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
