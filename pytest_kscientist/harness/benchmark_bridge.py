"""Hand our benchmark measurements to pytest-benchmark, so its storage and compare work on them.

pytest-benchmark registers its session object as the plugin ``pytest-benchmark``; its
``benchmark`` fixture records a run by appending a ``pytest_benchmark.stats.Metadata`` (built
from the fixture's name, id, group and extra_info) to that session's ``benchmarks`` list. We
append the same kind of record, built from the calls the worker timed, so
``--benchmark-json``, ``--benchmark-save``/``--benchmark-autosave``, ``--benchmark-compare`` and
``pytest-benchmark compare`` see our benchmarks like any others. We never define a
``benchmark`` fixture, and do nothing unless one of those flags asks for a record (under
pytest-xdist pytest-benchmark disables itself, and so does this).
"""

from __future__ import annotations

import warnings
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_kscientist.harness.results import CaseResult


def benchmark_session(config: pytest.Config) -> Any:
    """pytest-benchmark's session when it is active and asked to store or compare, else None."""
    bs = config.pluginmanager.get_plugin("pytest-benchmark")
    if bs is None or getattr(bs, "disabled", True) or not isinstance(
        getattr(bs, "benchmarks", None), list
    ):
        return None
    wanted = any(getattr(bs, flag, None) for flag in ("json", "save", "autosave", "compare"))
    return bs if wanted else None


def record(bs: Any, nodeid: str, name: str, group: str, result: CaseResult,
           extra_info: dict[str, Any]) -> None:
    """Append one benchmark (times in seconds, one call per round) to pytest-benchmark."""
    stats = result.stats
    if stats is None or not stats.samples_us:
        return
    try:
        from pytest_benchmark.stats import Metadata
    except ImportError as exc:  # pragma: no cover - pytest-benchmark is a dependency
        warnings.warn(f"pytest-benchmark records skipped: {exc}", pytest.PytestWarning,
                      stacklevel=2)
        return
    source = SimpleNamespace(
        name=name, fullname=nodeid, group=group, param=result.case_id, params=dict(result.case),
        extra_info=extra_info, cprofile_stats=None, has_error=False,
    )
    options = {"timer": stats.clock, "min_rounds": stats.runs, "warmup": True,
               "disable_gc": False}
    meta = Metadata(source, iterations=1, options=options)
    for t in stats.samples_us:
        meta.update(t / 1e6)
    bs.benchmarks.append(meta)
