"""The front door tells the truth (issue 29): the README is a quick start whose commands are the
ones CI runs, the options reference is the option tables, every flag and link the docs name
exists, every bench script is indexed, and a bare `pytest` runs the test suite."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from helpers import REPO

from pytest_kscientist.evolve.llm.llm_options import LLM_OPTIONS
from pytest_kscientist.evolve.run_options import EVOLVE_OPTIONS
from pytest_kscientist.options import CORE_OPTIONS, markdown

PAGES = [REPO / "README.md", REPO / "ARCHITECTURE.md", REPO / "bench" / "README.md",
         *sorted((REPO / "docs").glob("*.md"))]
FLAGS = {o.flag for o in (*CORE_OPTIONS, *EVOLVE_OPTIONS, *LLM_OPTIONS)}


def test_the_options_page_is_the_option_tables() -> None:
    page = (REPO / "docs" / "options.md").read_text(encoding="utf-8")
    assert page == markdown(), (
        "docs/options.md differs from the option tables; regenerate it with "
        "`python -m pytest_kscientist.options --markdown > docs/options.md`")


def test_the_options_page_lists_every_flag_once() -> None:
    page = (REPO / "docs" / "options.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `(--[\w-]+)", page, re.M)
    assert sorted(rows) == sorted(FLAGS)


def test_the_readme_is_a_quick_start_whose_commands_ci_runs() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 200
    first_block = readme.split("```")[1]
    commands = [line.split("#")[0].strip() for line in first_block.strip().splitlines()]
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    ci_tests = [line.strip() for line in ci if line.strip().startswith("pytest")]
    assert commands == ['pip install -e ".[test]" && pytest --evolve 3 tasks/fp8_gemm',
                        *ci_tests], commands
    for page in ("options", "formats", "timing", "evolve", "measurements"):
        assert f"(docs/{page}.md" in readme, f"the README does not link docs/{page}.md"


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return {_slug(h) for h in re.findall(r"^#+ (.+)$", text, re.M)}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_link_of_the_docs_resolves(page: Path) -> None:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if target.startswith(("http://", "https://")):
            continue
        path, _, anchor = target.partition("#")
        where = (page.parent / path).resolve() if path else page
        if not where.exists():
            broken.append(f"{target}: no such file")
        elif anchor and where.suffix == ".md" and anchor not in _anchors(where):
            broken.append(f"{target}: no heading '#{anchor}' in {where.name}")
    assert not broken, broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_flag_the_docs_name_exists(page: Path) -> None:
    named = set(re.findall(r"(?<![\w-])(--(?:ks-[a-z0-9]+(?:-[a-z0-9]+)*|kernel|evolve))\b",
                           page.read_text(encoding="utf-8")))
    assert named - FLAGS == set(), f"{page.name} names flags no option table has"


def test_bench_readme_indexes_every_script() -> None:
    index = (REPO / "bench" / "README.md").read_text(encoding="utf-8")
    scripts = sorted(p.name for p in (REPO / "bench").iterdir()
                     if p.suffix in (".py", ".sh"))
    missing = [name for name in scripts if f"`{name}`" not in index]
    assert not missing, f"bench/README.md does not list {missing}: add a row for each"


def test_a_bare_pytest_runs_the_test_suite_not_the_tasks(pytester: pytest.Pytester) -> None:
    shutil.copy(REPO / "pyproject.toml", pytester.path / "pyproject.toml")
    pytester.mkdir("tests")
    (pytester.path / "tests" / "test_suite.py").write_text("def test_suite():\n    pass\n")
    (pytester.path / "tasks" / "toy").mkdir(parents=True)
    (pytester.path / "tasks" / "toy" / "test_task.py").write_text("def test_task():\n    pass\n")
    bare = pytester.runpytest("--collect-only", "-q", "-p", "no:cacheprovider")
    bare.stdout.fnmatch_lines(["tests/test_suite.py::test_suite", "1 test collected*"])
    named = pytester.runpytest("tasks", "--collect-only", "-q", "-p", "no:cacheprovider")
    named.stdout.fnmatch_lines(["tasks/toy/test_task.py::test_task", "1 test collected*"])
