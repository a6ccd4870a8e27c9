"""Command-line flags and their ini twins, resolved once into a frozen ``Settings``."""

from __future__ import annotations

import json
import math
import os
import secrets
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pytest_kscientist.kswarnings import KsNoSavedRun


@dataclass(frozen=True)
class Settings:
    kernels: tuple[Path, ...]
    json_path: Path | None
    salt: int
    salt_given: bool
    profile: str
    device: str
    timeout_s: float
    bench_budget_s: float | None
    evolve: int | None
    extra: dict[str, str] = field(default_factory=dict)
    # None: every baseline the task declares; otherwise the names picked by --ks-baselines.
    baselines: tuple[str, ...] | None = None
    min_speedup: tuple[tuple[str, float], ...] = ()
    compare_path: Path | None = None
    compare_runs: tuple[Any, ...] = ()  # the RunResults read from compare_path
    max_regression: float | None = None  # a fraction: 0.05 for 5%
    skip_reference: bool = False  # --ks-skip-reference: the reference is not timed
    # --ks-beside: kernels timed interleaved beside every candidate, like baselines.
    beside: tuple[Path, ...] = ()
    # --ks-same-as: candidate stem -> (the kernel whose code it runs, the case ids where it does).
    same_as: dict[str, tuple[str, frozenset[str]]] = field(default_factory=dict)
    # --ks-solutions: a folder of candidates matched to each task by its name.
    solutions: Path | None = None
    # --ks-drawn: Hypothesis-drawn cases per candidate (None: the profile's space.examples).
    drawn: int | None = None
    # --ks-kernelbench-tol: atol = rtol of KernelBench problems' allclose.
    kernelbench_tol: float = 1e-2
    # --ks-lenient-task: a hole task validation finds is a warning, not a failed item.
    lenient_task: bool = False
    # --ks-attribution: one profiled call per candidate says which kernels its time went to.
    attribution: bool = False
    # --ks-min-own-share: the least share of a candidate's time in its own kernels, for every
    # task (None: each task's [kernel] min_own_share).
    min_own_share: float | None = None
    # How messages quote the gate options and --ks-min-own-share (QUOTED): the flag, or
    # "ks_x (ini)" where an ini file set the value (dest -> name; read through ``quoted``).
    names: dict[str, str] = field(default_factory=dict)
    # --ks-bench-workers: the worker processes each kernel's timing rounds are spread over;
    # None (auto): KsSession.auto_workers picks them once the session's kernels are known.
    bench_workers: int | None = 1
    # With --evolve, its options and the LLM scientist's, resolved at configure time by their
    # tables' resolvers (evolve.run_options.EvolveSettings, evolve.llm.settings.LLMSettings).
    evolve_options: Any = None
    llm: Any = None

    def quoted(self, dest: str) -> str:
        """How messages name option ``dest`` (one of QUOTED): as the user set it."""
        return self.names.get(dest) or _BY_DEST[dest].flag


@dataclass(frozen=True)
class Option:
    """One flag, its ini twin and its help: a row of an option table.

    The tables: ``CORE_OPTIONS`` here, ``evolve.run_options.EVOLVE_OPTIONS`` and
    ``evolve.llm.llm_options.LLM_OPTIONS``; ``register`` adds a table to pytest and
    ``raw_value`` reads one option (the flag wins over its ini twin). Each area's resolver turns
    the raw values into its part of the frozen ``Settings``, once, at configure time.
    """

    flag: str
    help: str
    metavar: str | None = None
    ini: str | None = None  # the ini twin's name; None: a flag only
    ini_default: Any = ""
    ini_type: str | None = None  # pytest's addini type: None (a string), "args" (a list), "bool"
    action: str = "store"  # or "append", "store_true"
    group: str = "evaluation"  # a key of GROUPS: the section of `pytest --help` it is shown in


    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


