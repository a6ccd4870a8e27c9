"""The offline scientist's second structural move: a graft. Where a kernel of another family
(other code, not other knob values) was faster on some benchmarks than the base, the child is
the base with that whole kernel inlined, run on the shapes around those benchmarks.

The rule:

1. Donors are the passed kernels of other families that are not grafts themselves and whose
   ``KS_*`` declarations each equal the base's (none is fine). A benchmark goes to the donor
   with the lowest median on it, when that median beats the base's own by at least
   ``MIN_GAIN``.
2. Each such benchmark, most gained first, gets a box of shapes (a ``GRAFTS`` rule, at most
   ``MAX_GRAFTS``) unless an earlier box of the same donor holds it: on every shape key the box
   first spans the thresholds (``compose.threshold``) to the neighbouring values the benchmarks
   take, then bounds are dropped, key by key, low before high, while the box still holds only
   benchmarks won by its donor. So a box holds the shapes nearest its benchmark that no other
   benchmark contradicts, and a shape in no box runs the base.
3. The child: the base's source unchanged except that its ``custom_kernel`` is renamed
   ``_own_custom_kernel``; then each donor's code with every module-level name it binds (not its
   imports) prefixed ``_g_<id>_`` (``transplant``, scope-aware); then ``GRAFTS`` and a
   ``custom_kernel`` that runs the first rule's donor on a call whose shape (the base's
   ``shape_of(data)``) lies in its box, else the base's own.

Its knobs stay the base's (``TUNABLES``, its rules), so knob moves go on inside it; its
skeleton differs from the base's, so it starts a family of its own. ``own_source`` gives back
the base's source, so a link over the benchmarks the graft moved can be taken (``links.py``).
"""

from __future__ import annotations

import ast
import functools
import math
import symtable
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from pytest_kscientist.evolve.offline.compose import MAX_CLASSES, Bound, describe, holds, threshold
from pytest_kscientist.evolve.offline.knob_model import pct
from pytest_kscientist.evolve.offline.knobs import KnobError, _module_literal, skeleton_sha
from pytest_kscientist.evolve.roles import CandidateSummary, ExperimentPlan, Graft, TaskBrief
from pytest_kscientist.formats.declarations import assignments
from pytest_kscientist.formats.source_ast import parse

GRAFTS_NAME = "GRAFTS"
SHAPE_OF = "shape_of"
OWN = "_own_custom_kernel"
# The marker is data: grafted kernels in existing populations carry it (it names the module's
# path before the package took subpackages), so it keeps its text.
MARK = "# --- grafts, written by the offline scientist (pytest_kscientist/evolve/graft.py) ---"
MIN_GAIN = 0.03  # as compose.MIN_CLASS_GAIN: medians timed in different sessions drift
MAX_GRAFTS = MAX_CLASSES - 1


class GraftError(KnobError):
    """A kernel cannot be grafted onto a base, or a graft's source cannot be read."""


def prefix(kernel_id: str) -> str:
    return f"_g_{kernel_id}_"


def _module_defs(tree: ast.Module) -> set[str]:
    """Names a module binds at its top level by def or class."""
    return {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                        ast.ClassDef))}


_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
_SCOPES = (*_FUNCTIONS, ast.ClassDef, *_COMPREHENSIONS)


def _scope_nodes(body: Sequence[ast.AST]) -> list[ast.AST]:
    """The nodes of ``body`` its own scope evaluates: not inside a def or class body, a lambda
    or a comprehension (their defaults and decorators too: they bind no names)."""
    out: list[ast.AST] = []
    stack = list(body)
    while stack:
        node = stack.pop()
        out.append(node)
        if not isinstance(node, _SCOPES):
            stack.extend(ast.iter_child_nodes(node))
    return out


def _bound_here(node: ast.AST) -> list[str]:
    """The names ``node`` binds in the scope it runs in (imports aside)."""
    if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
        return [node.id]
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and node.name:
        return [node.name]
    if isinstance(node, ast.MatchMapping) and node.rest:
        return [node.rest]
    return []


