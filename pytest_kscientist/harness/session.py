"""Per-run state of the plugin, registered at configure time and reached via ``config.stash``."""

from __future__ import annotations

import datetime
import gc
import json
import platform
import shutil
import socket
import sys
import tempfile
import threading
from contextlib import AbstractContextManager, nullcontext
from functools import cached_property
from pathlib import Path
from typing import Any

import pytest

from pytest_kscientist.formats.task import Task
from pytest_kscientist.harness.baselines import Partner, Turns
from pytest_kscientist.harness.device_lock import DeviceLock, open_lock, say_now
from pytest_kscientist.harness.evaluate import Evaluator
from pytest_kscientist.harness.files import atomic_write
from pytest_kscientist.harness.mounts import (
    Mounts,
    build_folder,
    extension_root,
    quiet_prefix,
    sandbox_plan,
)
from pytest_kscientist.harness.results import (
    SOURCE_KEPT_BYTES,
    BaselineInfo,
    CandidateResult,
    CaseResult,
    GateResult,
    MachineInfo,
    RunResults,
    TaskValidation,
)
from pytest_kscientist.harness.rounds import Lineup
from pytest_kscientist.harness.runners import RunnerProcess, Spares
from pytest_kscientist.harness.scan import scan_file
from pytest_kscientist.harness.scores import score_all
from pytest_kscientist.harness.spawn import clean_environment, gpu_visible
from pytest_kscientist.options import Settings, option_name

REFERENCE_NAME = "reference"
# The most --kernel files whose runners a GPU session starts while it collects (start_early).
EARLY_RUNNERS = 4


def _import_torch() -> Any:
    """torch, imported; where this is its first import, its objects frozen out of the cyclic
    collector's passes (``gc.freeze``): they live as long as the process, and walking them
    cost every pytest run 0.33 s in pytest's five ``gc.collect()`` at exit and 0.25 s more in
    the interpreter's own exit (2-core CPU, 2026-12-04)."""
    first = "torch" not in sys.modules
    import torch

    if first:
        gc.freeze()
    return torch