# The sections of `pytest --help`, by concern, in the order shown (issue 29: 34 options in one
# group hid which ones a task needs). Key -> (pytest's group name, its title).
GROUPS = {
    "evaluation": ("kscientist", "kscientist: evaluating kernels (candidates, cases, timing, "
                   "results)"),
    "gates": ("kscientist-gates", "kscientist: performance gates for CI (gate[...] items)"),
    "evolve": ("kscientist-evolve", "kscientist: evolving kernels (--evolve)"),
    "llm": ("kscientist-llm", "kscientist: the LLM scientist of --evolve"),
    "devices": ("kscientist-devices", "kscientist: devices"),
}


CORE_OPTIONS = (
    Option("--kernel", "candidate file exposing custom_kernel(data) to evaluate instead of the "
           "task's seeds; repeat for several", "PATH", action="append"),
    Option("--ks-solutions", "a folder of candidates, matched to each collected task by name: "
           "DIR/<task>.py and DIR/<task>/*.py (a KernelBench problem's name is its file stem, a "
           "GPU MODE problem's its folder); a task with no match is skipped", "DIR"),
    Option("--ks-drawn", "check each candidate on N cases Hypothesis draws from the space the "
           "task's profile declares ([profiles.X.space]; a failure is shrunk by Hypothesis; "
           "--ks-salt reproduces the draws); default: the space's examples, 0: "
           "none", "N", ini="ks_drawn"),
    Option("--ks-kernelbench-tol", "atol = rtol of KernelBench problems' allclose (default "
           "0.01, KernelBench v0/v0.1's fp32 setting; its newer fp32 setting is 1e-4)", "TOL",
           ini="ks_kernelbench_tol"),
    Option("--ks-lenient-task", "report a task that lets trivial kernels pass (its "
           "task::validate item: an all-zeros or constant output passes its check, or its "
           "reference output does not change with the seed) as a warning instead of a failed "
           "item", ini="ks_lenient_task", ini_default=False, ini_type="bool",
           action="store_true"),
    Option("--ks-attribution", "profile one extra untimed call of each candidate (on its first "
           "check) and report the kernels its time went to: its own (declared in its file: "
           "@triton.jit, __global__) against torch's and libraries' (the summary, --ks-json); "
           "always on for a task that sets [kernel] min_own_share", ini="ks_attribution",
           ini_default=False, ini_type="bool", action="store_true"),
    Option("--ks-min-own-share", "refuse a candidate whose profiled call spends less than "
           "FRACTION (0-1) of its time in kernels its file declares (its first check fails, it "
           "is not timed); for every collected task, over the task's [kernel] min_own_share; "
           "for GPU MODE and KernelBench folders, which have no task.toml", "FRACTION",
           ini="ks_min_own_share"),
    Option("--ks-json", "write machine-readable results (versioned JSON) to PATH", "PATH"),
    Option("--ks-salt", "reuse the secret seed salt of an earlier run to reproduce it", "INT"),
    Option("--ks-profile", "case profile: auto (full with a GPU, else cpu), cpu, full or any "
           "profile the task defines", "NAME", ini="ks_profile", ini_default="auto"),
    Option("--ks-device", "device the candidates run on: auto, cpu, cuda or cuda:N", "DEV",
           ini="ks_device", ini_default="auto", group="devices"),
    Option("--ks-timeout", "a worker that does not answer within SECONDS is killed and its "
           "test fails (default 120)", "SECONDS", ini="ks_timeout", ini_default="120"),
    Option("--ks-bench-budget", "time spent timing each benchmark case (default: the task's "
           "bench.budget_s)", "SECONDS", ini="ks_bench_budget"),
    Option("--ks-bench-workers", "worker processes each kernel is timed in, taking the rounds "
           "in turn: a process that runs a kernel slower for its whole life (0.7-4.5%% seen on an "
           "H200, 5-24%% on a 2-core CPU) then widens the intervals instead of moving the "
           "ratio; costs a worker start per kernel and extra worker. auto (default): one a "
           "round (4) on a GPU when two or more kernels are compared (candidates, --ks-beside, "
           "--ks-compare's saved copies), else 1; rounds that run out of device memory go on "
           "in one", "N", ini="ks_bench_workers",
           ini_default="auto"),
    Option("--evolve", "evolve the task folder given with the Kernel Scientist (selector, "
           "designer, writer) until its population has N generations after the seeds, each "
           "evaluated as a child pytest run; rerun to resume after an interruption", "N",
           group="evolve"),
    Option("--ks-baselines", "baselines timed beside each candidate: all (default), none, or "
           "comma-separated names from the task's [[baselines]]", "NAMES", ini="ks_baselines",
           ini_default="all"),
    Option("--ks-beside", "a kernel file timed interleaved beside every candidate, as an extra "
           "baseline named by its file stem (speedups vs_<stem>, with intervals); repeatable. "
           "--evolve times each generation's parents this way", "PATH", action="append"),
    Option("--ks-same-as", "a JSON file of the form "
           "{\"STEM\": {\"as\": \"OTHER\", \"cases\": [CASE_ID, ...]}}: on those "
           "benchmarks candidate STEM runs kernel OTHER's code (its knob point there), "
           "so it is not timed again and its result there is OTHER's in this session, marked "
           "timed_as; --evolve's child sessions pass it for knob moves and grafts", "PATH"),
    Option("--ks-skip-reference", "do not time the task's reference (no reference node, no "
           "speedup_vs_ref); --evolve's child sessions pass it", action="store_true"),
    Option("--ks-min-speedup", "gate: fail a candidate whose geomean speedup over baseline NAME "
           "(or 'reference') is below FACTOR, e.g. cublas_task_layout=1.5; repeatable (the ini "
           "twin takes several, space-separated)", "NAME=FACTOR", ini="ks_min_speedup",
           ini_default=[], ini_type="args", action="append", group="gates"),
    Option("--ks-compare", "compare each candidate with its result in PATH, a --ks-json file of "
           "an earlier run (a renamed file is found by its text); the file it ran there (saved "
           "in PATH) is timed beside it as <stem>_saved; a report without "
           "--ks-max-regression. The ini twin's file not there yet warns and compares with "
           "nothing", "PATH", ini="ks_compare", group="gates"),
    Option("--ks-max-regression", "gate: fail a candidate more than PERCENT slower than in "
           "--ks-compare, or not in it (geomean over common benchmarks, against its saved file "
           "timed beside it, else through the reference timed in both runs on one machine, "
           "which also overrules the saved copy where the two disagree and the reference's "
           "own time held still); it fails only when "
           "the change's 95%% interval excludes no change, e.g. 5%% (below 1, write the %%)",
           "PERCENT", ini="ks_max_regression", group="gates"),
)


