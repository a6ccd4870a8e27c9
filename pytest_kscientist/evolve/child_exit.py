"""Loaded into every child session of ``--evolve`` (``-p``): records how the session ended.

A child session writes its ``--ks-json`` even when it is interrupted, with the results it had
so far. Its parent knows its exit code; a run resumed after the parent was killed does not.
This file, ``<results>.exit``, written after the results, tells a finished session's results
(exit 0 or 1: adoptable, ``evolve/orphans.py``) from an interrupted one's.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_kscientist.harness.files import atomic_write

FINISHED = (int(pytest.ExitCode.OK), int(pytest.ExitCode.TESTS_FAILED))


def exit_path(results: Path) -> Path:
    """Where the exit status of the session that writes ``results`` goes."""
    return results.with_name(results.name + ".exit")


def exit_status(results: Path) -> int | None:
    """The recorded exit status of the session that wrote ``results``; None when it did not
    record one (it was killed, or is still running) or the file is unreadable."""
    try:
        return int(exit_path(results).read_text(encoding="utf-8").strip())
    except (OSError, ValueError):
        return None


LOOP_ENDED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_runtestloop(session: pytest.Session) -> object:
    result = yield
    session.config.stash[LOOP_ENDED] = True  # every item ran: no interrupt came through
    return result


@pytest.hookimpl(trylast=True)  # after the harness's own sessionfinish has written the results
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    results = session.config.getoption("ks_json", default=None)
    if not results:
        return
    status = int(exitstatus)
    if status in FINISHED and not session.config.stash.get(LOOP_ENDED, False):
        # A second Ctrl-C inside pytest's own interrupt handling leaves the session's exit
        # status at 0: a test loop that never ended is an interrupted session whatever it says.
        status = int(pytest.ExitCode.INTERRUPTED)
    atomic_write(exit_path(Path(results)), f"{status}\n")