def _module_bound(source: str) -> tuple[set[str], dict[str, str]]:
    """(names the module binds at module level other than only by import, names declared
    ``global`` anywhere included; imported name -> the import statement that binds it). A name
    both imported and assigned (``try: import x`` / ``except ImportError: x = None``) counts as
    imported. GraftError on a star import (what it binds cannot be read)."""
    tree = parse(source)
    nodes = _scope_nodes(tree.body)
    imports: dict[str, str] = {}
    for node in nodes:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name == "*":
                    raise GraftError(f"`{ast.unparse(node)}` binds names that cannot be read "
                                     "from the source; import the names it needs")
                name = alias.asname or alias.name.split(".")[0]
                imports[name] = ast.unparse(type(node)(**{**node.__dict__, "names": [alias]}))
    bound = {n for node in nodes for n in _bound_here(node)}
    bound |= {n for node in ast.walk(tree) if isinstance(node, ast.Global) for n in node.names}
    return bound - set(imports), imports


def _builtins_read(source: str, bound: set[str]) -> set[str]:
    """Names the module's code reads as globals without binding them (builtins, or errors)."""
    out: set[str] = set()

    def walk(table: symtable.SymbolTable) -> None:
        for sym in table.get_symbols():
            name = sym.get_name()
            if name in bound:
                continue
            if table.get_type() == "module":
                if sym.is_referenced() and not sym.is_assigned() and not sym.is_imported():
                    out.add(name)
            elif sym.is_global() and sym.is_referenced():
                out.add(name)
        for child in table.get_children():
            walk(child)

    walk(symtable.symtable(source, "<kernel>", "exec"))
    return out


def _class_reads_its_own(tree: ast.Module, names: set[str]) -> set[str]:
    """Module-level names a class body reads in or before the statement that first binds them
    there: Python reads the module's binding then, the class's after, and no renaming keeps
    both (a read after the binding is the class's own: left as it is)."""
    out: set[str] = set()
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        first: dict[str, int] = {}
        for i, stmt in enumerate(cls.body):
            for node in _scope_nodes([stmt]):
                for name in _bound_here(node):
                    first.setdefault(name, i)
        for i, stmt in enumerate(cls.body):
            out |= {n.id for n in _scope_nodes([stmt]) if isinstance(n, ast.Name)
                    and isinstance(n.ctx, ast.Load) and n.id in names and i <= first.get(
                        n.id, -1)}
    return out


def _comprehension_targets(tree: ast.Module) -> set[str]:
    """Names the module's comprehensions (at module level) bind."""
    return {n.id for node in _scope_nodes(tree.body)
            if isinstance(node, _COMPREHENSIONS)
            for gen in node.generators for n in ast.walk(gen.target) if isinstance(n, ast.Name)}


