"""Reading and rewriting TUNABLES through the ast (``pytest_kscientist.evolve.offline.knobs``)."""

from __future__ import annotations

import ast
import keyword
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_kscientist.evolve.offline.knobs import (
    KnobError,
    moves,
    paired_moves,
    read_space,
    read_tunables,
    rewrite_tunables,
    skeleton_sha,
)

SEED = Path(__file__).parent.parent / "tasks" / "fp8_gemm" / "seeds" / "torch_dequant.py"


def test_reads_the_fp8_seed() -> None:
    source = SEED.read_text()
    assert read_tunables(source) == {"k_group": 1, "m_chunk": 0}
    assert read_space(source)["k_group"] == [0, 1, 2, 4, 8, 16]


def test_rewrite_changes_only_the_value_text() -> None:
    source = SEED.read_text()
    out = rewrite_tunables(source, {"m_chunk": 64})
    assert read_tunables(out) == {"k_group": 1, "m_chunk": 64}
    assert out.replace('"m_chunk": 64}', '"m_chunk": 0}') == source


def test_rewrite_keeps_comments_layout_and_non_ascii_text() -> None:
    source = (
        '"""Noyau à réglages: ünïcode before the dict shifts byte columns."""\n'
        "X = 'é'; TUNABLES = {  # knobs\n"
        "    'a': -1,   # négatif\n"
        "    'b': (1,\n"
        "          2),\n"
        "    'c': 'wörd',\n"
        "}\n"
        "TUNABLE_SPACE = {'a': [-1, 0]}\n"
    )
    out = rewrite_tunables(source, {"a": 0, "b": 7, "c": "ß"})
    assert read_tunables(out) == {"a": 0, "b": 7, "c": "ß"}
    assert "# négatif" in out and "# knobs" in out and "X = 'é'" in out
    assert out.count("\n") == source.count("\n") - 1  # only the (1,\n 2) span shrank


def test_module_without_tunables_reads_empty_and_refuses_rewrite() -> None:
    assert read_tunables("x = 1\n") == {}
    assert read_space("x = 1\n") == {}
    with pytest.raises(KnobError, match="declares no module-level TUNABLES"):
        rewrite_tunables("x = 1\n", {"a": 1})


@pytest.mark.parametrize(
    ("source", "changes", "message"),
    [
        ("TUNABLES = {'a': 1}\n", {"b": 2}, "has no knob 'b'"),
        ("TUNABLES = dict(a=1)\n", {"a": 2}, "must be a dict literal"),
        ("TUNABLES = {'a': f(1)}\n", {"a": 2}, "must be a literal value"),
        ("TUNABLES = {1: 1}\n", {"a": 2}, "keys must be string literals"),
        ("TUNABLES = {'a': 1}\n", {"a": object()}, "is not a plain literal"),
        ("TUNABLES = {'a': 1}\n", {"a": float("nan")}, "is not a plain literal"),
        ("TUNABLES = {'a': 1\n", {"a": 2}, "does not parse"),
    ],
)
def test_rewrite_errors_name_the_problem(source: str, changes: dict, message: str) -> None:
    with pytest.raises(KnobError, match=message):
        rewrite_tunables(source, changes)


def test_space_values_must_be_lists() -> None:
    with pytest.raises(KnobError, match="non-empty list"):
        read_space("TUNABLE_SPACE = {'a': 3}\n")


def test_last_assignment_wins_and_annotated_assignment_counts() -> None:
    source = "TUNABLES: dict = {'a': 1}\nTUNABLES = {'a': 2}\n"
    assert read_tunables(source) == {"a": 2}
    assert rewrite_tunables(source, {"a": 3}) == "TUNABLES: dict = {'a': 1}\nTUNABLES = {'a': 3}\n"


def test_skeleton_ignores_knob_values_only() -> None:
    a = "TUNABLES = {'a': 1}\ndef f():\n    return 1\n"
    assert skeleton_sha(a) == skeleton_sha(rewrite_tunables(a, {"a": 5}))
    assert skeleton_sha(a) != skeleton_sha(a.replace("return 1", "return 2"))


def test_moves_are_neighbours_and_pairs_touch_two_knobs() -> None:
    space = {"a": [1, 2, 4, 8], "b": [0, 1]}
    values = {"a": 2, "b": 0}
    assert list(moves(values, space)) == [{"a": 1}, {"a": 4}, {"b": 1}]
    assert {"a": 8} in list(moves(values, space, steps=2))
    assert list(paired_moves(values, space)) == [{"a": 1, "b": 1}, {"a": 4, "b": 1}]
    # a value outside the space: every listed value is a move
    assert list(moves({"a": 3}, {"a": [1, 2]})) == [{"a": 1}, {"a": 2}]


names = st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=8).filter(
    lambda s: not keyword.iskeyword(s)
)
literals = st.one_of(
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
    st.none(),
    st.text(max_size=6),
)