class KsSession:
    """What one pytest run knows: settings, device, evaluators and results."""

    def __init__(self, config: pytest.Config, settings: Settings) -> None:
        self.config = config
        self.settings = settings
        # Under pytest-xdist every worker takes the controller's salt (pytest_configure_node),
        # so the salt the summary prints reproduces every worker's draws.
        self.salt = getattr(config, "workerinput", {}).get("ks_salt", settings.salt)
        self.started_at = datetime.datetime.now(datetime.timezone.utc).isoformat()
        self.evaluators: dict[Path, Evaluator] = {}
        self.tasks: dict[str, Task] = {}
        self.node_names: dict[Path, list[str]] = {}  # each task file's nodes (TaskFile.collect)
        # task name -> candidate name -> result, filled from reports (so it works under xdist)
        self.results: dict[str, dict[str, CandidateResult]] = {}
        # task name -> the baselines it declares, with whether this run times them
        self.baselines: dict[str, list[BaselineInfo]] = {}
        # (task name, baseline name) -> the worker shared by every candidate's benchmarks
        self.partners: dict[tuple[str, str], Partner] = {}
        # task name -> candidate name -> its record, ``not_run`` saying why its items skip (its
        # KS_REQUIRES, unmet here); the record stands when none of its items made one
        self.unmet: dict[str, dict[str, CandidateResult]] = {}
        # The bench items of each case and what their shared rounds gave (harness/rounds.py)
        self.lineup = Lineup()
        # (task, name) of partners timed beside as kernels of the candidates' kind
        # (--ks-beside, --ks-compare's saved copies): Partner.full_sample.
        self.beside: set[tuple[str, str]] = set()
        # task name -> worker processes a kernel's rounds go to (--ks-bench-workers auto)
        self.auto_counts: dict[str, int] = {}
        # task name -> (workers a kernel before, case id) where a turn ran out of device memory
        # and the rounds went on in one worker a kernel (fewer_workers)
        self.fewer: dict[str, tuple[int, str]] = {}
        self._saved_folder: Path | None = None
        # task name -> its task::validate verdict (harness/task_validation.py), from reports
        self.validations: dict[str, TaskValidation] = {}
        # The candidate nodes (collect.CandidateNode) that started a worker this session
        self.holders: set[Any] = set()
        # Worker starts begun in the background (starts.start_workers), until waited for.
        self.starting: list[Any] = []
        # The first calls of the workers so begun that would otherwise make theirs in a timed
        # round (starts.WarmUp), made together once they have all started (wait_for_starts).
        self.warm_ups: list[Any] = []
        # Those first calls begun (starts.Starting), until waited for (``_wait_all``).
        self.warming: list[Any] = []
        # (task, candidate) -> seconds its first worker's import took (CandidateResult.load_s).
        self.loads: dict[tuple[str, str], float] = {}
        # (task, candidate) -> its first worker's load_inline calls answered here
        # (CandidateResult.inline_builds).
        self.inline_builds: dict[tuple[str, str], list[Any]] = {}
        self._builds: Any = None  # shared_builds()
        # Runner processes started while the first task file was collected, on a GPU (its
        # --kernel files' own: start_early), as (mounts, environment, process), until the
        # session's spares take them.
        self.early_runners: list[tuple[Mounts | None, dict[str, str], RunnerProcess]] | None = None
        self._builds_lock = threading.Lock()
        # task name -> kind of item (check, bench, compile, gate, validate) -> pytest's seconds
        # in those items, setup, call and teardown (RunResults.item_seconds), from reports.
        self.item_seconds: dict[str, dict[str, float]] = {}
        # task name -> why workers did not start where that was an item's verdict
        # (spawn.MachineFailed), from reports (RunResults.machine_failures)
        self.machine_failures: dict[str, list[str]] = {}
        # task name -> its folder, from reports (xdist's controller collects no task)
        self.task_paths: dict[str, str] = {}

    def task_names(self) -> list[str]:
        """The tasks this run reports on: those with results, then those only validated."""
        return list(dict.fromkeys([*self.results, *self.validations]))

    @cached_property
    def device(self) -> str:
        wanted = self.settings.device
        if wanted == "cpu":
            return "cpu"
        torch = _import_torch()
        available = torch.cuda.is_available()
        if wanted == "auto":
            return _gpu_named("auto") if available else "cpu"
        named = option_name(self.config, "ks_device")  # the flag, or ks_device (ini)
        if not available:
            raise pytest.UsageError(
                f"{named} {wanted}: no CUDA/ROCm device is visible to torch "
                f"{torch.__version__}; use {named} cpu or auto"
            )
        if wanted.startswith("cuda:") and int(wanted[5:]) >= torch.cuda.device_count():
            raise pytest.UsageError(
                f"{named} {wanted}: torch sees {torch.cuda.device_count()} CUDA device(s) "
                f"here, cuda:0 to cuda:{torch.cuda.device_count() - 1}; pick one of those")
        return _gpu_named(wanted)

    @cached_property
    def device_name(self) -> str:
        if self.device.startswith("cuda"):
            import torch

            return torch.cuda.get_device_name(self.device)
        return platform.processor() or platform.machine() or "cpu"

    @cached_property
    def device_lock(self) -> DeviceLock | None:
        """The GPU's machine-wide lock (``device_lock.py``), opened on first use; None on the
        CPU, or where it could not be opened (warned of)."""
        return open_lock(self.device) if self.device.startswith("cuda") else None

    def device_turn(self, who: str) -> AbstractContextManager[Any]:
        """Held while an item checks or times kernels: the GPU's lock, else nothing."""
        lock = self.device_lock
        return nullcontext() if lock is None else lock.held(who, say_now(self.config))

    @cached_property
    def profile(self) -> str:
        if self.settings.profile == "auto":
            return "full" if self.device.startswith("cuda") else "cpu"
        return self.settings.profile

    def evaluator(self, task: Task) -> Evaluator:
        # By spec file: the problems of a KernelBench level share one folder.
        # (starts.start_workers makes each task's before its background starts ask for it)
        if task.spec_path not in self.evaluators:
            self.evaluators[task.spec_path] = Evaluator(task, self.device, self.salt)
        return self.evaluators[task.spec_path]

    def workers_for(self, task_name: str) -> int:
        """Worker processes each kernel of the task is timed in (``--ks-bench-workers``)."""
        if task_name in self.fewer:
            return 1
        return self.settings.bench_workers or self.auto_counts.get(task_name, 1)

    def rounds_workers(self, task_name: str) -> tuple[int, str]:
        """(the workers a kernel the task's rounds began with, the benchmark from which they
        went on in one because the device ran out of memory, or "")."""
        return self.fewer.get(task_name, (self.workers_for(task_name), ""))

    def fewer_workers(self, task_name: str, case_id: str) -> bool:
        """After a turn of ``task_name``'s rounds ran out of device memory: end the timing
        twins of its every kernel (each held a CUDA context, its inputs, outputs and allocator
        cache; vectoradd's 16384 x 16384 case filled an 80 GB H100 in 4 workers a kernel), so
        the rounds go on in one worker a kernel. False where they already were."""
        count = self.workers_for(task_name)
        if count <= 1:
            return False
        self.fewer[task_name] = (count, case_id)
        holders = [node for nodes in self.lineup.planned.values() for node in nodes
                   if node.task.name == task_name]
        holders += [partner for (task, _), partner in self.partners.items() if task == task_name]
        for holder in holders:
            holder.turns.count = 1
            holder.turns.close()
        return True

    def auto_workers(self) -> None:
        """``--ks-bench-workers auto``, once the selected items are planned: on a GPU, a task
        whose rounds compare two or more kernels (candidates, --ks-beside kernels,
        --ks-compare's saved copies) times every kernel of it in one worker a round. On one
        H200 one copy's worker ran a kernel faster than its twin's in every round on 11 of 18
        shapes, by 0.7-4.5%, so two copies of one kernel read 4.5% apart; in a worker a
        round the process effect enters the rounds' spread and their median instead
        (notes/timing.md, section 4). Elsewhere one worker: on the 2-core CPU, with workers
        forked from one zygote, more did not help."""
        wanted = self.settings.device
        if (self.settings.bench_workers is not None or wanted == "cpu"
                or (wanted == "auto" and not gpu_visible())  # no torch import to find that out
                or not self.device.startswith("cuda")):
            return
        self.auto_counts = auto_counts(self.lineup.planned.values(), self.beside)
        for nodes in self.lineup.planned.values():
            for node in nodes:
                node.turns.count = self.auto_counts.get(node.task.name, 1)

    def bench_budget(self, task: Task) -> float:
        return self.settings.bench_budget_s or task.spec.bench.budget_s

    def skipped_baselines(self, task: str) -> dict[str, str]:
        """Baselines of ``task`` this run does not time: name -> why."""
        return {b.name: b.reason for b in self.baselines.get(task, []) if b.status == "skipped"}

    def partners_for(self, task: Task) -> list[Partner]:
        """Workers of the task's active baselines, started on first use and kept for the run."""
        active = [b.name for b in self.baselines.get(task.name, []) if b.status == "active"]
        out = []
        for spec in task.spec.baselines:
            if spec.name in active:
                key = (task.name, spec.name)
                if key not in self.partners:
                    self.partners[key] = Partner(task, spec, self.device, self.settings.timeout_s,
                                                 init_seed=self.evaluator(task).init_seed,
                                                 spares=self.spares,
                                                 full_sample=key in self.beside,
                                                 turns=Turns(self.workers_for(task.name)),
                                                 builds=self.shared_builds,
                                                 answered=self.inline_builds.setdefault(
                                                     key, []))
                out.append(self.partners[key])
        return out

    def shared_builds(self) -> Any:
        """The answers to this session's workers' load_inline calls
        (``harness/shared_builds.SharedBuilds``), made on first use; workers load in threads."""
        with self._builds_lock:
            if self._builds is None:
                from pytest_kscientist.harness.shared_builds import SharedBuilds

                self._builds = SharedBuilds(extension_root())
            return self._builds

    @cached_property
    def spares(self) -> Spares:
        """Runner processes started ahead of need (GPU runs only: worker.Spares), the ones
        started in collection among them (``_runners_early``); on the CPU, sandboxed workers
        forked from a zygote (harness/forked.py)."""
        spares = Spares.for_device(self.device.startswith("cuda"))
        early, self.early_runners = self.early_runners or [], []
        for mounts, env, process in early:
            if spares.ahead:
                spares.adopt(mounts, env, process)
            else:  # the device files were there, but torch found no GPU
                process.discard()
        return spares

    def start_early(self, spec_path: Path) -> None:
        """Begin the workers' start while ``spec_path`` is collected, before this process
        imports torch (to find the device and the profile).

        On the CPU (surely the device): start the zygote of its workers. Its import of torch
        then runs beside this process's own instead of after it, and every worker is forked
        from it (harness/forked.py). On the 2-core CPU a session's start spent 1.1-1.7 s
        importing torch here, then 1.2 s more for its workers' (2026-12-04, when two runners
        were started early instead). On a GPU: ``_runners_early``."""
        wanted = self.settings.device
        if wanted != "cpu" and (wanted != "auto" or gpu_visible()):
            self._runners_early(spec_path, wanted)
            return
        if "torch" in sys.modules or "spares" in self.__dict__:
            return
        spares = self.spares = Spares.for_device(gpu=False)  # the device will be the CPU
        if quiet_prefix(spec_path) is not None:  # the sandbox works: its workers are forked
            spares.start_zygote(clean_environment("cpu"))

    def _runners_early(self, spec_path: Path, wanted: str) -> None:
        """On a GPU, for the first task file collected: start the runner of each --kernel file
        (at most ``EARLY_RUNNERS``), sandboxed as its first worker will be, for that worker
        to take (``spares``). Its import of torch then runs beside this process's collection.
        On an H100 host a CUDA seed's first check waited 3.4-3.7 s for its runner's start,
        begun after 3.1-5.8 s of collection, most of that this process's own import of
        torch."""
        if self.early_runners is not None:  # begun, or the spares were made (they take them)
            return
        self.early_runners = []
        env = clean_environment(_gpu_named(wanted))  # as ``device`` will name it
        for source in self.settings.kernels[:EARLY_RUNNERS]:
            mounts, why, cache_why = sandbox_plan(spec_path, build_folder(source))
            if why is not None or cache_why is not None:
                return  # its worker warns of it when it starts; not from collection
            if all(mounts != started for started, _, _ in self.early_runners):
                # one a sandbox: files that build nothing (or the same bytes) share theirs, and
                # their first worker's take starts the next (Spares.take)
                self.early_runners.append((mounts, env, RunnerProcess(mounts, env)))

    def wait_for_starts(self, warm: bool = True) -> None:
        """Wait until every worker start begun in the background has ended: before a timed call
        (no build beside it), and before the session closes its workers (none started after).
        With ``warm`` (before a timed call), then make the first calls of the workers that
        would make theirs in the rounds, all at once (``_begin_warm_ups``)."""
        _wait_all(self.starting)
        if warm and self.warm_ups:
            self._begin_warm_ups()
        _wait_all(self.warming)

    def _begin_warm_ups(self) -> None:
        """Begin the workers' first calls (starts.WarmUp), each in a thread of its own.

        A process pays for its kernel's first call: CUDA's lazy loading of its code, library
        handles, a Triton launcher (on an H100, 4-5 s for GPU MODE vectoradd's reference, up to
        2.2 s in fp8_gemm's). Made in the rounds, those costs came one worker after another
        (24 s of vectoradd's first benchmark with four workers a kernel); here they overlap,
        and no call is timed meanwhile. A call that fails is left for its round to meet
        again; one that hangs is that round's verdict (``Turns.hung``)."""
        from pytest_kscientist.harness.starts import Starting  # starts imports this module

        warm, self.warm_ups = self.warm_ups, []
        gate = threading.BoundedSemaphore(len(warm))  # all at once
        for job in warm:
            Starting(job.run, gate, self.warming, name="ks-warm")

    def close_workers(self, hurry: bool = False) -> None:
        """End the candidates' and baselines' workers and any runner started ahead of need, and
        close the GPU's lock file. ``hurry`` (an interrupted session): kill the workers at once,
        for a worker busy in its kernel never reads the request to exit, and each was given
        10 s to."""
        # A hurried close does not wait for the starts still running in the background, which
        # add their nodes to ``holders`` meanwhile: read as a copy, then taken one at a time
        # (iterating the set failed with "Set changed size during iteration" after -x, once in
        # a run of the suite); a start that ends after this dies with this process (lifeline).
        if hurry:
            for holder in [*self.holders, *self.partners.values()]:
                for worker in holder.turns.live(holder.worker):
                    worker.kill()
        while self.holders:
            self.holders.pop().drop_worker()
        for partner in list(self.partners.values()):
            partner.close()
        if "spares" in self.__dict__:
            self.spares.close()
        for _, _, process in self.early_runners or []:  # the session never took spares
            process.discard()
        self.early_runners = []
        if self.__dict__.get("device_lock") is not None:
            self.__dict__.pop("device_lock").close()

    def saved_folder(self) -> Path:
        """A folder for this session's copies of saved kernels (--ks-compare), removed at its
        end."""
        if self._saved_folder is None:
            self._saved_folder = Path(tempfile.mkdtemp(prefix="ks-saved-"))
            folder = self._saved_folder
            self.config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))
        return self._saved_folder

    # -- results ----------------------------------------------------------------------------

    def record(self, task: str, candidate: str, path: str, sha: str, case: CaseResult,
               role: str = "candidate") -> None:
        self._record_of(task, candidate, path, sha, role).cases.append(case)

    def record_gate(self, task: str, candidate: str, path: str, sha: str,
                    gate: GateResult) -> None:
        self._record_of(task, candidate, path, sha).gates.append(gate)

    def record_compile(self, task: str, candidate: str, path: str, sha: str,
                       result: dict) -> None:
        """Keep a compile[<arch>] item's verdict (``compiles.CompileItem``)."""
        from pytest_kscientist.harness.results import CompileResult

        self._record_of(task, candidate, path, sha).compiles.append(
            CompileResult.model_validate(result))

    def _record_of(self, task: str, candidate: str, path: str, sha: str,
                   role: str = "candidate") -> CandidateResult:
        """The candidate's record, made by whichever of its items comes first (compile items
        of HIP candidates, checks, gates): a candidate's gets its source scan and its text."""
        per_task = self.results.setdefault(task, {})
        if candidate not in per_task:
            own = role == "candidate"
            per_task[candidate] = CandidateResult.model_validate(
                {"name": candidate, "path": path, "sha256": sha, "role": role,
                 "suspicious": scan_file(Path(path)) if own else [],
                 "source": kept_source(Path(path)) if own else None})
        return per_task[candidate]

    def finalize(self) -> None:
        """Fill geomeans and speedups (only candidates whose every benchmark passed), and
        whether each baseline's judged outputs all passed the check."""
        for task in dict.fromkeys([*self.results, *self.unmet]):
            per_task = self.results.setdefault(task, {})
            for name, record in self.unmet.get(task, {}).items():
                per_task.setdefault(name, record).not_run = record.not_run
            for name, record in per_task.items():
                record.load_s = self.loads.get((task, name))
                record.inline_builds = self.inline_builds.get((task, name), [])
            score_all(per_task, REFERENCE_NAME)
            for info in self.baselines.get(task, []):
                info.verified = baseline_verified(info.name, per_task)

    def machine(self) -> MachineInfo:
        import torch

        return MachineInfo(
            hostname=socket.gethostname(), platform=platform.platform(),
            python=sys.version.split()[0], torch=torch.__version__, device=self.device,
            device_name=self.device_name,
        )

    def _task_path(self, name: str) -> str:
        task = self.tasks.get(name)
        return str(task.root) if task is not None else self.task_paths.get(name, "")

    def write_json(self, path: Path, interrupted: bool = False) -> None:
        """Write one RunResults per task (a list when several tasks ran or none), atomically;
        ``interrupted``: the session was stopped before its items ran."""
        runs = []
        for name in self.task_names():
            workers, fewer_from = self.rounds_workers(name)
            runs.append(RunResults(
                task=name, task_path=self._task_path(name), profile=self.profile,
                salt=self.salt, started_at=self.started_at, machine=self.machine(),
                candidates=list(self.results.get(name, {}).values()),
                baselines=self.baselines.get(name, []),
                task_validation=self.validations.get(name),
                item_seconds=self.item_seconds.get(name, {}), interrupted=interrupted,
                bench_workers=workers, fewer_workers_from=fewer_from,
                machine_failures=self.machine_failures.get(name, []),
            ).model_dump(mode="json"))
        body = runs[0] if len(runs) == 1 else runs
        text = json.dumps(body, indent=2)
        if path.is_symlink() or (path.exists() and not path.is_file()):
            # A link, a pipe (`--ks-json >(jq ...)`), a device: written through, not replaced
            # by a file of ours (the atomic rename replaced /dev/full with a regular file).
            with open(path, "w", encoding="utf-8") as out:
                out.write(text)
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, text)