class _Renamer(ast.NodeTransformer):
    """Prefixes the names in ``names`` wherever they refer to the module's binding, scope by
    scope as ``symtable`` resolves them (a parameter or local of the same name is left)."""

    # Python 3.12 inlines comprehensions: symtable gives them no scope of their own (PEP 709)
    SCOPES = _SCOPES if sys.version_info < (3, 12) else (*_FUNCTIONS, ast.ClassDef)
    TABLE_NAMES = {ast.Lambda: "lambda", ast.ListComp: "listcomp", ast.SetComp: "setcomp",
                   ast.DictComp: "dictcomp", ast.GeneratorExp: "genexpr"}

    def __init__(self, table: symtable.SymbolTable, names: set[str], pre: str) -> None:
        self.tables = [table]
        self.pending: list[list[symtable.SymbolTable]] = [list(table.get_children())]
        self.names, self.pre = names, pre

    def _module_ref(self, name: str) -> bool:
        if name not in self.names:
            return False
        if len(self.tables) == 1:
            return True
        table = self.tables[-1]
        try:
            sym = table.lookup(name)
        except KeyError:
            return True
        if table.get_type() == "class":
            return not sym.is_local() and not sym.is_free()
        return sym.is_global()

    def _visit_all(self, node: ast.AST, fields: Sequence[str]) -> None:
        for field in fields:
            value = getattr(node, field, None)
            if isinstance(value, list):
                setattr(node, field, [self.visit(v) if v is not None else None for v in value])
            elif isinstance(value, ast.AST):
                setattr(node, field, self.visit(value))

    def _child(self, node: ast.AST) -> symtable.SymbolTable:
        """The scope's table: the first not yet taken of the enclosing scope's children with
        its name and line (matched by both, not by order alone)."""
        name = getattr(node, "name", None) or self.TABLE_NAMES[type(node)]
        for i, child in enumerate(self.pending[-1]):
            if child.get_name() == name and child.get_lineno() == node.lineno:  # type: ignore[attr-defined]
                return self.pending[-1].pop(i)
        raise GraftError(f"no scope {name!r} at line {node.lineno} in the symbol table; "  # type: ignore[attr-defined]
                         "this Python's symtable differs from what graft.py reads")

    def _enter(self, node: ast.AST) -> Any:
        """Visit what the enclosing scope evaluates of ``node`` (defaults, annotations,
        decorators, bases, a comprehension's first iterable), then its body in its own scope."""
        if isinstance(node, _FUNCTIONS):
            args = node.args
            self._visit_all(args, ["defaults", "kw_defaults"])
            if not isinstance(node, ast.Lambda):
                for a in args.posonlyargs + args.args + args.kwonlyargs + [
                        x for x in (args.vararg, args.kwarg) if x is not None]:
                    self._visit_all(a, ["annotation"])
                self._visit_all(node, ["returns", "decorator_list"])
        elif isinstance(node, ast.ClassDef):
            self._visit_all(node, ["bases", "keywords", "decorator_list"])
        else:
            self._visit_all(node.generators[0], ["iter"])
        table = self._child(node)  # found by the name the donor gave it
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and (
                len(self.tables) == 1 and node.name in self.names):
            node.name = self.pre + node.name
        self.tables.append(table)
        self.pending.append(list(table.get_children()))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            node.body = [self.visit(s) for s in node.body]
        elif isinstance(node, ast.Lambda):
            node.body = self.visit(node.body)
        else:
            first = node.generators[0]
            self._visit_all(first, ["target", "ifs"])
            for g in node.generators[1:]:
                self.visit(g)
            self._visit_all(node, ["key", "value"] if isinstance(node, ast.DictComp) else ["elt"])
        self.tables.pop()
        self.pending.pop()
        return node

    def visit(self, node: ast.AST) -> Any:
        if isinstance(node, self.SCOPES):
            return self._enter(node)
        if isinstance(node, _COMPREHENSIONS) and self.tables[-1].get_type() == "class":
            return self._class_comprehension(node)
        return super().visit(node)

    def _class_comprehension(self, node: ast.AST) -> Any:
        """Python 3.12+: a comprehension in a class body has no table of its own, yet, as
        before, it sees the module's names, not the class's (its first iterable aside)."""
        gens = node.generators  # type: ignore[attr-defined]
        self._visit_all(gens[0], ["iter"])
        targets = {n.id for g in gens for n in ast.walk(g.target) if isinstance(n, ast.Name)}
        for sub in ast.walk(node):
            if sub is gens[0].iter or any(sub is x for x in ast.walk(gens[0].iter)):
                continue
            if isinstance(sub, ast.Name) and sub.id in self.names and sub.id not in targets:
                sub.id = self.pre + sub.id
        return node

    def visit_Name(self, node: ast.Name) -> ast.Name:
        if self._module_ref(node.id):
            node.id = self.pre + node.id
        return node

    def _bind(self, node: ast.AST) -> ast.AST:
        """Names bound as strings (``except E as x``, match captures), not as Name nodes."""
        self.generic_visit(node)
        for field in ("name", "rest"):
            value = getattr(node, field, None)
            if isinstance(value, str) and self._module_ref(value):
                setattr(node, field, self.pre + value)
        return node

    visit_ExceptHandler = visit_MatchAs = visit_MatchStar = visit_MatchMapping = _bind

    def visit_Global(self, node: ast.Global) -> ast.Global:
        node.names = [self.pre + n if n in self.names else n for n in node.names]
        return node