def register(parser: pytest.Parser, options: tuple[Option, ...]) -> None:
    """Add each option of a table to pytest: the flag in its ``GROUPS`` section of the help,
    its ini twin on ``parser``."""
    for option in options:
        group = _group(parser, option.group)
        help_text = option.help + (f" (ini: {option.ini})" if option.ini else "")
        if option.action == "store_true":
            group.addoption(option.flag, dest=option.dest, action="store_true", default=False,
                            help=help_text)
        else:
            group.addoption(option.flag, dest=option.dest, action=option.action,
                            default=[] if option.action == "append" else None,
                            metavar=option.metavar, help=help_text)
        if option.ini:
            parser.addini(option.ini, f"default for {option.flag}", type=option.ini_type,
                          default=option.ini_default)


def raw_value(config: pytest.Config, option: Option) -> tuple[Any, str]:
    """The option's raw value, the flag's when given, else its ini twin's, and the name to quote
    in messages: ``name (ini)`` where an ini file set the value, else the flag (an unset ini
    twin reads as its default, which is no user's typing)."""
    value = config.getoption(option.dest, default=None)
    if value not in (None, [], False) or option.ini is None:
        return value, option.flag
    try:
        value = config.getini(option.ini)
    except ValueError as exc:  # a "bool" ini that is no truth value: pytest raises
        raise pytest.UsageError(
            f"{option.ini} (ini): {exc}; expected true or false (also 1/0, yes/no, on/off)"
        ) from None
    unset = value in (None, "", [], False) or value == option.ini_default
    return value, option.flag if unset else f"{option.ini} (ini)"


_BY_DEST = {option.dest: option for option in CORE_OPTIONS}


