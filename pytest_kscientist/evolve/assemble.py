"""Who plays the three roles of a run, and what they are told about the task (the brief).

Each role comes from the first ``pytest_kscientist_make_<role>`` hook that returns one (a
``conftest.py`` or plugin can replace any role). The built-in scientists are ``trylast``
implementations of the same hooks (``BuiltinRoles``): the LLM scientist when a provider is
configured, else the offline scientist; pluggy calls them only for roles nobody else filled.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_kscientist.evolve.hardware import describe
from pytest_kscientist.evolve.population import Member
from pytest_kscientist.evolve.roles import (
    DEFAULT_CONTRACT,
    Designer,
    Selector,
    TaskBrief,
    Writer,
)
from pytest_kscientist.formats.task import Task

PROTOCOLS = {"selector": Selector, "designer": Designer, "writer": Writer}


@dataclass(frozen=True)
class Roles:
    """The three roles of one run."""

    selector: Selector
    designer: Designer
    writer: Writer
    notes: tuple[str, ...] = ()

    def names(self) -> dict[str, str]:
        return {
            role: type(getattr(self, role)).__name__ for role in ("selector", "designer", "writer")
        }


def is_budget_exhausted(exc: BaseException) -> bool:
    """Whether a role's error is the LLM budget running out (a clean stop, not a failure)."""
    try:
        from pytest_kscientist.evolve.llm.llm_errors import BudgetExhausted
    except ImportError:
        return False
    return isinstance(exc, BudgetExhausted)


def is_outage(exc: BaseException) -> bool:
    """Whether a role's error is the LLM provider failing for good (the run stops, code 3)."""
    try:
        from pytest_kscientist.evolve.llm.llm_errors import ProviderOutage
    except ImportError:
        return False
    return isinstance(exc, ProviderOutage)


class RoleError(Exception):
    """A hook returned something that cannot play the role."""


def task_brief(task: Task, members: Sequence[Member]) -> TaskBrief:
    """The brief: description, reference source, hardware and benchmarks as last measured."""
    evaluated = [m.evaluation for m in members if m.evaluation is not None]
    latest = max(evaluated, key=lambda e: e.evaluated_at, default=None)
    hardware, bench_ids, bench_cases = "not measured yet", [], {}
    if latest is not None and latest.machine is not None:
        mi = latest.machine
        known = describe(mi.device_name, mi.device)
        hardware = f"{known}; torch {mi.torch}, {mi.platform}"
    if latest is not None and latest.profile in task.spec.profiles:
        hardware += f"; case profile '{latest.profile}'"
        benchmarks = task.spec.profiles[latest.profile].benchmarks
        bench_ids = [task.case_id(c) for c in benchmarks]
        bench_cases = {task.case_id(c): dict(c) for c in benchmarks}
    return TaskBrief(
        name=task.name,
        description=task.spec.description.strip(),
        reference_source=reference_text(task),
        hardware=hardware,
        benchmark_ids=bench_ids,
        benchmark_cases=bench_cases,
        entry=task.entry,
        contract=CONTRACTS.get(task.form, DEFAULT_CONTRACT),
    )


# What a candidate defines, per task format (Task.entry names it; issue 12).
CONTRACTS = {
    "kernelbench": (
        "`class ModelNew(torch.nn.Module)` with Model's constructor arguments and `forward` "
        "arguments, returning what Model returns (parameters created in Model's order get "
        "Model's weights); `get_inputs`/`get_init_inputs` may stay but are not used"
    ),
    "gpumode": (
        "`custom_kernel(data)`: `data` is what the reference's `generate_input` returns, the "
        "result what `ref_kernel` returns, judged by `check_implementation`; `from task import "
        "input_t, output_t` works, `import reference` does not"
    ),
}


def reference_text(task: Task) -> str:
    """The reference the roles see: the problem file of a KernelBench task (its Model), a GPU
    MODE problem's reference.py followed by its task.py (the input and output types), a native
    task's reference.py."""
    if task.form != "gpumode":
        return task.reference.read_text(encoding="utf-8")
    name = task.reference.name
    parts = [f"# ---- {name} ----\n{task.files.get(name, '').rstrip()}"]
    if "task.py" in task.files:
        parts.append(f"# ---- task.py (the input and output types) ----\n"
                     f"{task.files['task.py'].rstrip()}")
    return "\n\n".join(parts) + "\n"