def transplant(donor: str, kernel_id: str, base: str) -> str:
    """``donor``'s code to be appended to ``base``: every name it binds at module level other
    than by import prefixed ``_g_<id>_`` (where it refers to that binding), its ``from
    __future__`` imports dropped (``base`` must make each), its docstring kept as a comment (its
    first three lines). GraftError
    when an import of the donor would rebind a name of the base to something else."""
    try:
        tree = parse(donor)
        table = symtable.symtable(donor, "<donor>", "exec")
        base_tree = parse(base)
    except SyntaxError as e:
        raise GraftError(f"a graft needs sources that parse: {e}") from e
    names, imports = _module_bound(donor)
    base_names, base_imports = _module_bound(base)
    futures = {a.name for n in tree.body if isinstance(n, ast.ImportFrom)
               and n.module == "__future__" for a in n.names}
    base_futures = {a.name for n in base_tree.body if isinstance(n, ast.ImportFrom)
                    and n.module == "__future__" for a in n.names}
    if not futures <= base_futures:
        raise GraftError(f"kernel {kernel_id} imports {sorted(futures)} from __future__ and the "
                         f"base {sorted(base_futures)}: the base must make each of its imports")
    base_reads = {n.id for n in ast.walk(base_tree) if isinstance(n, ast.Name)}
    for name, stmt in imports.items():
        if name in futures:
            continue
        if base_imports.get(name, stmt) != stmt or name in base_names or (
                name in base_reads and name not in base_imports):
            raise GraftError(
                f"kernel {kernel_id}'s `{stmt}` would rebind `{name}`, which the base binds or "
                f"reads otherwise; graft it onto a base that imports `{name}` the same way")
    shadowed = _builtins_read(donor, names | set(imports)) & (base_names | set(base_imports))
    if shadowed:
        raise GraftError(f"kernel {kernel_id} reads {sorted(shadowed)} as builtins, which the "
                         "base binds at module level; the graft would hand it the base's")
    for why, found in (("a class body binds and reads", _class_reads_its_own(tree, names)),
                       ("a module-level comprehension binds",
                        _comprehension_targets(tree) & names)):
        if found:
            raise GraftError(f"in kernel {kernel_id}, {why} {sorted(found)}, also module-level "
                             "names: renaming cannot keep what they read")
    pre = prefix(kernel_id)
    clash = {pre + n for n in names} & (base_names | set(base_imports))
    if clash:
        raise GraftError(f"the base already binds {sorted(clash)}; it cannot take kernel "
                         f"{kernel_id}'s names")
    body = []
    for i, node in enumerate(tree.body):
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            continue
        if i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and (
                isinstance(node.value.value, str)):
            continue
        body.append(node)
    doc = ast.get_docstring(tree) or ""
    renamer = _Renamer(table, names, pre)
    tree.body = [renamer.visit(node) for node in body]
    head = "".join(f"# {line}".rstrip() + "\n" for line in doc.splitlines()[:3])
    return head + ast.unparse(tree) + "\n"


def read_grafts(source: str) -> list[dict[str, Any]] | None:
    """The module-level ``GRAFTS`` literal (None when the kernel binds none)."""
    node = _module_literal(parse(source), GRAFTS_NAME, ast.List,
                           "a list literal of {'when': {...}, 'kernel': id} rules")
    if node is None:
        return None
    try:
        rules = ast.literal_eval(node)
    except ValueError as e:
        raise GraftError(f"{GRAFTS_NAME} must be written out literally: {e}") from e
    return rules


def own_source(source: str) -> str | None:
    """The base a graft was made from (its source before ``MARK``, its kernel named
    ``custom_kernel`` again, ending in one newline), or None when ``source`` is no graft."""
    head, mark, _ = source.partition("\n" + MARK + "\n")
    if not mark:
        return None
    head = head.rstrip("\n") + "\n"
    tree = parse(head)
    lines = head.splitlines(keepends=True)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == OWN:
            line = lines[node.lineno - 1]
            lines[node.lineno - 1] = line.replace(f"def {OWN}(", "def custom_kernel(", 1)
            return "".join(lines)
    return None


