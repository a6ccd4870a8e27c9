"""Fixtures and hooks for the project's own tests; shared helpers live in ``helpers.py``.

Tests that start a candidate worker, a pytest session or another process are marked ``slow``
automatically, so ``pytest tests -m "not slow"`` is the fast lane (README, Development).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import session_server
import torch  # noqa: F401 - imported once here: pytester restores sys.modules after inline runs
from helpers import AXPY, spawns

from pytest_kscientist.evolve.sessions import NO_HYPOTHESIS_PLUGIN

collect_ignore = ["data"]
XDIST_ENVIRONMENT = ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID")


def pytest_configure(config: pytest.Config) -> None:
    """The environment the suite's sessions and workers start in.

    Under pytest-xdist (the README's ``pytest tests -n 2``) each worker's environment names
    the worker; the sessions the tests start must see what a user's own session sees
    (pytest-benchmark switches itself off under xdist, and the harness draws its fresh seeds
    per xdist lane), so those variables go.

    One compile cache for the whole suite: pytester points HOME at each test's own folder,
    so every pytester session evaluating the HIP seed compiled it (and built its precompiled
    prelude) again. The folder is where this machine keeps compile results (``compiles``'s
    default, resolved before any test moves HOME); a KS_COMPILE_CACHE already set wins, and
    the tests of the cache set their own."""
    from pytest_kscientist.harness.compiles import cache_folder

    for name in XDIST_ENVIRONMENT:
        os.environ.pop(name, None)

    folder = cache_folder()
    if folder is not None:
        os.environ.setdefault("KS_COMPILE_CACHE", str(folder))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under ``-n`` (pytest-xdist), the tests of one file go to one worker (xdist's
    ``loadfile``) unless another ``--dist`` than the default is named: the modules' shared
    fixtures (a compiled seed, a precompiled header, a corpus session) are built once, not once
    per worker, and a module's tests keep their order."""
    if config.getoption("dist") != "load":
        return None
    from xdist.scheduler import LoadFileScheduling

    return LoadFileScheduling(config, log)


@pytest.fixture
def pytester(pytester: pytest.Pytester) -> pytest.Pytester:
    """pytest's own, its subprocess sessions without Hypothesis's pytest plugin, as the
    helpers' (``helpers.PYTEST``): it imports all of hypothesis at each session's end."""
    run = pytester.runpytest_subprocess

    def without_hypothesis(*args: Any, **kwargs: Any) -> pytest.RunResult:
        return run(*NO_HYPOTHESIS_PLUGIN, *args, **kwargs)

    pytester.runpytest_subprocess = without_hypothesis  # type: ignore[method-assign]
    real_popen = pytester.popen

    def popen(cmdargs: Any, stdout: Any = subprocess.PIPE, stderr: Any = subprocess.PIPE,
              stdin: Any = pytester.CLOSE_STDIN, **kw: Any) -> Any:
        """pytest's own, but a ``python -m pytest`` into files forked by the session server
        (``session_server``: what it saves, and when a session still starts for real)."""
        if stdin is pytester.CLOSE_STDIN and set(kw) <= {"close_fds"} and not any(
                isinstance(f, int) for f in (stdout, stderr)):
            env = dict(os.environ)
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(),
                                                              env.get("PYTHONPATH", "")]))
            served = session_server.popen(cmdargs, stdout, stderr, None, env)
            if served is not None:
                return served
        return real_popen(cmdargs, stdout=stdout, stderr=stderr, stdin=stdin, **kw)

    pytester.popen = popen  # type: ignore[method-assign]
    return pytester


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``slow`` every test that starts a process (``helpers.spawns``)."""
    for item in items:
        function = getattr(item, "function", None)
        module = getattr(item, "module", None)
        if function is not None and module is not None and spawns(function, module):
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def toolchain() -> Any:
    """The AMDGPU toolchain of the HIP compile gate; skips without one (fails under
    ``KS_HIP_REQUIRED=1``, as CI sets it: tools/install_hip_toolchain.sh installs it)."""
    from pytest_kscientist.hip import toolchain as hip_toolchain

    found = hip_toolchain.find()
    if isinstance(found, str):
        if os.environ.get("KS_HIP_REQUIRED") == "1":
            pytest.fail(f"KS_HIP_REQUIRED=1 but no AMDGPU toolchain: {found}")
        pytest.skip(f"no AMDGPU toolchain ({found}); {hip_toolchain.install_command()}")
    return found


@pytest.fixture
def axpy_dir(tmp_path: Path) -> Path:
    """A private copy of the tiny axpy task."""
    dest = tmp_path / "axpy"
    shutil.copytree(AXPY, dest)
    return dest