def _llm_roles(config: pytest.Config, brief: TaskBrief, log_dir: Path) -> tuple[Any, list[str]]:
    try:
        from pytest_kscientist.evolve.llm.factory import llm_notice, make_llm_roles
    except ImportError:
        return None, []
    roles = make_llm_roles(config, brief, log_dir)
    notes = [n for n in [llm_notice(config)] if n]
    if roles is not None and hasattr(roles, "describe"):
        notes.append(roles.describe())
    return roles, notes


def _generations_left(config: pytest.Config, members: Sequence[Member]) -> tuple[int, int]:
    """(generations this run still has to make, candidates per generation): ``--evolve N``
    less the generations the population already holds."""
    from pytest_kscientist.harness.session import KS_SESSION

    ks = config.stash.get(KS_SESSION, None)
    if ks is None or not ks.settings.evolve:
        return 0, 0
    done = max((m.meta.generation for m in members), default=0)
    return ks.settings.evolve - done, ks.settings.evolve_options.candidates


def _projection(config: pytest.Config, made: Any, members: Sequence[Member]) -> str:
    """The projected LLM cost of the generations this run still has to make, or ""."""
    project = getattr(made, "projection", None)
    if project is None:
        return ""
    return str(project(*_generations_left(config, members)))


def llm_start(config: pytest.Config, log_dir: Path,
              members: Sequence[Member]) -> list[tuple[str, str]]:
    """(stage, line) pairs before anything is spent or run, when the built-in LLM scientist
    has generations to make: the projected cost (none when the ledger in ``log_dir`` cannot
    be read: the roles' start shows it then; no run is counted in the ledger), and the
    provider's start check (``factory.check_provider``: a warning line, or ``ProviderOutage``
    when the provider refuses the key or the model)."""
    try:
        from pytest_kscientist.evolve.llm import llm_options
        from pytest_kscientist.evolve.llm.cost import project
        from pytest_kscientist.evolve.llm.factory import check_provider
        from pytest_kscientist.evolve.llm.ledger import peek_ledger
        from pytest_kscientist.evolve.llm.transcript import LEDGER_FILE
    except ImportError:
        return []
    settings = llm_options.settings(config)
    generations, candidates = _generations_left(config, members)
    if settings.provider == "offline" or generations <= 0:
        return []
    view = peek_ledger(settings.prices, settings.budget_usd, log_dir / LEDGER_FILE)
    lines = [] if view is None else [("cost", project(view, generations, candidates))]
    warning = check_provider(settings)
    return lines + ([("llm", warning)] if warning else [])


def _own_roles(config: pytest.Config) -> bool:
    """Whether a conftest or plugin implements a role hook, so the built-in roles may not play."""
    hook = config.pluginmanager.hook
    return any(
        impl.plugin_name != BUILTIN_ROLES
        for caller in (hook.pytest_kscientist_make_selector,
                       hook.pytest_kscientist_make_designer,
                       hook.pytest_kscientist_make_writer)
        for impl in caller.get_hookimpls()
    )


