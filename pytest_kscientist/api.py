"""The small documented API for measurement scripts (``bench/``).

A script that times kernels outside a pytest session (a plain loop beside the harness's timer,
a knob sweep, tables from a ``--ks-json`` file or a population) reaches the package through
this module and nothing else; a test (``tests/test_bench_api.py``) holds ``bench/`` to that.
Every name here is stable within a ``--ks-json`` schema version (``RunResults.schema_version``):
a change to one of them is a change to that schema's contract. The package's other modules may
move. Importing this module imports neither torch nor candidate code (the same test checks).
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from pytest_kscientist.evolve import findings as _findings
from pytest_kscientist.evolve import population as _population
from pytest_kscientist.evolve.offline import compose as _compose
from pytest_kscientist.evolve.offline import knobs as _knobs
from pytest_kscientist.evolve.offline import links as _links
from pytest_kscientist.formats import task as _task
from pytest_kscientist.harness import baselines as _baselines
from pytest_kscientist.harness import correctness as _correctness
from pytest_kscientist.harness import evaluate as _evaluate
from pytest_kscientist.harness import mounts as _mounts
from pytest_kscientist.harness import received as received
from pytest_kscientist.harness import results as _results
from pytest_kscientist.harness import rounds as _rounds
from pytest_kscientist.harness import spawn as _spawn
from pytest_kscientist.harness import stats as _stats
from pytest_kscientist.hip import source as _hip_source
from pytest_kscientist.worker import threads as _threads
from pytest_kscientist.worker import timing as _timing

__all__ = [
    "CandidateResult", "Evaluator", "Member", "Point", "Population", "RunResults",
    "ThreadWatch", "Worker", "best_member", "compare", "compose", "confirmed_speedup",
    "geomean", "judge", "load_module", "load_reference", "load_task", "make_timer",
    "median_interval", "read_hip_source", "read_space", "read_tunables", "received",
    "rewrite_tunables", "round_quota", "sandbox_available", "split", "start_worker", "t95",
]

# -- tasks, references and kernel files ------------------------------------------------------

load_task = _task.load_task
"""``load_task(root)``: the validated task in folder ``root`` (its ``task.toml``); TaskSpecError."""

load_reference = _evaluate.load_reference
"""``load_reference(task)``: the task's reference module, imported in this process."""


def load_module(path: str | Path, name: str) -> ModuleType:
    """The Python file at ``path`` imported as a fresh module called ``name``, as the worker
    loads a candidate (not added to ``sys.modules``); ImportError when it cannot be loaded."""
    from pytest_kscientist.worker.runner import _load_module  # the worker's own loader

    module: ModuleType = _load_module(str(path), name)
    return module


# -- timing and judging ----------------------------------------------------------------------

make_timer = _timing.make_timer
"""``make_timer(device, after_call=None)``: the worker's timer for "cpu" or "cuda[:i]"."""

ThreadWatch = _threads.ThreadWatch
"""The worker's check for threads a call left running: ``after()`` per call, then ``found``."""

geomean = _stats.geomean
"""``geomean(values)``: the geometric mean of positive values; ValueError otherwise."""

median_interval = _stats.median_interval
"""``median_interval(times)``: the distribution-free 95% interval of the median the harness
reports (and its 1% stop reads); ValueError for no values."""

t95 = _stats.t95
"""``t95(freedom)``: Student's t, two-sided 95%, for that many degrees of freedom."""

compare = _correctness.compare
"""``compare(out, ref, atol, rtol)``: None when ``out`` matches ``ref``, else why not."""

judge = _correctness.judge
"""``judge(out, ref, atol, rtol)``: None when ``out`` matches ``ref``, else a ``Mismatch`` with
its ``count`` of elements outside the tolerance (0 where shape or dtype differ)."""

# -- workers (the pytest side of the two processes) ------------------------------------------

Worker = _spawn.Worker
"""One live candidate process (``request(op, **fields)``, ``close()``); sandboxed if it can be."""

sandbox_available = _mounts.sandbox_available
"""``sandbox_available(protect=())``: None when the OS sandbox works here, else why not."""

start_worker = _baselines.start_worker
"""``start_worker(task, source, entry, prepare, device, timeout_s)``: a Worker with ``source``
loaded; CandidateFailure when it does not load."""

Evaluator = _evaluate.Evaluator
"""``Evaluator(task, device, salt)``: judges a task's cases for any worker (``check``...)."""

round_quota = _rounds.round_quota
"""``round_quota(bench_spec, rounds)``: one round's ``warmup``, ``min_runs``, ``samples`` and
``precise_after``, as ``Evaluator.bench`` takes them in a case of ``rounds`` rounds."""

# ``received``: the pytest side's reading of a worker's answer, ``spec(worker, device)`` (the
# handovers to ask for, None: every output in its frame) and ``output(worker, meta, payload,
# device)``; ``bench/transport.py --pipe`` replaces ``received.spec`` to time frames alone.

# -- records: --ks-json runs and evolve populations ------------------------------------------

RunResults = _results.RunResults
"""The record ``--ks-json`` writes (pydantic; ``RunResults.model_validate_json(text)``)."""

CandidateResult = _results.CandidateResult
"""One candidate file's part of a RunResults: its checks, benchmarks and geomean."""

Population = _population.Population
"""``Population(root, task)``: one task's evolve population folder, safe to share."""

Member = _population.Member
"""One readable candidate of a Population: its meta, source and (once evaluated) record."""

best_member = _findings.best
"""``best_member(members)``: the fastest seed, unless a descendant is confirmed faster."""

confirmed_speedup = _findings.confirmed
"""``confirmed_speedup(member, by_id)``: (speedup, low, high) over its root seed, the product of the
links timed beside each parent; None for a seed or where a link was not timed beside one."""

split = _links.split
"""``split(child, parent)``: the (ratio, low, high) timed beside ``parent`` on the benchmarks
where ``child`` runs another knob point or kernel, and on the rest; None for other pairs."""

# -- kernel sources: knobs and HIP -----------------------------------------------------------

read_tunables = _knobs.read_tunables
"""``read_tunables(source)``: the kernel's ``TUNABLES`` dict ({} when it declares none)."""

read_space = _knobs.read_space
"""``read_space(source)``: the kernel's ``TUNABLE_SPACE`` (knob -> allowed values), or {}."""

rewrite_tunables = _knobs.rewrite_tunables
"""``rewrite_tunables(source, changes, by_shape=None)``: ``source`` with those ``TUNABLES``
values (and ``by_shape``'s rules as its ``TUNABLES_BY_SHAPE``), all else intact."""

Point = _compose.Point
"""One measured knob point: a passed kernel's id, its knob values, its benchmark medians."""

compose = _compose.compose
"""``compose(points, cases, keys, benches, base_knobs)``: per-class rules, or None."""

read_hip_source = _hip_source.read_source
"""``read_hip_source(path)``: a HIP candidate's ``load_inline`` source and flags, not imported."""