def _named(config: pytest.Config, dest: str) -> tuple[Any, str]:
    """A core option's raw value and the name its errors quote: the flag, or the ini key
    (``ks_timeout (ini)``) where the value came from an ini file."""
    return raw_value(config, _BY_DEST[dest])


def _value(config: pytest.Config, dest: str) -> Any:
    """A core option's raw value (the flag wins over its ini twin)."""
    return _named(config, dest)[0]


# The options whose names the gates' verdicts and the own-share check quote (Settings.names).
QUOTED = ("ks_min_speedup", "ks_max_regression", "ks_compare", "ks_min_own_share")


def option_name(config: pytest.Config, dest: str) -> str:
    """How messages after configure time (collection errors) name core option ``dest``."""
    return _named(config, dest)[1]


def _group(parser: pytest.Parser, key: str) -> pytest.OptionGroup:
    """The help section ``key`` of ``GROUPS`` (pytest returns the group once created)."""
    return parser.getgroup(*GROUPS[key])


def add_options(parser: pytest.Parser) -> None:
    """Register the core options (the --evolve and LLM tables register theirs beside them)."""
    for key in GROUPS:  # created in this order; a section left empty is not shown
        _group(parser, key)
    register(parser, CORE_OPTIONS)


def _positive(flag: str, raw: str, kind: type = float) -> float:
    try:
        value = kind(raw)
    except ValueError:
        value = 0
    # NaN compares false both ways and inf overflows the worker's deadlines: finite only.
    if not (0 < value < float("inf")):
        noun = "a positive number of seconds" if kind is float else "a positive integer"
        raise pytest.UsageError(f"{flag} expects {noun}, got '{raw}'")
    return value


def _can_create_in(folder: Path) -> bool:
    """Whether a file can be made in ``folder`` (tried: root passes the access check for /proc
    and read-only mounts, where the results' write then failed after the whole run)."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".ks-json-probe-", dir=folder)
    except OSError:
        return False
    os.close(fd)
    os.unlink(probe)
    return True


def unusable_stem(path: Path) -> str:
    """Why ``path``'s stem cannot name a candidate's items ("" when it can)."""
    if "[" not in path.stem and "]" not in path.stem:
        return ""
    return (f"the file's stem '{path.stem}' names its test items "
            f"(task.toml::{path.stem}::check[...]), and pytest reads a node id's first '[' as "
            "the start of its last part's parameters, so those ids could not be passed back to "
            "pytest; rename the file without '[' and ']'")


def _kernel_files(flag: str, raws: list[str]) -> tuple[Path, ...]:
    """Existing .py files, made absolute as given; a usage error naming ``flag`` otherwise.

    Symlinks are not followed (as pytest does with its own paths): a kernel is named by the
    stem of the path the user gave, so ``--kernel link.py`` is ``link`` to ``-k`` and in the
    results, while its worker reads the target's code through the link."""
    paths = []
    for raw in raws:
        path = Path(raw).expanduser()
        if path.is_dir():
            raise pytest.UsageError(
                f"{flag} {raw}: is a folder; expected a Python file exposing "
                "custom_kernel(data) (for a folder of solutions matched to tasks by name: "
                "--ks-solutions DIR)")
        if not path.is_file():
            # Relative to where pytest runs, as pytest's own paths: an ini's addopts too, so a
            # run from a subfolder missed the file with no word of where it looked.
            where = "" if path.is_absolute() else f" in {Path.cwd()}"
            raise pytest.UsageError(
                f"{flag} {raw}: no such file{where}; expected a Python file exposing "
                "custom_kernel(data)")
        if path.suffix != ".py":
            raise pytest.UsageError(
                f"{flag} {raw}: expected a .py file exposing custom_kernel(data), got "
                f"'{path.suffix or 'no suffix'}'"
            )
        unusable = unusable_stem(path)
        if unusable:
            raise pytest.UsageError(f"{flag} {raw}: {unusable}")
        given = Path(os.path.abspath(path))  # lexically, as pytest's absolutepath
        if given not in paths:  # one path given twice runs once, as pytest's paths
            paths.append(given)
    return tuple(paths)