class BuiltinRoles:
    """The built-in scientists as ``trylast`` hook implementations, registered by ``--evolve``.

    The three roles of one task are made together (the LLM roles share a session and a cost
    ledger) the first time any of them is asked for, and kept for the run.
    """

    def __init__(self, log_dir: Path) -> None:
        self._log_dir = log_dir  # where the LLM scientist logs its calls
        self._made: dict[str, tuple[tuple[Any, Any, Any], list[str]]] = {}

    def made(self, task: TaskBrief) -> tuple[tuple[Any, Any, Any], list[str]] | None:
        """(selector, designer, writer) and the notes about them, for ``task``; None when no
        role of it was asked for."""
        return self._made.get(task.name)

    def _roles(self, config: pytest.Config, task: TaskBrief) -> tuple[Any, Any, Any]:
        if task.name not in self._made:
            llm, notes = _llm_roles(config, task, self._log_dir)
            if llm is None:
                from pytest_kscientist.evolve.offline.scientist import (
                    OfflineDesigner,
                    OfflineSelector,
                    OfflineWriter,
                )

                llm = (OfflineSelector(), OfflineDesigner(), OfflineWriter())
            self._made[task.name] = (llm if hasattr(llm, "projection") else tuple(llm),
                                     notes)  # type: ignore[assignment]
        return self._made[task.name][0]

    @pytest.hookimpl(trylast=True)
    def pytest_kscientist_make_selector(self, config: pytest.Config, task: TaskBrief) -> Any:
        return self._roles(config, task)[0]

    @pytest.hookimpl(trylast=True)
    def pytest_kscientist_make_designer(self, config: pytest.Config, task: TaskBrief) -> Any:
        return self._roles(config, task)[1]

    @pytest.hookimpl(trylast=True)
    def pytest_kscientist_make_writer(self, config: pytest.Config, task: TaskBrief) -> Any:
        return self._roles(config, task)[2]


BUILTIN_ROLES = "kscientist-builtin-roles"


def register_builtin_roles(config: pytest.Config, root: Path) -> BuiltinRoles:
    """Register (once) the built-in scientists; LLM logs go under ``root / "llm"``."""
    found = config.pluginmanager.get_plugin(BUILTIN_ROLES)
    if isinstance(found, BuiltinRoles):
        return found
    builtin = BuiltinRoles(root / "llm")
    config.pluginmanager.register(builtin, BUILTIN_ROLES)
    return builtin


class RolesFactory:
    """Builds the run's roles once the seeds are measured (the brief needs them); ``preview``
    gives the lines to show before generation 0 (the LLM cost projection)."""

    def __init__(self, config: pytest.Config, task: Task, root: Path) -> None:
        self._config = config
        self._task = task
        self._builtin = register_builtin_roles(config, root)
        self._log_dir = root / "llm"
        self._projected = False  # whether preview showed the projection

    def preview(self, members: Sequence[Member]) -> list[tuple[str, str]]:
        """(stage, line) pairs for the start of the run, unless a conftest or plugin implements
        a role hook (the projection then waits for the roles to start): the projected LLM cost,
        and the provider's start check. A provider that refuses the key or the model stops the
        run here (``ProviderOutage``), before anything is evaluated: before, a bad key showed
        only after generation 0, minutes to hours into a run."""
        if _own_roles(self._config):
            return []
        lines = llm_start(self._config, self._log_dir, members)
        self._projected = any(stage == "cost" for stage, _ in lines)
        return lines

    def __call__(self, members: Sequence[Member]) -> tuple[Roles, TaskBrief]:
        config = self._config
        brief = task_brief(self._task, members)
        chosen = {
            "selector": config.hook.pytest_kscientist_make_selector(config=config, task=brief),
            "designer": config.hook.pytest_kscientist_make_designer(config=config, task=brief),
            "writer": config.hook.pytest_kscientist_make_writer(config=config, task=brief),
        }
        # Notes about the built-in scientists, when one of them plays a role.
        made = self._builtin.made(brief)
        ours = made is not None and any(v is m for m in made[0] for v in chosen.values())
        notes = list(made[1]) if made is not None and ours else []
        if not self._projected:
            projection = _projection(config, made[0] if made is not None and ours else (),
                                     members)
            notes += [projection] if projection else []
        for role, value in chosen.items():
            if not isinstance(value, PROTOCOLS[role]):
                method = {"selector": "select", "designer": "design", "writer": "write"}[role]
                raise RoleError(
                    f"pytest_kscientist_make_{role} returned {type(value).__name__}, which has "
                    f"no {method}() method; return an object implementing the {role.title()} "
                    "protocol of pytest_kscientist.evolve.roles, or None"
                )
        return Roles(notes=tuple(notes), **chosen), brief


def make_roles_factory(config: pytest.Config, task: Task, root: Path) -> RolesFactory:
    """A callable building the run's roles once the seeds are measured (the brief needs them),
    with ``preview`` for the lines to show before they are."""
    return RolesFactory(config, task, root)