def kept_source(path: Path) -> str | None:
    """The file's text for the results, or None when it is too large or not text."""
    try:
        if path.stat().st_size > SOURCE_KEPT_BYTES:
            return None
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def baseline_verified(name: str, per_task: dict[str, CandidateResult]) -> bool | None:
    """True if every item and interleaved round of baseline ``name`` in this run passed the
    check, False if one missed it (xfailed) or failed, None if none ran."""
    own = per_task.get(name)
    verdicts = [c.outcome == "passed" for c in own.cases if c.outcome != "skipped"
                ] if own is not None and own.role == "baseline" else []
    for cand in per_task.values():
        for case in cand.cases:
            timing = case.baselines.get(name)
            if timing is not None:
                verdicts.append(timing.verified and not timing.reason)
    return all(verdicts) if verdicts else None


KS_SESSION = pytest.StashKey[KsSession]()


def _gpu_named(wanted: str) -> str:
    """The GPU a --ks-device of ``wanted`` ("auto", "cuda", "cuda:N") runs on where it has one,
    as ``KsSession.device`` names it; the workers' environment pins that one."""
    return "cuda:0" if wanted in ("auto", "cuda") else wanted


def _wait_all(pending: list[Any]) -> None:
    """Wait for every background job of ``pending`` (starts.Starting), raising its error; each
    stays listed until it has ended, so a wait that a signal interrupts (pytest-timeout's
    alarm, Ctrl-C) is taken up by the next, before any of their workers is used."""
    while pending:
        pending[-1].wait()
        pending.pop()


def auto_counts(planned: Any, beside: set[tuple[str, str]]) -> dict[str, int]:
    """``--ks-bench-workers auto`` on a GPU: task name -> workers a kernel, for the tasks whose
    rounds compare two or more kernels (``planned``: the lineup's lists of nodes, each with
    ``task`` and ``role``; ``beside``: (task name, partner) of the --ks-beside kernels and the
    saved copies): one worker a round, 2 to 8."""
    compared: dict[str, set[str]] = {}
    tasks: dict[str, Task] = {}
    for nodes in planned:
        for node in nodes:
            tasks[node.task.name] = node.task
            if node.role == "candidate":
                compared.setdefault(node.task.name, set()).add(node.name)
    for task_name, name in beside:
        compared.setdefault(task_name, set()).add(name)
    return {name: min(max(task.spec.bench.rounds_on("cuda"), 2), 8) for name, task in tasks.items()
            if len(compared.get(name, ())) >= 2}