def resolve(config: pytest.Config) -> Settings:
    """Validate every option once; raise pytest.UsageError naming the flag and the fix."""
    opt = config.option
    kernels = _kernel_files("--kernel", opt.kernel)
    beside = _kernel_files("--ks-beside", opt.ks_beside)
    both = [p for p in beside if p in kernels]
    if both:
        raise pytest.UsageError(
            f"--kernel/--ks-beside: {both[0]} is given to both, expected each kernel once "
            "(--kernel makes it a candidate with items, --ks-beside times it beside the "
            "candidates without items of its own); drop one of the two")
    stems = [p.stem for p in kernels] + [p.stem for p in beside]
    for stem in set(stems):
        if stems.count(stem) > 1:
            clash = ", ".join(str(p) for p in (*kernels, *beside) if p.stem == stem)
            raise pytest.UsageError(
                f"--kernel/--ks-beside: two kernels are named '{stem}' ({clash}); test ids and "
                "speedup columns use the file stem, so rename one"
            )
    if opt.ks_salt is None:
        salt, salt_given = secrets.randbits(32), False
    else:
        try:
            salt, salt_given = int(opt.ks_salt), True
        except ValueError:
            raise pytest.UsageError(
                f"--ks-salt expects the integer printed by an earlier run, got '{opt.ks_salt}'"
            ) from None
    profile = _value(config, "ks_profile") or "auto"
    raw_device, device_name = _named(config, "ks_device")
    device = (raw_device or "auto").strip()
    if device not in ("auto", "cpu", "cuda") and not (
        device.startswith("cuda:") and device[5:].isdigit()
    ):
        raise pytest.UsageError(
            f"{device_name} expects auto, cpu, cuda or cuda:N, got '{device}'"
        )
    raw_timeout, timeout_name = _named(config, "ks_timeout")
    timeout = _positive(timeout_name, raw_timeout)
    raw_budget, budget_name = _named(config, "ks_bench_budget")
    budget = _positive(budget_name, raw_budget) if raw_budget else None
    evolve = None
    if opt.evolve is not None:
        evolve = int(_positive("--evolve", opt.evolve, int))
        for flag, given in (("--kernel", bool(kernels)), ("--ks-json", bool(opt.ks_json))):
            if given:
                raise pytest.UsageError(
                    f"--evolve cannot be combined with {flag}: evolution picks its own "
                    f"candidates and writes results to the population folder; drop {flag}"
                )
        # --setup-plan implies --setup-only; like --collect-only they run no item's call.
        listing = next((flag for flag, on in (
            ("--collect-only", config.getoption("collectonly", False)),
            ("--setup-plan", config.getoption("setupplan", False)),
            ("--setup-only", config.getoption("setuponly", False))) if on), None)
        if listing is not None:
            raise pytest.UsageError(
                f"--evolve cannot be combined with {listing}: each generation is evaluated "
                f"in a child session and written to the population folder, which {listing} "
                "must not do (with --ks-llm gemini, not pay for); to list a task's items: "
                f"pytest TASK {listing}")
        if opt.ks_same_as:
            raise pytest.UsageError(
                "--evolve cannot be combined with --ks-same-as: each generation's child session "
                "is given its own, for the children that run their parents' code on some "
                "benchmarks; drop --ks-same-as")
        # Given on the command line only: a project's ini gates stay for its plain runs.
        gates = (("--ks-min-speedup", bool(opt.ks_min_speedup)),
                 ("--ks-max-regression", opt.ks_max_regression is not None),
                 ("--ks-compare", opt.ks_compare is not None))
        for flag, given in gates:
            if given:
                raise pytest.UsageError(
                    f"--evolve cannot be combined with {flag}: its generations are judged by "
                    f"their timings beside their parents, not by gates; drop {flag} and gate "
                    "the kernel it finds in a plain run (pytest TASK --kernel BEST.py "
                    f"{flag} ...)")
    json_path = Path(opt.ks_json) if opt.ks_json else None
    if json_path is not None and json_path.is_dir():
        # Found at the start, not after a long evaluation whose results it would lose.
        raise pytest.UsageError(f"--ks-json {json_path}: is a folder, expected the path of the "
                                f"JSON file to write; e.g. --ks-json {json_path / 'results.json'}")
    if json_path is not None and not (json_path.is_symlink() or json_path.exists()):
        # The first existing folder above it must be a writable folder (the rest is made); an
        # existing file, link, pipe or device is written through at the end.
        above = next(p for p in json_path.absolute().parents if p.exists())
        if not above.is_dir() or not _can_create_in(above):
            what = "is a file, not a folder" if not above.is_dir() else "is not writable"
            raise pytest.UsageError(
                f"--ks-json {json_path}: cannot be written, {above} {what}; give a path in a "
                "folder you can write, e.g. --ks-json results.json")
    raw_drawn, drawn_name = _named(config, "ks_drawn")
    drawn = None
    if raw_drawn not in (None, ""):
        try:
            drawn = int(raw_drawn)
        except ValueError:
            drawn = -1
        if drawn < 0:
            raise pytest.UsageError(f"{drawn_name} expects a number of cases (0 or more), got "
                                    f"'{raw_drawn}'")
    solutions = Path(opt.ks_solutions).resolve() if opt.ks_solutions else None
    if solutions is not None and not solutions.is_dir():
        raise pytest.UsageError(f"--ks-solutions {opt.ks_solutions}: expected a folder of "
                                "candidate files, found none there; fix the path")
    if solutions is not None and (kernels or evolve is not None):
        raise pytest.UsageError("--ks-solutions cannot be combined with --kernel or --evolve: "
                                "each picks the candidates; drop one")
    compare_path, compare_runs, max_regression = _comparison(config)
    if (json_path is not None and compare_path is not None
            and json_path.resolve() == compare_path.resolve()):
        # The run wrote its results over the saved run it was gated on: a rerun of the failed
        # job then compared the slow kernel with itself, and passed.
        raise pytest.UsageError(
            f"--ks-json {json_path} is the file {option_name(config, 'ks_compare')} compares "
            "with: this run would write over the saved run it is gated on; write its results "
            "to another file, e.g. --ks-json results.json")
    min_speedup = _min_speedups(*_named(config, "ks_min_speedup"))
    skip_reference = bool(opt.ks_skip_reference)
    if skip_reference and any(name == "reference" for name, _ in min_speedup):
        raise pytest.UsageError(
            "--ks-min-speedup reference=...: the gate needs the reference timed, but "
            "--ks-skip-reference leaves it out; drop one of the two"
        )
    return Settings(
        kernels=tuple(kernels), json_path=json_path, salt=salt, salt_given=salt_given,
        profile=profile, device=device, timeout_s=timeout, bench_budget_s=budget, evolve=evolve,
        baselines=_baselines(config),
        min_speedup=min_speedup, compare_path=compare_path, compare_runs=compare_runs,
        max_regression=max_regression, skip_reference=skip_reference, beside=beside,
        solutions=solutions, drawn=drawn, kernelbench_tol=_tolerance(config),
        lenient_task=bool(_value(config, "ks_lenient_task")),
        attribution=bool(_value(config, "ks_attribution")),
        min_own_share=_share(config), bench_workers=_bench_workers(config),
        same_as=_same_as(opt.ks_same_as),
        names={dest: option_name(config, dest) for dest in QUOTED},
    )


