"""Options of ``--evolve`` runs (flags with ini twins), resolved once into ``EvolveSettings``.

``plugin.py`` calls ``add_options(parser)`` from ``pytest_addoption`` and
``resolve(config)`` from ``pytest_configure`` when ``--evolve`` is given (kept in the frozen
``Settings`` as ``evolve_options``). The flag wins over its ini twin.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from pytest_kscientist.options import Option, raw_value, register

DEFAULT_CANDIDATES = 3


@dataclass(frozen=True)
class EvolveSettings:
    """Budgets and places of an evolution run."""

    candidates: int
    time_limit_s: float | None
    population_root: Path
    # --ks-devices: each generation's candidates split over parallel child sessions, one per
    # device; () for one child session on the harness's usual device.
    devices: tuple[str, ...] = ()


EVOLVE_OPTIONS = (
    Option("--ks-candidates", f"new candidates per --evolve generation (default "
           f"{DEFAULT_CANDIDATES})", "N", ini="ks_candidates",
           ini_default=str(DEFAULT_CANDIDATES), group="evolve"),
    Option("--ks-time-limit", "stop --evolve cleanly after SECONDS of wall-clock time; rerun to "
           "continue (default: no limit)", "SECONDS", ini="ks_time_limit", group="evolve"),
    Option("--ks-population", "folder holding the populations of --evolve, one subfolder per "
           "task (default: <rootdir>/population; the ini twin is relative to the ini file)",
           "DIR", ini="ks_population", group="evolve"),
    Option("--ks-devices", "evaluate each --evolve generation in parallel child sessions, one "
           "per device: comma-separated cuda:N entries (GPUs of one model) or cpu entries, or "
           "'all' for every CUDA device (default: one session)", "LIST", ini="ks_devices",
           group="devices"),
)
_BY_DEST = {option.dest: option for option in EVOLVE_OPTIONS}


def add_options(parser: pytest.Parser) -> None:
    """Register the ``--evolve`` table: ``--ks-candidates``, ``--ks-time-limit``,
    ``--ks-population``, ``--ks-devices`` and their ini twins."""
    register(parser, EVOLVE_OPTIONS)


def _raw(config: pytest.Config, dest: str) -> tuple[str, str]:
    """The raw value and the name to quote in errors (the flag, or the ini key)."""
    value, name = raw_value(config, _BY_DEST[dest])
    return str(value or "").strip(), name


def resolve(config: pytest.Config) -> EvolveSettings:
    """Validate and resolve the options; raise ``pytest.UsageError`` naming the option and fix."""
    raw, name = _raw(config, "ks_candidates")
    try:
        candidates = int(raw)
    except ValueError:
        candidates = 0
    if candidates <= 0:
        raise pytest.UsageError(
            f"{name} expects a positive integer (new candidates per generation), got '{raw}'; "
            f"e.g. {DEFAULT_CANDIDATES}"
        )
    raw, name = _raw(config, "ks_time_limit")
    time_limit = None
    if raw:
        try:
            time_limit = float(raw)
        except ValueError:
            time_limit = 0.0
        if not time_limit > 0 or time_limit == float("inf"):
            raise pytest.UsageError(
                f"{name} expects a positive number of seconds, got '{raw}'; e.g. 3600, or leave "
                "it out for no limit"
            )
    flag = config.getoption("ks_population", default=None)
    if flag:
        root = config.invocation_params.dir / Path(flag).expanduser()
        name = "--ks-population"
    elif raw_ini := str(config.getini("ks_population") or "").strip():
        base = config.inipath.parent if config.inipath else config.rootpath
        root, name = base / Path(raw_ini).expanduser(), "ks_population (ini)"
    else:
        root, name = config.rootpath / "population", "the default population folder"
    if root.exists() and not root.is_dir():
        raise pytest.UsageError(
            f"{name} expects a directory, found a file at {root}; point it at a folder"
        )
    return EvolveSettings(candidates, time_limit, root.resolve(), _devices(config))


def _devices(config: pytest.Config) -> tuple[str, ...]:
    raw, name = _raw(config, "ks_devices")
    if not raw:
        return ()
    if config.getoption("ks_device", default=None):
        raise pytest.UsageError(
            f"{name} and --ks-device both pick devices; keep {name} (one child session per "
            "device) or --ks-device (one session), not both"
        )
    if raw == "all":
        import torch

        count = torch.cuda.device_count()
        if count == 0:
            raise pytest.UsageError(
                f"{name} all: this machine has no CUDA device; name devices (e.g. cpu,cpu) or "
                "leave the option out"
            )
        return _one_model(tuple(f"cuda:{i}" for i in range(count)), name, raw)
    given = [d.strip() for d in raw.split(",")]
    bad = [d for d in given if d != "cpu" and not re.fullmatch(r"cuda:[0-9]+", d)]
    if bad:
        raise pytest.UsageError(
            f"{name} expects comma-separated cuda:N or cpu entries, or all; got '{bad[0]}' in "
            f"'{raw}'; e.g. cuda:0,cuda:1"
        )
    # cuda:01 is cuda:1 (and torch refuses the spelling in the child, after generation 0)
    devices = tuple(d if d == "cpu" else f"cuda:{int(d[5:])}" for d in given)
    if "cpu" in devices and len(set(devices)) > 1:
        raise pytest.UsageError(
            f"{name} '{raw}' mixes cpu with GPUs: the sessions would time other profiles on "
            "other machines, and their kernels would be ranked together; name GPUs only, or "
            "cpu entries only"
        )
    gpus = [d for d in devices if d != "cpu"]
    if len(set(gpus)) != len(gpus):
        raise pytest.UsageError(
            f"{name} names a GPU twice in '{raw}': two sessions on one GPU would disturb each "
            "other's timings; name each GPU once"
        )
    if gpus:
        import torch

        count = torch.cuda.device_count()
        missing = [d for d in gpus if int(d[5:]) >= count]
        if missing:
            have = (f"{count} CUDA device(s), cuda:0 to cuda:{count - 1}" if count else
                    "no CUDA device")
            raise pytest.UsageError(
                f"{name} names {missing[0]}, but torch sees {have} here; name devices it "
                "sees, all, or cpu entries")
        return _one_model(devices, name, raw)
    return devices


def _one_model(gpus: tuple[str, ...], name: str, raw: str) -> tuple[str, ...]:
    """``gpus``, where they are of one model: each generation's kernels are ranked together
    whichever session timed them (the seeds of generation 0 are dealt across the sessions)."""
    import torch

    models = {d: torch.cuda.get_device_name(int(d[5:])) for d in gpus}
    if len(set(models.values())) > 1:
        seen = ", ".join(f"{d} {m}" for d, m in models.items())
        raise pytest.UsageError(
            f"{name} {raw} names GPUs of different models ({seen}): their sessions' times "
            "would be ranked together as one machine's; name GPUs of one model")
    return gpus


def validate(config: pytest.Config) -> None:
    """Check the ``--evolve`` options once, at configure time."""
    resolve(config)
