"""GPU MODE ``reference-kernels`` problem folders as tasks, collected unchanged (issue 12).

A folder holds ``task.yml`` (``files``, ``lang``, ``description``, ``tests``, ``benchmarks``,
timeouts, ``ranking_by``), ``reference.py`` (``generate_input(**case)``, ``ref_kernel(data)``,
``check_implementation(data, output)``) and ``task.py``; ``utils.py`` and ``eval.py`` come from
one folder up through ``files``. Honoured: ``files`` (every listed file but the submission and
``config.main``, snapshotted at load and given to both processes as its ``name``),
``description``, ``tests``, ``benchmarks``, ``lang: py``; ``solutions/correct/`` files are the
seeds. Not honoured (said in the README): ``lang`` other than ``py`` and ``multi_gpu`` problems
(collected as skipped, with the reason), the timeouts (``--ks-timeout`` instead), ``ranking_by``
(the summary always shows the geometric mean, which GPU MODE's ``geom`` ranks by), ``gpus``,
``templates``.

The reference module is loaded here once, at collection, from the snapshot, with the folder's
module names (``task``, ``utils``) imported for it alone and taken out of ``sys.modules`` again,
so two problems in one session do not share a ``task`` module.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from pytest_kscientist.errors import TaskSpecError
from pytest_kscientist.formats.task import BenchSpec, Profile, Task, TaskSpec

YML_NAME = "task.yml"
SUBMISSION = "@SUBMISSION@"
REFERENCE = "reference.py"
NEEDED = ("generate_input", "ref_kernel", "check_implementation")


class Unsupported(TaskSpecError):
    """A recognisable GPU MODE problem this harness does not run (collected as skipped)."""


def _read(spec_path: Path) -> Any:
    import yaml

    return yaml.safe_load(spec_path.read_text(encoding="utf-8"))


def looks_like_problem(spec_path: Path) -> bool:
    """Whether ``spec_path`` is a GPU MODE problem's ``task.yml``: a mapping with ``tests`` and
    ``files`` beside a ``reference.py`` (a CI workflow's ``task.yml`` is not claimed)."""
    if spec_path.name != YML_NAME or not (spec_path.parent / REFERENCE).is_file():
        return False
    try:
        raw = _read(spec_path)
    except Exception:  # noqa: BLE001 - any YAML error: the file is simply not one of ours
        return False
    return isinstance(raw, dict) and "tests" in raw and "files" in raw


def _cases(spec_path: Path, raw: dict[str, Any], field: str) -> list[dict[str, Any]]:
    cases = raw.get(field) or []
    if not isinstance(cases, list) or not all(isinstance(c, dict) for c in cases):
        raise TaskSpecError(f"{spec_path}: field '{field}' should be a list of mappings (one per "
                            f"case), found {type(cases).__name__}; fix the YAML")
    for i, case in enumerate(cases):
        if "seed" not in case:
            raise TaskSpecError(f"{spec_path}: {field}[{i}] has no 'seed' (found keys "
                                f"{sorted(case)}); every GPU MODE case names its seed")
    return cases


def _snapshot(spec_path: Path, raw: dict[str, Any]) -> dict[str, str]:
    """The files ``task.yml`` lists (name -> text), without the submission and its harness."""
    main = (raw.get("config") or {}).get("main", "eval.py")
    files: dict[str, str] = {}
    for i, entry in enumerate(raw.get("files") or []):
        if not isinstance(entry, dict) or "name" not in entry or "source" not in entry:
            raise TaskSpecError(f"{spec_path}: files[{i}] should be {{name, source}}, found "
                                f"{entry!r}; fix the YAML")
        name, source = str(entry["name"]), str(entry["source"])
        if source == SUBMISSION or name == main:
            continue
        path = (spec_path.parent / source).resolve()
        try:
            files[name] = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise TaskSpecError(f"{spec_path}: files[{i}] names {source!r}, which cannot be "
                                f"read ({exc.strerror}); fix the path") from None
    if REFERENCE not in files:
        files[REFERENCE] = (spec_path.parent / REFERENCE).read_text(encoding="utf-8")
    return files


def load_problem(spec_path: Path) -> Task:
    """A GPU MODE problem folder as a Task; Unsupported for ones collected as skipped."""
    try:
        raw = _read(spec_path)
    except Exception as exc:  # noqa: BLE001 - report any YAML error with the file's name
        raise TaskSpecError(f"{spec_path}: not valid YAML ({exc}); fix the syntax") from None
    root = spec_path.parent
    lang = str(raw.get("lang", "py"))
    if lang != "py":
        raise Unsupported(f"{spec_path}: lang {lang!r} problems are not run by pytest-kscientist "
                          "(only lang: py; a CUDA or HIP source goes through load_inline)")
    if raw.get("multi_gpu"):
        raise Unsupported(f"{spec_path}: multi_gpu problems are not run by pytest-kscientist "
                          "(one GPU per candidate worker)")
    tests = _cases(spec_path, raw, "tests")
    if not tests:
        raise TaskSpecError(f"{spec_path}: field 'tests' is empty; a problem needs a test case")
    benchmarks = _cases(spec_path, raw, "benchmarks")
    keys = list(tests[0])
    try:
        profile = Profile.model_validate({"tests": tests, "benchmarks": benchmarks})
        spec = TaskSpec(
            name=root.name, description=str(raw.get("description", "")).strip(),
            reference=REFERENCE, seeds="solutions/correct", case_keys=keys, output_index=None,
            bench=BenchSpec.model_validate({}), profiles={"full": profile, "cpu": profile},
        )
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise TaskSpecError(f"{spec_path}: its cases do not fit ({problems}); every test and "
                            "benchmark needs the same keys, with int, float, bool or str "
                            "values") from None
    files = _snapshot(spec_path, raw)
    module = _import_reference(spec_path, files)
    return Task(root, spec, form="gpumode", spec_path=spec_path, module=module, files=files)


def _import_reference(spec_path: Path, files: dict[str, str]) -> Any:
    """The reference module, its sibling modules imported from a private copy of the files."""
    from pytest_kscientist.formats.forms import exec_source

    names = {Path(n).stem for n in files if n.endswith(".py")}
    saved = {n: sys.modules.pop(n) for n in list(sys.modules) if n.split(".")[0] in names}
    with tempfile.TemporaryDirectory(prefix="ks-gpumode-") as stage:
        for name, text in files.items():
            (Path(stage) / name).write_text(text, encoding="utf-8")
        sys.path.insert(0, stage)
        try:
            module = exec_source(f"_ks_reference_{spec_path.parent.name}", files[REFERENCE],
                                 str(spec_path.parent / REFERENCE))
        except Exception as exc:  # noqa: BLE001 - the problem's code: report it as a spec error
            raise TaskSpecError(f"{spec_path.parent / REFERENCE}: importing it failed: "
                                f"{type(exc).__name__}: {exc}") from None
        finally:
            sys.path.remove(stage)
            for n in [n for n in sys.modules if n.split(".")[0] in names]:
                del sys.modules[n]
            sys.modules.update(saved)
    missing = [n for n in NEEDED if not callable(getattr(module, n, None))]
    if missing:
        raise TaskSpecError(f"{spec_path.parent / REFERENCE}: defines no {', '.join(missing)}; "
                            "a GPU MODE reference needs generate_input(**case), ref_kernel(data) "
                            "and check_implementation(data, output)")
    return module