def _same_as(raw: str | None) -> dict[str, tuple[str, frozenset[str]]]:
    """--ks-same-as's file read: stem -> (other stem, case ids); a usage error naming what is
    wrong with it."""
    if not raw:
        return {}
    shape = ('{"c0006": {"as": "c0001", "cases": ["m1024-n512-k7168-s6563"]}}: a candidate '
             'stem, the kernel whose code it runs, and the case ids of the benchmarks where it '
             'does')
    try:
        data = json.loads(Path(raw).read_text(encoding="utf-8"))
    except OSError as exc:
        raise pytest.UsageError(f"--ks-same-as {raw}: cannot be read ({exc.strerror or exc}); "
                                "give the path of a JSON file") from None
    except ValueError as exc:
        raise pytest.UsageError(f"--ks-same-as {raw}: not JSON ({exc}); expected {shape}"
                                ) from None
    if not isinstance(data, dict):
        raise pytest.UsageError(f"--ks-same-as {raw}: expected a JSON object, found "
                                f"{type(data).__name__}; e.g. {shape}")
    out: dict[str, tuple[str, frozenset[str]]] = {}
    for stem, entry in data.items():
        other = entry.get("as") if isinstance(entry, dict) else None
        cases = entry.get("cases") if isinstance(entry, dict) else None
        if (not isinstance(other, str) or not other or not isinstance(cases, list)
                or not all(isinstance(c, str) and c for c in cases)):
            raise pytest.UsageError(f"--ks-same-as {raw}: the entry of '{stem}' is "
                                    f"{json.dumps(entry)[:120]}; expected {shape}")
        if other == stem:
            raise pytest.UsageError(f"--ks-same-as {raw}: '{stem}' is named as running its own "
                                    "code; name another kernel or drop the entry")
        out[stem] = (other, frozenset(cases))
    for stem, (other, _) in out.items():
        if other in out:
            raise pytest.UsageError(
                f"--ks-same-as {raw}: '{stem}' runs '{other}''s code, which is itself named "
                f"as running '{out[other][0]}''s; name the kernel that is timed "
                f"('{out[other][0]}') for both")
    return out