def graft_source(base: str, grafts: Sequence[Graft], entry: str = "custom_kernel") -> str:
    """The child's source (rule 3)."""
    tree = parse(base)
    if SHAPE_OF not in _module_defs(tree) or entry not in _module_defs(tree):
        raise GraftError(f"a graft's base must define `{entry}(data)` and `{SHAPE_OF}(data)` "
                         "(the call's shape as the task's case keys) at module level")
    if read_grafts(base) is not None or MARK in base:
        raise GraftError("the base is a graft already; graft onto the kernel it was made from")
    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == entry]
    reads = [n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == entry]
    base_names, base_imports = _module_bound(base)
    taken = {OWN, GRAFTS_NAME, "_GRAFTED"} & (base_names | set(base_imports))
    lines = base.splitlines(keepends=True)
    line = lines[defs[-1].lineno - 1] if defs else ""
    if len(defs) != 1 or reads or taken or f"def {entry}(" not in line:
        raise GraftError(
            f"a graft renames the base's `def {entry}(` to `{OWN}` and binds {GRAFTS_NAME} and "
            f"_GRAFTED: the base must define {entry} once, as a plain `def {entry}(` on one "
            f"line, never name it elsewhere, and bind none of those names (found "
            f"{len(defs)} definition(s), {len(reads)} other use(s), {sorted(taken)} bound)")
    lines[defs[0].lineno - 1] = line.replace(f"def {entry}(", f"def {OWN}(", 1)
    parts = ["".join(lines).rstrip("\n") + "\n\n\n" + MARK + "\n"]
    seen: dict[str, None] = {}
    for g in grafts:  # each donor is checked against the base and the donors before it
        if g.kernel not in seen:
            seen[g.kernel] = None
            parts.append(f"\n# kernel {g.kernel}, its module-level names prefixed "
                         f"{prefix(g.kernel)}\n" + transplant(g.source, g.kernel, "".join(parts)))
    rules = "".join(
        (f"    # {g.note}\n" if g.note else "")
        + f"    {{'when': {_when_text(g.when)}, 'kernel': {g.kernel!r}}},\n" for g in grafts)
    kernels = ", ".join(f"{k!r}: {prefix(k)}{entry}" for k in seen)
    parts.append(
        f"\n\n# The first rule whose bounds hold for the call's shape (low <= value < high, None:"
        f"\n# no bound) runs that kernel; any other shape runs this file's own.\n"
        f"{GRAFTS_NAME} = [\n{rules}]\n"
        f"_GRAFTED = {{{kernels}}}\n\n\n"
        f"def {entry}(data):\n"
        f'    """The grafted kernel of the first rule that holds for the call\'s shape, else '
        f'{OWN}."""\n'
        f"    shape = {SHAPE_OF}(data)\n"
        f"    for rule in {GRAFTS_NAME}:\n"
        f"        if all((low is None or low <= shape[key]) and (high is None or shape[key] < "
        f"high)\n"
        f"               for key, (low, high) in rule['when'].items()):\n"
        f"            return _GRAFTED[rule['kernel']](data)\n"
        f"    return {OWN}(data)\n")
    source = "".join(parts)
    compile(source, "<graft>", "exec", dont_inherit=True)  # noqa: S102 - a check, not a run
    return source


def _when_text(when: Mapping[str, Bound]) -> str:
    return "{" + ", ".join(f"{k!r}: [{lo!r}, {hi!r}]" for k, (lo, hi) in when.items()) + "}"


@functools.lru_cache(maxsize=4096)
def _donor_facts(source: str) -> tuple[str, bool, frozenset[tuple[str, str]]] | None:
    """(skeleton, whether a graft, its ``KS_*`` declarations) of a source, read once: the
    designer asks it of every member each generation; None when it does not read."""
    try:
        tree = parse(source)
        family, grafted = skeleton_sha(source), MARK in source or read_grafts(source) is not None
    except (KnobError, SyntaxError):
        return None
    declared = frozenset((name, ast.unparse(value)) for name, value, _ in assignments(tree)
                         if name.startswith("KS_"))
    return family, grafted, declared


def donors(base: CandidateSummary, family: str,
           population: Sequence[CandidateSummary]) -> list[CandidateSummary]:
    """Rule 1's donors for ``base`` (of ``family``), in population order."""
    facts = _donor_facts(base.source)
    want = dict(facts[2]) if facts else {}
    out = []
    for c in population:
        if c.id == base.id or c.status != "passed" or not c.bench_median_us:
            continue
        found = _donor_facts(c.source)
        if found is None or found[0] == family or found[1]:
            continue
        if all(want.get(k) == v for k, v in found[2]):
            out.append(c)
    return out


