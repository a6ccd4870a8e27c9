"""pytest11 entry point of pytest-kscientist: options, hooks, wiring. Imports nothing heavy."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from pathlib import Path
from typing import Any

import pytest

from pytest_kscientist import hookspecs
from pytest_kscientist.formats.task import SPEC_NAME, looks_like_task
from pytest_kscientist.options import add_options, resolve

# The option registrations of --evolve and of its LLM scientist, beside options.py's.
OPTION_MODULES = (
    "pytest_kscientist.evolve.run_options",
    "pytest_kscientist.evolve.llm.llm_options",
)


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)
    for module in OPTION_MODULES:
        extension = _optional(module)
        if extension is not None:
            extension.add_options(parser)


def _optional(module: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and module.startswith(exc.name):
            return None
        raise


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    from pytest_kscientist import fixtures
    from pytest_kscientist.harness.session import KS_SESSION, KsSession

    config.addinivalue_line("markers", "kscientist: a pytest-kscientist task case")
    config.addinivalue_line("markers", "gpu: needs a CUDA or ROCm device (the checks, benchmarks "
                            "and gates of a kernel that declares KS_REQUIRES, of a baseline "
                            "with requires)")
    if config.option.help:
        # Only the help is shown: a bad value, or a saved run not there, must not hide it.
        return
    settings = resolve(config)
    if settings.evolve is not None:
        # Resolved once, here, into the one frozen Settings the loop and the LLM scientist read.
        evolve_options, llm_options = (_optional(m) for m in OPTION_MODULES)
        settings = dataclasses.replace(
            settings,
            evolve_options=evolve_options.resolve(config) if evolve_options else None,
            llm=llm_options.settings(config) if llm_options else None,
        )
    ks = KsSession(config, settings)
    if settings.device not in ("auto", "cpu"):
        # A device asked for by name is checked now, so its absence is a usage error rather
        # than a collection error inside a traceback (issue 11).
        _ = ks.device
    config.stash[KS_SESSION] = ks
    config.pluginmanager.register(KsHooks(ks), "kscientist-session")
    if not config.pluginmanager.has_plugin("kscientist-fixtures"):
        config.pluginmanager.register(fixtures, "kscientist-fixtures")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """pytest-xdist's controller, once a worker: the worker draws with the controller's salt."""
    from pytest_kscientist.harness.session import KS_SESSION

    node.workerinput["ks_salt"] = node.config.stash[KS_SESSION].salt


# xdist's --dist modes that may split one task file's items over several workers.
_SPLITTING = ("load", "loadscope", "loadgroup", "worksteal")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under ``-n``, the items of one task file go to one worker: a task's candidates,
    reference and gates are then timed in one process, one after another, and a gate sees
    every benchmark of its candidate. Split over workers, a gate read the one benchmark its
    worker had run (a 2x slower kernel passed), a reference timed elsewhere left
    --ks-min-speedup skipped, and two workers timed kernels on one device at once. Other
    tests are scheduled as the --dist mode says (worksteal's stealing aside)."""
    dist = config.getoption("dist")
    if dist not in _SPLITTING:
        return None
    from xdist.scheduler import LoadGroupScheduling, LoadScopeScheduling

    # loadgroup keeps its own grouping (xdist_group marks) for the other tests.
    base = LoadGroupScheduling if dist == "loadgroup" else LoadScopeScheduling

    class TaskFileScheduling(base):  # type: ignore[valid-type,misc]
        def _split_scope(self, nodeid: str) -> str:
            file = nodeid.split("::", 1)[0]
            if _claims_path(str(config.rootpath / file)):
                return file
            grouped = dist in ("loadscope", "loadgroup")
            return super()._split_scope(nodeid) if grouped else nodeid

    return TaskFileScheduling(config, log)