def _bench_workers(config: pytest.Config) -> int | None:
    raw, name = _named(config, "ks_bench_workers")
    if raw in (None, "", "auto"):
        return None
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if not 1 <= value <= 8:
        raise pytest.UsageError(f"{name} expects auto or a number of worker processes per "
                                f"kernel from 1 to 8 (2 spreads each kernel's rounds over two), "
                                f"got '{raw}'")
    return value


def _share(config: pytest.Config) -> float | None:
    raw, name = _named(config, "ks_min_own_share")
    if raw in (None, ""):
        return None
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 1:
        raise pytest.UsageError(f"{name} expects a share of the candidate's time "
                                f"between 0 and 1 (e.g. 0.5 for half), got '{raw}'")
    return value


def _tolerance(config: pytest.Config) -> float:
    raw, name = _named(config, "ks_kernelbench_tol")
    if raw in (None, ""):
        return 1e-2
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise pytest.UsageError(f"{name} expects a tolerance of 0 or more (e.g. "
                                f"1e-4), got '{raw}'")
    return value


def _baselines(config: pytest.Config) -> tuple[str, ...] | None:
    given, name = _named(config, "ks_baselines")
    raw = (given or "all").strip()
    if raw == "all":
        return None
    if raw == "none":
        return ()
    names = tuple(n.strip() for n in raw.split(","))
    if not all(names):
        raise pytest.UsageError(
            f"{name} expects all, none or comma-separated baseline names, got '{raw}'; "
            "e.g. --ks-baselines cublas_task_layout,cublas_kmajor"
        )
    return names


def _min_speedups(raw: list[str], option: str) -> tuple[tuple[str, float], ...]:
    gates: dict[str, float] = {}
    for item in raw:
        name, sep, factor = item.partition("=")
        if sep and name.strip() in gates:
            raise pytest.UsageError(
                f"{option} names '{name.strip()}' twice ({gates[name.strip()]:g} and "
                f"{factor.strip()}); keep one gate per baseline")
        try:
            value = float(factor.strip().removesuffix("x"))
        except ValueError:
            value = 0.0
        if not sep or not name.strip() or not value > 0:
            raise pytest.UsageError(
                f"{option} expects NAME=FACTOR with a baseline name and a positive "
                f"factor, got '{item}'; e.g. --ks-min-speedup cublas_task_layout=1.5"
            )
        gates[name.strip()] = value
    return tuple(gates.items())


