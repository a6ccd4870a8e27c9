"""Command-line flags and their ini twins, resolved once into a frozen ``Settings``."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from pathlib import Path

import pytest

PROFILES = ("auto", "cpu", "full")


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
                    help="run N generations of the Kernel Scientist (selector, designer, writer) "
                    "on the task folder given, evaluating each generation as a pytest run")
    parser.addini("ks_profile", "default for --ks-profile", default="auto")
    parser.addini("ks_device", "default for --ks-device", default="auto")
    parser.addini("ks_timeout", "default for --ks-timeout", default="120")
    parser.addini("ks_bench_budget", "default for --ks-bench-budget", default="")
    return group


def _positive(flag: str, raw: str, kind: type = float) -> float:
    try:
        value = kind(raw)
    except ValueError:
        value = 0
    if value <= 0:
        noun = "a positive number of seconds" if kind is float else "a positive integer"
        raise pytest.UsageError(f"{flag} expects {noun}, got '{raw}'")
    return value


def resolve(config: pytest.Config) -> Settings:
    """Validate every option once; raise pytest.UsageError naming the flag and the fix."""
    opt = config.option
    kernels = []
    for raw in opt.kernel:
        path = Path(raw).expanduser()
        if not path.is_file():
            raise pytest.UsageError(
                f"--kernel {raw}: no such file; expected a Python file exposing custom_kernel(data)"
            )
        if path.suffix != ".py":
            raise pytest.UsageError(
                f"--kernel {raw}: expected a .py file exposing custom_kernel(data), got "
                f"'{path.suffix or 'no suffix'}'"
            )
        kernels.append(path.resolve())
    stems = [p.stem for p in kernels]
    for stem in set(stems):
        if stems.count(stem) > 1:
            clash = ", ".join(str(p) for p in kernels if p.stem == stem)
            raise pytest.UsageError(
                f"--kernel: two candidates are named '{stem}' ({clash}); test ids use the file "
                "stem, so rename one"
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
    return Settings(
        kernels=tuple(kernels), json_path=json_path, salt=salt, salt_given=salt_given,
        profile=profile, device=device, timeout_s=timeout, bench_budget_s=budget, evolve=evolve,
    )
