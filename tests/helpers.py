"""Paths and helpers shared by the project's tests (imported as ``helpers``; conftest.py keeps
only fixtures and hooks)."""

from __future__ import annotations

import importlib.util
import inspect
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import session_server

from pytest_kscientist.evolve.sessions import NO_HYPOTHESIS_PLUGIN

DATA = Path(__file__).parent / "data"
AXPY = DATA / "axpy"
CANDIDATES = DATA / "candidates"
REPO = Path(__file__).parent.parent
# A pytest session in a subprocess, as the tests start one (NO_HYPOTHESIS_PLUGIN: why there);
# PYTEST without pytest's cache, SESSION with it (for --lf).
SESSION = (sys.executable, "-m", "pytest", *NO_HYPOTHESIS_PLUGIN)
PYTEST = (*SESSION, "-p", "no:cacheprovider")


# A task copy's timing cut to the least (tests that time nothing they assert on): on the
# 2-core CPU pytest fp8_gemm's three benchmarks took 30 s with the task's own settings (4
# rounds of at least 5 calls, Triton interpreted), 4.7 s with these.
QUICK_BENCH = ("\n[bench]\nbudget_s = 0.1\nmin_runs = 1\nrounds = 2\nwarmup = 1\n"
               "verify_samples = 1\n")


def quick_bench(task: Path) -> Path:
    """``task``, a copy of a task without a ``[bench]`` table, given QUICK_BENCH's."""
    spec = task / "task.toml"
    assert "[bench]" not in spec.read_text(), spec
    with spec.open("a") as f:
        f.write(QUICK_BENCH)
    return task


def load_file(path: Path, name: str) -> ModuleType:
    """The module in ``path`` (a script of bench/, a task's file), run once under ``name``."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # as an import would (dataclasses look their module up there)
    spec.loader.exec_module(module)
    return module


def run_pytest(args: list[str], cwd: Path, timeout: float = 600,
               env: dict[str, str] | None = None) -> tuple[int, str, Any]:
    """Run pytest in a subprocess with --ks-json; return (exit code, output, parsed JSON)."""
    out = cwd / "ks-results.json"
    proc = session_server.run([*PYTEST, "-rA", "--ks-json", str(out), *args], cwd=cwd,
                              env=env, timeout=timeout)
    data = json.loads(out.read_text()) if out.exists() else None
    return proc.returncode, proc.stdout + proc.stderr, data


def case_reasons(data: Any) -> dict[tuple[str, str], tuple[str, str]]:
    """(candidate, case_id) -> (outcome, reason) from a RunResults JSON."""
    return {
        (c["name"], case["case_id"]): (case["outcome"], case["reason"])
        for c in data["candidates"]
        for case in c["cases"]
    }


# Names whose use means a process is started: a worker, a pytest session, a subprocess.
SPAWNING = frozenset({
    "run_pytest", "runpytest", "runpytest_subprocess", "runpytest_inprocess", "subprocess",
    "Popen", "Worker", "start_worker", "ks_evaluate", "evaluate_child", "session_server",
})


def _names(code: Any) -> set[str]:
    """The global and attribute names a code object uses, its nested code (comprehensions,
    lambdas, inner functions) included."""
    names = set(code.co_names)
    for const in code.co_consts:
        if inspect.iscode(const):
            names |= _names(const)
    return names


def spawns(func: Any, module: ModuleType, seen: set[str] | None = None) -> bool:
    """Whether ``func``, a fixture it requests or a module-level function it calls (in
    ``module``) names something in SPAWNING."""
    seen = set() if seen is None else seen
    code = getattr(func, "__code__", None)
    if code is None:
        return False
    used = _names(code)
    if SPAWNING & used:
        return True
    names = sorted(used)
    try:
        names += list(inspect.signature(func).parameters)
    except (TypeError, ValueError):
        pass
    for name in names:
        if name in seen:
            continue
        seen.add(name)
        found = getattr(module, name, None)
        if found is None:
            continue
        target = inspect.unwrap(found) if hasattr(found, "__wrapped__") else found
        if inspect.isfunction(target) and target.__module__ == module.__name__ and spawns(
                target, module, seen):
            return True
    return False


def fixup_text(source: str) -> str:
    """The text of the CUDA seed's stream-K fixup function in ``source`` (the seed's or a
    patched seed's)."""
    start = source.index("__device__ bool fixup(")
    return source[start:source.index("\n}\n", start)]
