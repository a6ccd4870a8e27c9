"""bench/ reaches the package only through ``pytest_kscientist.api`` (issue 29), and that API
imports no torch."""

from __future__ import annotations

import ast
import re
import subprocess
import sys

import pytest
from helpers import REPO

BENCH = REPO / "bench"
API = "pytest_kscientist.api"
# Python inside a shell script: a here-document fed to `python3 -` (after the command's
# continued lines), or `python3 -c '...'`.
HEREDOC = re.compile(r"python3? - [^\n]*<<'?(\w+)'?(?:[^\n]*\\\n)*[^\n]*\n(.*?)\n\1\n", re.S)
INLINE = re.compile(r"python3? -c '([^']*)'")


def _sources() -> list[tuple[str, str]]:
    """(label, Python source) for every bench script and the Python inside its shell scripts."""
    found = [(p.name, p.read_text(encoding="utf-8")) for p in sorted(BENCH.glob("*.py"))]
    for sh in sorted(BENCH.glob("*.sh")):
        text = sh.read_text(encoding="utf-8")
        found += [(f"{sh.name}:{text[:m.start()].count(chr(10)) + 1}", m.group(2))
                  for m in HEREDOC.finditer(text)]
        found += [(f"{sh.name}:{text[:m.start()].count(chr(10)) + 1}", m.group(1))
                  for m in INLINE.finditer(text)]
    return found


def _package_imports(source: str) -> list[str]:
    """Every module of the package an import statement in ``source`` names."""
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names += ([f"{node.module}.{a.name}" for a in node.names]
                      if node.module == "pytest_kscientist" else [node.module])
    return [n for n in names if n.split(".")[0] == "pytest_kscientist"]


def test_the_scan_finds_the_scripts_and_the_python_in_the_runbook() -> None:
    labels = [label for label, _ in _sources()]
    assert "summarize.py" in labels and "transport.py" in labels
    inline = [source for label, source in _sources() if label.startswith("h200_runbook.sh:")]
    assert any(API in source for source in inline), "the runbook's inline step was not found"
    assert _package_imports("from pytest_kscientist.harness import stats\n"
                            "import pytest_kscientist.api\nfrom pytest_kscientist import api\n"
                            ) == ["pytest_kscientist.harness", API, API]


@pytest.mark.parametrize(("label", "source"), _sources(), ids=[label for label, _ in _sources()])
def test_a_bench_script_imports_only_the_api_of_the_package(label: str, source: str) -> None:
    wrong = [name for name in _package_imports(source) if name != API]
    assert not wrong, (f"bench/{label} imports {wrong}; import from {API} instead (add the name "
                       "there, with its contract, if it is missing)")


def test_the_api_imports_no_torch_and_names_what_it_exports() -> None:
    code = ("import sys, pytest_kscientist.api as api; "
            "print('torch' in sys.modules, sorted(set(api.__all__) - set(dir(api))))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "[]"], proc.stdout