@settings(max_examples=150, deadline=None)
@given(
    knobs=st.dictionaries(names, literals, min_size=1, max_size=5),
    new=st.lists(literals, min_size=5, max_size=5),
    layout=st.sampled_from(["one-line", "multi-line", "commented"]),
    # Kernel sources are UTF-8 files: no lone surrogates (Cs), which ast.parse cannot encode
    # (hypothesis found '# \ud800' in CI).
    prefix=st.text(st.characters(exclude_characters="\x00\r\n", exclude_categories=("Cs",)),
                   max_size=10).map(
        lambda s: f"# {s}\n"
    ),
    pick=st.integers(0, 31),
)
def test_rewrite_round_trips(knobs: dict, new: list, layout: str, prefix: str, pick: int) -> None:
    items = [f"{k!r}: {v!r}" for k, v in knobs.items()]
    if layout == "one-line":
        body = "{" + ", ".join(items) + "}"
    elif layout == "multi-line":
        body = "{\n" + "".join(f"    {i},\n" for i in items) + "}"
    else:
        body = "{  # é\n" + "".join(f"    {i},  # ü {n}\n" for n, i in enumerate(items)) + "}"
    source = f"{prefix}import os\nTUNABLES = {body}\n\ndef custom_kernel(d):\n    return d\n"
    keys = list(knobs)
    changes = {k: new[i] for i, k in enumerate(keys) if pick >> i & 1}
    out = rewrite_tunables(source, changes)
    ast.parse(out)
    assert read_tunables(out) == knobs | changes
    head, tail = source.split("TUNABLES = ", 1)[0], source.rsplit("}", 1)[1]
    assert out.startswith(head) and out.endswith(tail)
    assert rewrite_tunables(out, {k: knobs[k] for k in changes}) == rewrite_tunables(source, {})


SHAPED = (
    '"""Knobs per class of shapes."""\n'
    "TUNABLES = {'a': 1, 'b': 'x'}  # defaults\n"
    "SHAPE_KEYS = ['m', 'k']\n"
    "TUNABLES_BY_SHAPE = []  # rules\n"
    "def custom_kernel(d):\n"
    "    return d\n"
)


def test_per_shape_rules_read_and_rewrite_leaving_the_rest_intact() -> None:
    from pytest_kscientist.evolve.offline.knobs import read_by_shape, read_shape_keys

    assert read_by_shape(SEED.read_text()) is None  # declares none: cannot dispatch per shape
    assert read_shape_keys(SEED.read_text()) == []
    assert (read_by_shape(SHAPED), read_shape_keys(SHAPED)) == ([], ["m", "k"])
    rules = [{"when": {"m": (None, 2509), "k": [725, None]}, "knobs": {"a": 2}},
             {"when": {"m": [0.5, 9.5]}, "knobs": {"a": 3, "b": "y"}}]
    out = rewrite_tunables(SHAPED, {"b": "z"}, rules, ["m < 2509, k >= 725: c0002's", ""])
    assert read_tunables(out) == {"a": 1, "b": "z"}
    assert read_by_shape(out) == [
        {"when": {"m": [None, 2509], "k": [725, None]}, "knobs": {"a": 2}},
        {"when": {"m": [0.5, 9.5]}, "knobs": {"a": 3, "b": "y"}}]
    assert "    # m < 2509, k >= 725: c0002's\n" in out and "  # rules\n" in out
    assert skeleton_sha(out) == skeleton_sha(SHAPED)  # the same code: one family
    assert rewrite_tunables(out, {"b": "x"}, []) == SHAPED  # back to no rules, byte for byte


@pytest.mark.parametrize(
    ("rules", "message"),
    [
        ({"when": {}}, "must be a list literal of"),
        ([{"when": {}, "knobs": {"c": 1}}], r"TUNABLES_BY_SHAPE\[0\] sets 'c', which TUNABLES"),
        ([{"when": {"n": [1, 2]}, "knobs": {}}], "bounds 'n', which is not in SHAPE_KEYS"),
        ([{"when": {"m": [4, 2]}, "knobs": {}}], r"low < high .* found \[4, 2\]"),
        ([{"when": {"m": [1]}, "knobs": {}}], "must be bounded by"),
        ([{"when": {"m": [True, 2]}, "knobs": {}}], "must be bounded by"),
        ([{"when": {}, "knobs": {"a": [1]}}], "is not a plain literal"),
        ([{"when": {}}], "must be a dict with the keys 'when' and 'knobs'"),
    ],
)
def test_bad_per_shape_rules_are_refused_with_the_rule_named(rules: object, message: str) -> None:
    with pytest.raises(KnobError, match=message):
        rewrite_tunables(SHAPED, {}, rules)  # type: ignore[arg-type]


def test_per_shape_rules_need_a_kernel_that_declares_them() -> None:
    from pytest_kscientist.evolve.offline.knobs import read_by_shape

    with pytest.raises(KnobError, match="declares no module-level TUNABLES_BY_SHAPE list"):
        rewrite_tunables(SEED.read_text(), {}, [{"when": {}, "knobs": {"k_group": 2}}])
    with pytest.raises(KnobError, match="TUNABLES_BY_SHAPE must be a list literal"):
        read_by_shape("TUNABLES = {'a': 1}\nTUNABLES_BY_SHAPE = rules()\n")
    with pytest.raises(KnobError, match="written with literal values only"):
        read_by_shape("TUNABLES = {'a': 1}\nTUNABLES_BY_SHAPE = [x]\n")
