"""Task folders: the spec file (``task.toml``) validated by pydantic, and its profiles."""

from __future__ import annotations

import os
import re
import sys
from fnmatch import fnmatch
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)

from pytest_kscientist.errors import TaskSpecError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

SPEC_NAME = "task.toml"
# A case's parameters: ints in native tasks; GPU MODE problems may also pass floats, strings and
# booleans to their generate_input. Strict, so 1.0 stays a float and "3" a string.
Case = dict[str, StrictInt | StrictFloat | StrictBool | StrictStr]


# The spec's own tables take TOML's types as they are (an int still reads as a float): loose,
# `atol = true` read as 1.0 (a kernel off by 0.9 passed) and "1e-6" as a number.
STRICT = ConfigDict(extra="forbid", strict=True)


class CheckSpec(BaseModel):
    model_config = STRICT
    atol: float = Field(1e-3, ge=0)
    rtol: float = Field(2e-2, ge=0)
    # The re-run that exposes cached results (evaluate._second_inputs): "redraw" (the case
    # drawn again with another seed, into the same tensors: keeps the inputs' structure) or
    # "changed" (one element of every floating-point input changed, which also exposes a cache
    # keyed by a few sampled elements but can break structure: an SPD matrix, sorted
    # boundaries; it falls back to a draw where the reference raises on the changed inputs,
    # gives non-finite numbers it did not, or no input is floating point).
    rerun: Literal["redraw", "changed"] = "redraw"


class FloorSpec(BaseModel):
    """Peak rates of a device family: no correct run can beat flops/peak or bytes/peak."""

    model_config = STRICT
    device: str
    peak_tflops: float = Field(gt=0)
    peak_tbps: float = Field(gt=0)