def _unknown_candidates(config: pytest.Config, collected: dict[Path, list[str]]) -> list[str]:
    """For each node id on the command line naming no candidate of a task file it names
    (``task.toml::wrong`` without ``--kernel wrong.py``: pytest's bare "not found"), where
    candidates come from. ``collected``: each task file's node names."""
    hints = []
    here = config.invocation_params.dir
    for arg in config.args:
        path, _, rest = str(arg).partition("::")
        wanted = rest.split("::")[0].split("[")[0]
        names = collected.get((here / path).resolve())
        if wanted and names is not None and wanted not in names:
            hints.append(f"{arg}: no candidate '{wanted}' in this run (it has: "
                         f"{', '.join(names)}); a kernel file is a candidate when given with "
                         "--kernel PATH (its stem is its name), found in the task's seeds/, or "
                         "matched by --ks-solutions")
    return hints


@functools.lru_cache(maxsize=1024)
def _claims_path(path: str) -> bool:
    return Path(path).is_file() and claims(Path(path))


def claims(file_path: Path) -> bool:
    """Whether ``file_path`` is a task of a supported format (and only then: issue 12)."""
    if file_path.name == SPEC_NAME:
        return looks_like_task(file_path)
    if file_path.name == "task.yml":
        from pytest_kscientist.formats.gpumode import looks_like_problem

        return looks_like_problem(file_path)
    if file_path.suffix == ".py":
        from pytest_kscientist.formats.kernelbench import looks_like_problem

        return looks_like_problem(file_path)
    return False


def _evolve_spec(path: Path) -> Path | None:
    """The task file ``--evolve`` runs on: ``path`` itself when ``claims`` accepts it, else the
    ``task.toml`` or GPU MODE ``task.yml`` it holds when it is a folder; None otherwise."""
    if path.is_dir():
        return next((path / name for name in (SPEC_NAME, "task.yml")
                     if (path / name).is_file() and claims(path / name)), None)
    return path if path.is_file() and claims(path) else None


def _evolve_target(args: list[str], from_testpaths: bool = False) -> Path:
    """The one task file ``--evolve`` runs on, from the command line's paths; UsageError
    otherwise. ``from_testpaths``: no path was given, so pytest took the ini's testpaths."""
    spec = _evolve_spec(Path(args[0])) if len(args) == 1 and not from_testpaths else None
    if spec is None:
        got = (f"none (pytest fell back to testpaths: {' '.join(args)})" if from_testpaths
               else f"'{' '.join(args) or 'none'}'")
        raise pytest.UsageError(
            f"--evolve expects exactly one task: a folder holding {SPEC_NAME} or a GPU MODE "
            "task.yml, or a KernelBench problem file (a .py defining Model, get_inputs and "
            f"get_init_inputs), got {got}; e.g. pytest --evolve 3 tasks/fp8_gemm"
        )
    return spec


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> Any:
    if claims(file_path):
        from pytest_kscientist.harness.collect import TaskFile
        from pytest_kscientist.harness.session import KS_SESSION

        if parent.config.stash[KS_SESSION].settings.evolve is not None:
            # --evolve is its own mode: child sessions run the task's items. The file is still
            # claimed, empty, so `pytest --evolve 3 path/task.yml` is not "file not found".
            return EvolveTarget.from_parent(parent, path=file_path)
        if not _runs_nothing(parent.config):
            parent.config.stash[KS_SESSION].start_early(file_path)
        return TaskFile.from_parent(parent, path=file_path)
    return None


# Listings that collect (and end the session as a run does) but run no item: --fixtures,
# --fixtures-per-test and --cache-show are sessions of their own, and --setup-plan /
# --setup-only run their items' setup, never their call. Under them a worker zygote was
# started, under --setup-plan candidates imported (their builds), and --ks-json replaced by [].
_LISTINGS = ("collectonly", "setuponly", "showfixtures", "show_fixtures_per_test", "cacheshow")


def _runs_nothing(config: pytest.Config) -> bool:
    """Whether the session runs no item (--co and the other listings, ``_LISTINGS``)."""
    return any(config.getoption(dest, False) for dest in _LISTINGS)


