"""GPU MODE ``reference-kernels`` problem folders as tasks, collected unchanged (issues 12, 30).

A folder holds ``task.yml`` (``files``, ``lang``, ``description``, ``tests``, ``benchmarks``,
timeouts, ``ranking_by``), ``reference.py`` (``generate_input(**case)``, ``ref_kernel(data)``,
``check_implementation(data, output)``) and ``task.py``; ``utils.py`` and ``eval.py`` come from
one folder up through ``files``. Honoured: ``files`` (every listed file but the submission and
``config.main``, snapshotted at load and given to both processes as its ``name``),
``description``, ``tests``, ``benchmarks``, ``lang: py``; ``solutions/correct/`` files are the
seeds, else the folder's own ``submission.py``. Not honoured (said in the README): ``lang``
other than ``py`` and ``multi_gpu`` problems (collected as skipped, with the reason), the
timeouts (``--ks-timeout`` instead), ``ranking_by`` (the summary always shows the geometric
mean, which GPU MODE's ``geom`` ranks by), ``gpus``, ``templates``.

Cases are taken as GPU MODE's eval.py files take them (issue 30): each case's own keys (the
linalg problems add ``case`` to some), ``seed`` where a case has one, and lists of ints
(nvfp4_group_gemm's per-group ``m``, ``n``, ``k``, passed as tuples). A folder whose reference
the harness cannot drive (another interface, a module not installed here) is one skipped item.

The reference module is loaded here once, at collection, from the snapshot, with the folder's
module names (``task``, ``utils``) imported for it alone and taken out of ``sys.modules`` again,
so two problems in one session do not share a ``task`` module.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

from pydantic import (
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    model_validator,
)

from pytest_kscientist.errors import TaskSpecError
from pytest_kscientist.formats.task import BenchSpec, Case, Profile, Task, TaskSpec

YML_NAME = "task.yml"
SUBMISSION = "@SUBMISSION@"
REFERENCE = "reference.py"
OWN_SUBMISSION = "submission.py"  # the example submission a problem folder ships
# What GPU MODE's eval.py files import from the reference; ref_kernel is timed as the
# ``reference`` node where the reference defines it (the evals themselves never call it).
NEEDED = ("generate_input", "check_implementation")
INTERFACE = ("generate_input(**case) -> data, custom_kernel(data) -> output, "
             "check_implementation(data, output)")

# The values GPU MODE's eval.py files parse out of a case: ints and names, and (group GEMM)
# lists of ints; YAML floats and booleans pass through as the YAML gives them.
ProblemCase = dict[str, StrictInt | StrictFloat | StrictBool | StrictStr | list[StrictInt]]


class Unsupported(TaskSpecError):
    """A recognisable GPU MODE problem this harness does not run (collected as skipped)."""


class ProblemProfile(Profile):
    tests: list[ProblemCase] = Field(min_length=1)  # type: ignore[assignment]
    benchmarks: list[ProblemCase] = Field(default_factory=list)  # type: ignore[assignment]


class ProblemSpec(TaskSpec):
    """A TaskSpec whose cases need not share their keys: GPU MODE's eval passes each case's
    own keys to generate_input (cholesky_py's tests[7] adds ``case`` to the other four)."""

    profiles: dict[str, ProblemProfile]  # type: ignore[assignment]

    @model_validator(mode="after")
    def _cases_match_keys(self) -> ProblemSpec:  # replaces TaskSpec's check of the same name
        return self


class ProblemTask(Task):
    """A GPU MODE folder: ids name the keys each case has; seeds fall back to submission.py."""

    def case_id(self, case: Case) -> str:
        return "-".join(f"{'s' if k == 'seed' else k}{_text(case[k])}"
                        for k in self.spec.case_keys if k in case)

    def seeds(self) -> list[Path]:
        found = super().seeds()
        if found or self.seeds_dir.is_dir():
            return found
        own = self.root / OWN_SUBMISSION
        return [own] if own.is_file() else []

    def no_candidates(self) -> str:
        return (f"task '{self.name}': no candidate: {self.root} has neither "
                f"{self.spec.seeds}/*.py nor {OWN_SUBMISSION}, and no --kernel was given; "
                "pass --kernel PATH")


def _text(value: Any) -> str:
    return "_".join(map(str, value)) if isinstance(value, list) else str(value)


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
    if not isinstance(cases, list) or not all(isinstance(c, dict) and c for c in cases):
        raise TaskSpecError(f"{spec_path}: field '{field}' should be a list of non-empty "
                            f"mappings (one per case), found {cases!r:.80}; fix the YAML")
    # nvfp4_gemv lists {m: 256, k: 7168, l: 1, seed: 1111} twice: one test id, one verdict.
    unique: list[dict[str, Any]] = []
    for case in cases:
        if case not in unique:
            unique.append(case)
    return unique


def _keys(cases: list[dict[str, Any]]) -> list[str]:
    """Every key of the cases, in the order they first appear (the test ids' order)."""
    return list(dict.fromkeys(k for case in cases for k in case))


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
    try:
        profile = ProblemProfile.model_validate({"tests": tests, "benchmarks": benchmarks})
        spec = ProblemSpec(
            name=root.name, description=str(raw.get("description", "")).strip(),
            reference=REFERENCE, seeds="solutions/correct", case_keys=_keys(tests + benchmarks),
            output_index=None, bench=BenchSpec.model_validate({}),
            profiles={"full": profile, "cpu": profile},
        )
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise TaskSpecError(f"{spec_path}: its cases do not fit ({problems}); a case's values "
                            "are ints, floats, booleans, strings or lists of ints") from None
    files = _snapshot(spec_path, raw)
    module = _import_reference(spec_path, files)
    return ProblemTask(root, spec, form="gpumode", spec_path=spec_path, module=module,
                       files=files)


def _import_reference(spec_path: Path, files: dict[str, str]) -> Any:
    """The reference module, its sibling modules imported from a private copy of the files."""
    from pytest_kscientist.formats.forms import exec_source

    where = spec_path.parent / REFERENCE
    names = {Path(n).stem for n in files if n.endswith(".py")}
    saved = {n: sys.modules.pop(n) for n in list(sys.modules) if n.split(".")[0] in names}
    with tempfile.TemporaryDirectory(prefix="ks-gpumode-") as stage:
        for name, text in files.items():
            (Path(stage) / name).write_text(text, encoding="utf-8")
        sys.path.insert(0, stage)
        try:
            module = exec_source(f"_ks_reference_{spec_path.parent.name}", files[REFERENCE],
                                 str(where))
        except ModuleNotFoundError as exc:
            # aiter (amd_202602), helion...: the environment lacks it, the folder is fine.
            raise Unsupported(f"{where}: importing it needs the module {exc.name!r}, which is "
                              "not installed here (its task.yml lists "
                              f"{', '.join(sorted(files))}); install it, or run where it "
                              "is") from None
        except Exception as exc:  # noqa: BLE001 - the problem's code: report it as a spec error
            raise TaskSpecError(f"{where}: importing it failed: "
                                f"{type(exc).__name__}: {exc}") from None
        finally:
            sys.path.remove(stage)
            for n in [n for n in sys.modules if n.split(".")[0] in names]:
                del sys.modules[n]
            sys.modules.update(saved)
    missing = [n for n in NEEDED if not callable(getattr(module, n, None))]
    if missing:
        defined = sorted(n for n, v in vars(module).items()
                         if callable(v) and not n.startswith("_")
                         and getattr(v, "__module__", None) == module.__name__)
        raise Unsupported(f"{where}: defines no {', '.join(missing)} (it defines "
                          f"{', '.join(defined) or 'no functions'}): its eval drives another "
                          f"interface than the one pytest-kscientist runs ({INTERFACE})")
    return module