class Span(BaseModel):
    """The valid values of one case key: ``min`` to ``max``, multiples of ``multiple_of``."""

    model_config = ConfigDict(extra="forbid")
    min: int = Field(ge=0)
    max: int = Field(ge=0)
    multiple_of: int = Field(1, ge=1)

    @model_validator(mode="after")
    def _has_a_value(self) -> Span:
        if self.first() > self.max:
            raise ValueError(f"no multiple of {self.multiple_of} lies in [{self.min}, {self.max}]")
        return self

    def first(self) -> int:
        return -(-self.min // self.multiple_of) * self.multiple_of


class Space(BaseModel):
    """The cases a task accepts, for Hypothesis-drawn checks (``[profiles.X.space]``):
    a Span per case key but the seed, and how many cases each candidate is checked on."""

    model_config = ConfigDict(extra="forbid")
    examples: int = Field(8, ge=0)
    keys: dict[str, Span]


class Profile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tests: list[Case] = Field(min_length=1)
    benchmarks: list[Case] = Field(default_factory=list)
    space: Space | None = None

    @field_validator("space", mode="before")
    @classmethod
    def _spans(cls, value: Any) -> Any:
        # In TOML the spans sit beside ``examples``: m = { min = 64, max = 1024 }.
        if isinstance(value, dict) and "keys" not in value:
            value = dict(value)
            examples = value.pop("examples", 8)
            return {"examples": examples, "keys": value}
        return value


CPU_ROUNDS = 16  # BenchSpec.rounds_on
GPU_ROUNDS = 4


class BenchSpec(BaseModel):
    """How long and how often each benchmark case is timed."""

    model_config = STRICT
    warmup: int = Field(2, ge=0)
    min_runs: int = Field(5, ge=1)
    max_runs: int = Field(200, ge=1)
    budget_s: float = Field(1.0, gt=0)
    verify_samples: int = Field(3, ge=1)
    # A candidate timed beside baselines alternates with them this many times, each round
    # getting budget_s / rounds, so a drifting clock shifts both sides of every ratio alike.
    # Unset: CPU_ROUNDS on a CPU, GPU_ROUNDS on a GPU (rounds_on).
    rounds: int | None = Field(None, ge=1)

    def rounds_on(self, device: str) -> int:
        """The rounds of a case timed on ``device`` ("cpu", "cuda:0"): the task's, else
        sixteen on a CPU and four on a GPU. On the 2-core CPU two copies of a kernel read within
        5% on every shape in 27 of 27 runs with sixteen rounds, 25 of 27 with four, both misses
        beside a bursty load (notes/timing.md, section 4): a burst of the machine's falls into
        more, shorter turns. On a GPU four hold (worst shape 0.76-2.49% on an H200)."""
        if self.rounds is not None:
            return self.rounds
        return CPU_ROUNDS if device.startswith("cpu") else GPU_ROUNDS


class KernelSpec(BaseModel):
    """What the task asks of a candidate's own kernel (``[kernel]``)."""

    model_config = STRICT
    # The least share of a candidate's time in kernels its own file declares (GPU: device
    # time; CPU: call time outside torch ops), from one profiled call per candidate
    # (harness/attribution.py); unset: measured only with --ks-attribution, never refused.
    min_own_share: float | None = Field(None, ge=0.0, le=1.0)


# A baseline with verify = "report" missing the check on more than this share of an output's
# elements is not doing the task: it fails like a strict one (cuBLAS fp8 on the H200: 0.3%).
REPORT_MAX_SHARE = 0.05
REQUIREMENT = re.compile(r"^(cuda|nvidia|rocm|sm_(\d+)(\d))$")
BASELINE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")


def unknown_requirement(need: str) -> str | None:
    """Why ``need`` is not a device requirement (baselines' requires, KS_REQUIRES), or None."""
    if REQUIREMENT.match(need):
        return None
    return f"unknown requirement {need!r}; expected cuda, nvidia, rocm or sm_XY (e.g. sm_90)"


class BaselineSpec(BaseModel):
    """A trusted implementation every candidate is timed beside (``[[baselines]]``)."""

    model_config = ConfigDict(extra="forbid")
    name: str
    file: str
    description: str = ""
    # True: the file exposes prepare(data) (not timed) and run(prepared) (timed), a yardstick
    # with its input conversion excluded; False: custom_kernel(data), like a candidate.
    prepare: bool = Field(False, strict=True)
    # Capabilities the device must have, else the baseline is skipped: "cuda" (any CUDA or
    # ROCm GPU), "nvidia", "rocm", "sm_90" (an NVIDIA GPU of compute capability 9.0 or newer).
    requires: list[str] = Field(default_factory=list)
    # "strict": a baseline whose output misses the check fails its items and gives no speedup.
    # "report": a miss within the tolerance's reach (right shape and dtype, NaN/Inf where the
    # reference has them, at most REPORT_MAX_SHARE of the elements) is reported (xfail) and its
    # times stay a yardstick, flagged unverified; e.g. cuBLAS fp8 on Hopper, whose wgmma
    # accumulation misses 1e-3 + 2e-2*|ref| on ~0.3% of elements (notes/fp8_gemm_h200.md).
    verify: Literal["strict", "report"] = "strict"

    @field_validator("requires", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("requires")
    @classmethod
    def _known(cls, value: list[str]) -> list[str]:
        for need in value:
            problem = unknown_requirement(need)
            if problem:
                raise ValueError(problem)
        return value

    @field_validator("name")
    @classmethod
    def _usable_name(cls, value: str) -> str:
        if not BASELINE_NAME.match(value):
            raise ValueError(
                "a baseline name becomes a test id and a --ks-min-speedup key: use letters, "
                "digits, '_', '.', '-'"
            )
        if value == "reference":
            raise ValueError("'reference' is the task's own reference node; pick another name")
        return value


class TaskSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    description: str = ""
    reference: str = "reference.py"
    seeds: str = "seeds"
    case_keys: list[str] = Field(min_length=1)
    # Where generate_input's data holds a preallocated output the kernel writes into: its
    # position among the data's leaves (forms.leaves: tensors and plain values, in order, from
    # 0; fp8_gemm's c is 4). Unset: the kernel makes and returns its own output, and every
    # input must come back unchanged.
    output_index: int | None = Field(None, ge=0)
    check: CheckSpec = Field(default_factory=lambda: CheckSpec.model_validate({}))
    bench: BenchSpec = Field(default_factory=lambda: BenchSpec.model_validate({}))
    kernel: KernelSpec = Field(default_factory=lambda: KernelSpec.model_validate({}))
    floor: list[FloorSpec] = Field(default_factory=list)
    baselines: list[BaselineSpec] = Field(default_factory=list)
    profiles: dict[str, Profile]

    @field_validator("baselines")
    @classmethod
    def _unique_names(cls, baselines: list[BaselineSpec]) -> list[BaselineSpec]:
        names = [b.name for b in baselines]
        for name in names:
            if names.count(name) > 1:
                raise ValueError(f"two baselines are named {name!r}; names must be unique")
        return baselines

    @field_validator("profiles")
    @classmethod
    def _has_full(cls, profiles: dict[str, Profile]) -> dict[str, Profile]:
        if "full" not in profiles:
            raise ValueError("needs a [profiles.full] table (the GPU profile)")
        return profiles

    @model_validator(mode="after")
    def _cases_match_keys(self) -> TaskSpec:
        drawn = sorted(k for k in self.case_keys if k != "seed")
        for pname, profile in self.profiles.items():
            if profile.space is not None and sorted(profile.space.keys) != drawn:
                raise ValueError(
                    f"profiles.{pname}.space has spans for {sorted(profile.space.keys)}, "
                    f"expected one for each case key but the seed: {drawn}"
                )
            for kind in ("tests", "benchmarks"):
                seen: dict[str, int] = {}
                for i, case in enumerate(getattr(profile, kind)):
                    if sorted(case) != sorted(self.case_keys):
                        raise ValueError(
                            f"profiles.{pname}.{kind}[{i}] has keys {sorted(case)}, "
                            f"expected exactly case_keys {sorted(self.case_keys)}"
                        )
                    # one node id a case: a second would run the case again under the same id
                    cid = case_id_of(self.case_keys, case)
                    if cid in seen:
                        raise ValueError(
                            f"profiles.{pname}.{kind}[{i}] repeats [{seen[cid]}] (case {cid}); "
                            "list each case once")
                    seen[cid] = i
        return self


class Task:
    """A loaded task: a folder with ``task.toml`` (``form`` "native"), a GPU MODE problem
    folder ("gpumode", gpumode.py) or a KernelBench problem file ("kernelbench",
    kernelbench.py). ``spec_path`` is the file it was collected from."""

    def __init__(self, root: Path, spec: TaskSpec, form: str = "native",
                 spec_path: Path | None = None, module: Any = None,
                 files: dict[str, str] | None = None) -> None:
        self.root = root
        self.spec = spec
        self.name = spec.name
        self.form = form
        self.spec_path = spec_path or root / SPEC_NAME
        self.reference = root / spec.reference
        self.seeds_dir = root / spec.seeds
        self.module = module  # the reference module, when the format loads it with the task
        self.files = files or {}  # GPU MODE: the problem's files as its task.yml lists them
        self.entry = "ModelNew" if form == "kernelbench" else "custom_kernel"
        self.reference_entry = "Model" if form == "kernelbench" else "ref_kernel"

    def describe(self) -> dict[str, Any]:
        """How a worker draws this task's inputs (forms.load_problem): text or a path."""
        if self.form == "gpumode":
            # From the snapshot taken at load, so both processes run the same problem code.
            name = self.reference.name
            return {"form": "gpumode", "path": str(self.reference), "reference": self.files[name],
                    "files": {k: v for k, v in self.files.items() if k != name}}
        return {"form": self.form, "path": str(self.reference)}

    def baseline_path(self, baseline: BaselineSpec) -> Path:
        return self.root / baseline.file

    def seeds(self) -> list[Path]:
        if not self.spec.seeds or not self.seeds_dir.is_dir():
            return []
        return sorted(p for p in self.seeds_dir.glob("*.py") if not p.name.startswith("_"))

    def profile(self, name: str, option: str = "--ks-profile") -> Profile:
        """The profile ``name``; a TaskSpecError naming ``option`` (where the name was set: the
        flag, or ``ks_profile (ini)``) when the task has none of that name."""
        try:
            return self.spec.profiles[name]
        except KeyError:
            known = ", ".join(sorted(self.spec.profiles))
            raise TaskSpecError(
                f"task '{self.name}' has no profile '{name}' (it has: {known}); "
                f"pick one of those with {option}"
                + (f"; without a GPU {option} auto picks 'cpu': give the task a "
                   "[profiles.cpu] of small cases to run it on the CPU by default"
                   if name == "cpu" else "")
            ) from None

    def floor_for(self, device_name: str) -> FloorSpec | None:
        for floor in self.spec.floor:
            if floor.device == "*" or fnmatch(device_name.lower(), f"*{floor.device.lower()}*"):
                return floor
        return None

    def case_id(self, case: Case) -> str:
        return case_id_of(self.spec.case_keys, case)


def case_id_of(keys: list[str], case: Case) -> str:
    """A case's id: its values in ``keys``' order, each behind its key's short name."""
    return "-".join(f"{_short(k)}{case[k]}" for k in keys)


def _short(key: str) -> str:
    return "s" if key == "seed" else key


def _format_loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


# Top-level keys only this plugin's task specs have: a task.toml without any of them belongs to
# something else (issue 12: a project's "[task] name = 'build docs'" failed collection).
OUR_KEYS = frozenset({"case_keys", "profiles"})


def looks_like_task(spec_path: Path) -> bool:
    """Whether ``spec_path`` is a task spec of ours (valid or not) rather than another tool's
    ``task.toml``: it names ``case_keys`` or ``profiles`` at top level; one that is not valid
    TOML counts as ours when a ``reference.py`` lies beside it (its error is then reported)."""
    try:
        raw = tomllib.loads(spec_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        return False
    except tomllib.TOMLDecodeError:
        return (spec_path.parent / "reference.py").is_file()
    return bool(OUR_KEYS & set(raw))


def load_task(root: Path) -> Task:
    """Load and validate ``root/task.toml`` (``root`` may name that file itself); raise
    TaskSpecError naming the file and field."""
    # Absolute, for its paths go to workers that run in a folder of their own: a relative
    # `ks_load_task("axpy")` failed every candidate as the task's fault (no axpy/reference.py
    # there). Links are kept (no resolve), as for the collected tasks' paths.
    root = Path(os.path.abspath(root))
    if root.name == SPEC_NAME and root.is_file():
        root = root.parent  # the path pytest's node ids and `pytest x/task.toml` name
    elif root.is_file():
        raise TaskSpecError(f"{root}: a task is a folder holding {SPEC_NAME}, got a file; pass "
                            f"its folder ({root.parent}) or its {SPEC_NAME}")
    spec_path = root / SPEC_NAME
    try:
        raw = tomllib.loads(spec_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TaskSpecError(
            f"{spec_path}: no task spec here; a task folder needs {SPEC_NAME}"
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise TaskSpecError(f"{spec_path}: not valid TOML ({exc}); fix the syntax") from None
    try:
        spec = TaskSpec.model_validate(raw)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            shown = repr(err.get("input"))
            # a check of the whole spec (or a table) has the whole of it as input: not shown
            found = ("" if err["type"] == "missing" or isinstance(err.get("input"), dict)
                     else f", found {shown if len(shown) <= 120 else shown[:117] + '...'}")
            if err["type"] == "extra_forbidden":
                found += _did_you_mean(err["loc"])
            lines.append(f"  field '{_format_loc(err['loc'])}': {err['msg']}{found}")
        raise TaskSpecError(
            f"{spec_path}: invalid task spec ({len(lines)} error(s)):\n" + "\n".join(lines)
        ) from None
    task = Task(root, spec)
    if not task.reference.is_file():
        raise TaskSpecError(
            f"{spec_path}: field 'reference' names {spec.reference!r}, which does not exist in "
            f"{root}; add the file with generate_input(**case) and ref_kernel(data)"
        )
    _check_reference(spec_path, task.reference)
    for i, baseline in enumerate(spec.baselines):
        if not task.baseline_path(baseline).is_file():
            entry = "prepare(data) and run(prepared)" if baseline.prepare else "custom_kernel(data)"
            raise TaskSpecError(
                f"{spec_path}: field 'baselines[{i}].file' names {baseline.file!r}, which does "
                f"not exist in {root}; add the file (exposing {entry}) or fix the path"
            )
    return task


def _did_you_mean(loc: tuple[Any, ...]) -> str:
    """For a key the spec does not know: the known keys of its table, the closest first."""
    import difflib
    import typing

    model: Any = TaskSpec
    for part in loc[:-1]:
        if isinstance(part, int) or model is None:
            continue  # a list's position
        if isinstance(model, dict):  # a table of named tables: profiles.<name>
            model = model["value"]
            continue
        field = model.model_fields.get(part)
        if field is None:
            return ""
        args = [a for a in typing.get_args(field.annotation) if a is not type(None)]
        inner = args[-1] if args else field.annotation
        if typing.get_origin(field.annotation) is dict:
            model = {"value": inner}
        elif isinstance(inner, type) and issubclass(inner, BaseModel):
            model = inner
        else:
            return ""
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        return ""
    known = list(model.model_fields)
    close = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.6)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    return f"{hint} (known here: {', '.join(known)})"


REFERENCE_NEEDS = ("generate_input", "ref_kernel")


def _check_reference(spec_path: Path, reference: Path) -> None:
    """The reference parses and binds generate_input and ref_kernel at top level (read, not
    imported: collection stays free of torch); else a TaskSpecError naming the file, where
    otherwise every candidate would fail to load in its worker."""
    import ast

    try:
        tree = ast.parse(reference.read_bytes(), filename=str(reference))
    except SyntaxError as exc:
        raise TaskSpecError(
            f"{reference}: not valid Python (line {exc.lineno}: {exc.msg}); the reference of "
            f"{spec_path} must import to judge any candidate: fix it") from None
    bound: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            bound.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif not isinstance(node, (ast.Expr, ast.Pass)):
            return  # bound under if/try/with or by exec: left to the import to tell
    if "*" in bound:
        return  # a star import may bring them
    missing = [name for name in REFERENCE_NEEDS if name not in bound]
    if missing:
        raise TaskSpecError(
            f"{reference} defines no {' or '.join(missing)}; the reference of {spec_path} "
            "needs generate_input(**case, device=...) returning the inputs of a case and "
            "ref_kernel(data) returning the expected output (docs/formats.md)")