def _cores() -> int:
    """How many CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class EvolveTarget(pytest.File):
    """A task file under ``--evolve``: no items in this session (child sessions run them)."""

    def collect(self) -> list[pytest.Item]:
        return []


class KsHooks:
    """Session hooks, registered at configure time with the run's state."""

    def __init__(self, ks: Any) -> None:
        self.ks = ks
        self.evolve_code: int | None = None  # the exit code of an --evolve run
        self.evolve_spec: Path | None = None  # the task file --evolve runs on, found once
        self.deselected_gates: list[pytest.Item] = []  # by -k/-m, before our modifyitems
        self.deselected_names: set[str] = set()  # the candidates of the items deselected
        self.finished = 0  # items whose run protocol ended (pytest_runtest_logfinish)

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection(self, session: pytest.Session) -> None:
        if self.ks.settings.evolve is not None:
            # Before collecting: a bare `pytest --evolve 2` would otherwise collect the whole
            # test suite (12.4 s, issue 29) only to refuse it.
            config = session.config
            self.evolve_spec = _evolve_target(
                config.args, config.args_source is pytest.Config.ArgsSource.TESTPATHS)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> bool | None:
        if self.ks.settings.evolve is None:
            config = session.config
            if not (_runs_nothing(config) or session.testsfailed
                    or config.pluginmanager.has_plugin("dsession")):  # xdist's controller
                from pytest_kscientist.harness.compiles import compile_ahead
                from pytest_kscientist.harness.starts import start_workers

                compile_ahead(session.items, _cores())
                start_workers(session.items, _cores())
            return None
        if session.testsfailed:
            raise session.Interrupted(f"{session.testsfailed} error(s) during collection")
        from pytest_kscientist.errors import TaskSpecError
        from pytest_kscientist.evolve.loop import run_evolution
        from pytest_kscientist.evolve.population import PopulationError

        spec = self.evolve_spec
        assert spec is not None  # pytest_collection found it or raised
        try:
            self.evolve_code = run_evolution(session.config, spec.resolve())
        except (TaskSpecError, PopulationError) as exc:
            raise pytest.UsageError(f"--evolve {session.config.args[0]}: {exc}") from None
        return True

    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        from pytest_kscientist.harness.items import CandidateItem, GateItem

        self.deselected_gates += [item for item in items if isinstance(item, GateItem)]
        self.deselected_names |= {item.candidate.name for item in items
                                  if isinstance(item, CandidateItem)}

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        """The run's order already before other plugins read it: --sw (stepwise) deselects
        the items before its last failure as passed, and in collection order the reference's
        benchmarks come before every candidate's checks, so it skipped them unrun."""
        from pytest_kscientist.harness.items import in_round_order

        items[:] = in_round_order(items)

    # after -k/-m deselection: only selected items count
    @pytest.hookimpl(trylast=True, specname="pytest_collection_modifyitems")
    def pytest_collection_modifyitems_last(self, items: list[pytest.Item]) -> None:
        from pytest_kscientist.harness.items import (
            check_same_as,
            keep_gates_judged,
            plan_rounds,
            tag_timed,
            warn_deselected_gates,
        )

        warn_deselected_gates(self.deselected_gates, items)
        keep_gates_judged(items)
        items[:] = plan_rounds(items, self.ks.lineup)
        # A kernel given but not selected here is no typo: its stand-ins are timed themselves.
        given = (*self.ks.settings.beside, *self.ks.settings.kernels)
        check_same_as(self.ks.lineup, self.ks.settings.same_as,
                      {p.stem for p in given} | self.deselected_names)
        self.ks.auto_workers()
        tag_timed(items, self.ks.baselines)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> None:
        from pytest_kscientist.harness.items import show_printed

        if call.when == "call":
            show_printed(item, call)

    def pytest_runtest_logfinish(self) -> None:
        self.finished += 1

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        from pytest_kscientist.harness.results import (
            BaselineInfo,
            CaseResult,
            GateResult,
            TaskValidation,
        )

        ours = [(name, json.loads(prop)) for name, prop in report.user_properties
                if name.startswith("ks_") and isinstance(prop, str)]  # results.report_property
        for name, prop in ours:
            if name == "ks_item":  # every phase: where the session's time went
                self.ks.task_paths.setdefault(prop["task"], prop["task_path"])
                if "baselines" in prop:  # known here already, unless this is xdist's controller
                    self.ks.baselines.setdefault(prop["task"], [
                        BaselineInfo.model_validate(b) for b in prop["baselines"]])
                per_task = self.ks.item_seconds.setdefault(prop["task"], {})
                per_task[prop["kind"]] = per_task.get(prop["kind"], 0.0) + report.duration
        if report.when != "call":
            return
        for name, value in ours:
            if name == "ks_case":
                self.ks.record(value["task"], value["candidate"], value["path"],
                               value["sha256"], CaseResult.model_validate(value["result"]),
                               role=value.get("role", "candidate"))
            elif name == "ks_gate":
                self.ks.record_gate(value["task"], value["candidate"], value["path"],
                                    value["sha256"], GateResult.model_validate(value))
            elif name == "ks_task_validation":
                self.ks.validations[value["task"]] = TaskValidation.model_validate(
                    value["result"])
            elif name == "ks_machine_failure":
                self.ks.machine_failures.setdefault(value["task"], []).append(value["cause"])
            elif name == "ks_compile":
                self.ks.record_compile(value["task"], value["candidate"], value["path"],
                                       value["sha256"], value["result"])

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if session.exitstatus == pytest.ExitCode.USAGE_ERROR:  # pytest's "not found", perhaps
            for hint in _unknown_candidates(session.config, self.ks.node_names):
                session.config.get_terminal_writer().line(f"kscientist: {hint}")
        if self.evolve_code is not None:
            # The loop's codes follow pytest's: 0 done, 1 nothing passes, 2 interrupted,
            # 3 a role or child session failed, 4 the offline scientist has no knobs to move
            # (evolve/loop.py, run_evolution).
            session.exitstatus = self.evolve_code
        ks = self.ks
        interrupted = session.exitstatus == pytest.ExitCode.INTERRUPTED
        # -x, --maxfail, --sw: the loop stopped early; the kernels still loading in the
        # background will not run, so they are not waited for (one importing for 20 s held
        # the session that long). A start left running dies with this process (its lifeline).
        stopped = bool(session.shouldfail or session.shouldstop)
        if not (interrupted or stopped):
            # A worker started after close_workers would outlive it; none is warmed now.
            ks.wait_for_starts(warm=False)
        try:
            ks.close_workers(hurry=interrupted or stopped)
        except KeyboardInterrupt:  # Ctrl-C while closing: the rest at once, without a traceback
            ks.close_workers(hurry=True)
            session.exitstatus = pytest.ExitCode.INTERRUPTED
        if hasattr(session.config, "workerinput"):
            return  # a pytest-xdist worker: its reports reach the controller, which writes
        ks.finalize()
        for per_task in ks.results.values():
            for result in per_task.values():
                session.config.hook.pytest_kscientist_candidate_result(
                    config=session.config, result=result
                )
        if ks.settings.json_path is not None and not _runs_nothing(session.config):
            # Always (an empty list when no task ran: a CI step must not read the file an
            # earlier run left there as this run's results), but not when only collecting.
            # -x / --maxfail stop a session with exit code 1, not 2: its items after the stop
            # never ran either, and a gate reading the file skipped the kernels it lacked.
            cut = stopped and self.finished < session.testscollected
            ks.write_json(ks.settings.json_path, interrupted=interrupted or cut)

    def pytest_terminal_summary(self, terminalreporter: Any, exitstatus: int) -> None:
        from pytest_kscientist.harness.report import selection_hints, write_summary

        write_summary(terminalreporter, self.ks)
        keyword = terminalreporter.config.option.keyword
        if exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED and keyword:
            for line in selection_hints(self.ks, keyword):
                terminalreporter.write_line(line, yellow=True)