def _comparison(config: pytest.Config) -> tuple[Path | None, tuple[Any, ...], float | None]:
    for dest, (wanted, example) in {"ks_compare": ("a --ks-json file", "baseline.json"),
                                    "ks_max_regression": ("a percentage", "5%")}.items():
        if config.getoption(dest, default=None) == "":
            # An unset CI variable (--ks-max-regression "$LIMIT") dropped the gate in silence.
            flag = _BY_DEST[dest].flag
            raise pytest.UsageError(
                f"{flag} was given an empty value, expected {wanted}; the variable it was set "
                f"from is empty? e.g. {flag} {example}")
    raw_path, path_name = _named(config, "ks_compare")
    raw_max, max_name = _named(config, "ks_max_regression")
    max_regression = _percentage(raw_max, max_name) if raw_max else None
    if max_regression is not None and not raw_path:
        raise pytest.UsageError(
            f"{max_name} {raw_max} needs --ks-compare PATH (ini: ks_compare), the "
            "--ks-json file of the run to compare with; add it"
        )
    if not raw_path:
        return None, (), max_regression
    from pytest_kscientist.harness.gates import read_saved

    path = Path(raw_path).expanduser()
    if path_name != "--ks-compare" and config.inipath is not None:
        path = config.inipath.parent / path  # an ini value is relative to its file
        if not path.exists() and max_name != "--ks-max-regression":
            # A project's ini names the saved run every run reads: before the run that saves
            # it, and on a checkout without it, every run (--help too) was a usage error.
            gate = f" and judges no {max_name} gate" if max_regression is not None else ""
            config.issue_config_time_warning(KsNoSavedRun(
                f"{path_name} {path}: no such file yet, so this run compares with no saved "
                f"run{gate}; save one with --ks-json {raw_path} (from the ini file's folder), "
                "or pass --ks-compare to make a missing file an error"), stacklevel=2)
            return None, (), None
    return path, tuple(read_saved(path, path_name)), max_regression


def _percentage(raw: str, name: str) -> float:
    """``--ks-max-regression``'s value as a fraction (5% -> 0.05); a usage error for anything
    but a finite non-negative percentage, and for a bare number below 1 (0.05 reads as 0.05%,
    and is as often meant as a fraction of 5%)."""
    text = str(raw).strip()
    marked = text.endswith("%")
    try:
        value = float(text.removesuffix("%").strip())
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise pytest.UsageError(
            f"{name} expects a non-negative percentage, got '{raw}'; e.g. --ks-max-regression 5%"
        )
    if not marked and 0 < value < 1:
        raise pytest.UsageError(
            f"{name} {raw}: a number below 1 without '%' is ambiguous: it reads as {value:g}%, "
            f"but may mean a fraction ({value * 100:g}%); write {value:g}% or {value * 100:g}%")
    return value / 100.0


MARKDOWN_HEAD = """# Options

Every flag, by its section of `pytest --help`. A flag's ini twin fixes it in the project's ini
file (`[tool.pytest.ini_options]` in `pyproject.toml`, or `pytest.ini`); the flag wins. A bad
value is a usage error naming the option, what was expected and the fix. Generated from the
option tables (`options.py`, `evolve/run_options.py`, `evolve/llm/llm_options.py`) by
`python -m pytest_kscientist.options --markdown > docs/options.md`; `tests/test_docs.py`
fails when this page and the tables disagree.
"""


def markdown() -> str:
    """The options reference (docs/options.md): every option table, one section per group."""
    from pytest_kscientist.evolve.llm.llm_options import LLM_OPTIONS
    from pytest_kscientist.evolve.run_options import EVOLVE_OPTIONS

    options = (*CORE_OPTIONS, *EVOLVE_OPTIONS, *LLM_OPTIONS)
    lines = [MARKDOWN_HEAD]
    for key, (_, title) in GROUPS.items():
        heading = title.removeprefix("kscientist: ")
        lines += [f"## {heading[0].upper()}{heading[1:]}", "",
                  "| flag | ini | meaning |", "|---|---|---|"]
        for option in (o for o in options if o.group == key):
            flag = option.flag + (f" {option.metavar}" if option.metavar else "")
            flag = f"`{flag}`" + (" (repeatable)" if option.action == "append" else "")
            ini = f"`{option.ini}`" if option.ini else ""
            # Escaped so that `<task>` and `a|b` show as written, not as HTML or a new cell.
            meaning = option.help.replace("%%", "%").replace("<", "\\<").replace("|", "\\|")
            lines.append(f"| {flag} | {ini} | {meaning} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1:] != ["--markdown"]:
        sys.exit("usage: python -m pytest_kscientist.options --markdown > docs/options.md")
    sys.stdout.write(markdown())