def box(target: str, inside: set[str], cases: Mapping[str, Mapping[str, Any]],
        keys: Sequence[str]) -> dict[str, Bound] | None:
    """Rule 2's box around ``target``, holding only benchmarks of ``inside``; None when even
    the first box holds another (benchmarks alike on every key)."""
    when: dict[str, Bound] = {}
    for key in keys:
        values = sorted({cases[b][key] for b in cases})
        i = values.index(cases[target][key])
        when[key] = (threshold(values[i - 1], values[i]) if i > 0 else None,
                     threshold(values[i], values[i + 1]) if i + 1 < len(values) else None)
    if not all(b in inside for b in cases if holds(when, cases[b])):
        return None
    for key in keys:
        for side in (0, 1):
            lo, hi = when[key]
            trial = {**when, key: (None, hi) if side == 0 else (lo, None)}
            if all(b in inside for b in cases if holds(trial, cases[b])):
                when = trial
    return {k: v for k, v in when.items() if v != (None, None)}


def plan(task: TaskBrief, base: CandidateSummary, family: str, keys: Sequence[str],
         population: Sequence[CandidateSummary], spread: float) -> tuple[ExperimentPlan | None,
                                                                            str]:
    """The graft move from ``base`` (rules 1-2) and a findings line naming what other families
    win, or (None, "") when none wins a benchmark by ``MIN_GAIN`` or the base cannot take one."""
    tree = parse(base.source)
    if SHAPE_OF not in _module_defs(tree) or task.entry not in _module_defs(tree) or (
            MARK in base.source):
        return None, ""
    cases = {b: task.benchmark_cases[b] for b in base.bench_median_us
             if b in task.benchmark_cases and base.bench_median_us[b] > 0}
    keys = [k for k in keys if all(isinstance(c.get(k), (int, float))
                                   and not isinstance(c.get(k), bool) for c in cases.values())]
    if not cases or not keys:
        return None, ""
    won: dict[str, tuple[float, CandidateSummary]] = {}
    for d in donors(base, family, population):
        for b in cases:
            t = d.bench_median_us.get(b, 0)
            gain = math.log(base.bench_median_us[b] / t) if t > 0 else -math.inf
            if gain >= math.log1p(MIN_GAIN) and gain > won.get(b, (-math.inf, d))[0]:
                won[b] = (gain, d)
    if not won:
        return None, ""
    learned = "- faster elsewhere than in this family: " + "; ".join(
        f"{x} {won[x][1].id} ({pct(won[x][0]):+.0f}%)" for x in sorted(won))
    grafts: list[Graft] = []
    boxes: list[dict[str, Bound]] = []
    for b in sorted(won, key=lambda b: -won[b][0]):
        donor = won[b][1]
        if any(holds(w, cases[b]) for w in boxes) or len(grafts) >= MAX_GRAFTS:
            continue
        inside = {x for x in won if won[x][1].id == donor.id}
        when = box(b, inside, cases, keys)
        if when is None:
            continue
        held = [x for x in cases if holds(when, cases[x])]
        gains = [won[x][0] for x in held]
        note = (f"{describe(when)}: {donor.id}, {pct(sum(gains) / len(gains)):+.0f}% on "
                f"{', '.join(held)} by the medians")
        boxes.append(when)
        grafts.append(Graft(when=when, kernel=donor.id, source=donor.source, note=note))
    if not grafts:
        return None, learned
    moved = {x for x in cases if any(holds(w, cases[x]) for w in boxes)}
    for x in moved:  # the first box that holds a benchmark runs it; each holds only its own
        first = next(g for g, w in zip(grafts, boxes, strict=True) if holds(w, cases[x]))
        assert won[x][1].id == first.kernel, (x, first.kernel)
    share = len(moved) / len(cases)
    gain = sum(won[x][0] for x in moved) / len(moved)
    low, high = pct(share * (gain - spread)), pct(share * (gain + spread))
    title = "graft: " + "; ".join(f"{describe(g.when)} {g.kernel}" for g in grafts)
    try:
        graft_source(base.source, grafts, task.entry)
    except (GraftError, SyntaxError, ValueError) as e:
        return None, learned + f" (not grafted: {e})"
    return ExperimentPlan(
        title=title,
        changes=(
            f"{base.id} with whole kernels of other families on the shapes around the "
            f"benchmarks they won: {'; '.join(g.note for g in grafts)}; predicted "
            f"{pct(share * gain):+.1f}% ({low:+.1f}..{high:+.1f}%) on the geomean over "
            f"{base.id}, from medians timed in different sessions"),
        expected_gain_min_pct=round(low, 2),
        expected_gain_max_pct=round(high, 2),
        innovation=round(10.0 * share, 2),
        grafts=grafts,
    ), learned
