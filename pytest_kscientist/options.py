"""Command-line flags and their ini twins, resolved once into a frozen ``Settings``."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest


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


def add_options(parser: pytest.Parser) -> pytest.OptionGroup:
    group = parser.getgroup("kscientist", "pytest-kscientist: GPU kernel tasks")
    group.addoption(
        "--kernel", action="append", default=[], metavar="PATH",
        help="candidate file exposing custom_kernel(data) to evaluate instead of the task's "
        "seeds; repeat for several",
    )
    group.addoption("--ks-json", metavar="PATH", default=None,
                    help="write machine-readable results (versioned JSON) to PATH")
    group.addoption("--ks-salt", metavar="INT", default=None,
                    help="reuse the secret seed salt of an earlier run to reproduce it")
    group.addoption("--ks-profile", metavar="NAME", default=None,
                    help="case profile: auto (full with a GPU, else cpu), cpu, full or any "
                    "profile the task defines (ini: ks_profile)")
    group.addoption("--ks-device", metavar="DEV", default=None,
                    help="device the candidates run on: auto, cpu, cuda or cuda:N "
                    "(ini: ks_device)")
    group.addoption("--ks-timeout", metavar="SECONDS", default=None,
                    help="a worker that does not answer within SECONDS is killed and its test "
                    "fails (ini: ks_timeout; default 120)")
    group.addoption("--ks-bench-budget", metavar="SECONDS", default=None,
                    help="time spent timing each benchmark case (ini: ks_bench_budget; default: "
                    "the task's bench.budget_s)")
    group.addoption("--evolve", metavar="N", default=None,
                    help="evolve the task folder given with the Kernel Scientist (selector, "
                    "designer, writer) until its population has N generations after the seeds, "
                    "each evaluated as a child pytest run; rerun to resume after an interruption")
    group.addoption("--ks-baselines", metavar="NAMES", default=None,
                    help="baselines timed beside each candidate: all (default), none, or "
                    "comma-separated names from the task's [[baselines]] (ini: ks_baselines)")
    group.addoption("--ks-beside", action="append", default=[], metavar="PATH",
                    help="a kernel file timed interleaved beside every candidate, as an extra "
                    "baseline named by its file stem (speedups vs_<stem>, with intervals); "
                    "repeatable. --evolve times each generation's parents this way")
    group.addoption("--ks-skip-reference", action="store_true", default=False,
                    help="do not time the task's reference (no reference node, no "
                    "speedup_vs_ref); --evolve's child sessions pass it")
    group.addoption("--ks-min-speedup", action="append", default=[], metavar="NAME=FACTOR",
                    help="gate: fail a candidate whose geomean speedup over baseline NAME (or "
                    "'reference') is below FACTOR, e.g. cublas_task_layout=1.5; repeatable "
                    "(ini: ks_min_speedup, space-separated)")
    group.addoption("--ks-compare", metavar="PATH", default=None,
                    help="compare each candidate with its result in PATH, a --ks-json file of "
                    "an earlier run (ini: ks_compare)")
    group.addoption("--ks-max-regression", metavar="PERCENT", default=None,
                    help="gate: fail a candidate more than PERCENT slower (geomean over common "
                    "benchmarks) than in --ks-compare, e.g. 5%% (ini: ks_max_regression)")
    parser.addini("ks_profile", "default for --ks-profile", default="auto")
    parser.addini("ks_device", "default for --ks-device", default="auto")
    parser.addini("ks_timeout", "default for --ks-timeout", default="120")
    parser.addini("ks_bench_budget", "default for --ks-bench-budget", default="")
    parser.addini("ks_baselines", "default for --ks-baselines", default="all")
    parser.addini("ks_min_speedup", "default for --ks-min-speedup (NAME=FACTOR ...)",
                  type="args", default=[])
    parser.addini("ks_compare", "default for --ks-compare", default="")
    parser.addini("ks_max_regression", "default for --ks-max-regression", default="")
    return group


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


def _kernel_files(flag: str, raws: list[str]) -> tuple[Path, ...]:
    """Existing .py files, resolved; a usage error naming ``flag`` otherwise."""
    paths = []
    for raw in raws:
        path = Path(raw).expanduser()
        if not path.is_file():
            raise pytest.UsageError(
                f"{flag} {raw}: no such file; expected a Python file exposing custom_kernel(data)"
            )
        if path.suffix != ".py":
            raise pytest.UsageError(
                f"{flag} {raw}: expected a .py file exposing custom_kernel(data), got "
                f"'{path.suffix or 'no suffix'}'"
            )
        paths.append(path.resolve())
    return tuple(paths)


def resolve(config: pytest.Config) -> Settings:
    """Validate every option once; raise pytest.UsageError naming the flag and the fix."""
    opt = config.option
    kernels = _kernel_files("--kernel", opt.kernel)
    beside = _kernel_files("--ks-beside", opt.ks_beside)
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
    profile = opt.ks_profile or config.getini("ks_profile") or "auto"
    device = (opt.ks_device or config.getini("ks_device") or "auto").strip()
    if device not in ("auto", "cpu", "cuda") and not (
        device.startswith("cuda:") and device[5:].isdigit()
    ):
        raise pytest.UsageError(
            f"--ks-device expects auto, cpu, cuda or cuda:N, got '{device}'"
        )
    timeout = _positive("--ks-timeout", opt.ks_timeout or config.getini("ks_timeout"))
    raw_budget = opt.ks_bench_budget or config.getini("ks_bench_budget")
    budget = _positive("--ks-bench-budget", raw_budget) if raw_budget else None
    evolve = None
    if opt.evolve is not None:
        evolve = int(_positive("--evolve", opt.evolve, int))
        for flag, given in (("--kernel", bool(kernels)), ("--ks-json", bool(opt.ks_json))):
            if given:
                raise pytest.UsageError(
                    f"--evolve cannot be combined with {flag}: evolution picks its own "
                    f"candidates and writes results to the population folder; drop {flag}"
                )
    json_path = Path(opt.ks_json) if opt.ks_json else None
    compare_path, compare_runs, max_regression = _comparison(config)
    min_speedup = _min_speedups(opt.ks_min_speedup or config.getini("ks_min_speedup"))
    skip_reference = bool(opt.ks_skip_reference)
    if skip_reference and any(name == "reference" for name, _ in min_speedup):
        raise pytest.UsageError(
            "--ks-min-speedup reference=...: the gate needs the reference timed, but "
            "--ks-skip-reference leaves it out; drop one of the two"
        )
    return Settings(
        kernels=tuple(kernels), json_path=json_path, salt=salt, salt_given=salt_given,
        profile=profile, device=device, timeout_s=timeout, bench_budget_s=budget, evolve=evolve,
        baselines=_baselines(opt.ks_baselines or config.getini("ks_baselines") or "all"),
        min_speedup=min_speedup, compare_path=compare_path, compare_runs=compare_runs,
        max_regression=max_regression, skip_reference=skip_reference, beside=beside,
    )


def _baselines(raw: str) -> tuple[str, ...] | None:
    raw = raw.strip()
    if raw == "all":
        return None
    if raw == "none":
        return ()
    names = tuple(n.strip() for n in raw.split(","))
    if not all(names):
        raise pytest.UsageError(
            f"--ks-baselines expects all, none or comma-separated baseline names, got '{raw}'; "
            "e.g. --ks-baselines cublas_task_layout,cublas_kmajor"
        )
    return names


def _min_speedups(raw: list[str]) -> tuple[tuple[str, float], ...]:
    gates: dict[str, float] = {}
    for item in raw:
        name, sep, factor = item.partition("=")
        try:
            value = float(factor.strip().removesuffix("x"))
        except ValueError:
            value = 0.0
        if not sep or not name.strip() or not value > 0:
            raise pytest.UsageError(
                f"--ks-min-speedup expects NAME=FACTOR with a baseline name and a positive "
                f"factor, got '{item}'; e.g. --ks-min-speedup cublas_task_layout=1.5"
            )
        gates[name.strip()] = value
    return tuple(gates.items())


def _comparison(config: pytest.Config) -> tuple[Path | None, tuple[Any, ...], float | None]:
    opt = config.option
    raw_path = opt.ks_compare or config.getini("ks_compare")
    raw_max = opt.ks_max_regression or config.getini("ks_max_regression")
    max_regression = None
    if raw_max:
        text = raw_max.strip().removesuffix("%")
        try:
            max_regression = float(text) / 100.0
        except ValueError:
            max_regression = -1.0
        if not max_regression >= 0:
            raise pytest.UsageError(
                f"--ks-max-regression expects a non-negative percentage, got '{raw_max}'; "
                "e.g. --ks-max-regression 5%"
            )
        if not raw_path:
            raise pytest.UsageError(
                f"--ks-max-regression {raw_max} needs --ks-compare PATH, the --ks-json file of "
                "the run to compare with; add it"
            )
    if not raw_path:
        return None, (), max_regression
    from pytest_kscientist.gates import read_saved

    path = Path(raw_path).expanduser()
    return path, tuple(read_saved(path)), max_regression
